"""The CUDA MPS control daemon that EdgeAcc's SM split relies on.

EdgeAcc runs a prefill side and a decode side on every GPU. With
``--edge-acc-sm-partition mps`` (the default) each side is an MPS client whose
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the SMs it may use; that cap only
exists when an MPS control daemon answers on the pipe directory the clients
look at. This module starts, inspects and stops that daemon, and gives the
launcher :func:`require_daemon` to refuse a start that would silently run
without the split.

Standard library only (no torch, no sglang), so it runs on a GPU host from the
repository with ``PYTHONPATH=python``.

What ``start`` does, and why:

* Directories. The pipe directory is where clients find the daemon, the log
  directory is where the daemon writes ``control.log``/``server.log``. Defaults:
  ``--pipe-dir`` / ``--log-dir``, else ``CUDA_MPS_PIPE_DIRECTORY`` /
  ``CUDA_MPS_LOG_DIRECTORY``, else ``/tmp/nvidia-mps`` and ``/tmp/nvidia-log``
  (NVIDIA's own defaults are under ``/var/log`` and ``/tmp``; ``/tmp`` needs no
  root and is what containers can share). The server processes must see the
  same ``CUDA_MPS_PIPE_DIRECTORY`` as the daemon.
* Environment of the daemon. ``CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1``
  so that each client context gets its own SM limit, and no
  ``CUDA_VISIBLE_DEVICES``: the daemon must see every GPU, each client then
  picks its own with its own ``CUDA_VISIBLE_DEVICES``. The caller's
  environment is not changed.
* ``--multiuser-server``. The reference deployment passed it on CUDA >= 12.8.
  ``auto`` (the default) decides from the daemon itself: if its ``--help``
  lists the flag it is passed; if the help lists options but not this one it
  is not; if the help says nothing useful, the CUDA version in the
  ``nvidia-smi`` header decides (>= 12.8 passes it). When an ``auto`` start
  with the flag is refused by the daemon, the start is retried once without it.
  (On the lent H200, driver 580.159.04 / CUDA 13.0, ``--help`` lists
  ``-M,--multiuser-server  Enable multi-user mode`` and auto passed it.)
* Ownership. ``nvidia-cuda-mps-control -d`` forks and returns before the
  daemon answers, so ``start`` polls ``get_server_list`` until it answers, then
  reads the daemon's pid from the ``nvidia-cuda-mps-control.pid`` file the
  daemon writes into the pipe directory and records what it started in
  ``sglang-edgeacc-mps.json`` next to it. ``stop`` sends ``quit`` only to a
  daemon recorded there (same pid), so a daemon the host's administrator runs
  is never stopped by us. Start and stop take a lock file in the pipe
  directory so that several launchers on one host do not race.

Every call of the control binary has a timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

logger = logging.getLogger(__name__)

CONTROL_BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
DEFAULT_LOG_DIR = "/tmp/nvidia-log"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"
PER_CTX_PARTITIONING_ENV = "CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING"
MULTIUSER_SERVER_FLAG = "--multiuser-server"
MULTIUSER_SERVER_MIN_CUDA = (12, 8)
MULTIUSER_MODES = ("auto", "on", "off")

STATE_FILE_NAME = "sglang-edgeacc-mps.json"
LOCK_FILE_NAME = "sglang-edgeacc-mps.lock"
# Written by the daemon itself into its pipe directory.
DAEMON_PID_FILE_NAME = "nvidia-cuda-mps-control.pid"

START_COMMAND = "sglang-edgeacc mps start"
DEFAULT_TIMEOUT_S = 15.0
_POLL_S = 0.1


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


@dataclass(frozen=True)
class StartRecord:
    """What ``start`` launched; kept in the pipe directory so ``stop`` can tell ours from theirs."""

    control_pid: Optional[int]
    pipe_dir: str
    log_dir: str
    multiuser_server: bool
    command: tuple[str, ...]
    started_at: float
    started_by_pid: int

    @classmethod
    def from_json(cls, data: Mapping) -> "StartRecord":
        return cls(
            control_pid=data.get("control_pid"),
            pipe_dir=str(data["pipe_dir"]),
            log_dir=str(data["log_dir"]),
            multiuser_server=bool(data.get("multiuser_server", False)),
            command=tuple(data.get("command", ())),
            started_at=float(data.get("started_at", 0.0)),
            started_by_pid=int(data.get("started_by_pid", 0)),
        )


@dataclass(frozen=True)
class MpsServer:
    pid: int
    clients: tuple[int, ...]


@dataclass(frozen=True)
class MpsStatus:
    pipe_dir: str
    answering: bool
    control_pid: Optional[int]
    servers: tuple[MpsServer, ...]
    record: Optional[StartRecord]

    @property
    def started_by_us(self) -> bool:
        return self.answering and _owns(self.record, self.control_pid)

    def to_json(self) -> dict:
        return {
            "pipe_dir": self.pipe_dir,
            "answering": self.answering,
            "control_pid": self.control_pid,
            "started_by_us": self.started_by_us,
            "servers": [{"pid": s.pid, "clients": list(s.clients)} for s in self.servers],
            "record": asdict(self.record) if self.record is not None else None,
        }


@dataclass(frozen=True)
class StartOutcome:
    started: bool  # False: a daemon already answered and nothing was done
    status: MpsStatus
    multiuser_reason: str = ""


@dataclass(frozen=True)
class MultiuserDecision:
    use: bool
    reason: str


# --------------------------------------------------------------------------- helpers


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


def _run(
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


def _client_env(dirs: MpsDirs) -> dict[str, str]:
    env = dict(os.environ)
    env[PIPE_DIR_ENV] = str(dirs.pipe_dir)
    env[LOG_DIR_ENV] = str(dirs.log_dir)
    return env


def _daemon_env(dirs: MpsDirs) -> dict[str, str]:
    env = _client_env(dirs)
    env[PER_CTX_PARTITIONING_ENV] = "1"
    # The daemon must see every GPU; each client narrows with its own CUDA_VISIBLE_DEVICES.
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _pid_alive(pid: Optional[int]) -> bool:
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still accepts signal 0; a daemon whose parent never reaps it is gone all the same.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_daemon_pid(dirs: MpsDirs) -> Optional[int]:
    try:
        return int(dirs.daemon_pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_record(dirs: MpsDirs) -> Optional[StartRecord]:
    try:
        return StartRecord.from_json(json.loads(dirs.state_file.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring unreadable MPS state file %s: %s", dirs.state_file, exc)
        return None


def _write_record(dirs: MpsDirs, record: StartRecord) -> None:
    tmp = dirs.state_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    os.replace(tmp, dirs.state_file)


def _owns(record: Optional[StartRecord], current_pid: Optional[int]) -> bool:
    if record is None:
        return False
    if record.control_pid is None or current_pid is None:
        # Without the daemon's pid file the record is the only evidence; trust it only
        # while the recorded process (when known) is still there.
        return record.control_pid is None or _pid_alive(record.control_pid)
    return record.control_pid == current_pid


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


# --------------------------------------------------------------------------- queries


def send_command(
    command: str, dirs: MpsDirs, *, timeout: float = DEFAULT_TIMEOUT_S, binary: Optional[str] = None
) -> Optional[str]:
    """Send one command on the control pipe; its output, or None when no daemon answers.

    With no daemon the real client prints "Cannot find MPS control daemon process"
    and exits 1 (seen on driver 580), hence "non-zero exit = nobody answers".
    """
    binary = binary or find_control_binary()
    proc = _run([binary], env=_client_env(dirs), timeout=timeout, input_text=command + "\n")
    if proc.returncode != 0:
        logger.debug(
            "%s %r on %s: rc=%d out=%r err=%r",
            CONTROL_BINARY, command, dirs.pipe_dir, proc.returncode, proc.stdout, proc.stderr,
        )
        return None
    return proc.stdout


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(tok) for tok in text.split() if tok.isdigit())


def read_status(
    dirs: MpsDirs, *, timeout: float = DEFAULT_TIMEOUT_S, binary: Optional[str] = None
) -> MpsStatus:
    binary = binary or find_control_binary()
    listing = send_command("get_server_list", dirs, timeout=timeout, binary=binary)
    record = _read_record(dirs)
    if listing is None:
        return MpsStatus(str(dirs.pipe_dir), False, None, (), record)
    servers = []
    for pid in _pids(listing):
        clients = send_command(f"get_client_list {pid}", dirs, timeout=timeout, binary=binary)
        servers.append(MpsServer(pid, _pids(clients or "")))
    return MpsStatus(str(dirs.pipe_dir), True, _read_daemon_pid(dirs), tuple(servers), record)


def parse_cuda_version(nvidia_smi_output: str) -> Optional[tuple[int, int]]:
    """The driver's CUDA version from the ``CUDA Version: X.Y`` field of nvidia-smi's header."""
    match = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", nvidia_smi_output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def detect_cuda_version(timeout: float = DEFAULT_TIMEOUT_S) -> Optional[tuple[int, int]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = _run([smi], env=os.environ, timeout=timeout)
    except MpsError as exc:
        logger.warning("could not read the CUDA version from nvidia-smi: %s", exc)
        return None
    return parse_cuda_version(proc.stdout)


def decide_multiuser_server(
    mode: str, binary: str, *, timeout: float = DEFAULT_TIMEOUT_S
) -> MultiuserDecision:
    if mode not in MULTIUSER_MODES:
        raise MpsError(f"--multiuser-server must be one of {', '.join(MULTIUSER_MODES)}, got {mode!r}")
    if mode == "on":
        return MultiuserDecision(True, "--multiuser-server on")
    if mode == "off":
        return MultiuserDecision(False, "--multiuser-server off")
    try:
        proc = _run([binary, "--help"], env=os.environ, timeout=timeout)
        help_text = proc.stdout + proc.stderr
    except MpsError as exc:
        logger.debug("%s --help failed: %s", binary, exc)
        help_text = ""
    if MULTIUSER_SERVER_FLAG in help_text:
        return MultiuserDecision(True, f"{CONTROL_BINARY} --help lists {MULTIUSER_SERVER_FLAG}")
    if re.search(r"(^|[\s\[|])-d\b", help_text):
        return MultiuserDecision(False, f"{CONTROL_BINARY} --help does not list {MULTIUSER_SERVER_FLAG}")
    cuda = detect_cuda_version(timeout)
    if cuda is None:
        return MultiuserDecision(False, "CUDA version unknown (no nvidia-smi header)")
    shown = f"{cuda[0]}.{cuda[1]}"
    if cuda >= MULTIUSER_SERVER_MIN_CUDA:
        return MultiuserDecision(True, f"driver CUDA {shown} >= 12.8")
    return MultiuserDecision(False, f"driver CUDA {shown} < 12.8")


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


# --------------------------------------------------------------------------- actions


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
        proc = _run(argv, env=_daemon_env(dirs), timeout=timeout)
        if proc.returncode != 0 and decision.use and multiuser_server == "auto":
            logger.warning(
                "%s refused %s (rc=%d: %s); retrying without it",
                CONTROL_BINARY, MULTIUSER_SERVER_FLAG, proc.returncode, (proc.stdout + proc.stderr).strip(),
            )
            decision = MultiuserDecision(False, f"the daemon refused {MULTIUSER_SERVER_FLAG}")
            argv = [binary, "-d"]
            proc = _run(argv, env=_daemon_env(dirs), timeout=timeout)
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
        _wait_for(lambda: _read_daemon_pid(dirs) is not None, min(timeout, 2.0))
        record = StartRecord(
            control_pid=_read_daemon_pid(dirs),
            pipe_dir=str(dirs.pipe_dir),
            log_dir=str(dirs.log_dir),
            multiuser_server=decision.use,
            command=tuple(argv),
            started_at=time.time(),
            started_by_pid=os.getpid(),
        )
        _write_record(dirs, record)
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
        record = _read_record(dirs)
        if not answering():
            if record is not None:
                logger.info("removing the stale record %s (its daemon no longer answers)", dirs.state_file)
                dirs.state_file.unlink(missing_ok=True)
            logger.info("no MPS control daemon answers on %s; nothing to stop", dirs.pipe_dir)
            return False
        current_pid = _read_daemon_pid(dirs)
        if not force and not _owns(record, current_pid):
            raise MpsNotStartedByUs(
                f"the MPS control daemon on {dirs.pipe_dir} (pid {current_pid}) was not started by "
                f"sglang-edgeacc (no matching {STATE_FILE_NAME}); leaving it running. Stop it yourself "
                f"with `echo quit | CUDA_MPS_PIPE_DIRECTORY={dirs.pipe_dir} {CONTROL_BINARY}`, "
                "or pass --force"
            )
        logger.info("stopping the MPS control daemon on %s (pid %s)", dirs.pipe_dir, current_pid)
        proc = _run([binary], env=_client_env(dirs), timeout=timeout, input_text="quit\n")
        if proc.returncode != 0:
            raise MpsError(
                f"`echo quit | {CONTROL_BINARY}` exited with {proc.returncode}: "
                f"{(proc.stdout + proc.stderr).strip() or 'no output'}"
            )
        pid = current_pid if current_pid is not None else (record.control_pid if record else None)
        gone = _wait_for(lambda: not _pid_alive(pid) and not answering(), timeout)
        if not gone:
            raise MpsError(
                f"the MPS control daemon on {dirs.pipe_dir} (pid {pid}) did not exit within "
                f"{timeout:g}s of `quit`; MPS clients may still be running "
                "(stop the server first), or end it with `kill <pid>`"
            )
        dirs.state_file.unlink(missing_ok=True)
        logger.info("MPS control daemon on %s stopped", dirs.pipe_dir)
        return True


def require_daemon(pipe_dir: Optional[str] = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Raise unless an MPS control daemon answers where the EdgeAcc children will look.

    The EdgeAcc launcher calls this before it spawns the prefill and decode
    sides with any SM split but ``none``: without a daemon, the CUDA driver
    ignores ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, the kernels of the two
    processes never overlap, and both sides would time-slice the whole GPU
    without saying so.
    """
    dirs = resolve_dirs(pipe_dir, None)
    hint = f"start one with `{START_COMMAND}`"
    if str(dirs.pipe_dir) != DEFAULT_PIPE_DIR:
        hint = f"start one with `{START_COMMAND} --pipe-dir {dirs.pipe_dir}`"
    try:
        binary = find_control_binary()
    except MpsControlNotFound as exc:
        raise MpsDaemonNotRunning(
            f"EdgeAcc's concurrent sides need the CUDA MPS control daemon, but {exc}"
        ) from exc
    if send_command("get_server_list", dirs, timeout=timeout, binary=binary) is None:
        raise MpsDaemonNotRunning(
            f"EdgeAcc's concurrent sides need a CUDA MPS control daemon, and none "
            f"answers on {PIPE_DIR_ENV}={dirs.pipe_dir}: {hint} (scripts/sglang_launch_server.sh "
            "does this for you), or pass --edge-acc-sm-partition none to let the sides time-slice."
        )
