"""The pre-built SM partitions the adaptive split (``--edge-acc-sm-partition adaptive``) chooses from.

Green-context streams of increasing SM counts, made once per prefill side
(:class:`GreenContextPartitions`), optionally topped by the whole GPU on a
least-priority stream; :func:`build_partitions_or_warn` says what runs instead where
green contexts cannot be made. Which one a batch runs on is
:class:`~sglang_edgeacc.edge_acc.adaptive_split.AdaptiveSplitPolicy`'s decision.
Only torch and the standard library are imported, so the device can run this from
the repository without sglang.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

import torch

from .sm_partition import (
    MPS_PERCENT_VAR,
    GreenContextStream,
    SmPartitionError,
    green_context_stream,
    green_contexts_available,
    sm_granularity,
)

logger = logging.getLogger(__name__)

ADAPTIVE_MODE = "adaptive"

def default_sm_counts(total_sms: int, minimum: int, multiple: int, count: int = 5) -> list[int]:
    """``count`` prefill SM counts spread from about 1/4 to about 7/8 of the GPU, plus one just below all.

    Multiples of ``multiple``. The top count (the largest multiple below ``total_sms``,
    128 of 132 on an H200) is there because 7/8 (112 SMs) reached only 13.5 k prefill
    tok/s where chunked prefill reaches 16-20 k (measured with a standalone benchmark now in git history).
    """
    if count < 1:
        raise ValueError(f"need at least one partition, got {count}")
    low = max(minimum, (total_sms // 4) // multiple * multiple)
    high = max(low, (total_sms * 7 // 8) // multiple * multiple)
    top = (total_sms - 1) // multiple * multiple
    counts = [high] if count == 1 else []
    for i in range(count if count > 1 else 0):
        raw = low + (high - low) * i / (count - 1)
        counts.append(max(minimum, int(round(raw / multiple)) * multiple))
    if top >= minimum:
        counts.append(top)
    return sorted(set(counts))


HIGHEST_STREAM_PRIORITY = -100  # torch maps it to the device's greatest priority
LOWEST_STREAM_PRIORITY = 0  # CUDA's least priority, also every green-context stream's


def whole_gpu_low_priority_stream(device_index: int = 0) -> GreenContextStream:
    """The top "partition": all SMs, on a stream of the least priority.

    Nothing confines it; it only yields. The block scheduler dispatches a
    waiting block of a higher-priority stream before one of this stream as SMs
    free up, so a decode stream at :data:`HIGHEST_STREAM_PRIORITY` gets the SMs
    it needs at each kernel boundary while prefill fills the rest of the GPU.
    It protects decode only if the decode work really runs at a higher priority.
    """
    total = torch.cuda.get_device_properties(device_index).multi_processor_count
    stream = torch.cuda.Stream(device_index, priority=LOWEST_STREAM_PRIORITY)
    return GreenContextStream(stream=stream, num_sms=total, total_sms=total, context=None)


def high_priority_stream(device_index: int = 0) -> torch.cuda.Stream:
    """A stream of the greatest priority, for the decode side's steps (graphs replay at it too)."""
    return torch.cuda.Stream(device_index, priority=HIGHEST_STREAM_PRIORITY)


class GreenContextPartitions:
    """Green-context streams of increasing SM counts for the prefill side, created once.

    Index 0 is the smallest. With ``whole_gpu_top`` the last index is not a green
    context but :func:`whole_gpu_low_priority_stream` (all SMs, least priority):
    above the largest green context there is otherwise no split point at all,
    while chunked prefill reaches higher prefill throughput (measured with a standalone benchmark now in git history).
    Keep the object alive while its streams are in use.
    """

    def __init__(
        self,
        sm_counts: Optional[Sequence[int]] = None,
        device_index: int = 0,
        *,
        tp_rank: int = 0,
        whole_gpu_top: bool = False,
    ):
        if not green_contexts_available():
            raise SmPartitionError(
                f"--edge-acc-sm-partition {ADAPTIVE_MODE} needs CUDA and torch.cuda.green_contexts "
                f"(torch {torch.__version__}); use --edge-acc-sm-partition mps"
            )
        total = torch.cuda.get_device_properties(device_index).multi_processor_count
        minimum, multiple = sm_granularity(device_index)
        counts = list(sm_counts) if sm_counts else default_sm_counts(total, minimum, multiple)
        bad = [n for n in counts if n < minimum or n > total or n % multiple]
        if bad:
            raise SmPartitionError(
                f"adaptive SM split: SM counts {bad} are not multiples of {multiple} between {minimum} and {total} "
                f"on cuda:{device_index}"
            )
        self.total_sms = total
        self.device_index = device_index
        self.parts: list[GreenContextStream] = [
            green_context_stream(n, device_index, role="prefill", tp_rank=tp_rank) for n in sorted(set(counts))
        ]
        if whole_gpu_top:
            self.parts.append(whole_gpu_low_priority_stream(device_index))
        self.whole_gpu_top = whole_gpu_top
        logger.info(
            "[edgeacc prefill tp%d] adaptive SM split: partitions %s of %d SMs",
            tp_rank,
            self.labels,
            total,
        )

    @property
    def sm_counts(self) -> list[int]:
        return [p.num_sms for p in self.parts]

    @property
    def labels(self) -> list[str]:
        """Names for logs and metrics: the SM count, ``all-lowprio`` for the whole-GPU top."""
        return [("all-lowprio" if p.context is None else str(p.num_sms)) for p in self.parts]

    def __len__(self) -> int:
        return len(self.parts)

    def stream(self, index: int) -> torch.cuda.Stream:
        return self.parts[index].stream


def build_partitions_or_warn(
    sm_counts: Optional[Sequence[int]] = None,
    device_index: int = 0,
    *,
    tp_rank: int = 0,
    whole_gpu_top: bool = False,
) -> Optional[GreenContextPartitions]:
    """The partitions, or None with a WARNING that says what runs instead.

    A process that is an MPS client with a thread percentage cannot make green
    contexts; it runs that fixed split (the launcher starts the prefill side so
    when this torch has no green contexts: ``sm_partition.child_env``). Otherwise
    None means the prefill side runs unconfined.
    """
    limited = os.environ.get(MPS_PERCENT_VAR)
    if limited:
        logger.warning("[edgeacc prefill tp%d] --edge-acc-sm-partition %s unavailable: this process is an MPS "
                       "client limited by %s=%s; running that fixed split", tp_rank, ADAPTIVE_MODE,
                       MPS_PERCENT_VAR, limited)
        return None
    try:
        return GreenContextPartitions(sm_counts, device_index, tp_rank=tp_rank, whole_gpu_top=whole_gpu_top)
    except SmPartitionError as exc:
        logger.warning("[edgeacc prefill tp%d] --edge-acc-sm-partition %s unavailable (%s); the prefill side "
                       "runs unconfined", tp_rank, ADAPTIVE_MODE, exc)
        return None


__all__ = [
    "ADAPTIVE_MODE",
    "HIGHEST_STREAM_PRIORITY",
    "LOWEST_STREAM_PRIORITY",
    "GreenContextPartitions",
    "build_partitions_or_warn",
    "default_sm_counts",
    "high_priority_stream",
    "whole_gpu_low_priority_stream",
]
