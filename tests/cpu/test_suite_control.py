"""The control of the GPU suite's torch.compile family, on the results of its run on an H100.

With every server on the first plain server's compiled kernels, a second plain server answered the
token workload exactly as the first did except for the concurrent burst, and EdgeAcc did not: its
streamed answer parted at the 10th token and its logprobs moved by up to 3.5e-3 (the token
comparison's tolerance is 2e-3). What a second plain server repeats, EdgeAcc must repeat
(``control_compare``); a plain server of other flags is compared with both and not judged
(``diagnose``). The recorded results are the real server's (``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib

import pytest

from tests.gpu import server_suite

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/results/server_suite_h100_torch_compile.json"
FAMILY = "tiny-torch-compile"


@pytest.fixture
def recorded() -> dict:
    results = json.loads(RESULTS.read_text())["results"]
    for entry in results[FAMILY]["arms"].values():  # judged again by each test
        for key in ("passed", "mismatches", "tolerance", "differs_from"):
            entry.pop(key, None)
    return results


def _arms(results: dict) -> dict:
    return results[FAMILY]["arms"]


def _edge_with_plain_topk(results: dict) -> None:
    """EdgeAcc's top-k runs replaced by plain's, so that only the control can fail it."""
    _arms(results)["edge-mps"]["result"]["topk"] = copy.deepcopy(_arms(results)["plain"]["result"]["topk"])


def test_edgeacc_differs_where_a_second_plain_server_repeated_plain(recorded):
    _edge_with_plain_topk(recorded)
    server_suite.judge(recorded)
    edge = _arms(recorded)["edge-mps"]
    assert not edge["passed"]
    assert sorted(m.split(":")[0] for m in edge["mismatches"]) == ["logprob_values", "stream_final"]
    assert _arms(recorded)["plain-again"]["passed"]


def test_edgeacc_repeating_plain_passes(recorded):
    arms = _arms(recorded)
    edge = arms["edge-mps"]["result"]
    for key, value in arms["plain"]["result"].items():
        if key not in ("burst", "burst_solo"):  # EdgeAcc's own scheduling, kept as recorded
            edge[key] = copy.deepcopy(value)
    server_suite.judge(recorded)
    assert arms["edge-mps"]["mismatches"] == []
    assert arms["edge-mps"]["passed"]


def test_a_burst_that_follows_edgeacc_scheduling_is_not_held_against_it(recorded):
    # Recorded: EdgeAcc's burst differs from plain's, which the second plain server repeated.
    arms = _arms(recorded)
    assert arms["plain-again"]["result"]["burst"] == arms["plain"]["result"]["burst"]
    assert arms["edge-mps"]["result"]["burst"] != arms["plain"]["result"]["burst"]
    plain, again, edge = (arms[a]["result"] for a in ("plain", "plain-again", "edge-mps"))
    assert not any(m.startswith("burst") for m in server_suite.control_compare(plain, again, edge))


def test_what_the_second_plain_server_did_not_repeat_is_not_controlled(recorded):
    arms = _arms(recorded)
    plain, again, edge = (arms[a]["result"] for a in ("plain", "plain-again", "edge-mps"))
    again["stream_final"] = list(edge["stream_final"])
    again["logprob_values"] = [v + 0.01 for v in plain["logprob_values"]]
    assert server_suite.control_compare(plain, again, edge) == []


def test_logprob_values_within_the_token_tolerance_are_the_same(recorded):
    arms = _arms(recorded)
    plain, again, edge = (arms[a]["result"] for a in ("plain", "plain-again", "edge-mps"))
    edge["stream_final"] = list(plain["stream_final"])
    edge["logprob_values"] = [v + server_suite.LOGPROB_TOLERANCE / 2 for v in plain["logprob_values"]]
    assert server_suite.control_compare(plain, again, edge) == []
    edge["logprob_values"][3] += server_suite.LOGPROB_TOLERANCE
    assert [m.split(":")[0] for m in server_suite.control_compare(plain, again, edge)] == ["logprob_values"]


def test_the_diagnostic_plain_server_is_compared_with_plain_and_edgeacc_not_judged(recorded):
    arms = _arms(recorded)
    diagnostic = copy.deepcopy(arms["edge-mps"])
    diagnostic.pop("mismatches", None)
    arms["plain-no-prefill-graph"] = diagnostic  # as if it computed what EdgeAcc's decode side computes
    server_suite.judge(recorded)
    assert diagnostic["passed"]  # its own self-checks only
    assert diagnostic["differs_from"] == {"plain": ["logprob_values", "stream_final"], "edge-mps": []}
    lines = server_suite.summary_lines(recorded)
    assert "     differs from plain in: logprob_values, stream_final" in lines
    assert "     differs from edge-mps in: nothing" in lines


def test_the_family_runs_the_diagnostic_plain_server_with_an_upstream_flag():
    from sglang.srt.server_args import ServerArgs

    family = server_suite.families("cuda")[FAMILY]
    assert family["arms"] == ("plain-again", "plain-no-prefill-graph", "plain-mps", "edge-mps", "edge-no-mps",
                              "edge-no-prefill-graph")
    flags = server_suite.PLAIN_VARIANTS["plain-no-prefill-graph"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", *family["args"], *flags])
    assert ns.disable_prefill_cuda_graph and ns.enable_torch_compile
    # A plain server: no MPS client environment, judged by its self-checks only.
    assert server_suite._arm_env("plain-no-prefill-graph", "cuda") == {}
    assert "plain-no-prefill-graph" in server_suite.DIAGNOSTIC_ARMS


def test_one_plain_arm_is_an_mps_client_and_one_edgeacc_arm_is_not(monkeypatch):
    monkeypatch.setenv("EDGEACC_SUITE_MPS_PIPE", "/tmp/edgeacc-test-pipe")
    clients = {arm for arm in server_suite.families("cuda")[FAMILY]["arms"]
               if server_suite._arm_env(arm, "cuda").get("CUDA_MPS_PIPE_DIRECTORY") == "/tmp/edgeacc-test-pipe"}
    assert clients == {"plain-mps", "edge-mps", "edge-no-prefill-graph"}
    assert server_suite._arm_env("plain", "cuda") == {}
    assert server_suite._arm_env("edge", "cuda")  # the fault run's EdgeAcc server
    assert "plain-mps" in server_suite.DIAGNOSTIC_ARMS and "edge-no-mps" not in server_suite.PLAIN_ARMS


def test_the_deterministic_compile_family_runs_every_server_without_on_device_tuning_and_judges_tokens():
    fams = server_suite.families("cuda")
    family = fams["tiny-torch-compile-deterministic"]
    assert family["args"] == fams[FAMILY]["args"] and family["compiled_by"] == "plain" and family["by_name"]
    assert family.get("oracle", "tokens") == "tokens"
    assert "tiny-torch-compile-deterministic" not in server_suite.families("cpu")
    for arm in ("plain", *family["arms"]):
        env = server_suite.server_env(arm, "cuda", family, {"TORCHINDUCTOR_CACHE_DIR": "/c"})
        assert env["TORCHINDUCTOR_DETERMINISTIC"] == "1" and env["TORCHINDUCTOR_CACHE_DIR"] == "/c"
    # The other compile family keeps inductor's tuning.
    assert "TORCHINDUCTOR_DETERMINISTIC" not in server_suite.server_env("edge-mps", "cuda", fams[FAMILY], {})


def test_the_deterministic_family_runs_a_second_edgeacc_server_as_the_first(monkeypatch):
    # Under the mode plain answers bit for bit as a second plain server; whether EdgeAcc answers as itself
    # takes a second EdgeAcc server of the same flags and environment.
    monkeypatch.setenv("EDGEACC_SUITE_MPS_PIPE", "/tmp/edgeacc-test-pipe")
    family = server_suite.families("cuda")["tiny-torch-compile-deterministic"]
    assert {"plain-again", "edge-mps", "edge-again"} <= set(family["arms"])
    assert server_suite.ARM_FLAGS["edge-again"] == server_suite.ARM_FLAGS["edge-mps"]
    assert server_suite.server_env("edge-again", "cuda", family, {}) == \
        server_suite.server_env("edge-mps", "cuda", family, {})


def test_the_deterministic_family_is_refused_by_name_on_a_torch_without_the_mode(monkeypatch, capsys):
    family = server_suite.families("cuda")["tiny-torch-compile-deterministic"]
    monkeypatch.setattr(server_suite, "inductor_has_deterministic_mode", lambda: False)
    monkeypatch.setattr(server_suite, "families", lambda platform: {"tiny-torch-compile-deterministic": family})
    with pytest.raises(SystemExit):
        server_suite.main(["--platform", "cpu", "--families", "tiny-torch-compile-deterministic"])
    err = capsys.readouterr().err
    assert "tiny-torch-compile-deterministic" in err and "TORCHINDUCTOR_DETERMINISTIC" in err


# A kernel of a server of the deterministic family on an H100 (torch 2.11, TORCH_LOGS=output_code): compiled
# without the mode although TORCHINDUCTOR_DETERMINISTIC=1 was in that server's environment.
KERNEL_LINE = (
    '[rank0]:V1206 13:40:00.320000 2500 torch/_inductor/graph.py:2552] [3/0] [__output_code]     inductor'
    "_meta={'grid_type': 'Grid1D', 'autotune_hints': set(), 'kernel_name': 'triton_poi_fused_embedding_0'"
    ", 'mutated_arg_names': [], 'optimize_mem': True, 'no_x_dim': False, 'atomic_add_found': False, 'num_"
    "load': 1, 'num_store': 1, 'num_reduction': 0, 'backend_hash': '91D1D1166449D9E2EB66EB9770C9E2C3B0FEB"
    "787341F27FEB4D3F0338DA50336', 'assert_indirect_indexing': True, 'autotune_local_cache': True, 'autot"
    "une_pointwise': True, 'autotune_remote_cache': None, 'force_disable_caches': True, 'dynamic_scale_rb"
    "lock': True, 'max_autotune': True, 'max_autotune_pointwise': False, 'min_split_scan_rblock': 256, 's"
    "pill_threshold': 16, 'store_cubin': False, 'deterministic': False, 'force_filter_reduction_configs':"
    " False, 'mix_order_reduction_allow_multi_stages': False, 'are_deterministic_algorithms_enabled': Fal"
    "se, 'coordinate_descent_tuning': True, 'coordinate_descent_search_radius': 1, 'coordinate_descent_ch"
    "eck_all_directions': False, 'tiling_scores': {'x': 1024}},"
)


def test_the_deterministic_family_reads_from_each_servers_kernels_whether_the_mode_was_in_effect():
    off = "\n".join(["[suite] started", KERNEL_LINE, KERNEL_LINE.replace("embedding_0", "embedding_1")])
    assert server_suite.deterministic_mode_in_log(off) is False
    on = off.replace("'deterministic': False", "'deterministic': True")
    assert server_suite.deterministic_mode_in_log(on) is True
    assert server_suite.deterministic_mode_in_log(on + "\n" + KERNEL_LINE) is False  # one kernel without it
    assert server_suite.deterministic_mode_in_log("no generated code in this log") is None


def test_where_tokens_are_the_oracle_a_second_plain_server_must_answer_as_the_first(recorded):
    plain = recorded[FAMILY]["arms"]["plain"]["result"]
    again = copy.deepcopy(plain)
    results = {"f": {"oracle": "tokens", "tie_step": 0.0, "arms": {
        "plain": {"result": plain}, "plain-again": {"result": again}, "edge-mps": {"result": copy.deepcopy(plain)}}}}
    server_suite.judge(results)
    assert results["f"]["arms"]["plain-again"]["passed"] and results["f"]["arms"]["edge-mps"]["passed"]
    again["solo_short"] = list(reversed(again["solo_short"]))
    server_suite.judge(results)
    entry = results["f"]["arms"]["plain-again"]
    assert not entry["passed"] and any("solo_short" in m for m in entry["mismatches"]), entry["mismatches"]
    # Under the top-k oracle the second plain server sets the tolerance and is not judged against plain.
    results["f"]["oracle"] = "topk"
    server_suite.judge(results)
    assert results["f"]["arms"]["plain-again"]["passed"]


def test_the_compile_family_at_the_reference_deployments_batch_sizes_is_picked_by_name_and_parses():
    from sglang.srt.server_args import ServerArgs

    fams = server_suite.families("cuda")
    family = fams["tiny-torch-compile-bs64"]
    assert family["by_name"] and family["oracle"] == "topk" and family["compiled_by"] == "plain"
    assert family["arms"] == ("plain-again", "edge-mps")  # the second plain server sets the oracle's tolerance
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", *family["args"]])
    assert ns.enable_torch_compile and ns.torch_compile_max_bs == 64 and ns.max_running_requests >= 64
    assert "tiny-torch-compile-bs64" not in server_suite.families("cpu")
