"""The decode side's report of a long gap between decode results (``edge_acc_server.long_gaps``).

On the real objects with a stepped clock: where the step clock puts a step's time, what counts as
long, which part of the loop is named, and how often a line is written. The decode loop's own report of a stall is in
``test_request_faults.py``, on the real CPU server.
"""

from __future__ import annotations

import gc
import logging
import time

import pytest

from sglang_edgeacc.edge_acc_server.decode_step_times import GC_PART, DecodeStep, DecodeStepClock, GcTimer
from sglang_edgeacc.edge_acc_server.long_gaps import MIN_INTERVAL_S, LongGapLog


def _step(seconds: float, parts: dict | None = None) -> DecodeStep:
    return DecodeStep(seconds=seconds, beside_prefill=False, parts=parts or {})


class SteppedClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_step_says_which_part_of_the_loop_took_its_time():
    clock = SteppedClock()
    steps = DecodeStepClock(clock)
    assert steps.result(is_decode=True, beside_prefill=False) is None  # the first result: no interval
    for part, spent in (("requests", 0.002), ("prefill hand-off", 0.3), ("requests", 0.001), ("pacing", 0.04)):
        clock.now += spent
        steps.mark(part)
    clock.now += 0.01  # processing the result
    step = steps.result(is_decode=True, beside_prefill=False)
    assert list(step.parts) == ["requests", "prefill hand-off", "pacing", "decode results"]
    assert abs(step.parts["requests"] - 0.003) < 1e-9 and abs(step.parts["decode results"] - 0.01) < 1e-9
    assert abs(sum(step.parts.values()) - step.seconds) < 1e-9
    # An idle pass starts over: the parts before it belong to no step.
    clock.now += 5
    steps.mark("requests")
    steps.idle()
    assert steps.result(is_decode=True, beside_prefill=False) is None
    clock.now += 0.02
    assert steps.result(is_decode=True, beside_prefill=False).parts == {"decode results": pytest.approx(0.02)}


def test_a_garbage_collection_inside_a_part_is_named_as_its_own_part():
    """A real collection, made to last 150 ms on the stepped clock: it is taken out of the part it stopped."""
    clock = SteppedClock()

    def slow_collection(phase, info):
        if phase == "start":
            clock.now += 0.15

    timer = GcTimer(clock)
    gc.callbacks.append(slow_collection)  # after the timer's: inside the bracket it measures
    try:
        steps = DecodeStepClock(clock, gc_timer=timer)
        steps.result(is_decode=True, beside_prefill=False)
        clock.now += 0.004
        steps.mark("prefill hand-off")
        clock.now += 0.003
        gc.collect()
        steps.mark("decode launch")
        clock.now += 0.002
        step = steps.result(is_decode=True, beside_prefill=False)
    finally:
        gc.callbacks.remove(slow_collection)
        timer.stop()
    assert timer._on_collection not in gc.callbacks
    assert step.parts[GC_PART] == pytest.approx(0.15)
    assert step.parts["decode launch"] == pytest.approx(0.003)
    assert step.parts["prefill hand-off"] == pytest.approx(0.004)
    assert sum(step.parts.values()) == pytest.approx(step.seconds)
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    line = gaps.gap(step, requests=16)
    assert "ms between two decode results of 16 running requests, the first step of that many (reported from" in line
    assert line.endswith("the loop's parts in ms: garbage collection 150, prefill hand-off 4, decode launch 3, decode results 2")


def test_a_gap_at_the_first_step_of_a_batch_size_says_so():
    clock = SteppedClock()
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    assert gaps.gap(None, requests=12) is None  # untimed, but 12 is a size seen from now on
    assert gaps.gap(_step(0.01), requests=15) is None  # short: nothing said, 15 seen
    assert "the first step of that many" in gaps.gap(_step(0.2), requests=16)
    clock.now += MIN_INTERVAL_S
    for seen in (12, 15, 16):
        line = gaps.gap(_step(0.2), requests=seen)
        assert line.startswith(f"[edgeacc decode tp0] 200 ms between two decode results of {seen} running requests "
                               "(reported from 100 ms)"), line
        clock.now += MIN_INTERVAL_S


