"""``sglang-edgeacc mps start|stop|status`` against a stub nvidia-cuda-mps-control.

The stub (tests/cpu/mps_stub.py) is put first on PATH and keeps its state in
the pipe directory, so every test drives the real CLI in a subprocess, exactly
as an operator or scripts/sglang_launch_server.sh would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cpu.mps_stub import install_stubs

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "sglang_edgeacc.cli", "mps"]


@pytest.fixture
def mps_env(tmp_path):
    bin_dir = install_stubs(tmp_path / "bin")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "python"), env.get("PYTHONPATH")) if p)
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(tmp_path / "pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = str(tmp_path / "log")
    env["CUDA_VISIBLE_DEVICES"] = "3,4"
    env["SGLANG_EDGEACC_MPS_TIMEOUT"] = "60"  # a loaded CI machine is slow to start the stub daemon
    for name in ("STUB_MPS_HELP", "STUB_MPS_REJECT_MULTIUSER", "STUB_CUDA_VERSION"):
        env.pop(name, None)
    yield env
    # Never leave a stub daemon behind, whatever the test did.
    pid_file = tmp_path / "pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():
        (tmp_path / "pipe" / "stub-quit").touch()
        deadline = time.monotonic() + 5
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def mps(env, *args, timeout=180):
    return subprocess.run(CLI + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def pipe(env) -> Path:
    return Path(env["CUDA_MPS_PIPE_DIRECTORY"])


def daemon_starts(env) -> list[list[str]]:
    calls = pipe(env) / "stub-calls.jsonl"
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [argv for argv in map(json.loads, lines) if "-d" in argv and "--serve" not in argv]


def test_start_status_stop_lifecycle(mps_env):
    started = mps(mps_env, "start")
    assert started.returncode == 0, started.stderr
    assert started.stdout.split()[0] == "started"

    daemon = json.loads((pipe(mps_env) / "stub-daemon.json").read_text())
    # The daemon sees every GPU, per-context SM partitioning, and our directories.
    assert daemon["env"]["CUDA_VISIBLE_DEVICES"] is None
    assert daemon["env"]["CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"] == "1"
    assert daemon["env"]["CUDA_MPS_PIPE_DIRECTORY"] == mps_env["CUDA_MPS_PIPE_DIRECTORY"]
    assert daemon["env"]["CUDA_MPS_LOG_DIRECTORY"] == mps_env["CUDA_MPS_LOG_DIRECTORY"]
    record = json.loads((pipe(mps_env) / "sglang-edgeacc-mps.json").read_text())
    assert record["control_pid"] == daemon["pid"]

    (pipe(mps_env) / "stub-servers.json").write_text(json.dumps({"5001": [7001, 7002]}))
    status = mps(mps_env, "status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["answering"] and report["started_by_us"]
    assert report["control_pid"] == daemon["pid"]
    assert report["servers"] == [{"pid": 5001, "clients": [7001, 7002]}]
    human = mps(mps_env, "status")
    assert "server 5001: clients 7001, 7002" in human.stdout
    assert "started by sglang-edgeacc" in human.stdout

    stopped = mps(mps_env, "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "stopped"
    assert not (pipe(mps_env) / "sglang-edgeacc-mps.json").exists()
    after = mps(mps_env, "status")
    assert after.returncode == 3
    assert "no MPS control daemon answers" in after.stdout


def test_start_is_idempotent(mps_env):
    first = mps(mps_env, "start")
    second = mps(mps_env, "start")
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    assert first.stdout.split()[0] == "started"
    assert second.stdout.split()[0] == "already-running"
    assert len(daemon_starts(mps_env)) == 1
    # Stop twice: the second finds nothing and says so without failing.
    assert mps(mps_env, "stop").stdout.strip() == "stopped"
    again = mps(mps_env, "stop")
    assert again.returncode == 0 and again.stdout.strip() == "not-running"


def test_stop_refuses_a_daemon_it_did_not_start(mps_env):
    pipe(mps_env).mkdir()
    Path(mps_env["CUDA_MPS_LOG_DIRECTORY"]).mkdir()
    # Someone else starts the daemon directly.
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=mps_env, check=True, timeout=30)
    deadline = time.monotonic() + 10
    while not (pipe(mps_env) / "nvidia-cuda-mps-control.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = mps(mps_env, "start")  # answers already: a no-op, not an adoption
    assert started.stdout.split()[0] == "already-running"
    assert not (pipe(mps_env) / "sglang-edgeacc-mps.json").exists()

    refused = mps(mps_env, "stop")
    assert refused.returncode == 1
    assert "was not started by sglang-edgeacc" in refused.stderr
    assert "echo quit" in refused.stderr and "--force" in refused.stderr
    still = mps(mps_env, "status", "--json")
    assert json.loads(still.stdout)["answering"] is True
    assert json.loads(still.stdout)["started_by_us"] is False

    forced = mps(mps_env, "stop", "--force")
    assert forced.returncode == 0, forced.stderr
    assert mps(mps_env, "status").returncode == 3


def test_stop_refuses_when_the_recorded_daemon_was_replaced(mps_env):
    assert mps(mps_env, "start").returncode == 0
    record_file = pipe(mps_env) / "sglang-edgeacc-mps.json"
    record = json.loads(record_file.read_text())
    record["control_pid"] = record["control_pid"] + 100000  # a pid that is not the daemon's
    record_file.write_text(json.dumps(record))
    refused = mps(mps_env, "stop")
    assert refused.returncode == 1
    assert "was not started by sglang-edgeacc" in refused.stderr


def test_stale_record_is_dropped(mps_env):
    pipe(mps_env).mkdir()
    stale = {"control_pid": 999999, "pipe_dir": str(pipe(mps_env)), "log_dir": "/tmp", "command": []}
    (pipe(mps_env) / "sglang-edgeacc-mps.json").write_text(json.dumps(stale))
    stop = mps(mps_env, "stop")
    assert stop.returncode == 0 and stop.stdout.strip() == "not-running"
    assert not (pipe(mps_env) / "sglang-edgeacc-mps.json").exists()


def test_control_binary_missing_from_path(mps_env, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    mps_env["PATH"] = str(empty)
    for action in ("start", "status", "stop"):
        result = mps(mps_env, action)
        assert result.returncode == 1
        assert "nvidia-cuda-mps-control is not on PATH" in result.stderr
        assert "--edge-acc-sm-partition none" in result.stderr


@pytest.mark.parametrize(
    "stub_env, expect_flag",
    [
        ({"STUB_MPS_HELP": "multiuser"}, True),  # the daemon advertises the flag
        ({"STUB_MPS_HELP": "plain", "STUB_CUDA_VERSION": "12.9"}, False),  # help is authoritative
        ({"STUB_MPS_HELP": "silent", "STUB_CUDA_VERSION": "12.8"}, True),  # no help: CUDA >= 12.8
        ({"STUB_MPS_HELP": "silent", "STUB_CUDA_VERSION": "12.4"}, False),
        ({"STUB_MPS_HELP": "multiuser", "STUB_MPS_REJECT_MULTIUSER": "1"}, False),  # refused: retried
    ],
)
def test_multiuser_server_auto_detection(mps_env, stub_env, expect_flag):
    mps_env.update(stub_env)
    result = mps(mps_env, "start")
    assert result.returncode == 0, result.stderr
    daemon = json.loads((pipe(mps_env) / "stub-daemon.json").read_text())
    assert ("--multiuser-server" in daemon["argv"]) is expect_flag
    record = json.loads((pipe(mps_env) / "sglang-edgeacc-mps.json").read_text())
    assert record["multiuser_server"] is expect_flag


def test_multiuser_server_forced_on_fails_clearly_when_refused(mps_env):
    mps_env["STUB_MPS_REJECT_MULTIUSER"] = "1"
    result = mps(mps_env, "start", "--multiuser-server", "on")
    assert result.returncode == 1
    assert "--multiuser-server -d` exited with 1" in result.stderr
    assert "control.log" in result.stderr


def test_pipe_and_log_dir_flags_override_the_environment(mps_env, tmp_path):
    pipe_dir, log_dir = tmp_path / "custom-pipe", tmp_path / "custom-log"
    result = mps(mps_env, "start", "--pipe-dir", str(pipe_dir), "--log-dir", str(log_dir))
    assert result.returncode == 0, result.stderr
    daemon = json.loads((pipe_dir / "stub-daemon.json").read_text())
    assert daemon["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe_dir)
    assert (log_dir / "control.log").exists()
    # The environment's pipe dir has no daemon; the flag's does.
    assert mps(mps_env, "status").returncode == 3
    assert mps(mps_env, "status", "--pipe-dir", str(pipe_dir)).returncode == 0
    assert mps(mps_env, "stop", "--pipe-dir", str(pipe_dir)).stdout.strip() == "stopped"


def test_require_daemon(mps_env, monkeypatch):
    from sglang_edgeacc.mps.control import MpsDaemonNotRunning
    from sglang_edgeacc.mps.launch_check import require_daemon

    monkeypatch.setenv("PATH", mps_env["PATH"])
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", mps_env["CUDA_MPS_PIPE_DIRECTORY"])
    with pytest.raises(MpsDaemonNotRunning) as missing:
        require_daemon()
    assert "sglang-edgeacc mps start" in str(missing.value)
    assert mps_env["CUDA_MPS_PIPE_DIRECTORY"] in str(missing.value)

    assert mps(mps_env, "start").returncode == 0
    require_daemon()  # answers now: no error
    require_daemon(mps_env["CUDA_MPS_PIPE_DIRECTORY"])

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(MpsDaemonNotRunning, match="not on PATH"):
        require_daemon()


def test_timeout_settings_are_validated(mps_env):
    mps_env["SGLANG_EDGEACC_MPS_TIMEOUT"] = "soon"
    bad_env = mps(mps_env, "status")
    assert bad_env.returncode == 1
    assert "SGLANG_EDGEACC_MPS_TIMEOUT must be a number of seconds" in bad_env.stderr
    bad_flag = mps(mps_env, "status", "--timeout", "0")
    assert bad_flag.returncode == 1 and "--timeout must be positive" in bad_flag.stderr


def test_parse_cuda_version():
    from sglang_edgeacc.mps.multiuser import parse_cuda_version

    header = "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0     |"
    assert parse_cuda_version(header) == (13, 0)
    assert parse_cuda_version("CUDA Version: 12.10") == (12, 10)
    assert parse_cuda_version("No devices were found") is None
