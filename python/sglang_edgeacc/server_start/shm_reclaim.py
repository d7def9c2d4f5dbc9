"""At start, remove what killed sglang servers left in ``/dev/shm``.

A server whose processes are all killed at once (``kill -9`` of its process
group, a container stop, the OOM killer) runs no cleanup, and Python's resource
tracker, which would have removed the registered leftovers, is killed with it.
What stays behind, per server: upstream's message-queue ring buffers
(``sgl_shm_mq_<pid>_<hex>``, 24 MiB each with ``--tp`` 2 or more; two with
EdgeAcc), its load-snapshot file (``sglang_loads_*.shm``) and the processes'
``multiprocessing`` semaphores (``sem.mp-*``). A host that restarts servers
all day fills its ``/dev/shm`` with them.

An entry is removed only when all of these hold:

* its name is of one of those families (or upstream's other pid-stamped one,
  ``multi_tokenizer_args_<pid>``);
* it belongs to this user (never another user's);
* where the name carries the creating pid, no process with that pid exists;
* no process maps it or has it open (``/proc/*/maps`` and ``/proc/*/fd``, by
  name and by inode): a live process's entry is never touched. This is the only rule for the names
  without a pid (semaphores, load files): such an entry is created mapped or
  open, and stays so while any process uses it, so one that nobody holds has no
  user left. A process this user cannot read (another user's, or one the
  kernel hides) is taken not to use this user's entries: sglang creates them
  with mode 0600;
* it was last modified at least ``SGLANG_EDGEACC_SHM_RECLAIM_MIN_AGE_S``
  seconds ago (default 60).

The age rule is for a ``/dev/shm`` shared with processes this one cannot see
(containers run with ``--ipc=host``): there a server starting in another
container has fresh entries that no visible process holds yet. An entry a
running server opened long ago is safe to unlink anyway (its mappings and open
handles stay valid). ``SGLANG_EDGEACC_SHM_RECLAIM_MIN_AGE_S=off`` turns the
sweep off.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import time
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Optional

import psutil

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
MIN_AGE_ENV = "SGLANG_EDGEACC_SHM_RECLAIM_MIN_AGE_S"
DEFAULT_MIN_AGE_S = 60.0
# The largest pid Linux hands out (PID_MAX_LIMIT on 64-bit).
PID_LIMIT = 1 << 22

# (family shown in the log, pattern; group 1 is the creating pid where the name has one)
FAMILIES: tuple[tuple[str, re.Pattern], ...] = (
    ("sgl_shm_*", re.compile(r"sgl_shm_\w+?_(\d+)_[0-9a-f]+")),
    ("multi_tokenizer_args_*", re.compile(r"multi_tokenizer_args_(\d+)")),
    ("sglang_loads_*", re.compile(r"sglang_loads_.+\.shm")),
    ("sem.mp-*", re.compile(r"sem\.mp-[\w-]+")),
)


@dataclass(frozen=True)
class ShmEntry:
    """An entry the sweep may remove."""

    name: str
    family: str
    size: int
    file_id: tuple[int, int]  # (device, inode): finds it in maps under any name it was mapped by


@dataclass(frozen=True)
class Reclaimed:
    removed: tuple[ShmEntry, ...]
    kept_in_use: int

    @property
    def freed_bytes(self) -> int:
        return sum(entry.size for entry in self.removed)

    def summary(self) -> str:
        counts = Counter(entry.family for entry in self.removed)
        families = ", ".join(f"{n} {family}" for family, n in sorted(counts.items()))
        return (f"reclaimed {len(self.removed)} entries ({self.freed_bytes / 2**20:.1f} MiB) that exited "
                f"processes left in {SHM_DIR}: {families}")


def classify(name: str) -> Optional[tuple[str, Optional[int]]]:
    """(family, creating pid or None) of a name this module may reclaim, else None."""
    for family, pattern in FAMILIES:
        match = pattern.fullmatch(name)
        if match:
            pid = int(match.group(1)) if pattern.groups else None
            if pid is not None and pid > PID_LIMIT:
                return None  # no process has such a pid: not a name sglang stamped
            return family, (pid or None)
    return None


@dataclass(frozen=True)
class InUse:
    """What processes map or hold open under a directory: by name, and by (device, inode).

    A name alone is not enough: glibc's ``sem_open`` creates a semaphore under a
    temporary name, maps it, and only then links it to ``sem.mp-*``, so the maps
    of every process using it show the temporary name, long removed.
    """

    names: frozenset[str]
    inodes: frozenset[tuple[int, int]]

    def holds(self, name: str, device: int, inode: int) -> bool:
        return name in self.names or (device, inode) in self.inodes


def _map_device(field: str) -> Optional[int]:
    try:
        major, minor = field.split(":")
        return os.makedev(int(major, 16), int(minor, 16))
    except ValueError:
        return None


def in_use(shm_dir: str = SHM_DIR, pids: Optional[Iterable[int]] = None) -> InUse:
    """What every readable process (or ``pids``) maps or holds open under ``shm_dir``."""
    prefix = shm_dir.rstrip("/") + "/"
    if pids is None:
        pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    names, inodes = set(), set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        names.add(fields[5].rstrip("\n")[len(prefix):].removesuffix(" (deleted)"))
                        device = _map_device(fields[3])
                        if device is not None:
                            inodes.add((device, int(fields[4])))
            fd_dir = f"/proc/{pid}/fd"
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                    if not target.startswith(prefix):
                        continue
                    names.add(target[len(prefix):].removesuffix(" (deleted)"))
                    info = os.stat(f"{fd_dir}/{fd}")
                    inodes.add((info.st_dev, info.st_ino))
                except OSError:
                    continue
        except OSError:  # gone meanwhile, or another user's
            continue
    return InUse(frozenset(names), frozenset(inodes))


def min_age_s() -> Optional[float]:
    """The age an entry needs before the sweep may remove it; None: the sweep is off."""
    value = os.environ.get(MIN_AGE_ENV, "").strip().lower()
    if not value:
        return DEFAULT_MIN_AGE_S
    if value == "off":
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        raise ValueError(f"{MIN_AGE_ENV}={value!r}: give seconds (e.g. 60) or 'off'") from None


def _candidates(shm_dir: str, uid: int, min_age: float) -> list[ShmEntry]:
    found = []
    now = time.time()
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return found
    for name in names:
        kind = classify(name)
        if kind is None:
            continue
        try:
            info = os.lstat(os.path.join(shm_dir, name))
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_uid != uid:
            continue
        if now - info.st_mtime < min_age:
            continue
        family, pid = kind
        if pid is not None and psutil.pid_exists(pid):
            continue
        found.append(ShmEntry(name, family, info.st_size, (info.st_dev, info.st_ino)))
    return found


def reclaim(shm_dir: str = SHM_DIR, min_age: Optional[float] = None) -> Reclaimed:
    """Remove this user's entries of dead processes that nobody holds; say what was freed.

    ``min_age`` defaults to :func:`min_age_s`'s; the sweep is off where that is None.
    """
    if min_age is None:
        min_age = min_age_s()
        if min_age is None:
            return Reclaimed((), 0)
    candidates = _candidates(shm_dir, os.geteuid(), min_age)
    if not candidates:
        return Reclaimed((), 0)
    held = in_use(shm_dir)
    removed, kept = [], 0
    for entry in candidates:
        if held.holds(entry.name, *entry.file_id):
            kept += 1
            continue
        try:
            os.unlink(os.path.join(shm_dir, entry.name))
        except FileNotFoundError:
            continue  # removed meanwhile (by a resource tracker, or another server starting)
        except OSError as exc:
            logger.warning("[edgeacc] could not remove %s/%s: %s", shm_dir, entry.name, exc)
            continue
        removed.append(entry)
    return Reclaimed(tuple(removed), kept)


def reclaim_and_log(shm_dir: str = SHM_DIR) -> Reclaimed:
    result = reclaim(shm_dir)
    if result.removed:
        logger.info("[edgeacc] %s", result.summary())
    return result
