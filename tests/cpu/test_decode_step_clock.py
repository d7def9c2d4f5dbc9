"""The decode side times each decode step once; the metrics and the adaptive split read that one measurement.

The step clock times a processed result against the previous decode result and
starts over when the loop idles or a result is not a decode step. Here the
decode side's own result processing runs with a clock set by hand, the real
``EdgeAccStats`` writing to a registry of its own, and the adaptive window, and
both readers are checked against the same steps. The series are read back the
way ``benchmarks/gpu_share.py`` reads ``/metrics``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler
from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStep, DecodeStepClock, DecodeStepWindow
from benchmarks import gpu_share
from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats

# Every series the decode side adds to /metrics, its kind and its labels (docs/quickstart.md, "Metrics").
SERIES = {
    "sglang_edgeacc_prefill_handoff_seconds": ("histogram", {"tp_rank"}),
    "sglang_edgeacc_prefill_message_bytes": ("histogram", {"tp_rank"}),
    "sglang_edgeacc_prefill_batches": ("counter", {"tp_rank"}),
    "sglang_edgeacc_prefill_batch_size": ("gauge", {"tp_rank"}),
    "sglang_edgeacc_prefill_queue_length": ("gauge", {"tp_rank"}),
    "sglang_edgeacc_decode_running_requests": ("gauge", {"tp_rank"}),
    "sglang_edgeacc_prefill_forward_seconds": ("counter", {"tp_rank"}),
    "sglang_edgeacc_prefill_tokens": ("counter", {"tp_rank"}),
    "sglang_edgeacc_prefill_attention_pairs": ("counter", {"tp_rank"}),
    "sglang_edgeacc_decode_steps": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_step_seconds": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_step_requests": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_context_tokens": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_sm_percent": ("gauge", {"tp_rank", "side"}),
}


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _stats():
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    stats = EdgeAccStats()
    stats.enable_prometheus({"tp_rank": "0"}, prefill_sm_percent=70, decode_sm_percent=100, registry=registry)
    return stats, registry


class _DecodeSide(DecodeSideScheduler):
    """Only what _edge_process_decode_result reads."""

    def __init__(self, clock, stats):
        self.decode_clock = DecodeStepClock(clock)
        self.decode_step_window = DecodeStepWindow(enabled=True)
        self.edge_acc_stats = stats
        self.prefill_link = SimpleNamespace(busy=False)

    def process_batch_result(self, batch, result):
        pass


def _batch(decode=True, requests=2, seq=10):
    # Each request has a 6-token prompt and seq - 6 tokens out; the newest is not attended to.
    reqs = [SimpleNamespace(origin_input_ids=[0] * 6, output_ids=[1] * (seq - 6)) for _ in range(requests)]
    return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode), reqs=reqs)


def test_one_measurement_feeds_the_metrics_and_the_adaptive_window():
    clock = _Clock()
    stats, registry = _stats()
    side = _DecodeSide(clock, stats)

    def result(at, busy, **batch):
        clock.now = at
        side.prefill_link.busy = busy
        side._edge_process_decode_result(_batch(**batch), None)

    result(100.000, False)  # the first result: nothing to time it against
    result(100.010, False)  # 10 ms, alone
    result(100.030, True)  # 20 ms beside a prefill
    result(100.060, True, requests=3)  # 30 ms beside a prefill
    side.decode_clock.idle()  # the loop idled: the next result starts over
    result(101.000, True)
    result(101.005, True, seq=20)  # 5 ms beside a prefill
    result(101.100, True, decode=False)  # not a decode step: starts over too
    result(101.200, False)
    result(101.240, False)  # 40 ms, alone

    window = side.decode_step_window.take()
    assert window == pytest.approx((20.0, 30.0, 5.0))
    counters = gpu_share.parse_counters(_exposition(registry))
    # The steps the window kept are exactly the metrics' steps beside a prefill, and the same durations.
    assert counters["decode_steps.yes"] == len(window) == 3
    assert counters["decode_step_seconds.yes"] == pytest.approx(sum(window) / 1e3)
    assert counters["decode_steps.no"] == 2
    assert counters["decode_step_seconds.no"] == pytest.approx(0.050)
    assert counters["decode_step_requests.yes"] == 2 + 3 + 2
    assert counters["decode_context_tokens.yes"] == 2 * 9 + 3 * 9 + 2 * 19


def test_without_the_adaptive_split_the_window_keeps_nothing_and_the_metrics_still_count():
    clock = _Clock()
    stats, registry = _stats()
    side = _DecodeSide(clock, stats)
    side.decode_step_window = DecodeStepWindow(enabled=False)
    side.prefill_link.busy = True
    for at in (100.0, 100.01, 100.02):
        clock.now = at
        side._edge_process_decode_result(_batch(), None)
    assert side.decode_step_window.take() == ()
    assert gpu_share.parse_counters(_exposition(registry))["decode_steps.yes"] == 2


def test_without_metrics_the_window_still_gets_every_step():
    clock = _Clock()
    side = _DecodeSide(clock, EdgeAccStats())  # --enable-metrics off
    side.prefill_link.busy = True
    for at in (100.0, 100.01, 100.03):
        clock.now = at
        side._edge_process_decode_result(_batch(), None)
    assert side.decode_step_window.take() == pytest.approx((10.0, 20.0))


def test_the_clock_alone():
    clock = _Clock()
    steps = DecodeStepClock(clock)
    assert steps.result(is_decode=True, beside_prefill=True) is None
    clock.now += 0.25
    assert steps.result(is_decode=True, beside_prefill=False) == DecodeStep(seconds=0.25, beside_prefill=False)
    clock.now += 1
    assert steps.result(is_decode=False, beside_prefill=False) is None
    clock.now += 1
    assert steps.result(is_decode=True, beside_prefill=True) is None


def test_the_series_names_kinds_and_labels_are_unchanged():
    stats, registry = _stats()
    stats.record_decode_step(DecodeStep(seconds=0.02, beside_prefill=True), requests=1, context_tokens=5)
    seen = {}
    for family in registry.collect():
        labels = {name for sample in family.samples for name in sample.labels if name != "le"}
        seen[family.name] = (family.type, labels)
    assert seen == SERIES


def _exposition(registry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()
