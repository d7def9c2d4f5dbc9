"""``--edge-acc-sm-partition adaptive`` on the prefill side: a green-context partition per batch.

The decode side measures its decode steps and its queue and sends them with
each prefill batch; the policy (:mod:`sglang_edgeacc.edge_acc.adaptive_split`)
turns them into the partition the batch runs on. Where this torch has no green
contexts the decode side starts the prefill side on the fixed MPS split instead
(``--edge-acc-prefill-sm-percent``; :func:`~sglang_edgeacc.edge_acc.sm_partition.child_env`),
and the prefill side says so once, at start; where the platform has no SMs, or
making the partitions fails anyway, it runs unconfined and says that.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_edgeacc.edge_acc.adaptive_partitions import GreenContextPartitions, build_partitions_or_warn
from sglang_edgeacc.edge_acc.adaptive_split import AdaptiveSplitConfig, AdaptiveSplitPolicy
from sglang_edgeacc.edge_acc_server.metrics import prefill_partition_gauge
from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree, is_group_leader, leader_decides

logger = logging.getLogger(__name__)


@dataclass
class AdaptiveSplit:
    """The partitions and the policy of one prefill side, and the rank group that shares its choice.

    The ranks of one attention-TP group run each batch's forward together, with
    collectives in it, so they must run it on the same partition: the group's first
    rank decides from its decode side's measurements and the others take its choice
    (:func:`~sglang_edgeacc.edge_acc_server.group_consensus.leader_decides`).
    """

    partitions: GreenContextPartitions
    policy: AdaptiveSplitPolicy
    tp_rank: int
    group: object = None  # the attention-TP CPU group; None: this rank decides alone
    _gauge: object = None

    @classmethod
    def create(cls, flags, device: torch.device, tp_rank: int, *, dp_rank: int = 0,
               group=None) -> "AdaptiveSplit | None":
        """``device`` with its index (``prefill_side.runner_gpu``); None where it runs unconfined."""
        if device.type != "cuda":
            logger.warning("[edgeacc prefill tp%d] --edge-acc-sm-partition adaptive: the %s platform has "
                           "no SMs to partition; running unconfined", tp_rank, device.type)
            return None
        # The whole-GPU, least-priority top extends the split to the prefill throughput the
        # largest green context cannot reach; the policy uses it only when the ITL SLO allows.
        partitions = build_partitions_or_warn(device_index=device.index, tp_rank=tp_rank, whole_gpu_top=True)
        # The group's ranks agree on a partition per batch with a collective: a rank without
        # partitions would never join it and the others would wait forever.
        if group is not None and not all_ranks_agree(partitions is not None, group):
            if partitions is not None:
                logger.warning("[edgeacc prefill tp%d] --edge-acc-sm-partition adaptive: another rank of this "
                               "attention-TP group could not make its partitions (its warning says why); "
                               "running unconfined", tp_rank)
            return None
        if partitions is None:
            return None
        config = AdaptiveSplitConfig(itl_slo_ms=flags.edge_acc_itl_slo_ms, ttft_slo_ms=flags.edge_acc_ttft_slo_ms)
        policy = AdaptiveSplitPolicy(config, len(partitions), sm_counts=partitions.sm_counts,
                                     total_sms=partitions.total_sms, unconfined_top=partitions.whole_gpu_top)
        split = cls(partitions=partitions, policy=policy, tp_rank=tp_rank, group=group)
        split._gauge = prefill_partition_gauge(tp_rank, dp_rank)
        return split

    @property
    def decides(self) -> bool:
        return self.group is None or is_group_leader(self.group)

    def stream_for(self, work) -> torch.cuda.Stream:
        """Feeds the policy the load ``work`` carries, then the stream of the partition chosen for it."""
        index = self._choose(work) if self.decides else 0
        if self.group is not None:
            index = leader_decides(index, self.group)
        if self._gauge is not None:
            self._gauge.set(self.partitions.sm_counts[index])
        return self.partitions.stream(index)

    def _choose(self, work) -> int:
        # The steps ran under the load the previous batch was sent with (the policy's
        # current load); the new load then applies to this batch, before the choice.
        for ms in work.decode_step_ms:
            self.policy.observe_decode_step(ms)
        if work.decode_batch_size > 0:
            self.policy.observe_decode_load(work.decode_batch_size, work.decode_context_tokens)
        self.policy.observe_queue(work.queued_tokens)
        return self.policy.choose()

    def observe(self, work, forward_ms: float, tokens: int) -> None:
        if self.decides:
            self.policy.observe_prefill(forward_ms, tokens, work.queued_tokens)
