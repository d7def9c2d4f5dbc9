"""The start guard on real processes, without sglang: a launcher, its children and an orphan.

A small launcher runs the guard as ``launch_server`` does and starts, with the
``spawn`` context as sglang does, a process named like a scheduler that starts a
child of its own (as a decode side starts its prefill side), and a second child.
Killing the "scheduler" leaves its child an orphan that a tree kill from the
launcher no longer finds. The guarded launcher must exit 1 within seconds,
naming the process, with the orphan and the sibling gone; without the guard the
launcher keeps waiting, as upstream's did under ``--dp``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

_LAUNCHER = textwrap.dedent(
    """
    import logging, multiprocessing as mp, sys, time

    def _grandchild():
        time.sleep(600)

    def _scheduler(report):
        import setproctitle
        setproctitle.setproctitle("sglang::scheduler_guard_test")
        child = mp.get_context("spawn").Process(target=_grandchild)
        child.start()
        report.send(child.pid)
        time.sleep(600)

    if __name__ == "__main__":
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        if sys.argv[1] == "guarded":
            from sglang_edgeacc.server_start import start_guard
            start_guard.start("", 0)
        ctx = mp.get_context("spawn")
        reader, writer = ctx.Pipe(duplex=False)
        scheduler = ctx.Process(target=_scheduler, args=(writer,))
        scheduler.start()
        sibling = ctx.Process(target=time.sleep, args=(600,))
        sibling.start()
        print("PIDS", scheduler.pid, reader.recv(), sibling.pid, flush=True)
        reader.recv()  # a "ready" that never comes: the pipe's writer lives on in the orphan
    """
)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("mode", ["guarded", "unguarded"])
def test_a_killed_server_process_ends_a_guarded_start_and_takes_the_orphan_down(tmp_path, mode):
    script = tmp_path / "launcher.py"
    script.write_text(_LAUNCHER)
    log = tmp_path / "launcher.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, stderr=out,
                                    text=True, start_new_session=True)
    try:
        line = launcher.stdout.readline().split()
        assert line[:1] == ["PIDS"], log.read_text()
        scheduler, orphan, sibling = (int(x) for x in line[1:])
        time.sleep(1.5)  # the guard notes the processes and their names twice a second
        os.kill(scheduler, signal.SIGKILL)
        killed = time.monotonic()
        if mode == "unguarded":
            time.sleep(3)
            assert launcher.poll() is None and _running(orphan), "without the guard the launcher waits on"
            return
        launcher.wait(timeout=10)
        assert time.monotonic() - killed < 10
        assert launcher.returncode == 1
        text = log.read_text()
        assert f"sglang::scheduler_guard_test (pid {scheduler}) was killed by signal 9 (SIGKILL)" in text, text
        assert "the server failed to start" in text
        assert not _running(orphan), "the orphan of the killed process is still running"
        assert not _running(sibling), "a sibling is still running"
    finally:
        # Every process of the test launcher is in its process group, the orphan included.
        try:
            os.killpg(launcher.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        launcher.wait(timeout=10)


def test_what_ran_before_the_launch_is_not_the_launchs():
    """sglang embedded in a program with children of its own: at a failure those are not taken down."""
    from sglang_edgeacc.server_start.server_processes import ServerProcesses

    # Started before the launch; its own child comes later, as a program's worker pool grows.
    before = subprocess.Popen(["sh", "-c", "sleep 0.5; sleep 60 & wait"], start_new_session=True)
    try:
        processes = ServerProcesses(os.getpid())
        ours = subprocess.Popen(["sleep", "60"])
        try:
            time.sleep(1.5)
            assert len(psutil.Process(before.pid).children()) == 1, "the program's later child never came"
            assert {proc.pid for proc in processes.alive()} == {ours.pid}
        finally:
            ours.kill()
            ours.wait(timeout=10)
    finally:
        os.killpg(before.pid, signal.SIGKILL)
        before.wait(timeout=10)


_FORKING_SCHEDULER = textwrap.dedent(
    """
    import os, sys, time
    import setproctitle
    setproctitle.setproctitle("sglang::scheduler_fork_test")
    for _ in range(2):
        child = os.fork()
        if child == 0:  # as a compiler run through subprocess is, before its exec
            time.sleep(0.8)
            os._exit(0)
        print("CHILD", child, flush=True)
        os.waitpid(child, 0)
    print("DONE", flush=True)
    time.sleep(60)
    """
)


def test_a_child_a_server_process_forks_is_not_a_server_process():
    """A fork of a scheduler carries the scheduler's name until it execs; its end is no failed start."""
    from sglang_edgeacc.server_start.server_processes import ServerProcesses

    processes = ServerProcesses(os.getpid())
    scheduler = subprocess.Popen([sys.executable, "-c", _FORKING_SCHEDULER], stdout=subprocess.PIPE, text=True)
    try:
        children, ended = [], []
        for line in scheduler.stdout:
            if line.startswith("DONE"):
                break
            children.append(int(line.split()[1]))
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:  # several looks while the fork runs under the inherited name
                ended += processes.observe()
                time.sleep(0.2)
        ended += processes.observe()
        assert len(children) == 2
        assert ended == [], [e.describe() for e in ended]
        scheduler.kill()
        scheduler.wait(timeout=10)
        deadline = time.monotonic() + 5
        while not ended and time.monotonic() < deadline:
            ended += processes.observe()
            time.sleep(0.1)
        assert [e.name for e in ended] == ["sglang::scheduler_fork_test"], "the scheduler's own end is still seen"
    finally:
        scheduler.kill()
        scheduler.wait(timeout=10)
