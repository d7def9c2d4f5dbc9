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
import socket
import tempfile
import uuid


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
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
    changes["nccl_port"] = _free_port()
    if hasattr(template, "instance_id"):
        changes["instance_id"] = uuid.uuid4().hex
    return dataclasses.replace(template, **changes)
