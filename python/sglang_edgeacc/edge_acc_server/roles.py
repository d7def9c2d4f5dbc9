"""Which side of EdgeAcc this process is, decided by the environment it was spawned with.

Upstream spawns schedulers with ``spawn``: a child sees the environment of its
parent at ``Process.start()``. The launcher sets ``SGLANG_EDGEACC=1`` once the
flags are parsed, and a decode side sets ``SGLANG_EDGEACC_ROLE=prefill`` only
around the start of its prefill side, so every process knows its role before
sglang constructs its scheduler.
"""

from __future__ import annotations

import os

ENABLED_ENV = "SGLANG_EDGEACC"
ROLE_ENV = "SGLANG_EDGEACC_ROLE"
CHANNEL_ENV = "SGLANG_EDGEACC_CHANNEL"
# The decode side's pid, given to its prefill side: by the time the prefill side
# looks, its parent may already be another process that adopted it.
DECODE_PID_ENV = "SGLANG_EDGEACC_DECODE_PID"
PREFILL = "prefill"
DECODE = "decode"


def edge_acc_enabled() -> bool:
    return os.environ.get(ENABLED_ENV) == "1"


def is_prefill_side() -> bool:
    return edge_acc_enabled() and os.environ.get(ROLE_ENV) == PREFILL


def is_decode_side() -> bool:
    return edge_acc_enabled() and not is_prefill_side()


def decode_side_pid() -> int:
    return int(os.environ[DECODE_PID_ENV])


def role() -> str:
    return PREFILL if is_prefill_side() else DECODE


def log_prefix(tp_rank: int, dp_rank: int | None = None) -> str:
    dp = f" dp{dp_rank}" if dp_rank is not None else ""
    return f"[edgeacc {role()}{dp} tp{tp_rank}]"
