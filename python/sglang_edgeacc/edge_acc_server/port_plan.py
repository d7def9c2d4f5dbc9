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
import tempfile
import uuid

from sglang.srt.utils.network import get_free_port_below_ephemeral

# The prefill sides bind their NCCL port only later, so (as upstream does for its
# own) the port comes from below the kernel's ephemeral range, where no outgoing
# connection can take it in the meantime; upstream draws its ports from
# 22000-29999, these from the band above.
_NCCL_PORT_BAND = (30000, 32767)


def free_nccl_port() -> int:
    """Upstream's below-ephemeral port draw, from an unseeded RNG.

    Every scheduler seeds Python's ``random`` with --random-seed, which upstream's
    helper draws from: every prefill side then drew the same port, and the second
    one's process group failed with EADDRINUSE (CI, --dp 2). The draw runs on a fresh
    seed, and the scheduler's own random state is put back afterwards.
    """
    state = random.getstate()
    random.seed()
    try:
        return get_free_port_below_ephemeral(*_NCCL_PORT_BAND)
    finally:
        random.setstate(state)


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
