"""A stand-in for ``nvidia-cuda-mps-control`` (and ``nvidia-smi``) for the CPU tests.

``install_stubs(bin_dir)`` writes executables named like the real tools into
``bin_dir``; put it first on PATH. The fake daemon keeps its state in
``$CUDA_MPS_PIPE_DIRECTORY``, as the real one keeps its pipes there:

* ``-d [--multiuser-server]`` forks a background "daemon" and returns at once
  (the real one also returns before it answers); the daemon writes
  ``nvidia-cuda-mps-control.pid`` and ``stub-daemon.json`` (its argv and the
  environment it saw) and lives until ``quit`` (or 120 s, so no test leaks it).
* Without arguments it is a client: reads commands on stdin
  (``get_server_list``, ``get_client_list PID``, ``quit``) and fails with
  rc 1 when no daemon runs. Servers and their clients are read from
  ``stub-servers.json`` (``{"pid": [client pids]}``), which tests write.
* ``--help`` prints a usage text; it lists ``--multiuser-server`` only when
  ``STUB_MPS_HELP=multiuser``; ``STUB_MPS_HELP=silent`` prints nothing.
* ``STUB_MPS_REJECT_MULTIUSER=1`` makes ``-d --multiuser-server`` fail.
* Every call is appended to ``stub-calls.jsonl``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

DAEMON_LIFETIME_S = 120.0
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
)


def _pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_pid() -> int | None:
    try:
        pid = int((_pipe_dir() / "nvidia-cuda-mps-control.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _serve(argv: list[str]) -> int:
    pipe = _pipe_dir()
    time.sleep(float(os.environ.get("STUB_MPS_START_DELAY", "0.3")))
    (pipe / "stub-daemon.json").write_text(
        json.dumps({"pid": os.getpid(), "argv": argv, "env": {k: os.environ.get(k) for k in RECORDED_ENV}})
    )
    log_dir = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/tmp/nvidia-log"))
    with open(log_dir / "control.log", "a") as log:
        log.write(f"stub daemon {os.getpid()} started\n")
    (pipe / "nvidia-cuda-mps-control.pid").write_text(str(os.getpid()))
    deadline = time.monotonic() + DAEMON_LIFETIME_S
    quit_marker = pipe / "stub-quit"
    while time.monotonic() < deadline and not quit_marker.exists():
        time.sleep(0.05)
    quit_marker.unlink(missing_ok=True)
    (pipe / "nvidia-cuda-mps-control.pid").unlink(missing_ok=True)
    return 0


def _client() -> int:
    if _daemon_pid() is None:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    try:
        servers = json.loads((_pipe_dir() / "stub-servers.json").read_text())
    except OSError:
        servers = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "get_server_list":
            for pid in servers:
                print(pid)
        elif words[0] == "get_client_list" and len(words) == 2:
            for pid in servers.get(words[1], []):
                print(pid)
        elif words[0] == "quit":
            (_pipe_dir() / "stub-quit").touch()
        else:
            print(f"Unknown command {words[0]}")
    return 0


def main(argv: list[str]) -> int:
    pipe = _pipe_dir()
    if pipe.is_dir():
        with open(pipe / "stub-calls.jsonl", "a") as calls:
            calls.write(json.dumps(argv) + "\n")
    if "--serve" in argv:
        return _serve([a for a in argv if a != "--serve"])
    if "--help" in argv or "-h" in argv:
        mode = os.environ.get("STUB_MPS_HELP", "plain")
        if mode == "silent":
            return 1
        print("Usage: nvidia-cuda-mps-control [options]\n  -d  start daemon in background\n  -f  foreground")
        if mode == "multiuser":
            print("  --multiuser-server  serve clients of all users from one server")
        return 0
    if "-d" in argv:
        if "--multiuser-server" in argv and os.environ.get("STUB_MPS_REJECT_MULTIUSER") == "1":
            print("Unrecognized option --multiuser-server", file=sys.stderr)
            return 1
        if _daemon_pid() is not None:
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return 0
    return _client()


NVIDIA_SMI = """#!/bin/sh
echo "+-----------------------------------------------------------------------------+"
echo "| NVIDIA-SMI 570.86.10    Driver Version: 570.86.10    CUDA Version: ${STUB_CUDA_VERSION:-12.8}  |"
echo "+-----------------------------------------------------------------------------+"
"""


def install_stubs(bin_dir: Path) -> Path:
    """Write ``nvidia-cuda-mps-control`` and ``nvidia-smi`` stubs into ``bin_dir``; returns it."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text())
    smi = bin_dir / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    for path in (control, smi):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
