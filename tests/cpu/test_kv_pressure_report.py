"""The KV-pressure benchmark reads sglang's /metrics text: gauges per label set are summed, other series ignored."""

from __future__ import annotations

from benchmarks import kv_pressure

METRICS = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="tiny",tp_rank="0"} 5.0
sglang:num_running_reqs{engine_type="unified",model_name="tiny",tp_rank="1"} 3.0
sglang:num_queue_reqs{engine_type="unified",model_name="tiny",tp_rank="0"} 7.0
sglang:num_retracted_requests_total{engine_type="unified",model_name="tiny",tp_rank="0"} 2.0
sglang:num_retracted_requests_created{engine_type="unified",model_name="tiny",tp_rank="0"} 1.7e+09
sglang:num_running_reqs_offline_batch{engine_type="unified",model_name="tiny",tp_rank="0"} 9.0
"""


def test_running_queued_and_retracted_are_read_and_summed_over_ranks():
    assert kv_pressure.parse_metrics(METRICS) == {
        "sglang:num_running_reqs": 8.0, "sglang:num_queue_reqs": 7.0, "sglang:num_retracted_requests_total": 2.0}
