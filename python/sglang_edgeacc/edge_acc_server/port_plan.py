"""Ports and endpoints of a prefill side.

A prefill side is built as an sglang scheduler, so it needs a ``PortArgs``.
It must not share the decode side's: it would bind the decode side's request
socket, publish load snapshots under the decode side's instance, and join the
decode sides' process group. Every endpoint is therefore a fresh ``ipc://``
path nobody else connects to (the prefill side takes work only from its
decode side), the instance id is new, and the NCCL port is a free one that all
prefill sides of one TP group share (rank 0 picks it, see decode_side).
"""

from __future__ import annotations

import dataclasses
import random
import socket
import tempfile
import uuid

# The prefill sides bind their NCCL port only later. A port from the kernel's
# ephemeral range (bind to port 0) can meanwhile go to some outgoing connection,
# so, as upstream does for its own, the port comes from below that range. It
# must not come from upstream's helper for this: the scheduler seeds Python's
# ``random`` with --random-seed, so every prefill side drew the same port and
# the second one's process group failed with EADDRINUSE (CI, --dp 2). Upstream
# draws its NCCL ports from 22000-29999; these come from the next band up.
_NCCL_PORT_BAND = (30000, 32767)
_SYSTEM_RANDOM = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_nccl_port() -> int:
    """A free port below the ephemeral range, drawn independently of any seeded RNG."""
    low, high = _NCCL_PORT_BAND[0], min(_NCCL_PORT_BAND[1], _ephemeral_low() - 1)
    if high - low >= 64:
        for port in _SYSTEM_RANDOM.sample(range(low, high + 1), 64):
            if _bindable(port):
                return port
    with socket.socket() as sock:  # no room below the ephemeral range on this host
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _fresh_ipc() -> str:
    return f"ipc://{tempfile.gettempdir()}/sglang-edgeacc-prefill-{uuid.uuid4().hex[:12]}"


def prefill_side_port_args(template):
    """A PortArgs like ``template`` (any decode side's) with every endpoint replaced."""
    changes = {}
    for field in dataclasses.fields(template):
        value = getattr(template, field.name)
        if field.name.endswith("_ipc_name") and isinstance(value, str) and value:
            changes[field.name] = _fresh_ipc()
    changes["nccl_port"] = free_nccl_port()
    if hasattr(template, "instance_id"):
        changes["instance_id"] = uuid.uuid4().hex
    return dataclasses.replace(template, **changes)
