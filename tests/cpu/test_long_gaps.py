"""The decode side's report of a long gap between decode results (``edge_acc_server.long_gaps``).

On the real objects with a stepped clock: what counts as long, which part of the loop is named,
and how often a line is written. The decode loop's own report of a stall is in
``test_request_faults.py``, on the real CPU server.
"""

from __future__ import annotations

import logging

from sglang_edgeacc.edge_acc_server.long_gaps import MIN_INTERVAL_S, LongGapLog, LoopParts


class SteppedClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_loop_parts_add_up_per_part_and_start_over_when_taken():
    clock = SteppedClock()
    parts = LoopParts(clock)
    for part, spent in (("requests", 0.002), ("prefill hand-off", 0.3), ("requests", 0.001), ("pacing", 0.04)):
        clock.now += spent
        parts.mark(part)
    taken = parts.take()
    assert list(taken) == ["requests", "prefill hand-off", "pacing"]
    assert abs(taken["requests"] - 0.003) < 1e-9 and abs(taken["prefill hand-off"] - 0.3) < 1e-9
    clock.now += 0.01
    parts.mark("decode results")
    taken = parts.take()
    assert list(taken) == ["decode results"] and abs(taken["decode results"] - 0.01) < 1e-9
    assert parts.take() == {}


def test_a_gap_of_four_targets_is_reported_with_its_largest_part_first(caplog):
    clock = SteppedClock()
    gaps = LongGapLog(itl_slo_ms=100.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    assert gaps.threshold_s == 0.4
    assert gaps.gap(0.399, {"decode results": 0.399}) is None
    with caplog.at_level(logging.WARNING):
        line = gaps.gap(0.436, {"requests": 0.001, "prefill hand-off": 0.4, "decode results": 0.035})
    assert line == ("[edgeacc decode tp0] 436 ms between two decode results (reported from 400 ms); "
                    "the loop's parts in ms: prefill hand-off 400, decode results 35, requests 1")
    assert line in caplog.messages


def test_a_small_target_still_reports_from_200_ms():
    assert LongGapLog(itl_slo_ms=20.0, log_prefix=str).threshold_s == 0.2


def test_at_most_one_line_per_interval_and_the_next_counts_the_ones_held_back():
    clock = SteppedClock()
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    assert gaps.gap(0.5, {}) is not None
    clock.now += MIN_INTERVAL_S / 2
    assert gaps.gap(0.6, {}) is None
    assert gaps.gap(0.7, {}) is None
    clock.now += MIN_INTERVAL_S
    line = gaps.gap(0.3, {"pacing": 0.3})
    assert line.endswith("pacing 300; 2 more such gaps since the last report")
    clock.now += MIN_INTERVAL_S
    assert "more such gaps" not in gaps.gap(0.3, {})
