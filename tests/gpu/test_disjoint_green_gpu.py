"""GPU proof: a co-partition's two green contexts confine their work to disjoint SMs.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_disjoint_green_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)"),
]
N = 8192


def _matmuls(stream: torch.cuda.Stream, a: torch.Tensor, reps: int) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record(stream)
        for _ in range(reps):
            a @ a
        end.record(stream)
    return start, end


def _alone_ms(stream: torch.cuda.Stream, a: torch.Tensor, reps: int = 8) -> float:
    _matmuls(stream, a, 2)[1].synchronize()
    start, end = _matmuls(stream, a, reps)
    end.synchronize()
    return start.elapsed_time(end) / reps


@pytest.fixture(scope="module")
def pair():
    if os.environ.get(MPS_PERCENT_VAR):
        pytest.skip(f"{MPS_PERCENT_VAR} is set: green contexts cannot be made in this process")
    from benchmarks.disjoint_green import disjoint_green_streams

    return disjoint_green_streams(16, 0)


def test_the_group_and_the_remainder_cover_the_gpu_once(pair):
    total = torch.cuda.get_device_properties(0).multi_processor_count
    print("SPLIT", pair.group.num_sms, pair.remainder.num_sms, "of", total)
    assert pair.group.num_sms >= 16 and pair.group.num_sms + pair.remainder.num_sms == total


def test_each_side_is_confined_and_they_do_not_share_sms(pair):
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    whole = _alone_ms(torch.cuda.Stream(), a)
    group = _alone_ms(pair.group.stream, a, reps=2)
    rest = _alone_ms(pair.remainder.stream, b)
    # Concurrently: a long run on the remainder while the group runs; disjoint SMs leave the
    # group's time as it was alone (overlapping ones would share SMs and slow it).
    torch.cuda.synchronize()
    r_start, r_end = _matmuls(pair.remainder.stream, b, 60)
    g_start, g_end = _matmuls(pair.group.stream, a, 2)
    g_end.synchronize()
    r_end.synchronize()
    both = g_start.elapsed_time(g_end) / 2
    print(f"MATMUL_MS whole={whole:.2f} group({pair.group.num_sms})={group:.2f} "
          f"remainder({pair.remainder.num_sms})={rest:.2f} group_next_to_remainder={both:.2f}")
    ratio = pair.remainder.num_sms / pair.group.num_sms
    assert group / whole > 0.6 * pair.group.total_sms / pair.group.num_sms
    assert group / rest > 0.6 * ratio
    assert both < 1.25 * group
