"""``--edge-acc-sm-partition adaptive`` on the prefill side: a green-context partition per batch.

The decode side measures its decode steps and its queue and sends them with
each prefill batch; the policy (:mod:`sglang_edgeacc.edge_acc.adaptive_split`)
turns them into the partition the batch runs on. Where green contexts cannot
be made (no CUDA, an older torch, an MPS percentage on this process) the
prefill side runs unconfined and says so once, at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_edgeacc.edge_acc.adaptive_partitions import GreenContextPartitions, build_partitions_or_warn
from sglang_edgeacc.edge_acc.adaptive_split import AdaptiveSplitConfig, AdaptiveSplitPolicy

logger = logging.getLogger(__name__)


@dataclass
class AdaptiveSplit:
    partitions: GreenContextPartitions
    policy: AdaptiveSplitPolicy
    tp_rank: int
    _gauge: object = None

    @classmethod
    def create(cls, flags, device: torch.device, tp_rank: int) -> "AdaptiveSplit | None":
        if device.type != "cuda":
            logger.warning("[edgeacc prefill tp%d] --edge-acc-sm-partition adaptive: the %s platform has "
                           "no SMs to partition; running unconfined", tp_rank, device.type)
            return None
        # The whole-GPU, least-priority top extends the split to the prefill throughput the
        # largest green context cannot reach; the policy uses it only when the ITL SLO allows.
        partitions = build_partitions_or_warn(device_index=device.index or 0,
                                              fixed_percent=flags.edge_acc_prefill_sm_percent, tp_rank=tp_rank,
                                              whole_gpu_top=True)
        if partitions is None:
            return None
        config = AdaptiveSplitConfig(itl_slo_ms=flags.edge_acc_itl_slo_ms, ttft_slo_ms=flags.edge_acc_ttft_slo_ms)
        policy = AdaptiveSplitPolicy(config, len(partitions), sm_counts=partitions.sm_counts,
                                     total_sms=partitions.total_sms, unconfined_top=partitions.whole_gpu_top)
        split = cls(partitions=partitions, policy=policy, tp_rank=tp_rank)
        split._gauge = _partition_gauge(tp_rank)
        return split

    def stream_for(self, work) -> torch.cuda.Stream:
        # The steps ran under the load the previous batch was sent with (the policy's
        # current load); the new load then applies to this batch, before the choice.
        for ms in work.decode_step_ms:
            self.policy.observe_decode_step(ms)
        if work.decode_batch_size > 0:
            self.policy.observe_decode_load(work.decode_batch_size, work.decode_context_tokens)
        self.policy.observe_queue(work.queued_tokens)
        index = self.policy.choose()
        if self._gauge is not None:
            self._gauge.set(self.partitions.sm_counts[index])
        return self.partitions.stream(index)

    def observe(self, work, forward_ms: float, tokens: int) -> None:
        self.policy.observe_prefill(forward_ms, tokens, work.queued_tokens)


def _partition_gauge(tp_rank: int):
    """The SMs of the partition in use, on upstream's /metrics (None without --enable-metrics)."""
    from sglang.srt.runtime_context import get_observability

    if not get_observability().enable_metrics:
        return None
    from prometheus_client import Gauge

    return Gauge("sglang_edgeacc_prefill_partition_sms", "SMs of the green-context partition the prefill side uses.",
                 ["tp_rank"], multiprocess_mode="mostrecent").labels(tp_rank=str(tp_rank))
