"""The decode side times each decode step once, and the metrics count that one measurement.

The step clock times a processed result against the previous decode result and
starts over when the loop idles or a result is not a decode step. Here the
decode side's own result processing runs with a clock set by hand and the real
``EdgeAccStats`` writing to a registry of its own. The series are read back the
way ``benchmarks/gpu_share.py`` reads ``/metrics``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_edgeacc.edge_acc_server.decode_pacing import DecodePacer
from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler
from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStep, DecodeStepClock
from sglang_edgeacc.edge_acc_server.long_gaps import LongGapLog
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
    "sglang_edgeacc_prefill_path_seconds": ("counter", {"tp_rank", "part"}),
    "sglang_edgeacc_prefill_tokens": ("counter", {"tp_rank"}),
    "sglang_edgeacc_prefill_attention_pairs": ("counter", {"tp_rank"}),
    "sglang_edgeacc_decode_steps": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_step_seconds": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_step_requests": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_context_tokens": ("counter", {"tp_rank", "beside_prefill"}),
    "sglang_edgeacc_decode_step_part_seconds": ("counter", {"tp_rank", "beside_prefill", "part"}),
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
        self.long_gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]")
        self.decode_pacer = DecodePacer(itl_slo_ms=50.0, clock=clock)
        self.edge_acc_stats = stats
        self.prefill_link = SimpleNamespace(busy=False)

    def process_batch_result(self, batch, result):
        pass


def _batch(decode=True, requests=2, seq=10):
    # Each request has a 6-token prompt and seq - 6 tokens out; the newest is not attended to.
    reqs = [SimpleNamespace(origin_input_ids=[0] * 6, output_ids=[1] * (seq - 6)) for _ in range(requests)]
    return SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: decode), reqs=reqs)


def test_each_step_is_counted_once_beside_a_prefill_or_alone():
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

    counters = gpu_share.parse_counters(_exposition(registry))
    assert counters["decode_steps.yes"] == 3
    assert counters["decode_step_seconds.yes"] == pytest.approx(0.020 + 0.030 + 0.005)
    assert counters["decode_steps.no"] == 2
    assert counters["decode_step_seconds.no"] == pytest.approx(0.050)
    assert counters["decode_step_requests.yes"] == 2 + 3 + 2
    assert counters["decode_context_tokens.yes"] == 2 * 9 + 3 * 9 + 2 * 19


def test_each_steps_time_is_counted_by_the_loop_part_it_went_to_and_read_back_per_step():
    clock = _Clock()
    stats, registry = _stats()
    side = _DecodeSide(clock, stats)

    def step(busy, *parts_ms):
        for part, ms in parts_ms:
            clock.now += ms / 1e3
            side.decode_clock.mark(part)
        clock.now += 0.004  # the result itself
        side.prefill_link.busy = busy
        side._edge_process_decode_result(_batch(), None)

    step(False)  # the first result: nothing to time it against, and its parts are not counted
    step(True, ("requests", 1), ("prefill hand-off", 6), ("pacing", 2))
    step(True, ("requests", 1), ("prefill hand-off", 2), ("decode launch", 3))
    step(False, ("requests", 1), ("pacing", 10))

    counters = gpu_share.parse_counters(_exposition(registry))
    assert {k: v for k, v in counters.items() if k.startswith("decode_part.")} == pytest.approx({
        "decode_part.yes.requests": 0.002, "decode_part.yes.prefill hand-off": 0.008,
        "decode_part.yes.pacing": 0.002, "decode_part.yes.decode launch": 0.003,
        "decode_part.yes.decode results": 0.008,
        "decode_part.no.requests": 0.001, "decode_part.no.pacing": 0.010, "decode_part.no.decode results": 0.004})
    # The parts of the steps add up to the steps' time.
    for beside in ("yes", "no"):
        parts = sum(v for k, v in counters.items() if k.startswith(f"decode_part.{beside}."))
        assert parts == pytest.approx(counters[f"decode_step_seconds.{beside}"])

    costs = gpu_share.ModelCosts(linear_flops_per_token=1.0, attention_flops_per_pair=1.0, weight_bytes=1.0,
                                 kv_bytes_per_token=1.0)
    share = gpu_share.shares({}, counters, costs, duration_s=1.0)
    assert share["decode_beside_prefill_yes"]["parts_ms"] == pytest.approx(
        {"requests": 1.0, "prefill hand-off": 4.0, "pacing": 1.0, "decode launch": 1.5, "decode results": 4.0})
    table = gpu_share.step_part_table({"edgeacc": {"workloads": {"poisson_8": {"gpu_share": share}}}})
    assert "| edgeacc | poisson_8 | yes | 11.50 | 1.00 | 4.00 | 1.00 | 1.50 | 4.00 |" in table
    assert "| edgeacc | poisson_8 | no | 15.00 | 1.00 | - | 10.00 | - | 4.00 |" in table


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
    stats.record_decode_step(DecodeStep(seconds=0.02, beside_prefill=True, parts={"pacing": 0.02}), requests=1,
                             context_tokens=5)
    stats.record_handoff(0.05, 40.0, 1, path={"forward": 0.04})
    seen = {}
    for family in registry.collect():
        labels = {name for sample in family.samples for name in sample.labels if name != "le"}
        seen[family.name] = (family.type, labels)
    assert seen == SERIES


def _exposition(registry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def test_each_part_of_the_prefill_path_is_timed_once_and_read_back_per_batch():
    from sglang_edgeacc.edge_acc_server.decode_side import prefill_path_parts
    from sglang_edgeacc.edge_acc_server.messages import PrefillResult, PrefillTimes
    from sglang_edgeacc.edge_acc_server.prefill_link import InflightPrefill

    stats, registry = _stats()
    # Two batches on one clock: scheduled, sent, taken, launched, done on the prefill side, taken back, merged.
    for offset in (0.0, 10.0):
        inflight = InflightPrefill(seq=1, batch=None, scheduled_at=offset + 1.000, sent_at=offset + 1.002)
        reply = PrefillResult(seq=1, next_token_ids=[5], logits_output=None, forward_ms=60.0,
                              times=PrefillTimes(taken_at=offset + 1.003, launched_at=offset + 1.007,
                                                 done_at=offset + 1.057))
        parts = prefill_path_parts(inflight, reply, taken_at=offset + 1.062, processed_at=offset + 1.064)
        assert parts == pytest.approx({"schedule": 0.002, "to_prefill_side": 0.001, "unpack": 0.004,
                                       "forward": 0.050, "to_decode_side": 0.005, "result": 0.002})
        # The parts add up to the batch's whole way, from scheduling to the merge.
        assert sum(parts.values()) == pytest.approx(0.064)
        stats.record_handoff(0.060, 60.0, 1, path=parts)
    means = gpu_share.mean_latencies(gpu_share.parse_counters(_exposition(registry)))
    assert means == pytest.approx({"prefill_path.schedule": 2.0, "prefill_path.to_prefill_side": 1.0,
                                   "prefill_path.unpack": 4.0, "prefill_path.forward": 50.0,
                                   "prefill_path.to_decode_side": 5.0, "prefill_path.result": 2.0})
    # A reply without times (an older prefill side, an error) still counts what the decode side saw.
    bare = PrefillResult(seq=1, next_token_ids=[], logits_output=None, forward_ms=0.0)
    assert set(prefill_path_parts(inflight, bare, 2.0, 2.5)) == {"schedule", "result"}


def test_upstreams_first_token_stages_are_read_from_its_histograms():
    text = """# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="m"} 1.5
