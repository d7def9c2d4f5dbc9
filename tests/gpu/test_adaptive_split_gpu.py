"""GPU proof: the adaptive split's pre-built partitions really confine the prefill side.

Builds GreenContextPartitions on cuda:0 (no MPS percentage in this process), runs the same
8192^3 bf16 matmul on the smallest and the largest partition and on an ordinary stream, and
checks that time grows as SMs shrink; then drives the policy with the measured times of a
decode-like matmul on an ordinary stream while a prefill-like matmul runs on the chosen
partition, and checks it moves to a smaller partition when the ITL SLO is breached.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_adaptive_split_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_edgeacc.edge_acc.adaptive_partitions import (
    GreenContextPartitions,
    build_partitions_or_warn,
    high_priority_stream,
)
from sglang_edgeacc.edge_acc.adaptive_split import AdaptiveSplitConfig, AdaptiveSplitPolicy
from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)"),
]
N = 8192


def _matmul_ms(stream: torch.cuda.Stream, a: torch.Tensor, b: torch.Tensor, reps: int = 10) -> float:
    with torch.cuda.stream(stream):
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(reps):
            a @ b
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / reps


@pytest.fixture(scope="module")
def parts():
    if os.environ.get(MPS_PERCENT_VAR):
        pytest.skip(f"{MPS_PERCENT_VAR} is set: green contexts cannot be made in this process")
    p = build_partitions_or_warn(device_index=0)
    if p is None:
        pytest.skip("green contexts unavailable on this torch/driver (the fallback warning was logged)")
    return p


def test_partitions_are_increasing_multiples_of_the_granularity(parts: GreenContextPartitions):
    counts = parts.sm_counts
    print("PARTITIONS", counts, "of", parts.total_sms)
    assert len(counts) >= 3 and counts == sorted(counts) and len(set(counts)) == len(counts)
    major, _ = torch.cuda.get_device_capability(0)
    if major >= 9:
        assert all(c % 8 == 0 for c in counts)
    assert counts[-1] < parts.total_sms


def test_a_matmul_on_a_smaller_partition_is_slower(parts: GreenContextPartitions):
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    full = _matmul_ms(torch.cuda.Stream(), a, b)
    small = _matmul_ms(parts.stream(0), a, b)
    large = _matmul_ms(parts.stream(len(parts) - 1), a, b)
    print(f"MATMUL_MS full={full:.2f} small({parts.sm_counts[0]})={small:.2f} large({parts.sm_counts[-1]})={large:.2f}")
    sm_ratio = parts.sm_counts[-1] / parts.sm_counts[0]
    # Compute-bound: time scales roughly with 1/SMs; allow 30 % for clocks and tails.
    assert small / large > 0.7 * sm_ratio
    assert large >= 0.9 * full


def test_policy_moves_to_a_smaller_partition_when_decode_suffers(parts: GreenContextPartitions):
    """Real interference: a 'decode' matmul on an ordinary stream next to a 'prefill' matmul on a partition."""
    dec_a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    pre_a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    decode_stream = torch.cuda.Stream()
    alone = _matmul_ms(decode_stream, dec_a, dec_a, reps=20)
    # ITL SLO between the decode time next to the largest and next to the smallest partition.
    policy = AdaptiveSplitPolicy(
        AdaptiveSplitConfig(itl_slo_ms=alone * 1.6, ttft_slo_ms=1e9),
        len(parts),
        initial_index=len(parts) - 1,
    )
    for _ in range(3 * len(parts)):
        idx = policy.choose()
        with torch.cuda.stream(parts.stream(idx)):
            for _ in range(20):
                pre_a @ pre_a  # keeps the chosen partition busy while decode steps run
        for _ in range(8):
            policy.observe_decode_step(_matmul_ms(decode_stream, dec_a, dec_a, reps=2))
        torch.cuda.synchronize()
    trace = [h.index for h in policy.history]
    print("DECODE_ALONE_MS", round(alone, 3), "TRACE", trace, [h.decode_pct_ms for h in policy.history])
    assert trace[-1] < len(parts) - 1
    assert all(b <= a for a, b in zip(trace, trace[1:]))  # TTFT never asks to grow here


def test_the_whole_gpu_top_is_unconfined_and_yields_to_a_high_priority_decode_stream():
    """The top index of ``whole_gpu_top`` runs on all SMs at the least priority (no green context)."""
    if os.environ.get(MPS_PERCENT_VAR):
        pytest.skip(f"{MPS_PERCENT_VAR} is set: green contexts cannot be made in this process")
    parts = GreenContextPartitions([32, 112], device_index=0, whole_gpu_top=True)
    assert parts.labels == ["32", "112", "all-lowprio"]
    assert parts.sm_counts[-1] == parts.total_sms
    decode = high_priority_stream(0)
    top = parts.stream(len(parts) - 1)
    print("PRIORITIES top", top.priority, "decode", decode.priority)
    assert decode.priority < top.priority  # lower number = higher priority
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    full = _matmul_ms(torch.cuda.Stream(), a, a)
    on_top = _matmul_ms(top, a, a)
    on_112 = _matmul_ms(parts.stream(1), a, a)
    print(f"MATMUL_MS full={full:.2f} all-lowprio={on_top:.2f} 112={on_112:.2f}")
    assert on_top < 1.1 * full  # not confined
    assert on_top < on_112


def test_a_torch_with_green_contexts_starts_the_adaptive_prefill_side_without_a_cap():
    from sglang_edgeacc.edge_acc.sm_partition import child_env, green_contexts_available

    assert green_contexts_available()
    # The fixed MPS split is only the fallback where torch lacks green contexts.
    assert child_env("prefill", 80, "adaptive") == {}
