"""`sglang-edgeacc doctor -- <launch_server arguments>` with the real sglang parser."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

from sglang_edgeacc.ascend import doctor

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "ascend")
NO_MTP = os.path.join(FIXTURES, "dsv32_w8a8_no_mtp")

# Every variable the checks read, so the machine's own environment cannot leak in.
CHECKED_VARS = (
    "HCCL_BUFFSIZE", "DEEPEP_HCCL_BUFFSIZE", "DEEPEP_NORMAL_LONG_SEQ_ROUND", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS",
    "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "SGLANG_ENABLE_SPEC_V2", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM",
    "HCCL_INTRA_PCIE_ENABLE", "HCCL_INTRA_ROCE_ENABLE", "HCCL_OP_EXPANSION_MODE", "HCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME", "SGLANG_EDGEACC_ASCEND_HARDWARE", "SGLANG_DEEPEP_BF16_DISPATCH",
)  # fmt: skip
SEED_ENV = {
    "SGLANG_EDGEACC_ASCEND_HARDWARE": "a2", "HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0",
    "HCCL_SOCKET_IFNAME": "enp189s0f0", "GLOO_SOCKET_IFNAME": "enp189s0f0", "HCCL_BUFFSIZE": "400",
    "SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "1",
    "DEEPEP_NORMAL_LONG_SEQ_ROUND": "8", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512",
}  # fmt: skip
FIXED_ENV = {
    "SGLANG_EDGEACC_ASCEND_HARDWARE": "a2", "HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0",
    "HCCL_SOCKET_IFNAME": "enp189s0f0", "GLOO_SOCKET_IFNAME": "enp189s0f0", "HCCL_BUFFSIZE": "1500",
}  # fmt: skip
NODE0 = [
    "--model-path", NO_MTP, "--device", "npu", "--tp", "16", "--nnodes", "2", "--node-rank", "0",
    "--dist-init-addr", "10.0.0.1:5000", "--attention-backend", "ascend", "--quantization", "modelslim",
    "--trust-remote-code", "--moe-a2a-backend", "deepep", "--deepep-mode", "auto",
]  # fmt: skip
NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]


@pytest.fixture
def environment(monkeypatch):
    for name in CHECKED_VARS:
        monkeypatch.delenv(name, raising=False)

    def apply(values):
        for key, value in values.items():
            monkeypatch.setenv(key, value)

    return apply


def run_doctor(argv, capsys):
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    rc = doctor.run(parser.parse_args(argv))
    return rc, capsys.readouterr().out


def test_seed_command_as_written_for_sglang_0_5_9(environment, capsys):
    environment(SEED_ENV)
    rc, out = run_doctor(["--json", "--", *NODE0, "--cuda-graph-bs", "4", "8", *NEXTN], capsys)
    data = json.loads(out)
    assert rc == 1 and data["ok"] is False
    failing = {c["id"]: c for c in data["checks"] if c["status"] == "fail"}
    # 0.5.23 has no --cuda-graph-bs (it became --cuda-graph-bs-decode): the real parser rejects it...
    assert "--cuda-graph-bs" in failing["launch-arguments"]["message"]
    assert "--cuda-graph-bs-decode" in failing["launch-arguments"]["fix"]
    # ...and the tolerant reading still finds both root causes of the seed
    assert set(failing) == {"launch-arguments", "speculative-mtp", "hccl-buffer", "ant-moving"}


def test_seed_command_in_0_5_23_spelling(environment, capsys):
    environment(SEED_ENV)
    rc, out = run_doctor(["--json", "--", *NODE0, "--cuda-graph-bs-decode", "4", "8", *NEXTN], capsys)
    data = json.loads(out)
    assert rc == 1
    assert {c["id"] for c in data["checks"] if c["status"] == "fail"} == {"speculative-mtp", "hccl-buffer", "ant-moving"}
    assert next(c for c in data["checks"] if c["id"] == "launch-arguments")["message"] == "read by sglang parser"


def test_seed_fixed_configuration(environment, capsys):
    environment(FIXED_ENV)
    rc, out = run_doctor(["--", *NODE0, "--cuda-graph-bs-decode", "4", "8"], capsys)
    assert rc == 0, out
    assert out.startswith("sglang-edgeacc doctor: 0 failing")
    assert "PASS hccl-buffer: HCCL_BUFFSIZE=1500 MB >= 1256 MB needed" in out
    assert "PASS speculative-mtp: no speculative decoding" in out


def test_text_report_puts_failures_first_with_their_fix(environment, capsys):
    environment(SEED_ENV)
    rc, out = run_doctor(["--", *NODE0, "--cuda-graph-bs-decode", "4", "8", *NEXTN], capsys)
    lines = out.splitlines()
    assert rc == 1 and lines[0].startswith("sglang-edgeacc doctor: 3 failing")
    assert lines[1].lstrip().startswith("FAIL ")
    assert lines[2].strip().startswith("fix: ")


def test_launcher_words_before_the_flags_are_ignored(environment, capsys):
    environment(FIXED_ENV)
    rc, _ = run_doctor(["--", "python3", "-m", "sglang.launch_server", *NODE0, "--cuda-graph-bs-decode", "4", "8"], capsys)
    assert rc == 0


def test_falls_back_to_the_tolerant_parser_without_sglang(environment, capsys, monkeypatch):
    environment(FIXED_ENV)
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", None)  # import now raises ImportError
    settings, problem = doctor.read_launch_args(["--", *NODE0, "--cuda-graph-bs", "4", "8", "--unknown-future-flag", "x"])
    assert problem is None and settings.parsed_by == "tolerant"
    assert settings.cuda_graph_bs == (4, 8) and settings.tp_size == 16
    rc, out = run_doctor(["--json", "--", *NODE0, "--cuda-graph-bs", "4", "8"], capsys)
    assert rc == 0 and json.loads(out)["ok"] is True


def test_sglang_and_tolerant_readings_agree(environment):
    argv = [*NODE0, "--cuda-graph-bs-decode", "4", "8", *NEXTN, "--chunked-prefill-size", "4096", "--dp-size", "2", "--enable-dp-attention"]
    from sglang_edgeacc.ascend.launch_settings import parse_tolerant

    by_sglang, problem = doctor.read_launch_args(argv)
    assert problem is None and by_sglang.parsed_by == "sglang"
    assert by_sglang == parse_tolerant(argv)  # parsed_by is not compared


def test_unreadable_command_exits_2(environment, capsys):
    parser = argparse.ArgumentParser()
    doctor.add_arguments(parser)
    assert doctor.run(parser.parse_args(["--", "--tp", "16"])) == 2
    assert "--model-path" in capsys.readouterr().err
