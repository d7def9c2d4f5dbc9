"""The serving benchmark's report merges runs made in separate device calls, workload by workload."""

from __future__ import annotations

import json
import os

import requests

from benchmarks import gpu_share, serving_vs_upstream
from tests.harness import SHARED_EDGE_ACC_LAUNCH


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


def test_slo_attainment_counts_the_first_token_and_the_worst_gap_of_each_request():
    details = {
        # prompt tokens: 500 (1 s budget), 2000 (2 s budget), 800, 800
        "input_lens": [500, 2000, 800, 800],
        "ttfts": [0.25, 1.5, 0.2, 0.0],  # the last request failed: no first token
        "itls": [[0.02, 0.05], [0.03], [0.02, 0.101], []],
    }
    got = serving_vs_upstream.slo_attainment(details)
    # 1: met, tight; 2: met (1.5 s <= 2 s), not tight; 3: a 101 ms gap; 4: failed.
    assert got["slo_attainment"] == 0.5 and got["tight_slo_attainment"] == 0.25
    assert got["p90_ttft_ms"] == 1500.0
    assert got["gap_over_slo_requests"] == 1 and got["gap_over_slo_first_only"] == 0  # request 3, its second gap


def test_requests_whose_only_long_gap_is_their_first_are_counted_apart():
    details = {"input_lens": [800] * 4, "ttfts": [0.1] * 4,
               "itls": [[0.12, 0.02], [0.12, 0.2], [0.02, 0.2], [0.02, 0.03]]}
    got = serving_vs_upstream.slo_attainment(details)
    assert got["gap_over_slo_requests"] == 3 and got["gap_over_slo_first_only"] == 1
    arms = {"edgeacc": {"workloads": {"poisson_8": {**got, "p90_ttft_ms": 100.0}}}}
    assert "| poisson_8 | edgeacc | 100 | 25% | 25% | 3 (1) |" in serving_vs_upstream.slo_table(arms)


def test_each_requests_first_gap_is_reported_apart_from_the_gaps_after_it():
    # Ten requests: first gaps of 10..100 ms; after them 99 gaps of 20 ms and one of 60 ms.
    details = {"itls": [[0.010 * (i + 1)] + [0.020] * 10 for i in range(10)] + [[]]}  # the last: one token only
    details["itls"][3][5] = 0.060
    got = serving_vs_upstream.gap_split(details)
    assert got["first_gap_p50_ms"] == 60.0 and got["first_gap_p90_ms"] == 100.0 and got["first_gap_max_ms"] == 100.0
    assert got["later_gap_p99_ms"] == 60.0  # the P99 of the 100 later gaps; a first gap would make it 90
    arms = {"control": {"workloads": {"poisson_8": got}}, "other": {"workloads": {"poisson_8": _result(1)}}}
    table = serving_vs_upstream.gap_table(arms)
    assert "| poisson_8 | control | 60.0 | 100.0 | 100.0 | 60.0 |" in table
    assert "| other |" not in table  # a result recorded without the split
    assert serving_vs_upstream.gap_table({"other": {"workloads": {"poisson_8": _result(1)}}}) == ""
    assert serving_vs_upstream.gap_split({"itls": [[], []]}) == {}


def test_the_goodput_rate_is_the_highest_poisson_rate_with_90_percent_met():
    def at(share):
        return {**_result(1000), "slo_attainment": share, "tight_slo_attainment": share / 2}

    arm = {"workloads": {"poisson_4": at(1.0), "poisson_8": at(0.95), "poisson_12": at(0.6),
                         "poisson_16": at(0.2), "steady": at(1.0)}}
    assert serving_vs_upstream.goodput_rate(arm) == 8.0
    assert serving_vs_upstream.goodput_rate(arm, "tight_slo_attainment") is None
    assert "| edgeacc | 8.0 | None |" in serving_vs_upstream.slo_table({"edgeacc": arm})


def test_one_token_answers_without_gaps_are_reported_not_called_errors():
    prefill_only = {"total_throughput": 16000.0, "median_ttft_ms": 90.0, "p99_ttft_ms": 300.0, "median_itl_ms": 0.0,
                    "p99_itl_ms": 0.0, "max_itl_ms": None}
    arms = {"upstream": {"workloads": {"prefill_only_8": prefill_only}},
            "edgeacc": {"workloads": {"prefill_only_8": dict(prefill_only, median_ttft_ms=99.0)}}}
    table = serving_vs_upstream.ratio_table(arms)
    assert "| edgeacc | 16000 | 99 | 300 | 0.0 | 0.0 | - | 1.00x, 1.10x, -, - |" in table, table


