"""The processes a launcher started, followed until the server is ready.

Every descendant is noted as it appears (``psutil`` handles, which tell a
reused pid from the process that had it), so a process whose parent died is
still known after the kernel gave it another parent, and can be taken down.

A descendant is a *server process* when sglang named it (``sglang::scheduler``,
``sglang::detokenizer``, ``sglang::data_parallel_controller``, an EdgeAcc
prefill side ``sglang::scheduler_edgeacc_prefill...``) or, before its imports
let it set that name, when it is a ``multiprocessing`` spawn child of the
launcher or of a process sglang named (a spawn child of some other tool a
scheduler runs is that tool's business). A child that a named process forked
carries its parent's name until it execs (a compiler run through
``subprocess``, a worker pool of ``fork``): it is the parent's helper, not a
server process, and its end is the parent's business too. Python's
resource tracker is not one: it lives until the last process that uses it is
gone, and then removes the semaphores and shared memory they left registered.

A server process has *ended* when it is gone or a zombie. A zombie's exit status
is still in ``/proc/<pid>/stat``; a process its parent already reaped has none.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Optional

import psutil

NAME_PREFIX = "sglang::"
SPAWN_MARK = "multiprocessing.spawn"
TRACKER_MARK = "multiprocessing.resource_tracker"
# /proc/<pid>/stat, counted from the field after the command name: 52nd field overall.
_EXIT_CODE_FIELD = 49


@dataclass(frozen=True)
class Ended:
    """A server process that ended; ``status`` is the wait status, None where nobody can know it."""

    pid: int
    name: str
    status: Optional[int]

    def counts_as_failure(self) -> bool:
        # A process sglang named is one the server needs; a spawn child that is not
        # named yet (still importing) or never will be (a helper) counts when it failed.
        if self.name.startswith(NAME_PREFIX):
            return True
        return self.status is not None and self.status != 0

    @property
    def killed_by(self) -> Optional[int]:
        if self.status is not None and os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        return None

    def describe(self) -> str:
        if self.status is None:
            how = "exited"
        elif self.killed_by is not None:
            try:
                sig_name = signal.Signals(self.killed_by).name
            except ValueError:
                sig_name = str(self.killed_by)
            how = f"was killed by signal {self.killed_by} ({sig_name})"
        else:
            how = f"exited with code {os.WEXITSTATUS(self.status)}"
        return f"{self.name} (pid {self.pid}) {how}"


def _exit_status(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        return int(stat[stat.rindex(")") + 2:].split()[_EXIT_CODE_FIELD])
    except (OSError, ValueError, IndexError):
        return None


def _sglang_name(cmdline: str, name: str) -> Optional[str]:
    if cmdline.startswith(NAME_PREFIX):
        return cmdline.split()[0]
    return name if name.startswith(NAME_PREFIX) else None


def _names(proc: psutil.Process) -> tuple[str, str]:
    """(command line, process name); empty for a process that is gone."""
    try:
        return " ".join(proc.cmdline()), proc.name()
    except psutil.Error:
        return "", ""


def _label(proc: psutil.Process, spawned_by_server: bool) -> tuple[str, bool]:
    """(name to report, whether it is a server process) of a live process."""
    cmdline, name = _names(proc)
    if not cmdline and not name:
        return "", False
    own = _sglang_name(cmdline, name)
    if own is not None:
        try:
            parent = proc.parent()
        except psutil.Error:
            parent = None
        if parent is not None and _sglang_name(*_names(parent)) == own:
            return f"a child of {own} (pid {parent.pid})", False
        return own, True
    if TRACKER_MARK in cmdline:
        return "resource tracker", False
    if SPAWN_MARK in cmdline:
        return "a process sglang spawned (still importing, not named yet)", spawned_by_server
    return name, False


class ServerProcesses:
    """The descendants of ``root_pid`` seen so far."""

    def __init__(self, root_pid: int):
        self._root = psutil.Process(root_pid)
        self._seen: dict[int, psutil.Process] = {}
        self._labels: dict[int, tuple[str, bool]] = {}
        self._reported: set[int] = set()
        # The guard's thread observes while a failure or the launcher's exit may ask what is alive.
        self._lock = threading.Lock()
        # What the process already ran before the launch (sglang embedded in a program that has
        # children of its own), and what those start later, is not the launch's: never killed.
        self._foreign: dict[int, psutil.Process] = {proc.pid: proc for proc in self._descendants()}

    def _descendants(self) -> list[psutil.Process]:
        """Parents before their children (psutil walks the tree from the root)."""
        try:
            return self._root.children(recursive=True)
        except psutil.Error:
            return []

    def _is_foreign(self, proc: psutil.Process) -> bool:
        known = self._foreign.get(proc.pid)
        if known is not None:
            if known == proc:
                return True
            del self._foreign[proc.pid]  # that process is gone; its pid now names another
        try:
            parent = proc.ppid()
        except psutil.Error:
            return False
        if parent in self._foreign:
            self._foreign[proc.pid] = proc
            return True
        return False

    def _note_descendants(self) -> None:
        for proc in self._descendants():
            if self._is_foreign(proc):
                continue
            known = self._seen.get(proc.pid)
            if known is None or known != proc:  # new, or a reused pid: the process that had it is gone
                self._seen[proc.pid] = proc
                self._labels.pop(proc.pid, None)
                self._reported.discard(proc.pid)

    def observe(self) -> list[Ended]:
        """Note new descendants; return the server processes that ended since the last call."""
        with self._lock:
            return self._observe()

    def _observe(self) -> list[Ended]:
        self._note_descendants()
        ended = []
        for pid, proc in self._seen.items():
            if pid in self._reported:
                continue
            status = self._ended_status(proc)
            if status is False:
                label = _label(proc, self._spawned_by_server(proc))
                if label[0]:
                    self._labels[pid] = label  # a process renames itself once its imports are done
                continue
            name, is_server = self._labels.get(pid, ("", False))
            self._reported.add(pid)
            if is_server:
                ended.append(Ended(pid, name, status))
        return ended

    def _spawned_by_server(self, proc: psutil.Process) -> bool:
        try:
            parent = proc.ppid()
        except psutil.Error:
            return False
        return parent == self._root.pid or self._labels.get(parent, ("", False))[0].startswith(NAME_PREFIX)

    @staticmethod
    def _ended_status(proc: psutil.Process):
        """False while running; else the exit status (None once reaped)."""
        try:
            if not proc.is_running():
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return _exit_status(proc.pid)
        except psutil.NoSuchProcess:
            return None
        except psutil.Error:
            return False
        return False

    def alive(self) -> list[psutil.Process]:
        """Every process seen (or a descendant now) that still runs, resource trackers left out."""
        with self._lock:
            self._note_descendants()
            seen = list(self._seen.items())
        running = []
        for pid, proc in seen:
            if self._ended_status(proc) is not False:
                continue
            label = _label(proc, False)
            if label[0] == "resource tracker" or self._labels.get(pid, ("",))[0] == "resource tracker":
                continue
            running.append(proc)
        return running


def _still_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def kill_all(procs: Iterable[psutil.Process], wait_s: float = 3.0) -> list[psutil.Process]:
    """SIGKILL ``procs``; return those still running after ``wait_s``.

    A killed process counts as gone once it is a zombie: whoever adopted it reaps
    it, which in a container whose init does not reap may be never.
    """
    targets = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
        except psutil.Error:
            pass
        targets.append(proc)
    deadline = time.monotonic() + wait_s
    while True:
        targets = [proc for proc in targets if _still_running(proc)]
        if not targets or time.monotonic() >= deadline:
            return targets
        time.sleep(0.05)
