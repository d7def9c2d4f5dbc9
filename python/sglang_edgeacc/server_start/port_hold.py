"""The HTTP port, held by the launcher from its first step until uvicorn serves on it.

Upstream binds the HTTP port only when uvicorn starts, after every scheduler is
up. Until then the port is free for anyone: the kernel hands ports of its
ephemeral range (32768-60999 by default) to every ``bind(0)`` and outgoing
``connect()``, and a server's own gloo listeners take about 18 per scheduler
process. One landing on the HTTP port made uvicorn fail to bind after the whole
start.

A listening socket blocks both: ``bind(0)`` never picks a port with a listener
on the same address, and ``connect()`` never picks a port that has a bound
socket. The held sockets are the ones uvicorn then serves on (handed over, not
closed and bound again), so there is no window. They are bound as asyncio's
``create_server(host, port)`` binds them (every address ``host`` resolves to,
``SO_REUSEADDR``, IPv6 sockets v6-only), so a port the hold gets is a port
uvicorn would have got. Connections that arrive before uvicorn serves wait in
the listen backlog and are answered once it does.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

# uvicorn's default listen backlog; uvicorn sets its own when it starts serving.
BACKLOG = 2048
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


class HttpPortTaken(SystemExit):
    """The HTTP port is in use; exits non-zero with the message on stderr."""

    def __init__(self, message: str):
        super().__init__(f"sglang-edgeacc: error: {message}")


def ephemeral_range() -> tuple[int, int]:
    try:
        with open(EPHEMERAL_RANGE_FILE) as fh:
            low, high = (int(x) for x in fh.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _holder(port: int) -> str:
    """' (pid N: command)' for the process listening on ``port``, where it can be seen."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                proc = psutil.Process(conn.pid)
                command = " ".join(" ".join(proc.cmdline()).split())[:120] or proc.name()
                return f" (pid {conn.pid}: {command})"
    except Exception:  # psutil.AccessDenied and friends: the holder is only a hint
        pass
    return ""


def port_in_use_message(host: str, port: int, error: OSError) -> str:
    where = f"{host}:{port}" if host else f"port {port}"
    if error.errno != errno.EADDRINUSE:
        # No other process holds it (an address this host lacks, a port this user may not bind):
        # advice about stopping a holder would mislead.
        return f"--port {port}: the HTTP server cannot listen on {where}: {error.strerror or error}. " \
               f"Check --host and --port."
    low, high = ephemeral_range()
    return (
        f"--port {port}: the HTTP server cannot listen on {where}: {error.strerror or error}{_holder(port)}. "
        f"Stop the process that holds it, or start with another --port; a port below {low} "
        f"(outside the kernel's ephemeral range {low}-{high}) is one that no outgoing connection can take."
    )


def _bind_addresses(host: Optional[str], port: int) -> list[tuple]:
    """The (family, type, proto, sockaddr) asyncio's create_server would bind for ``host``."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    seen, addresses = set(), []
    for family, socktype, proto, _, sockaddr in infos:
        key = (family, sockaddr)
        if key not in seen:
            seen.add(key)
            addresses.append((family, socktype, proto, sockaddr))
    return addresses


def listen_on(host: Optional[str], port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """Listening sockets on every address of ``host``; raises OSError (closing what it opened) if one fails."""
    sockets: list[socket.socket] = []
    try:
        for family, socktype, proto, sockaddr in _bind_addresses(host, port):
            sock = socket.socket(family, socktype, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            sock.listen(backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


@dataclass(frozen=True)
class HeldPort:
    host: str
    port: int
    sockets: tuple[socket.socket, ...]

    def serves(self, host: Optional[str], port: int) -> bool:
        return (host or "") == self.host and port == self.port


_lock = threading.Lock()
_held: Optional[HeldPort] = None


def hold(host: Optional[str], port: int) -> None:
    """Listen on ``host:port`` now, for uvicorn; raises :class:`HttpPortTaken` when the port is in use."""
    global _held
    if not port:
        return  # port 0: the OS picks one when uvicorn binds; nothing to protect
    try:
        sockets = listen_on(host, port)
    except OSError as exc:
        raise HttpPortTaken(port_in_use_message(host or "", port, exc)) from exc
    with _lock:
        previous, _held = _held, HeldPort(host or "", port, tuple(sockets))
    if previous is not None:
        _close(previous)
    logger.debug("holding %s:%d for the HTTP server until it serves", host, port)


def holding(host: Optional[str], port: int) -> bool:
    with _lock:
        return _held is not None and _held.serves(host, port)


def hand_over(host: Optional[str], port: int) -> Optional[list[socket.socket]]:
    """The held sockets for ``host:port``, once: the caller serves on them and owns them from here."""
    global _held
    with _lock:
        if _held is None or not _held.serves(host, port):
            return None
        held, _held = _held, None
    return list(held.sockets)


def release() -> None:
    """Close the held sockets (for an HTTP server that binds by itself)."""
    global _held
    with _lock:
        held, _held = _held, None
    if held is not None:
        _close(held)


def _close(held: HeldPort) -> None:
    for sock in held.sockets:
        sock.close()