def test_attainment_curves_list_every_rate_in_order_and_compare_with_the_best_upstream_arm():
    def at(share, tight):
        return {**_result(1000), "slo_attainment": share, "tight_slo_attainment": tight}

    arms = {
        "upstream": {"workloads": {"poisson_2": at(0.8, 0.5), "poisson_4": at(0.5, 0.2)}},
        "upstream-mixed-c2048": {"workloads": {"poisson_2": at(1.0, 0.95), "poisson_4": at(0.7, 0.6)}},
        "edgeacc": {"workloads": {"poisson_4": at(1.0, 1.0), "poisson_8": at(1.0, 0.92),
                                  "poisson_16": at(0.97, 0.5)}},
    }
    curves = serving_vs_upstream.attainment_curves(arms)
    assert "| arm (SLO met / tight SLO met) | 2 req/s | 4 req/s | 8 req/s | 16 req/s |" in curves, curves
    assert "| upstream | 80% / 50% | 50% / 20% | - | - |" in curves
    assert "| edgeacc | - | 100% / 100% | 100% / 92% | 97% / 50% |" in curves
    # upstream's best arm at the tight SLO is the mixed-chunk one (2 req/s); EdgeAcc holds it to 8.
    assert "tight-SLO goodput: edgeacc 8.0 req/s, best upstream (upstream-mixed-c2048) 2.0 req/s: 4.00x" in curves
    assert "tight-SLO goodput" in serving_vs_upstream.report_from_arms(arms)
    # Between the swept rates: EdgeAcc 8 + 8 * 0.02 / 0.42, mixed chunk 2 + 2 * 0.05 / 0.35.
    assert ("where the curves cross 90 %: edgeacc about 8.4 req/s, best upstream (upstream-mixed-c2048) "
            "about 2.3 req/s: 3.67x") in curves, curves


def test_a_curve_that_meets_the_sweeps_top_crosses_above_it():
    def at(tight):
        return {**_result(1000), "slo_attainment": 1.0, "tight_slo_attainment": tight}

    edgeacc = {"workloads": {"poisson_2": at(1.0), "poisson_4": at(0.95)}}
    assert serving_vs_upstream.goodput_crossing(edgeacc, "tight_slo_attainment") == (4.0, False)
    assert serving_vs_upstream.goodput_crossing({"workloads": {"poisson_2": at(0.5)}}, "tight_slo_attainment") is None
    arms = {"upstream": {"workloads": {"poisson_2": at(1.0), "poisson_4": at(0.4)}}, "edgeacc": edgeacc}
    assert ("edgeacc at least 4 req/s (the sweep's top), best upstream (upstream) about 2.3 req/s: at least 1.71x"
            in serving_vs_upstream.attainment_curves(arms))


def test_the_tight_slo_comparison_says_when_no_upstream_arm_meets_it_anywhere_on_the_sweep():
    def at(tight):
        return {**_result(1000), "slo_attainment": 1.0, "tight_slo_attainment": tight}

    arms = {"upstream": {"workloads": {"poisson_2": at(0.5)}},
            "edgeacc": {"workloads": {"poisson_2": at(1.0)}}}
    assert "upstream below 2 req/s on every arm" in serving_vs_upstream.attainment_curves(arms)


def test_an_arm_that_would_not_end_in_the_time_left_is_not_started():
    workloads = {w: serving_vs_upstream.WORKLOADS[w] for w in ("poisson_2", "poisson_4", "poisson_8")}
    # 160 s start + 10 s fingerprint + 5 s warm-up + (24 + 15) + (24 + 15) + (12 + 15) s of workloads
    assert serving_vs_upstream.arm_estimate_s(workloads, 160.0) == 280.0
    assert serving_vs_upstream.skip_reason("edgeacc", workloads, left_s=None, start_s=160.0) is None
    assert serving_vs_upstream.skip_reason("edgeacc", workloads, left_s=300.0, start_s=160.0) is None
    reason = serving_vs_upstream.skip_reason("edgeacc", workloads, left_s=200.0, start_s=160.0)
    assert reason.startswith("edgeacc: not started: 200 s left") and "about 280 s" in reason, reason
    steady = {"steady": serving_vs_upstream.WORKLOADS["steady"]}  # a closed loop: its length is a guess
    assert serving_vs_upstream.arm_estimate_s(steady, 100.0) == 205.0


def test_an_edge_acc_arm_with_several_targets_needs_its_workloads_once_per_target():
    workloads = {w: serving_vs_upstream.WORKLOADS[w] for w in ("poisson_2", "poisson_4", "poisson_8")}
    # One start, fingerprint and warm-up; 105 s of workloads at each of three targets.
    assert serving_vs_upstream.arm_estimate_s(workloads, 160.0, passes=3) == 490.0
    assert serving_vs_upstream.skip_reason("edgeacc", workloads, left_s=400.0, start_s=160.0, passes=3)
    assert serving_vs_upstream.skip_reason("edgeacc", workloads, left_s=400.0, start_s=160.0) is None


