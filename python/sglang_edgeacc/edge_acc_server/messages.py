"""What the decode side and the prefill side of one GPU say to each other.

One ZMQ PAIR socket per side pair (``ipc://``): the decode side binds, its
prefill side connects. Messages are frozen dataclasses, pickled. A message is
never a memory fence: every one that hands over device memory written by the
sender carries an :class:`~sglang_edgeacc.edge_acc.ordering.OrderingToken`
or was preceded by a host synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sglang_edgeacc.edge_acc.ordering import OrderingToken
from sglang_edgeacc.edge_acc.tensor_bundle import SharedTensors


@dataclass(frozen=True)
class SharedState:
    """Decode -> prefill, once: everything the prefill side maps instead of allocating."""

    tensors: SharedTensors
    memory_pool_config: Any  # upstream's MemoryPoolConfig, so both sides size pools alike
    kv_buffer_names: tuple[str, ...]
    decode_pid: int


@dataclass(frozen=True)
class PrefillReady:
    """Prefill -> decode, once: the shared state is mapped and the first forward may come."""

    pid: int
    mapped_bytes: int


@dataclass(frozen=True)
class PrefillWork:
    """Decode -> prefill: one prefill batch, slots already allocated by the decode side."""

    seq: int
    batch: bytes  # ScheduleBatch encoded by batch_codec
    written: Optional[OrderingToken]  # orders the decode side's req_to_token/KV writes


@dataclass(frozen=True)
class PrefillTimes:
    """When the prefill side took a batch, launched its forward and had its first tokens on the host.

    ``time.monotonic()`` seconds: one clock for every process of the host, so the decode
    side can set them beside its own.
    """

    taken_at: float
    launched_at: float
    done_at: float


@dataclass(frozen=True)
class PrefillResult:
    """Prefill -> decode: the sampled first tokens (host-synchronised: the KV is written)."""

    seq: int
    next_token_ids: list[int]
    logits_output: Any  # LogitsProcessorOutput with host tensors, logprob fields only
    forward_ms: float
    error: Optional[str] = None
    times: Optional[PrefillTimes] = None


@dataclass(frozen=True)
class FreezeGarbageCollector:
    """Decode -> prefill: freeze the garbage collector, as upstream's ``/freeze_gc`` does in its processes.

    Upstream sends it after the server's warmup by default, so the objects made at start leave the
    collections that would otherwise stop the process to scan them.
    """

    gc_threshold: Optional[tuple[int, ...]] = None


@dataclass(frozen=True)
class Shutdown:
    """Decode -> prefill: release the mappings and exit."""