def test_a_gap_of_two_targets_is_reported_with_its_largest_part_first(caplog):
    clock = SteppedClock()
    gaps = LongGapLog(itl_slo_ms=200.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    assert gaps.threshold_s == 0.4
    assert gaps.gap(_step(0.399, {"decode results": 0.399})) is None
    with caplog.at_level(logging.WARNING):
        line = gaps.gap(_step(0.436, {"requests": 0.001, "prefill hand-off": 0.4, "decode results": 0.035}))
    assert line == ("[edgeacc decode tp0] 436 ms between two decode results (reported from 400 ms); "
                    "the loop's parts in ms: prefill hand-off 400, decode results 35, requests 1")
    assert line in caplog.messages


def test_the_default_target_reports_every_gap_the_streaming_slo_counts():
    # 50 ms by default: a paced step beside a prefill (about one target) is not named, a gap over 100 ms is.
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=str)
    assert gaps.threshold_s == 0.1
    assert gaps.gap(_step(0.06)) is None and gaps.gap(_step(0.147)) is not None


def test_a_small_target_still_reports_from_100_ms():
    assert LongGapLog(itl_slo_ms=20.0, log_prefix=str).threshold_s == 0.1


def test_at_most_one_line_per_interval_and_the_next_counts_the_ones_held_back():
    clock = SteppedClock()
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", clock=clock)
    assert gaps.gap(_step(0.5)) is not None
    clock.now += MIN_INTERVAL_S / 2
    assert gaps.gap(_step(0.6)) is None
    assert gaps.gap(_step(0.7)) is None
    clock.now += MIN_INTERVAL_S
    line = gaps.gap(_step(0.3, {"pacing": 0.3}))
    assert line.endswith("pacing 300; 2 more such gaps since the last report")
    clock.now += MIN_INTERVAL_S
    assert "more such gaps" not in gaps.gap(_step(0.3))



def _waits_here(seconds: float) -> None:
    time.sleep(seconds)


def _stack_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("stall_stack")]


def test_a_gap_that_reaches_the_threshold_has_the_loops_stack_logged_while_it_lasts(caplog):
    """A real thread takes the real stack of the thread that built the log: the call it waits in."""
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", stacks=True)
    with caplog.at_level(logging.WARNING):
        assert gaps.gap(None, requests=4) is None  # the first result: the next gap is watched from here
        started = time.monotonic()
        _waits_here(0.25)
        line = gaps.gap(_step(time.monotonic() - started), requests=4)
        gaps.idle()
    [stack] = _stack_lines(caplog)
    assert stack.startswith("[edgeacc decode tp0] no decode result for 1"), stack  # 100-199 ms
    assert "the decode loop is in:\n" in stack and "in test_a_gap_that_reaches_the_threshold" in stack
    assert stack.rstrip().splitlines()[-2].strip().endswith("in _waits_here"), stack
    assert line.endswith("the decode loop's stack 100 ms into it is logged above (\"no decode result for ...\")")


def test_short_gaps_idle_loops_and_a_second_long_gap_within_the_interval_take_no_stack(caplog):
    gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]", stacks=True)
    with caplog.at_level(logging.WARNING):
        gaps.gap(None)
        for _ in range(3):  # decode steps well inside the threshold
            _waits_here(0.02)
            assert gaps.gap(_step(0.02)) is None
        gaps.idle()  # nothing to decode: a long wait is no gap
        _waits_here(0.2)
        assert gaps.gap(None) is None
        assert _stack_lines(caplog) == []
        _waits_here(0.15)
        assert "the decode loop's stack" in gaps.gap(_step(0.15))
        assert len(_stack_lines(caplog)) == 1
        # Within MIN_INTERVAL_S of a taken stack the next long gap takes none (and its line is held back).
        _waits_here(0.15)
        assert gaps.gap(_step(0.15)) is None
        gaps.idle()
    assert len(_stack_lines(caplog)) == 1


def test_a_new_target_moves_the_threshold_also_for_the_gap_being_watched(caplog):
    gaps = LongGapLog(itl_slo_ms=500.0, log_prefix=lambda: "[edgeacc decode tp0]", stacks=True)
    assert gaps.threshold_s == 1.0
    with caplog.at_level(logging.WARNING):
        gaps.gap(None, requests=4)  # a gap is watched from here, its stack due after 1 s
        _waits_here(0.05)  # the watching thread asleep until then
        gaps.retarget(50.0)
        assert gaps.threshold_s == 0.1
        _waits_here(0.3)
        line = gaps.gap(_step(0.3), requests=4)
        gaps.idle()
    [stack] = _stack_lines(caplog)  # taken at the new threshold, not the old deadline
    assert stack.startswith("[edgeacc decode tp0] no decode result for 1"), stack
    assert "(reported from 100 ms)" in line, line