def test_a_targets_workloads_are_an_arm_of_the_report_named_after_it():
    assert serving_vs_upstream.launch_target_ms("edgeacc") == 50.0
    assert serving_vs_upstream.launch_target_ms("edgeacc-itl-75") == 75.0
    assert serving_vs_upstream.target_label("edgeacc", 50.0) == "edgeacc"
    assert serving_vs_upstream.target_label("edgeacc", 100.0) == "edgeacc@itl-100"
    assert serving_vs_upstream.target_label("edgeacc", 67.5) == "edgeacc@itl-67.5"
    entry = {"started_s": 120.0, "fingerprint": {"lone": [1]}, "workloads": {"poisson_8": _result(1.0)},
             "targets": {"edgeacc@itl-100": {"itl_slo_ms": 100.0, "workloads": {"poisson_8": _result(2.0)}}}}
    arms = serving_vs_upstream.report_arms("edgeacc", entry)
    assert arms["edgeacc"] == {"started_s": 120.0, "fingerprint": {"lone": [1]},
                               "workloads": {"poisson_8": _result(1.0)}}
    assert arms["edgeacc@itl-100"] == {"started_s": 120.0, "fingerprint": {"lone": [1]}, "itl_slo_ms": 100.0,
                                       "workloads": {"poisson_8": _result(2.0)}, "same_server_as": "edgeacc"}
    assert "| edgeacc@itl-100 | 2 |" in serving_vs_upstream.ratio_table(arms)
    said = serving_vs_upstream.outputs_table({"upstream": {"fingerprint": {"lone": [1]}, "started_s": 60.0}, **arms})
    assert "- edgeacc: greedy outputs equal upstream" in said
    assert "edgeacc@itl-100: greedy" not in said and "- edgeacc@itl-100: the same servers at other targets" in said


