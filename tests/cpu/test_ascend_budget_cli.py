"""`sglang-edgeacc hccl-budget`: the calculator as a user runs it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from sglang_edgeacc.ascend import budget_cli

MB = 1024 * 1024
DSV32 = ["--hidden-size", "7168", "--topk", "8", "--num-experts", "256"]


def run_cli(argv, capsys):
    parser = argparse.ArgumentParser()
    budget_cli.add_arguments(parser)
    rc = budget_cli.run(parser.parse_args(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_required_mb_is_a_number(capsys):
    rc, out, _ = run_cli(["--hardware", "a3", "--mode", "normal", *DSV32, "--tokens-per-rank", "4096", "--json"], capsys)
    assert rc == 0
    data = json.loads(out)
    assert data["required_mb"] == 2036 and isinstance(data["required_mb"], int)
    assert sum(t["bytes"] for t in data["terms"]) == data["required_bytes"] == (4096 * 8 * (14848 + 14336) + 106 * MB) * 2
    assert data["suggested_mb"] == 2036 + 204


def test_text_lists_the_terms(capsys):
    rc, out, _ = run_cli(["--hardware", "a2", "--mode", "normal", *DSV32, "--tokens-per-rank", "4096", "--nodes", "2"], capsys)
    assert rc == 0
    assert out.splitlines()[0].startswith("HCCL_BUFFSIZE >= 1317 MB")
    for name in ("token payload", "IPC data offset", "RDMA data", "notify data", "total"):
        assert name in out


def test_ant_moving_and_int8_flags(capsys):
    rc, out, _ = run_cli(["--hardware", "a3", "--mode", "normal", *DSV32, "--tokens-per-rank", "3000", "--ant-moving", "8", "512", "--json"], capsys)
    assert (rc, json.loads(out)["required_mb"]) == (0, 552)
    rc, out, _ = run_cli(["--hardware", "a3", "--mode", "low_latency", *DSV32, "--tokens-per-rank", "8", "--int8-dispatch", "--json"], capsys)
    assert (rc, json.loads(out)["required_mb"]) == (0, 32)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--hardware", "a2", "--mode", "normal", "--tokens-per-rank", "512", "--nodes", "2", "--ant-moving", "8", "512"], "not supported"),
        (["--hardware", "a3", "--mode", "normal", "--tokens-per-rank", "5000", "--ant-moving", "8", "512"], "exceeds ROUND x PER_ROUND_TOKENS"),
        (["--hardware", "a3", "--mode", "normal", "--tokens-per-rank", "9000"], "--ant-moving"),
        (["--hardware", "a2", "--mode", "normal", "--tokens-per-rank", "5000", "--nodes", "2"], "4096"),
        (["--hardware", "a3", "--mode", "low_latency", "--tokens-per-rank", "2048"], "1024"),
        (["--hardware", "a2", "--mode", "normal", "--tokens-per-rank", "512", "--nodes", "2", "--ranks", "8"], "--ranks 8"),
    ],
)
def test_impossible_configurations_exit_2_with_the_reason(capsys, extra, message):
    rc, out, err = run_cli([*DSV32, *extra], capsys)
    assert rc == 2 and out == ""
    assert message in err


def test_routed_through_the_console_script_without_torch_or_sglang(tmp_path):
    # The subcommand must work where only the repository is present: block torch and sglang imports.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'sglang'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    repo_python = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{repo_python}")
    done = subprocess.run(
        [sys.executable, "-m", "sglang_edgeacc.cli", "hccl-budget", "--hardware", "a2", "--mode", "low_latency", *DSV32, "--tokens-per-rank", "32", "--nodes", "2", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["required_mb"] == 917
