"""The PAIR socket between a decode side and its prefill side, with liveness-aware waits."""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

import zmq


class PeerLost(RuntimeError):
    """The other side of EdgeAcc exited; the server must go down."""


def new_endpoint() -> str:
    return f"ipc://{tempfile.gettempdir()}/sglang-edgeacc-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class SideChannel:
    def __init__(self, endpoint: str, *, bind: bool):
        self.endpoint = endpoint
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PAIR)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._pollers: dict[tuple, zmq.Poller] = {}  # by the sockets watched beside this one
        if bind:
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)

    def send(self, message, *, peer_alive: Optional[Callable[[], bool]] = None, timeout_s: float = 600.0) -> None:
        """Send; a PAIR socket blocks until its peer has connected, so wait for that with checks."""
        self._send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL), peer_alive, timeout_s)

    def _send_bytes(self, data: bytes, peer_alive: Optional[Callable[[], bool]], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._socket.poll(200, zmq.POLLOUT):
            if peer_alive is not None and not peer_alive():
                raise PeerLost("the other EdgeAcc side exited before it could receive a message")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the other EdgeAcc side did not connect within {timeout_s:.0f} s")
        self._socket.send(data)

    def send_in_background(self, message, *, peer_alive: Callable[[], bool], timeout_s: float) -> "PendingSend":
        """Pickle ``message`` now and send it from a thread; :meth:`PendingSend.wait` joins it.

        For a message whose peer connects only after a slow start: the caller goes
        on with its own work meanwhile. Until ``wait`` returns, nothing else may
        use this channel (a ZeroMQ socket belongs to one thread at a time).
        """
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        return PendingSend(self, data, peer_alive, timeout_s)

    def poll(self):
        """The next message if one is waiting, else None; never blocks."""
        try:
            return pickle.loads(self._socket.recv(zmq.NOBLOCK))
        except zmq.Again:
            return None

    def recv(self, *, timeout_s: Optional[float], peer_alive: Callable[[], bool], what: str):
        """Block until a message arrives, checking the peer every 200 ms."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._socket.poll(200):
                return pickle.loads(self._socket.recv())
            if not peer_alive():
                raise PeerLost(f"the other EdgeAcc side exited while waiting for {what}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no {what} from the other EdgeAcc side within {timeout_s:.0f} s")

    def wait_readable(self, timeout_ms: int, also: Sequence[zmq.Socket] = ()) -> bool:
        """Whether a message is waiting here, or on one of ``also``, within ``timeout_ms``."""
        if not also:
            return bool(self._socket.poll(timeout_ms))
        key = tuple(also)
        poller = self._pollers.get(key)
        if poller is None:
            poller = self._pollers[key] = zmq.Poller()
            for socket in (self._socket, *also):
                poller.register(socket, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))

    def close(self) -> None:
        self._socket.close(linger=0)
        if self.endpoint.startswith("ipc://"):
            try:
                os.unlink(self.endpoint[len("ipc://"):])
            except OSError:
                pass


class PendingSend:
    """One message on its way from a thread; ``wait`` returns once it is sent, or raises why not."""

    def __init__(self, channel: SideChannel, data: bytes, peer_alive: Callable[[], bool], timeout_s: float):
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(channel, data, peer_alive, timeout_s),
                                        name="edgeacc-channel-send", daemon=True)
        self._thread.start()

    def _run(self, channel, data, peer_alive, timeout_s) -> None:
        try:
            channel._send_bytes(data, peer_alive, timeout_s)
        except BaseException as exc:  # re-raised in the caller's thread by wait()
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
