"""The serving benchmark's report merges runs made in separate device calls, workload by workload."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import serving_vs_upstream  # noqa: E402


def _result(tok_s: float) -> dict:
    return {"total_throughput": tok_s, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0, "median_itl_ms": 10.0,
            "p99_itl_ms": 20.0, "max_itl_ms": 30.0}


def test_an_arm_measured_on_different_workloads_in_two_runs_keeps_both():
    closed = {"arms": {"upstream": {"started_s": 120.0, "workloads": {"burst": _result(26000)}},
                       "edgeacc": {"started_s": 110.0, "workloads": {"burst": _result(26100)}}}}
    open_loop = {"arms": {"upstream": {"started_s": 105.0, "workloads": {"open_4": _result(8000)}}}}
    arms = serving_vs_upstream.merge_runs([closed, open_loop])
    assert set(arms["upstream"]["workloads"]) == {"burst", "open_4"}
    assert arms["upstream"]["started_s"] == 120.0
    table = serving_vs_upstream.ratio_table(arms)
    assert "| edgeacc | 26100 |" in table and "| upstream | 8000 |" in table


def test_a_later_run_of_the_same_workload_wins():
    first = {"arms": {"upstream": {"workloads": {"burst": _result(25000)}}}}
    second = {"arms": {"upstream": {"workloads": {"burst": _result(27000)}}}}
    arms = serving_vs_upstream.merge_runs([first, second])
    assert arms["upstream"]["workloads"]["burst"]["total_throughput"] == 27000