sglang:time_to_first_token_seconds_count{model_name="m"} 10.0
# TYPE sglang:per_stage_req_latency_seconds histogram
sglang:per_stage_req_latency_seconds_sum{stage="prefill_forward",tp_rank="0"} 0.2
sglang:per_stage_req_latency_seconds_count{stage="prefill_forward",tp_rank="0"} 10.0
sglang:per_stage_req_latency_seconds_sum{stage="prefill_forward",tp_rank="1"} 0.2
sglang:per_stage_req_latency_seconds_count{stage="prefill_forward",tp_rank="1"} 10.0
# TYPE sglang:queue_time_seconds histogram
sglang:queue_time_seconds_sum{tp_rank="0"} 0.05
sglang:queue_time_seconds_count{tp_rank="0"} 10.0
sglang:per_stage_req_latency_seconds_sum{stage="decode_loop",tp_rank="0"} 9.0
sglang:per_stage_req_latency_seconds_count{stage="decode_loop",tp_rank="0"} 1.0
"""
    after = gpu_share.parse_counters(text)
    assert "stage.decode_loop_sum" not in after
    means = gpu_share.mean_latencies({k: v for k, v in after.items()})
    assert means == pytest.approx({"ttft": 150.0, "stage.prefill_forward": 20.0, "queue": 5.0})
