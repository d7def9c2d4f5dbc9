"""Which MPS daemon is ours: the record ``start`` leaves in the pipe directory, and the test on it.

``start`` records what it launched in ``sglang-edgeacc-mps.json`` next to the
daemon's own pid file; ``stop`` and ``status`` call a daemon ours only when that
record names the pid now answering, so a daemon the host's administrator runs
is never stopped by us.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional

from sglang_edgeacc.mps.control import MpsDirs

logger = logging.getLogger(__name__)


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


def pid_alive(pid: Optional[int]) -> bool:
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


def read_record(dirs: MpsDirs) -> Optional[StartRecord]:
    try:
        return StartRecord.from_json(json.loads(dirs.state_file.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring unreadable MPS state file %s: %s", dirs.state_file, exc)
        return None


def write_record(dirs: MpsDirs, record: StartRecord) -> None:
    tmp = dirs.state_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    os.replace(tmp, dirs.state_file)


def owns(record: Optional[StartRecord], current_pid: Optional[int]) -> bool:
    if record is None:
        return False
    if record.control_pid is None or current_pid is None:
        # Without the daemon's pid file the record is the only evidence; trust it only
        # while the recorded process (when known) is still there.
        return record.control_pid is None or pid_alive(record.control_pid)
    return record.control_pid == current_pid
