"""What answers on an MPS pipe directory: the daemon, its servers and their clients, and whether it is ours."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from sglang_edgeacc.mps.control import (
    DEFAULT_TIMEOUT_S,
    MpsDirs,
    find_control_binary,
    read_daemon_pid,
    send_command,
)
from sglang_edgeacc.mps.ownership import StartRecord, owns, read_record


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
        return self.answering and owns(self.record, self.control_pid)

    def to_json(self) -> dict:
        return {
            "pipe_dir": self.pipe_dir,
            "answering": self.answering,
            "control_pid": self.control_pid,
            "started_by_us": self.started_by_us,
            "servers": [{"pid": s.pid, "clients": list(s.clients)} for s in self.servers],
            "record": asdict(self.record) if self.record is not None else None,
        }


def _pids(text: str) -> tuple[int, ...]:
    return tuple(int(tok) for tok in text.split() if tok.isdigit())


def read_status(
    dirs: MpsDirs, *, timeout: float = DEFAULT_TIMEOUT_S, binary: Optional[str] = None
) -> MpsStatus:
    binary = binary or find_control_binary()
    listing = send_command("get_server_list", dirs, timeout=timeout, binary=binary)
    record = read_record(dirs)
    if listing is None:
        return MpsStatus(str(dirs.pipe_dir), False, None, (), record)
    servers = []
    for pid in _pids(listing):
        clients = send_command(f"get_client_list {pid}", dirs, timeout=timeout, binary=binary)
        servers.append(MpsServer(pid, _pids(clients or "")))
    return MpsStatus(str(dirs.pipe_dir), True, read_daemon_pid(dirs), tuple(servers), record)
