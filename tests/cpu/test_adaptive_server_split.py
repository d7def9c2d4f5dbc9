"""edge_acc_server.adaptive: what the prefill side does with the load a PrefillWork carries (CPU).

The partitions are a stand-in (green contexts need a GPU); the policy and the message are real.
"""

from __future__ import annotations

from sglang_edgeacc.edge_acc.adaptive_split import AdaptiveSplitConfig, AdaptiveSplitPolicy
from sglang_edgeacc.edge_acc_server.adaptive import AdaptiveSplit
from sglang_edgeacc.edge_acc_server.messages import PrefillWork
from tests.gloo_ranks import run_ranks


class _Partitions:
    """Stands in for GreenContextPartitions: five splits, streams named by index."""

    sm_counts = [32, 48, 72, 96, 112]
    total_sms = 132
    whole_gpu_top = False

    def __len__(self) -> int:
        return len(self.sm_counts)

    def stream(self, index: int) -> str:
        return f"stream-{index}"


def _split() -> AdaptiveSplit:
    cfg = AdaptiveSplitConfig(itl_slo_ms=21.58, ttft_slo_ms=2400.0)
    return AdaptiveSplit(partitions=_Partitions(), policy=AdaptiveSplitPolicy(cfg, 5, initial_index=0), tp_rank=0)


def _work(steps, batch, queued=60_000) -> PrefillWork:
    return PrefillWork(seq=1, batch=b"", written=None, decode_step_ms=tuple(steps), queued_tokens=queued,
                       decode_batch_size=batch)


def test_the_load_in_the_message_moves_the_split_before_the_batch_runs():
    split = _split()
    plant = {64: [16.7, 18.1, 20.6, 23.2, 27.0], 32: [13.8, 14.3, 15.9, 18.0, 20.4]}
    batch = 64
    streams = [split.stream_for(_work([], batch))]
    for phase_batch, batches in ((64, 10), (32, 12)):
        for _ in range(batches):
            idx = split.policy.index
            streams.append(split.stream_for(_work([plant[batch][idx]] * 8, phase_batch)))
            split.observe(_work([], phase_batch), forward_ms=150.0, tokens=2048)
            batch = phase_batch
    assert split.policy.index == 4  # the burst at batch 32 grew to the top
    # The decode side now runs 64 requests: the very batch sent with that load gets split 2.
    streams.append(split.stream_for(_work([plant[32][4]] * 8, 64)))
    assert streams[-1] == "stream-2"


def test_a_message_without_a_load_keeps_the_feedback_rule():
    split = _split()
    for _ in range(6):
        split.stream_for(_work([15.0] * 8, 0))
        split.observe(_work([], 0), forward_ms=150.0, tokens=2048)
    assert split.policy.index == 4  # grew one step per batch on measured headroom alone
    assert not any(h.reason.startswith("feed-forward") for h in split.policy.history)


def test_a_backlog_in_the_message_drains_on_the_largest_split_predicted_within_the_itl_slo():
    """A queue that predicts a TTFT above half its SLO (but not above it) moves the batch to the
    largest split predicted to hold the ITL SLO, before the TTFT SLO itself breaks."""
    plant = {64: [16.7, 18.1, 20.6, 23.2, 27.0], 32: [13.8, 14.3, 15.9, 18.0, 20.4]}
    cfg = AdaptiveSplitConfig(itl_slo_ms=21.58, ttft_slo_ms=2400.0)
    policy = AdaptiveSplitPolicy(cfg, 5, initial_index=0, sm_counts=_Partitions.sm_counts, total_sms=132)
    split = AdaptiveSplit(partitions=_Partitions(), policy=policy, tp_rank=0)
    streams, steps = [], []
    for batch in [64] * 8 + [32]:
        # 2048 tokens in 150 ms with 30k queued: predicted TTFT ~2.3 s, in (0.5, 1] x the SLO.
        streams.append(split.stream_for(_work(steps, batch, queued=30_000)))
        split.observe(_work([], batch, queued=30_000), forward_ms=150.0, tokens=2048)
        steps = [plant[batch][split.policy.index]] * 8
    # 32 -> 48 SMs by one exploring step, 72 on the extrapolation (21.3 ms predicted), never 96
    # (26.8 ms predicted; 23.2 ms real); the batch-32 message keeps 72, bounded by batch 64.
    assert streams[:3] == ["stream-0", "stream-1", "stream-2"]
    assert set(streams[2:]) == {"stream-2"}
    assert [h.reason.split(":")[0] for h in policy.history if h.index != 0][:2] == ["drain", "drain"]
    assert policy.predicted_ttft_ms < cfg.ttft_slo_ms  # it moved before the TTFT SLO broke


def _group_rank(rank: int) -> tuple[list, int]:
    import torch.distributed as dist

    split = _split()
    split.group = dist.group.WORLD
    # The ranks' decode sides report different steps: apart, the ranks would choose apart.
    streams = []
    for _ in range(6):
        work = _work([15.0 + 20 * rank] * 8, 0)
        streams.append(split.stream_for(work))
        split.observe(work, forward_ms=150.0, tokens=2048)
    return streams, len(split.policy.history)


def test_the_ranks_of_a_group_run_the_partition_its_first_rank_chose():
    results = run_ranks(_group_rank, 2)
    (leader, decided), (follower, asked) = results[0], results[1]
    assert follower == leader
    assert leader[-1] == "stream-4"  # grew on its headroom, as in the test above
    assert decided > 0 and asked == 0  # the follower's policy was never asked


def _create_on_rank(rank: int) -> bool:
    import torch
    import torch.distributed as dist

    from sglang_edgeacc.edge_acc_server import adaptive

    # Rank 1's GPU cannot make green contexts; rank 0's can.
    adaptive.build_partitions_or_warn = lambda **kw: _Partitions() if rank == 0 else None
    adaptive.prefill_partition_gauge = lambda *a: None
    flags = type("Flags", (), {"edge_acc_itl_slo_ms": 50.0, "edge_acc_ttft_slo_ms": 2000.0})()
    split = AdaptiveSplit.create(flags, torch.device("cuda", rank), rank, group=dist.group.WORLD)
    return split is not None


def test_a_rank_without_partitions_takes_its_whole_group_unconfined_instead_of_hanging_it():
    # Each batch's partition is agreed with a collective; a rank that had none would never join it.
    assert run_ranks(_create_on_rank, 2) == {0: False, 1: False}
