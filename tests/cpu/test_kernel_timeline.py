"""The decode-step timeline split into kernel time and the gaps between kernels (benchmarks/kernel_timeline.py)."""

from __future__ import annotations

import torch

from benchmarks import kernel_timeline


def test_kernel_time_and_gaps_are_split_per_step_and_overlaps_count_once():
    # Two steps: kernels of 10 us with 5 us gaps; one kernel reported twice, overlapping.
    intervals = [(0, 10), (15, 25), (20, 25), (30, 40), (45, 55)]
    stats = kernel_timeline.timeline_stats(intervals, steps=2)
    assert stats["kernels"] == 4 and stats["kernels_per_step"] == 2.0
    assert stats["busy_us_per_step"] == 20.0
    assert stats["gap_us_per_step"] == 7.5 and stats["gap_us_mean"] == 5.0
    assert stats["busy_share"] == round(40 / 55, 3)


def test_a_step_whose_kernels_wait_shows_as_gaps_not_as_kernel_time():
    alone = kernel_timeline.timeline_stats([(i * 20, i * 20 + 10) for i in range(10)], steps=1)
    waiting = kernel_timeline.timeline_stats([(i * 60, i * 60 + 10) for i in range(10)], steps=1)
    lines = kernel_timeline.comparison_lines({"decode-only": alone, "beside": waiting})
    assert "kernel time 1.00x" in lines[1] and "gaps +0.36 ms/step" in lines[1]


def test_nothing_recorded_is_said_rather_than_counted_as_zero():
    assert kernel_timeline.timeline_stats([], steps=5) == {"steps": 5, "kernels": 0}
    assert kernel_timeline.comparison_lines({"x": {"steps": 5, "kernels": 0}}) == ["x: no kernels recorded"]


def test_the_profiler_path_records_what_the_step_ran():
    a = torch.randn(64, 64)

    def step():
        torch.mm(a, a)
        torch.relu(a)

    stats = kernel_timeline.profile_steps(step, steps=4, cuda=False)
    assert stats["kernels"] >= 4 and stats["busy_us_per_step"] > 0
