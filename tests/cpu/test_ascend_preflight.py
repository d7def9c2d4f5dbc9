"""The preflight checks on launch commands read by the tolerant parser (no sglang needed).

The field report (docs/ascend.md, section 1): two Atlas
800I A2 hosts, DeepSeek-V3.2 W8A8 without MTP weights, NEXTN 2/1/3,
SGLANG_ENABLE_SPEC_V2=1, ant-moving 8 x 512, `--cuda-graph-bs 4 8`; it hung at
"Capturing batches" and then died in aclnnDispatchNormalA2. The report does not
say what HCCL_BUFFSIZE it started from; 400 MB is what the public doc formula
gives for ant-moving 8 x 512 (2 x (106 MB + 512 x 3 x 7168 x 8 B) + 20 MB), so
that is the value used here.
"""

from __future__ import annotations

import os

import pytest

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.dispatch_inputs import ModelShape
from sglang_edgeacc.ascend.launch_settings import LaunchArgumentsError, parse_tolerant
from sglang_edgeacc.ascend.preflight_checks import run_preflight
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, WARN

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "ascend")
MB = 1024 * 1024


def ckpt(name):
    return os.path.join(FIXTURES, name)


TWO_A2_NODES = [
    "--device", "npu", "--tp", "16", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:5000",
    "--attention-backend", "ascend", "--quantization", "modelslim", "--trust-remote-code",
    "--moe-a2a-backend", "deepep", "--deepep-mode", "auto", "--cuda-graph-bs", "4", "8",
]  # fmt: skip
NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
CLUSTER_ENV = {
    "SGLANG_EDGEACC_ASCEND_HARDWARE": "a2",
    "HCCL_INTRA_PCIE_ENABLE": "1",
    "HCCL_INTRA_ROCE_ENABLE": "0",
    "HCCL_SOCKET_IFNAME": "enp189s0f0",
    "GLOO_SOCKET_IFNAME": "enp189s0f0",
}
SEED_ENV = {
    **CLUSTER_ENV,
    "HCCL_BUFFSIZE": "400",
    "SGLANG_ENABLE_SPEC_V2": "1",
    "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "1",
    "DEEPEP_NORMAL_LONG_SEQ_ROUND": "8",
    "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512",
}
FIXED_ENV = {**CLUSTER_ENV, "HCCL_BUFFSIZE": "1500"}


def preflight(args, env, model="dsv32_w8a8_no_mtp"):
    settings = parse_tolerant(["--model-path", ckpt(model), *args])
    return run_preflight(settings, env, probe=lambda: None)


def failing(report):
    return {c.id for c in report.failures}


# ----------------------------------------------------------------- the seed


