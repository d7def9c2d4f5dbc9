"""The CUDA MPS control daemon that EdgeAcc's SM split relies on.

EdgeAcc runs a prefill side and a decode side on every GPU. With
``--edge-acc-sm-partition mps`` (the default) each side is an MPS client whose
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the SMs it may use; that cap only
exists when an MPS control daemon answers on the pipe directory the clients
look at. This module starts and stops that daemon.

Standard library only (no torch, no sglang), so it runs on a GPU host from the
repository with ``PYTHONPATH=python``.

What ``start`` and ``stop`` do, and why (where the pipe and log directories
are: :mod:`.control`; whether ``--multiuser-server`` is passed:
:mod:`.multiuser`; which daemon is ours: :mod:`.ownership`; the launcher's
check: :mod:`.launch_check`):

* Environment of the daemon. ``CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1``
  so that each client context gets its own SM limit, and no
  ``CUDA_VISIBLE_DEVICES``: the daemon must see every GPU, each client then
  picks its own with its own ``CUDA_VISIBLE_DEVICES``. The caller's
  environment is not changed.
* Ownership. ``nvidia-cuda-mps-control -d`` forks and returns before the
  daemon answers, so ``start`` polls ``get_server_list`` until it answers, then
  reads the daemon's pid from the ``nvidia-cuda-mps-control.pid`` file the
  daemon writes into the pipe directory and records what it started in
  ``sglang-edgeacc-mps.json`` next to it. ``stop`` sends ``quit`` only to a
  daemon recorded there (same pid), so a daemon the host's administrator runs
  is never stopped by us. Start and stop take a lock file in the pipe
  directory so that several launchers on one host do not race.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from dataclasses import dataclass
from typing import Iterator, Optional

from sglang_edgeacc.mps.control import (
    CONTROL_BINARY,
    DEFAULT_TIMEOUT_S,
    STATE_FILE_NAME,
    MpsDirs,
    MpsError,
    MpsNotStartedByUs,
    client_env,
    find_control_binary,
    read_daemon_pid,
    resolve_dirs,
    run_command,
    send_command,
)
# The launcher imports require_daemon from this module.
from sglang_edgeacc.mps.launch_check import require_daemon  # noqa: F401
from sglang_edgeacc.mps.multiuser import MULTIUSER_SERVER_FLAG, MultiuserDecision, decide_multiuser_server
from sglang_edgeacc.mps.ownership import StartRecord, owns, pid_alive, read_record, write_record
from sglang_edgeacc.mps.status import MpsStatus, read_status

logger = logging.getLogger(__name__)

PER_CTX_PARTITIONING_ENV = "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"
_POLL_S = 0.1


@dataclass(frozen=True)
class StartOutcome:
    started: bool  # False: a daemon already answered and nothing was done
    status: MpsStatus
    multiuser_reason: str = ""


def _daemon_env(dirs: MpsDirs) -> dict[str, str]:
    env = client_env(dirs)
    env[PER_CTX_PARTITIONING_ENV] = "1"
    # The daemon must see every GPU; each client narrows with its own CUDA_VISIBLE_DEVICES.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _prepare_dirs(dirs: MpsDirs) -> None:
    for flag, path in (("--pipe-dir", dirs.pipe_dir), ("--log-dir", dirs.log_dir)):
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MpsError(f"cannot create {flag} {path}: {exc}; pass a writable directory") from exc
        if not os.access(path, os.W_OK | os.X_OK):
            raise MpsError(f"{flag} {path} is not writable by this user; pass a writable directory")


@contextlib.contextmanager
def _locked(dirs: MpsDirs, timeout: float) -> Iterator[None]:
    try:
        fd = os.open(dirs.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise MpsError(
            f"cannot open the lock file {dirs.lock_file} ({exc}); run as the user that owns "
            f"{dirs.pipe_dir}, or pass --pipe-dir"
        ) from exc
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MpsError(
                        f"another sglang-edgeacc mps command holds {dirs.lock_file} "
                        f"for more than {timeout:g}s"
                    ) from None
                time.sleep(_POLL_S)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def start_daemon(
    pipe_dir: Optional[str] = None,
    log_dir: Optional[str] = None,
    *,
    multiuser_server: str = "auto",
    timeout: float = DEFAULT_TIMEOUT_S,
) -> StartOutcome:
    """Start the daemon unless one already answers on the pipe directory (then do nothing)."""
    binary = find_control_binary()
    dirs = resolve_dirs(pipe_dir, log_dir)
    _prepare_dirs(dirs)

    def answering() -> bool:
        return send_command("get_server_list", dirs, timeout=timeout, binary=binary) is not None

    with _locked(dirs, timeout):
        if answering():
            status = read_status(dirs, timeout=timeout, binary=binary)
            logger.info(
                "an MPS control daemon already answers on %s (pid %s, %s); nothing to do",
                dirs.pipe_dir, status.control_pid,
                "started by sglang-edgeacc" if status.started_by_us else "not started by sglang-edgeacc",
            )
            return StartOutcome(False, status)
        if dirs.state_file.exists():
            logger.info("removing the stale record %s (its daemon no longer answers)", dirs.state_file)
            dirs.state_file.unlink(missing_ok=True)

        decision = decide_multiuser_server(multiuser_server, binary, timeout=timeout)
        logger.info(
            "starting %s on pipe dir %s, log dir %s (multiuser server: %s, because %s)",
            CONTROL_BINARY, dirs.pipe_dir, dirs.log_dir, "yes" if decision.use else "no", decision.reason,
        )
        argv = [binary] + ([MULTIUSER_SERVER_FLAG] if decision.use else []) + ["-d"]
        proc = run_command(argv, env=_daemon_env(dirs), timeout=timeout)
        if proc.returncode != 0 and decision.use and multiuser_server == "auto":
            logger.warning(
                "%s refused %s (rc=%d: %s); retrying without it",
                CONTROL_BINARY, MULTIUSER_SERVER_FLAG, proc.returncode, (proc.stdout + proc.stderr).strip(),
            )
            decision = MultiuserDecision(False, f"the daemon refused {MULTIUSER_SERVER_FLAG}")
            argv = [binary, "-d"]
            proc = run_command(argv, env=_daemon_env(dirs), timeout=timeout)
        if proc.returncode != 0:
            raise MpsError(
                f"`{' '.join(argv)}` exited with {proc.returncode}: "
                f"{(proc.stdout + proc.stderr).strip() or 'no output'}; see {dirs.log_dir / 'control.log'}"
            )
        # -d forks and returns before the daemon listens: wait until it answers.
        if not _wait_for(answering, timeout):
            raise MpsError(
                f"{CONTROL_BINARY} was started but does not answer on {dirs.pipe_dir} after "
                f"{timeout:g}s; see {dirs.log_dir / 'control.log'}"
            )
        _wait_for(lambda: read_daemon_pid(dirs) is not None, min(timeout, 2.0))
        record = StartRecord(
            control_pid=read_daemon_pid(dirs),
            pipe_dir=str(dirs.pipe_dir),
            log_dir=str(dirs.log_dir),
            multiuser_server=decision.use,
            command=tuple(argv),
            started_at=time.time(),
            started_by_pid=os.getpid(),
        )
        write_record(dirs, record)
        logger.info("MPS control daemon answers on %s (pid %s)", dirs.pipe_dir, record.control_pid)
        return StartOutcome(True, read_status(dirs, timeout=timeout, binary=binary), decision.reason)


def stop_daemon(
    pipe_dir: Optional[str] = None,
    *,
    force: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> bool:
    """Stop the daemon this tool started. False when no daemon answered (nothing to do)."""
    binary = find_control_binary()
    dirs = resolve_dirs(pipe_dir, None)
    if not dirs.pipe_dir.is_dir():
        logger.info("no MPS pipe directory %s; nothing to stop", dirs.pipe_dir)
        return False

    def answering() -> bool:
        return send_command("get_server_list", dirs, timeout=timeout, binary=binary) is not None

    with _locked(dirs, timeout):
        record = read_record(dirs)
        if not answering():
            if record is not None:
                logger.info("removing the stale record %s (its daemon no longer answers)", dirs.state_file)
                dirs.state_file.unlink(missing_ok=True)
            logger.info("no MPS control daemon answers on %s; nothing to stop", dirs.pipe_dir)
            return False
        current_pid = read_daemon_pid(dirs)
        if not force and not owns(record, current_pid):
            raise MpsNotStartedByUs(
                f"the MPS control daemon on {dirs.pipe_dir} (pid {current_pid}) was not started by "
                f"sglang-edgeacc (no matching {STATE_FILE_NAME}); leaving it running. Stop it yourself "
                f"with `echo quit | CUDA_MPS_PIPE_DIRECTORY={dirs.pipe_dir} {CONTROL_BINARY}`, "
                "or pass --force"
            )
        logger.info("stopping the MPS control daemon on %s (pid %s)", dirs.pipe_dir, current_pid)
        proc = run_command([binary], env=client_env(dirs), timeout=timeout, input_text="quit\n")
        if proc.returncode != 0:
            raise MpsError(
                f"`echo quit | {CONTROL_BINARY}` exited with {proc.returncode}: "
                f"{(proc.stdout + proc.stderr).strip() or 'no output'}"
            )
        pid = current_pid if current_pid is not None else (record.control_pid if record else None)
        gone = _wait_for(lambda: not pid_alive(pid) and not answering(), timeout)
        if not gone:
            raise MpsError(
                f"the MPS control daemon on {dirs.pipe_dir} (pid {pid}) did not exit within "
                f"{timeout:g}s of `quit`; MPS clients may still be running "
                "(stop the server first), or end it with `kill <pid>`"
            )
        dirs.state_file.unlink(missing_ok=True)
        logger.info("MPS control daemon on %s stopped", dirs.pipe_dir)
        return True
