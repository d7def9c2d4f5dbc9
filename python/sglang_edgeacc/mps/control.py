"""The MPS control pipe: where it is, how to reach the control binary, and one command on it.

Directories. The pipe directory is where clients find the daemon, the log
directory is where the daemon writes ``control.log``/``server.log``. Defaults:
``--pipe-dir`` / ``--log-dir``, else ``CUDA_MPS_PIPE_DIRECTORY`` /
``CUDA_MPS_LOG_DIRECTORY``, else ``/tmp/nvidia-mps`` and ``/tmp/nvidia-log``
(NVIDIA's own defaults are under ``/var/log`` and ``/tmp``; ``/tmp`` needs no
root and is what containers can share). The server processes must see the
same ``CUDA_MPS_PIPE_DIRECTORY`` as the daemon.

Every call of the control binary has a timeout. Standard library only.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

logger = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/tmp/nvidia-log"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"

STATE_FILE_NAME = "sglang-edgeacc-mps.json"
LOCK_FILE_NAME = "sglang-edgeacc-mps.lock"
# Written by the daemon itself into its pipe directory.
DAEMON_PID_FILE_NAME = "nvidia-cuda-mps-control.pid"

DEFAULT_TIMEOUT_S = 15.0


class MpsError(RuntimeError):
    """Any failure to start, stop or query the MPS control daemon."""


class MpsControlNotFound(MpsError):
    """``nvidia-cuda-mps-control`` is not on PATH."""


class MpsDaemonNotRunning(MpsError):
    """No MPS control daemon answers on the pipe directory the servers will use."""


class MpsNotStartedByUs(MpsError):
    """A daemon answers, but it is not the one this tool recorded starting."""


@dataclass(frozen=True)
class MpsDirs:
    pipe_dir: Path
    log_dir: Path

    @property
    def state_file(self) -> Path:
        return self.pipe_dir / STATE_FILE_NAME

    @property
    def lock_file(self) -> Path:
        return self.pipe_dir / LOCK_FILE_NAME

    @property
    def daemon_pid_file(self) -> Path:
        return self.pipe_dir / DAEMON_PID_FILE_NAME


def resolve_dirs(
    pipe_dir: Optional[str] = None,
    log_dir: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> MpsDirs:
    env = os.environ if environ is None else environ
    pipe = pipe_dir or env.get(PIPE_DIR_ENV) or DEFAULT_PIPE_DIR
    log = log_dir or env.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR
    return MpsDirs(pipe_dir=Path(pipe).absolute(), log_dir=Path(log).absolute())


def find_control_binary() -> str:
    found = shutil.which(CONTROL_BINARY)
    if found is None:
        raise MpsControlNotFound(
            f"{CONTROL_BINARY} is not on PATH. It ships with the NVIDIA driver's utilities "
            "(in a container: run with the NVIDIA container toolkit and "
            "NVIDIA_DRIVER_CAPABILITIES including 'compute,utility'). Without MPS the two sides "
            "only time-slice the GPU: start the server with --edge-acc-sm-partition none."
        )
    return found


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    input_text: Optional[str] = None,
) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            list(argv),
            input=input_text if input_text is not None else None,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise MpsError(
            f"`{' '.join(argv)}` did not finish within {timeout:g}s "
            "(raise it with --timeout if the host is slow)"
        ) from exc
    except FileNotFoundError as exc:
        raise MpsControlNotFound(f"{argv[0]} could not be executed: {exc}") from exc


def client_env(dirs: MpsDirs) -> dict[str, str]:
    env = dict(os.environ)
    env[PIPE_DIR_ENV] = str(dirs.pipe_dir)
    env[LOG_DIR_ENV] = str(dirs.log_dir)
    return env


def read_daemon_pid(dirs: MpsDirs) -> Optional[int]:
    try:
        return int(dirs.daemon_pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def send_command(
    command: str, dirs: MpsDirs, *, timeout: float = DEFAULT_TIMEOUT_S, binary: Optional[str] = None
) -> Optional[str]:
    """Send one command on the control pipe; its output, or None when no daemon answers.

    With no daemon the real client prints "Cannot find MPS control daemon process"
    and exits 1 (seen on driver 580), hence "non-zero exit = nobody answers".
    """
    binary = binary or find_control_binary()
    proc = run_command([binary], env=client_env(dirs), timeout=timeout, input_text=command + "\n")
    if proc.returncode != 0:
        logger.debug(
            "%s %r on %s: rc=%d out=%r err=%r",
            CONTROL_BINARY, command, dirs.pipe_dir, proc.returncode, proc.stdout, proc.stderr,
        )
        return None
    return proc.stdout