def test_a_run_out_of_time_says_which_arms_it_did_not_start_and_fails(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = serving_vs_upstream.main(["--platform", "cpu", "--dry-run", "--arms", "upstream,edgeacc",
                                     "--workloads", "poisson_2", "--time-limit-s", "5", "--out", str(out),
                                     "--workdir", str(tmp_path)])
    assert code == 1
    arms = json.loads(out.read_text())["arms"]
    assert set(arms) == {"upstream", "edgeacc"} and all("not_started" in entry for entry in arms.values())
    said = capsys.readouterr().out
    assert "[bench] upstream: not started: 5 s left" in said
    assert said.rstrip().endswith(serving_vs_upstream.report_from_arms(arms).rstrip())  # the run ends with its report


def test_the_warm_up_runs_its_requests_together_through_every_batch_size(cpu_servers):
    """On the real EdgeAcc server: each answer as long as asked, all decoded in one shrinking batch."""
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    before = gpu_share.scrape(server.url)
    lengths = serving_vs_upstream.warm_batch_sizes(server, batch=6, vocab=500)
    after = gpu_share.scrape(server.url)
    assert lengths == [2, 3, 4, 5, 6, 7]

    def delta(name):
        return sum(after.get(k, 0.0) - before.get(k, 0.0) for k in after if k.split(".")[0] == name)

    steps, requests = delta("decode_steps"), delta("decode_step_requests")
    # The first token of each comes from the prefill, then one batch decodes from 6 requests down to 1;
    # the counters time a step against the one before, so the first is not counted: 5 + 4 + 3 + 2 + 1.
    # One request at a time would be 15 steps of one request. (A scheduler that found the requests in two
    # prefill batches would still decode most of them together.)
    assert requests >= 15 and requests / steps >= 2.0, (steps, requests)


def test_the_benchmark_moves_a_running_server_to_another_target_on_an_empty_prefix_cache(cpu_servers):
    """On the real EdgeAcc server, through upstream's endpoints: the target the server then says, no cached prompt."""
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    prompt = "the same prompt twice " * 20
    server.generate(prompt, max_new_tokens=2)
    assert server.generate(prompt, max_new_tokens=2)["meta_info"]["cached_tokens"] > 0
    try:
        serving_vs_upstream.retarget(server, 100.0)
        (state,) = requests.get(f"{server.url}/get_server_info", timeout=30).json()["internal_states"]
        assert state["edge_acc"]["decode_pacing"] == {"itl_slo_ms": 100.0, "aimed_gap_ms": {"prompts_waiting": 90.0, "none_waiting": 45.0}}
        assert server.generate(prompt, max_new_tokens=2)["meta_info"]["cached_tokens"] == 0
    finally:
        serving_vs_upstream.retarget(server, 50.0)  # the shared server's default, for the tests after this one


def test_an_arm_of_another_build_runs_that_build_and_says_which(tmp_path, monkeypatch):
    import shutil
    import subprocess

    root = serving_vs_upstream.ROOT
    label = f"test-{os.getpid()}"
    arm = f"edgeacc+{label}"
    # Not exported yet: refused before any server starts, naming the script that exports it.
    assert f"ab-source.sh REV {label}" in serving_vs_upstream.arm_problem(arm)
    assert "no arm 'edgeac'" in serving_vs_upstream.arm_problem("edgeac+x")
    export = subprocess.run([str(root / "scripts/gpu-host/ab-source.sh"), "HEAD", label], capture_output=True,
                            text=True, timeout=120)
    try:
        assert export.returncode == 0, export.stderr
        assert serving_vs_upstream.arm_problem(arm) is None
        assert serving_vs_upstream.is_edge_acc(arm) and serving_vs_upstream.launch_target_ms(arm) == 50.0
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        assert serving_vs_upstream.arm_revision(arm) == head.strip()
        # A real interpreter with the environment each arm's server gets.
        where = {name: serving_vs_upstream.plugin_imported_from(name) for name in ("edgeacc", arm)}
        assert where[arm].is_relative_to((root / ".ab" / label).resolve()), where
        assert not where["edgeacc"].is_relative_to((root / ".ab").resolve()), where
        # Where something comes before the export on PYTHONPATH the arm is refused before any server starts.
        monkeypatch.setattr(serving_vs_upstream, "arm_env", lambda name: {})
        entry = serving_vs_upstream.run_arm(arm, "cpu", "unused", True, {}, tmp_path, 500)
        assert "would import the plugin from" in entry["error"] and "started_s" not in entry, entry
        assert entry["build"]["revision"] == head.strip(), entry
    finally:
        shutil.rmtree(root / ".ab" / label, ignore_errors=True)


def test_an_arm_of_an_unknown_build_is_refused_at_the_command_line(capsys):
    import pytest

    with pytest.raises(SystemExit):
        serving_vs_upstream.main(["--arms", "upstream,edgeacc+never-exported", "--platform", "cpu", "--dry-run"])
    assert "scripts/gpu-host/ab-source.sh REV never-exported" in capsys.readouterr().err


def test_two_arms_on_the_same_requests_are_compared_request_by_request():
    from benchmarks import paired

    got = paired.paired_first_tokens([100.0, 100.0, 100.0, 100.0], [90.0, 95.0, 110.0, 90.0])
    assert got.requests == 4 and got.earlier_share == 0.75
    assert got.mean_diff_ms == -3.75 and got.median_ratio == 0.925
    assert got.median_ratio_low <= 0.925 <= got.median_ratio_high
    # The same shift on every request: every resampled set gives the same ratio.
    even = paired.paired_first_tokens([80.0, 100.0, 120.0], [72.0, 90.0, 108.0])
    assert even.median_ratio_low == even.median_ratio == even.median_ratio_high == 0.9
    # A request that failed in either arm (no first token) is left out of the pairs.
    assert paired.paired_first_tokens([100.0, 0.0], [90.0, 50.0]).requests == 1
    assert paired.paired_first_tokens([100.0], [90.0, 80.0]) is None


def test_the_report_pairs_each_arm_with_the_first_only_where_their_requests_match():
    from benchmarks import paired

    def run(ttfts, lens):
        return {**_result(8000), "ttfts_ms": ttfts, "input_lens": lens}

    arms = {"edgeacc+base": {"workloads": {"poisson_4": run([100.0, 120.0], [1024, 2048])}},
            "edgeacc": {"workloads": {"poisson_4": run([90.0, 110.0], [1024, 2048])}},
            "edgeacc+old": {"workloads": {"poisson_4": run([80.0, 100.0], [2048, 1024])}}}
    table = paired.paired_table(arms)
    assert "| poisson_4 | edgeacc | edgeacc+base | 2 | 100% | -10.0 |" in table
    assert "poisson_4: edgeacc+old and edgeacc+base were not given the same requests" in table
    assert "| poisson_4 | edgeacc+old |" not in table
    failed = {"a": {"workloads": {"w": run([30.0], [8])}}, "b": {"workloads": {"w": run([0.0], [8])}}}
    assert paired.paired_table(failed) == "- w: no request had a first token from both b and a"
    assert table in serving_vs_upstream.report_from_arms(arms)
    # Without per-request results (runs recorded before them) there is nothing to pair.
    assert paired.paired_table({"a": {"workloads": {"w": _result(1)}}, "b": {"workloads": {"w": _result(1)}}}) == ""


def test_each_requests_first_token_is_kept_from_bench_servings_details():
    from benchmarks import paired

    details = {"ttfts": [0.0734, 0.0], "input_lens": [2048, 1024], "itls": [[0.01], []]}
    assert paired.request_details(details) == {"ttfts_ms": [73.4, 0.0], "input_lens": [2048, 1024]}
    assert paired.request_details({}) == {}