def test_seed_scenario_fails_naming_both_root_causes():
    report = preflight([*TWO_A2_NODES, *NEXTN], SEED_ENV)
    assert not report.ok
    assert failing(report) == {"speculative-mtp", "hccl-buffer", "ant-moving"}
    mtp = report.by_id("speculative-mtp")
    assert "model.layers.61." in mtp.message and "--speculative-algorithm" in mtp.fix
    ant = report.by_id("ant-moving")
    assert "two-node" in ant.message and "aclnnDispatchNormalA2" in ant.message
    assert ant.fix == "unset DEEPEP_NORMAL_LONG_SEQ_ROUND DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS"
    buf = report.by_id("hccl-buffer")
    # auto: the larger of normal (A2 layered, 8192/16 = 512 tokens per rank) and low-latency (layered, N=128)
    normal = 2 * 512 * (7168 * 2 + 4 * 8 * 4) + 1204 * MB
    low_latency = 256 * 128 * (7168 * 2 + 4 * 8 * 4) + 804 * MB
    needed = -(-max(normal, low_latency) // MB)
    assert needed == 1256
    assert f"below the {needed} MB" in buf.message
    assert buf.fix == f"export HCCL_BUFFSIZE={needed + 200}"
    # the leftover spec variables are fine while speculative flags are present
    assert report.by_id("speculative-env").status == PASS


def test_seed_fixed_configuration_passes_buffer_and_mtp():
    report = preflight(TWO_A2_NODES, FIXED_ENV)
    assert report.by_id("hccl-buffer").status == PASS
    assert report.by_id("speculative-mtp").status == PASS
    assert report.by_id("ant-moving").status == PASS
    assert report.ok, report.render()


def test_seed_half_fixed_still_fails_on_the_remaining_cause():
    # MTP flags removed but the buffer left small and ant-moving on: the second root cause alone
    env = {k: v for k, v in SEED_ENV.items() if not k.startswith("SGLANG_ENABLE")}
    assert failing(preflight(TWO_A2_NODES, env)) == {"hccl-buffer", "ant-moving"}
    # buffer raised, ant-moving still on: still refused (the layered kernel has no ant-moving)
    env["HCCL_BUFFSIZE"] = "1500"
    assert failing(preflight(TWO_A2_NODES, env)) == {"ant-moving"}


# ----------------------------------------------------------------- HCCL buffer


def test_deepep_buffsize_takes_precedence():
    env = {**FIXED_ENV, "DEEPEP_HCCL_BUFFSIZE": "600"}
    check = preflight(TWO_A2_NODES, env).by_id("hccl-buffer")
    assert check.status == FAIL and check.fix.startswith("export DEEPEP_HCCL_BUFFSIZE=")


def test_unset_buffer_is_auto_sized_on_npu():
    env = {k: v for k, v in FIXED_ENV.items() if k != "HCCL_BUFFSIZE"}
    report = preflight(TWO_A2_NODES, env)
    assert report.by_id("hccl-buffer").status == PASS
    assert report.auto_sizing is not None
    assert (report.auto_sizing.variable, report.auto_sizing.required_mb, report.auto_sizing.mb) == ("DEEPEP_HCCL_BUFFSIZE", 1256, 1456)
    assert "margin 200 MB" in report.auto_sizing.derivation


def test_unset_buffer_without_device_npu_is_a_failure():
    args = [a for a in TWO_A2_NODES if a not in ("--device", "npu")]
    env = {k: v for k, v in FIXED_ENV.items() if k != "HCCL_BUFFSIZE"}
    report = preflight(args, env)
    assert report.by_id("hccl-buffer").status == FAIL and report.auto_sizing is None
    assert report.by_id("device").status == WARN


def test_deepep_mode_picks_the_requirement():
    env = {**FIXED_ENV, "HCCL_BUFFSIZE": "1230"}  # between normal (1219) and low-latency (1256)
    base = [a for a in TWO_A2_NODES]
    i = base.index("auto")
    normal_only = base[:i] + ["normal"] + base[i + 1:]
    ll_only = base[:i] + ["low_latency"] + base[i + 1:]
    assert preflight(normal_only, env).by_id("hccl-buffer").status == PASS
    assert preflight(ll_only, env).by_id("hccl-buffer").status == FAIL
    assert preflight(base, env).by_id("hccl-buffer").status == FAIL


def test_a3_single_node_with_ant_moving_and_int8_dispatch():
    args = ["--device", "npu", "--tp", "16", "--moe-a2a-backend", "deepep", "--deepep-mode", "normal",
            "--chunked-prefill-size", "65536", "--max-prefill-tokens", "65536"]  # fmt: skip
    env = {"SGLANG_EDGEACC_ASCEND_HARDWARE": "a3", "HCCL_BUFFSIZE": "600"}
    report = preflight(args, env, "dsv32_w8a8_mtp")
    # 65536 / 16 = 4096 tokens per rank fit one default 8192 round: maxBs 4096, no ant-moving
    assert report.by_id("ant-moving").status == PASS
    assert report.by_id("hccl-buffer").status == FAIL
    assert f"below the {hb.normal_requirement('a3', ModelShape(7168, 8, 256), 16, 4096).required_mb} MB" in report.by_id("hccl-buffer").message
    env.update({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "8", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512"})
    report = preflight(args, env, "dsv32_w8a8_mtp")
    assert report.by_id("ant-moving").status == PASS
    assert report.by_id("hccl-buffer").status == PASS  # 552 MB with 8 x 512


# ----------------------------------------------------------------- ant-moving


@pytest.mark.parametrize(
    "ant, status, text",
    [
        ({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "8"}, FAIL, "set together"),
        ({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "300", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512"}, FAIL, "[1, 256]"),
        ({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "32", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "8192"}, FAIL, "131072"),
        ({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "2", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512"}, FAIL, "exceed ROUND x PER_ROUND_TOKENS = 1024"),
        ({"DEEPEP_NORMAL_LONG_SEQ_ROUND": "4", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512"}, PASS, "2048 >= 2048"),
        ({}, PASS, "fit one 8192-token round"),
    ],
)
def test_ant_moving_rules_on_one_a2_node(ant, status, text):
    args = ["--device", "npu", "--tp", "8", "--moe-a2a-backend", "deepep", "--deepep-mode", "normal",
            "--chunked-prefill-size", "16384"]  # fmt: skip  (16384 / 8 ranks = 2048 tokens per rank)
    check = preflight(args, {"SGLANG_EDGEACC_ASCEND_HARDWARE": "a2", "HCCL_BUFFSIZE": "5000", **ant}).by_id("ant-moving")
    assert check.status == status, check
    assert text in check.message


def test_more_tokens_than_one_round_without_ant_moving_fails_with_the_exports():
    args = ["--device", "npu", "--tp", "8", "--moe-a2a-backend", "deepep", "--deepep-mode", "normal",
            "--chunked-prefill-size", "131072", "--max-prefill-tokens", "131072"]  # fmt: skip
    check = preflight(args, {"SGLANG_EDGEACC_ASCEND_HARDWARE": "a2"}).by_id("ant-moving")
    assert check.status == FAIL and "16384 tokens per rank" in check.message
    assert check.fix.startswith("export DEEPEP_NORMAL_LONG_SEQ_ROUND=2 DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS=8192")


# ----------------------------------------------------------------- tokens per rank


def test_a2_two_nodes_limit_4096_tokens_per_rank():
    args = [*TWO_A2_NODES, "--chunked-prefill-size", "131072", "--max-prefill-tokens", "131072"]
    check = preflight(args, FIXED_ENV).by_id("normal-tokens-per-rank")
    assert check.status == FAIL and "8192 tokens per rank" in check.message
    assert check.fix.startswith("--chunked-prefill-size 65536")


def test_dp_attention_divides_the_chunk():
    # --dp 16 --enable-dp-attention: chunk 131072 / 16 = 8192 per DP rank, one rank each -> 8192 > 4096
    args = [*TWO_A2_NODES, "--dp", "16", "--enable-dp-attention", "--chunked-prefill-size", "131072", "--max-prefill-tokens", "131072"]
    assert preflight(args, FIXED_ENV).by_id("normal-tokens-per-rank").status == FAIL
    args = [*TWO_A2_NODES, "--dp", "16", "--enable-dp-attention", "--chunked-prefill-size", "32768"]
    assert "2048 tokens per rank" in preflight(args, FIXED_ENV).by_id("normal-tokens-per-rank").message


@pytest.mark.parametrize(
    "args, env, status, text",
    [
        (["--cuda-graph-bs", "4", "8", *NEXTN], {}, PASS, ">= 24 tokens per rank"),
        ([*NEXTN], {}, FAIL, "CUDA-graph max batch size 256 (sglang's NPU default, assumed) x 3 draft tokens = 768"),
        (["--cuda-graph-bs", "16", "32", "64"], {}, PASS, ">= 64"),
        (["--cuda-graph-bs", "16", "64", *NEXTN], {}, FAIL, "up to 192 tokens per rank"),
        (["--cuda-graph-bs", "16", "64", *NEXTN], {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "192"}, PASS, ">= 192"),
        ([], {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "2048"}, FAIL, "[1, 1024]"),
        ([], {"SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": "600"}, FAIL, "limit of 512"),
        (["--cuda-graph-bs", "64", "--max-running-requests", "16", *NEXTN], {}, PASS, "max running requests per DP rank 16"),
    ],
)
def test_low_latency_dispatch_tokens(args, env, status, text):
    base = [a for a in TWO_A2_NODES if a not in ("--cuda-graph-bs", "4", "8")]
    check = preflight([*base, *args], {**FIXED_ENV, "HCCL_BUFFSIZE": "3000", **env}, "dsv32_w8a8_mtp").by_id("low-latency-tokens-per-rank")
    assert check.status == status, check
    assert text in check.message


def test_low_latency_fix_names_the_export():
    base = [a for a in TWO_A2_NODES if a not in ("--cuda-graph-bs", "4", "8")]
    check = preflight([*base, "--cuda-graph-bs", "64", *NEXTN], FIXED_ENV, "dsv32_w8a8_mtp").by_id("low-latency-tokens-per-rank")
    assert check.fix == "export SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=192"


# ----------------------------------------------------------------- speculative decoding and MTP


@pytest.mark.parametrize(
    "model, extra, status, text",
    [
        ("dsv32_w8a8_no_mtp", [], FAIL, "no model.layers.61.* tensors"),
        ("dsv32_w8a8_no_nextn_config", [], FAIL, "num_nextn_predict_layers missing"),
        ("dsv32_w8a8_mtp", [], PASS, "quantized like the main model"),
        ("dsv32_w8a8_mtp", ["--speculative-draft-model-quantization", "unquant"], FAIL, "loads it as bf16"),
        ("dsv32_w8a8_mtp_bf16", [], FAIL, "marks FLOAT"),
        ("dsv32_w8a8_mtp_bf16", ["--speculative-draft-model-quantization", "unquant"], PASS, "says so"),
        ("dsv32_bf16_mtp", [], PASS, "present"),
        ("dsv32_w8a8_no_mtp", ["--speculative-draft-model-path", "/models/DeepSeek-V3-NextN"], PASS, "not used"),
    ],
)
def test_mtp_layer_checks(model, extra, status, text):
    check = preflight([*TWO_A2_NODES, *NEXTN, *extra], FIXED_ENV, model).by_id("speculative-mtp")
    assert check.status == status, check
    assert text in check.message
    if status == FAIL:
        assert check.fix


def test_bf16_mtp_fix_is_the_draft_quantization_flag():
    check = preflight([*TWO_A2_NODES, *NEXTN], FIXED_ENV, "dsv32_w8a8_mtp_bf16").by_id("speculative-mtp")
    assert check.fix.startswith("add --speculative-draft-model-quantization unquant")


def test_spec_variables_without_speculative_decoding_warn():
    env = {**FIXED_ENV, "SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "true"}
    check = preflight(TWO_A2_NODES, env).by_id("speculative-env")
    assert check.status == WARN
    assert check.fix == "unset SGLANG_ENABLE_SPEC_V2 SGLANG_ENABLE_OVERLAP_PLAN_STREAM"
    assert preflight(TWO_A2_NODES, {**FIXED_ENV, "SGLANG_ENABLE_SPEC_V2": "0"}).by_id("speculative-env").status == PASS


# ----------------------------------------------------------------- cluster environment


@pytest.mark.parametrize(
    "change, check_id, fix",
    [
        ({"HCCL_INTRA_PCIE_ENABLE": None}, "hccl-intra-pcie", "export HCCL_INTRA_PCIE_ENABLE=1"),
        ({"HCCL_INTRA_ROCE_ENABLE": "1"}, "hccl-intra-roce", "export HCCL_INTRA_ROCE_ENABLE=0"),
        ({"HCCL_OP_EXPANSION_MODE": "AIV"}, "hccl-op-expansion-mode", "unset HCCL_OP_EXPANSION_MODE"),
        ({"HCCL_SOCKET_IFNAME": None}, "hccl-socket-ifname", "export HCCL_SOCKET_IFNAME="),
        ({"GLOO_SOCKET_IFNAME": "lo"}, "gloo-socket-ifname", "export GLOO_SOCKET_IFNAME="),
        ({"HCCL_SOCKET_IFNAME": "eth0,lo"}, "hccl-socket-ifname", "export HCCL_SOCKET_IFNAME="),
    ],
)
def test_two_node_environment(change, check_id, fix):
    env = dict(FIXED_ENV)
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    report = preflight(TWO_A2_NODES, env)
    assert failing(report) == {check_id}
    assert report.by_id(check_id).fix.startswith(fix)


def test_single_node_needs_no_cluster_variables():
    args = ["--device", "npu", "--tp", "8", "--moe-a2a-backend", "deepep", "--deepep-mode", "normal"]
    report = preflight(args, {"SGLANG_EDGEACC_ASCEND_HARDWARE": "a2", "HCCL_BUFFSIZE": "5000", "HCCL_OP_EXPANSION_MODE": "AIV"})
    assert report.ok, report.render()


def test_without_deepep_the_buffer_checks_stand_aside():
    args = ["--device", "npu", "--tp", "8"]
    report = preflight(args, {"SGLANG_EDGEACC_ASCEND_HARDWARE": "a2"})
    assert report.ok and report.auto_sizing is None
    assert "DeepEP not in use" in report.by_id("hccl-buffer").message


def test_hardware_detection_sources():
    args = ["--device", "npu", "--tp", "8"]
    assert preflight(args, {}).by_id("hardware").status == WARN  # no npu-smi, nothing set: assumed A2
    settings = parse_tolerant(["--model-path", ckpt("dsv32_w8a8_mtp"), *args])
    report = run_preflight(settings, {}, probe=lambda: "| 0     910B3               | OK            | 93.5 ...")
    assert report.by_id("hardware").message == "A2 (from npu-smi info)"


def test_report_json_shape_and_missing_checkpoint():
    settings = parse_tolerant(["--model-path", "deepseek-ai/DeepSeek-V3.2", *TWO_A2_NODES])
    report = run_preflight(settings, FIXED_ENV, probe=lambda: None)
    data = report.to_json_dict()
    assert set(data) == {"ok", "checks"}
    assert all(set(c) == {"id", "status", "message", "fix"} for c in data["checks"])
    assert report.by_id("checkpoint").status == WARN
    assert report.by_id("hccl-buffer").status == WARN


def test_tolerant_parser_needs_a_model_path():
    with pytest.raises(LaunchArgumentsError, match="--model-path"):
        parse_tolerant(["--tp", "16"])
