"""The rules of the start-up sweep of /dev/shm, on real files and real processes (no server).

The sweep runs on a directory of this test's own, so that nothing of the host is
touched; the processes that hold entries are real, and are read through /proc
exactly as the sweep reads every process at a server start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sglang_edgeacc.server_start import shm_reclaim

# Holds FILE open (mode "open") or mapped with the descriptor closed (mode "map") until stdin closes.
_HOLDER = textwrap.dedent(
    """
    import mmap, os, sys
    path, mode = sys.argv[1], sys.argv[2]
    fd = os.open(path, os.O_RDWR)
    if mode == "map":
        mapped = mmap.mmap(fd, 4096)
        os.close(fd)
    print("holding", flush=True)
    sys.stdin.read()
    """
)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _entry(directory, name: str, size: int = 4096) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


@pytest.fixture
def holders():
    started = []

    def hold(path: str, mode: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", _HOLDER, path, mode], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "holding"
        started.append(proc)
        return proc

    yield hold
    for proc in started:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_only_leftovers_of_dead_processes_that_nobody_holds_are_removed(tmp_path, holders):
    dead, me = _dead_pid(), os.getpid()
    garbage = {
        f"sgl_shm_mq_{dead}_0a1b2c3d": 3 * 4096,
        "sglang_loads_tmpabc_1234abcd.shm": 4096,
        "sem.mp-x1y2z3_q": 32,
        f"multi_tokenizer_args_{dead}": 4096,
    }
    kept = {
        f"sgl_shm_mq_{me}_0a1b2c3d": "its creator (this test) is alive",
        f"sgl_shm_mq_{dead}_feedbeef": "a live process has it open",
        "sem.mp-heldbymap": "a live process maps it (descriptor closed)",
        "sglang_loads_held_0000beef.shm": "a live process has it open",
        "torch_123_456_7": "not a family the sweep owns",
        "sem.loky-abc": "not a family the sweep owns",
        "unrelated": "not a family the sweep owns",
    }
    for name, size in garbage.items():
        _entry(tmp_path, name, size)
    for name in kept:
        _entry(tmp_path, name)
    holders(str(tmp_path / f"sgl_shm_mq_{dead}_feedbeef"), "open")
    holders(str(tmp_path / "sem.mp-heldbymap"), "map")
    holders(str(tmp_path / "sglang_loads_held_0000beef.shm"), "open")
    os.symlink(tmp_path / "unrelated", tmp_path / f"sgl_shm_link_{dead}_abcdef01")

    result = shm_reclaim.reclaim(str(tmp_path), min_age=0)

    assert sorted(e.name for e in result.removed) == sorted(garbage)
    assert result.freed_bytes == sum(garbage.values())
    left = set(os.listdir(tmp_path))
    for name, why in kept.items():
        assert name in left, f"{name} was removed although {why}"
    assert f"sgl_shm_link_{dead}_abcdef01" in left, "a symlink is not a shared-memory entry"
    assert result.kept_in_use == 3
    summary = result.summary()
    assert summary.startswith(f"reclaimed 4 entries ({sum(garbage.values()) / 2**20:.1f} MiB)")
    assert "1 sem.mp-*" in summary and "1 sgl_shm_*" in summary and "1 sglang_loads_*" in summary


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user needs root")
def test_another_users_leftover_is_never_removed(tmp_path):
    dead = _dead_pid()
    path = _entry(tmp_path, f"sgl_shm_mq_{dead}_0a1b2c3d")
    sem = _entry(tmp_path, "sem.mp-otheruser")
    for p in (path, sem):
        os.chown(p, 65534, 65534)
    assert shm_reclaim.reclaim(str(tmp_path), min_age=0).removed == ()
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(path), "sem.mp-otheruser"])


def test_a_real_multiprocessing_semaphore_of_a_live_process_is_kept():
    """The live semaphores in the real /dev/shm: this process's own lock must survive a sweep."""
    import multiprocessing

    before = set(os.listdir(shm_reclaim.SHM_DIR))
    lock = multiprocessing.get_context("spawn").Lock()
    ours = {n for n in set(os.listdir(shm_reclaim.SHM_DIR)) - before if n.startswith("sem.mp-")}
    assert ours, "a spawn-context lock has a name in /dev/shm"
    held = shm_reclaim.in_use(pids=[os.getpid()])
    for name in ours:  # mapped under the temporary name glibc created it with: only the inode tells
        info = os.stat(os.path.join(shm_reclaim.SHM_DIR, name))
        assert held.holds(name, info.st_dev, info.st_ino)
    removed = shm_reclaim.reclaim(min_age=0)
    assert not ours & {e.name for e in removed.removed}
    assert ours <= set(os.listdir(shm_reclaim.SHM_DIR))
    del lock


def test_fresh_leftovers_wait_for_the_minimum_age_and_the_sweep_can_be_turned_off(tmp_path, monkeypatch):
    """A /dev/shm shared with unseen processes may hold a starting server's fresh entries: they are kept."""
    dead = _dead_pid()
    fresh = _entry(tmp_path, f"sgl_shm_mq_{dead}_0a1b2c3d")
    old = _entry(tmp_path, "sem.mp-oldleftover")
    an_hour_ago = os.path.getmtime(old) - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))

    monkeypatch.delenv(shm_reclaim.MIN_AGE_ENV, raising=False)
    assert [e.name for e in shm_reclaim.reclaim(str(tmp_path)).removed] == ["sem.mp-oldleftover"]
    assert os.path.exists(fresh)

    os.utime(fresh, (an_hour_ago, an_hour_ago))
    monkeypatch.setenv(shm_reclaim.MIN_AGE_ENV, "off")
    assert shm_reclaim.reclaim(str(tmp_path)).removed == ()
    assert os.path.exists(fresh)
    monkeypatch.setenv(shm_reclaim.MIN_AGE_ENV, "soon")
    with pytest.raises(ValueError, match="SGLANG_EDGEACC_SHM_RECLAIM_MIN_AGE_S='soon'"):
        shm_reclaim.reclaim(str(tmp_path))


@pytest.mark.parametrize("name, family, pid", [
    ("sgl_shm_mq_1234_0a1b2c3d", "sgl_shm_*", 1234),
    ("sgl_shm_mq_1234_12345678", "sgl_shm_*", 1234),
    ("multi_tokenizer_args_77", "multi_tokenizer_args_*", 77),
    ("sglang_loads_tmpx_0011aabb.shm", "sglang_loads_*", None),
    ("sem.mp-abc_12", "sem.mp-*", None),
    ("sgl_shm_mq_0_0a1b", "sgl_shm_*", None),  # pid 0 names no process
])
def test_names_are_classified(name, family, pid):
    assert shm_reclaim.classify(name) == (family, pid)


@pytest.mark.parametrize("name", ["torch_1_2_3", "sem.loky-x", "sglang_loads_x", "nccl-1", "sgl_shm_mq"])
def test_other_names_are_not_the_sweeps(name):
    assert shm_reclaim.classify(name) is None
