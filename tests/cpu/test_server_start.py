"""A server that cannot start exits at once and leaves nothing behind; a killed server's leftovers are reclaimed.

Real servers on the edgeacc_cpu platform. Every wait has its own deadline, so a
regression fails in seconds to minutes instead of hanging CI:

* a taken HTTP port ends the launch before anything is spawned (patch ``http_port``);
* uvicorn failing to bind (the hold switched off to get there) ends the start
  within 10 s of the error (patch ``start_failure``; unpatched, the launcher waits 12 minutes);
* a decode side killed during an EdgeAcc ``--dp 2`` start ends it within 10 s,
  its orphaned prefill side included (patch ``start_failure``; unpatched, it hangs);
* the server's own processes cannot take its HTTP port (patch ``http_port``);
* a start after a ``kill -9`` of a whole EdgeAcc ``--tp 2`` server removes what
  that server left in /dev/shm, and nothing a live process or another user holds
  (patch ``shm_reclaim``).

``EDGEACC_TEST_PLATFORM=cuda`` runs the same cases in the real server on a GPU
(``tests/gpu/on_device.sh start-failure``): one GPU, so ``--tp``/``--dp`` are
dropped, and EdgeAcc runs without an SM split (the start path does not depend on it).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import psutil
import pytest

from sglang_edgeacc.server_start import shm_reclaim
from tests.fault_injection import edgeacc_faults
from tests.harness import SHM_DIR, STARTUP_TIMEOUT_S, SglangServer, assert_nothing_left, session_processes

pytestmark = pytest.mark.server

PLATFORM = os.environ.get("EDGEACC_TEST_PLATFORM", "cpu")
ON_GPU = PLATFORM == "cuda"
# Small pool and few graphs: these cases are about the start, not the serving.
GPU_ARGS = ("--mem-fraction-static", "0.3", "--cuda-graph-max-bs-decode", "4", "--edge-acc-sm-partition", "none")
EXIT_WITHIN_S = 10.0
BIND_ERROR = "error while attempting to bind on address"


def _server(*args: str) -> SglangServer:
    if not ON_GPU:
        return SglangServer(args=args)
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--tp", "--dp"):
            skip = True
        else:
            kept.append(arg)
    extra = GPU_ARGS if "--enable-edge-acc" in kept else GPU_ARGS[:4]
    return SglangServer(args=(*kept, *extra), platform="cuda")


def _wait_until(predicate, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    return None


def _listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


def _spawned_by_sglang(proc: psutil.Process) -> bool:
    """A scheduler or detokenizer (helpers the imports run, such as ldconfig, are not)."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.spawn" in cmdline or cmdline.startswith("sglang::")


def test_a_taken_http_port_ends_the_launch_before_anything_is_spawned():
    server = _server("--skip-server-warmup")
    with _listener(server.port):
        server.launch()
        try:
            def ended_or_spawned():
                if server.proc.poll() is not None:
                    return "ended"
                return "a scheduler was spawned" if any(map(_spawned_by_sglang, server.descendants())) else None

            # Unpatched, the launcher loads the model and then waits for ever: a child is the failure.
            outcome = _wait_until(ended_or_spawned, STARTUP_TIMEOUT_S, poll_s=0.05)
            assert outcome == "ended", f"the launch went on ({outcome}) with its port taken:\n{server.log_tail()}"
            assert server.proc.returncode != 0
            log = server.log_tail(20_000)
            assert f"--port {server.port}: the HTTP server cannot listen on 127.0.0.1:{server.port}" in log, log
            assert "Address already in use" in log and f"(pid {os.getpid()}:" in log
            assert "start with another --port" in log
            assert_nothing_left(server)
        finally:
            server.stop()


def test_an_http_server_that_cannot_bind_ends_the_start_within_10_s():
    """The hold is switched off so that uvicorn itself meets the taken port, after the whole start.

    With the warmup on, as by default: unpatched, uvicorn's lifespan shutdown then waits for the
    warmup thread, which polls the taken port 120 times, 6 s each."""
    server = _server()
    env = edgeacc_faults.server_env(**{edgeacc_faults.WITHOUT_PATCHES_ENV: "http_port"})
    with _listener(server.port):
        server.launch(env)
        try:
            failed_at = _wait_until(lambda: BIND_ERROR in server.log_tail(20_000) and time.monotonic(),
                                    STARTUP_TIMEOUT_S, poll_s=0.2)
            assert failed_at, f"uvicorn never tried to bind:\n{server.log_tail()}"
            exited = _wait_until(lambda: server.proc.poll() is not None, EXIT_WITHIN_S + 1)
            assert exited and time.monotonic() - failed_at < EXIT_WITHIN_S, \
                f"the launcher still runs {EXIT_WITHIN_S:.0f} s after uvicorn failed to bind:\n{server.log_tail()}"
            assert server.proc.returncode == 1
            log = server.log_tail(20_000)
            assert "[edgeacc] the server failed to start: --port" in log and "start with another --port" in log, log
            assert_nothing_left(server)
        finally:
            server.stop()


def _prefill_side_and_parent(server: SglangServer):
    for proc in server.descendants():
        try:
            if proc.name().startswith("sglang::scheduler_edgeacc_prefill"):
                return proc, proc.parent()
        except psutil.Error:
            continue
    return None


def test_a_decode_side_killed_during_a_dp_start_ends_it_within_10_s_with_its_prefill_side():
    """Unpatched, the data-parallel controller waits for the dead rank's "ready" for good."""
    server = _server("--dp", "2", "--enable-edge-acc", "--skip-server-warmup")
    server.launch()
    try:
        found = _wait_until(lambda: _prefill_side_and_parent(server) or server.proc.poll() is not None,
                            STARTUP_TIMEOUT_S, poll_s=0.2)
        assert found and found is not True, f"no prefill side came up:\n{server.log_tail()}"
        prefill, decode = found
        time.sleep(1.0)  # the guard notes processes and their names twice a second
        decode.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        exited = _wait_until(lambda: server.proc.poll() is not None, EXIT_WITHIN_S + 1)
        assert exited and time.monotonic() - killed_at < EXIT_WITHIN_S, \
            f"the launcher still runs {EXIT_WITHIN_S:.0f} s after a decode side was killed:\n{server.log_tail()}"
        assert server.proc.returncode == 1
        log = server.log_tail(50_000)
        named = rf"the server failed to start: \S+ \(pid {decode.pid}\) was killed by signal 9"
        if ON_GPU:
            # One GPU, so no --dp: upstream's launcher waits on its only scheduler and names the death first.
            named += r"|Rank 0 scheduler died during initialization \(exit code: -9\)"
        assert re.search(named, log), log
        assert not prefill.is_running() or prefill.status() == psutil.STATUS_ZOMBIE, "the prefill side lives on"
        assert_nothing_left(server)
    finally:
        server.stop()


def test_the_servers_own_processes_cannot_take_its_http_port():
    """Every process the server spawns tries to listen on the HTTP port as it starts, as a gloo
    listener the kernel gave that port would. The launcher holds it, so none gets it."""
    server = _server("--skip-server-warmup")
    try:
        server.start(env=edgeacc_faults.server_env(**{edgeacc_faults.TAKE_PORT_ENV: str(server.port)}))
        assert server.generate("The capital of France is", max_new_tokens=2)["meta_info"]["completion_tokens"] == 2
        log = server.log_tail(200_000)
        assert f"could not take port {server.port}" in log, "the fault never ran: the test would prove nothing"
        assert f"took port {server.port}" not in log
    finally:
        server.stop()


def _pid_of_a_process_that_exited() -> int:
    proc = psutil.Popen(["true"])
    proc.wait()
    return proc.pid


def _entries_used_by(pids) -> set[str]:
    """Names in /dev/shm that ``pids`` map or hold open; semaphores are mapped under another name: by inode."""
    held = shm_reclaim.in_use(pids=pids)
    found = set()
    for name in os.listdir(SHM_DIR):
        try:
            info = os.stat(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            continue
        if held.holds(name, info.st_dev, info.st_ino):
            found.add(name)
    return found


def test_a_start_reclaims_what_a_killed_server_left_and_nothing_anyone_holds():
    killed = _server("--enable-edge-acc", "--tp", "2", "--skip-server-warmup").start()
    try:
        killed.observe()
        used = _entries_used_by(killed.seen_pids)
        os.killpg(killed.proc.pid, signal.SIGKILL)  # the whole group, resource tracker included
        killed.proc.wait(timeout=30)
        _wait_until(lambda: not session_processes(killed.proc.pid), 30)
    finally:
        killed.stop(remove_shm=False)
    left = {name: shm_reclaim.classify(name)[0] for name in used & set(os.listdir(SHM_DIR))
            if shm_reclaim.classify(name)}
    # One rank on a GPU leaves fewer families (the TP message queues, sgl_shm_*, need --tp 2): any will do.
    expected = set() if ON_GPU else {"sgl_shm_*", "sglang_loads_*", "sem.mp-*"}
    assert left and expected <= set(left.values()), f"the kill left {left}: the test would prove nothing"
    sizes = {name: os.stat(os.path.join(SHM_DIR, name)).st_size for name in left}

    # Entries of the same families that the start must keep.
    import multiprocessing

    before = set(os.listdir(SHM_DIR))
    live_lock = multiprocessing.get_context("spawn").Lock()  # a semaphore this (live) process maps
    live_sems = {n for n in set(os.listdir(SHM_DIR)) - before if n.startswith("sem.mp-")}
    assert live_sems
    dead = _pid_of_a_process_that_exited()
    own = os.path.join(SHM_DIR, f"sgl_shm_mq_{os.getpid()}_0e0e0e0e")  # its creator is alive
    held = os.path.join(SHM_DIR, f"sgl_shm_mq_{dead}_0f0f0f0f")  # creator gone, a live process holds it
    other_user = os.path.join(SHM_DIR, f"sgl_shm_mq_{dead}_0d0d0d0d")  # creator gone, not this user's
    for path in (own, held, other_user):
        open(path, "wb").close()
    if os.geteuid() == 0:
        os.chown(other_user, 65534, 65534)
    holder = open(held, "rb")
    keep = [own, held, *(os.path.join(SHM_DIR, n) for n in live_sems)]
    keep += [other_user] if os.geteuid() == 0 else []

    second = _server("--skip-server-warmup")
    try:
        # The leftovers are seconds old: the sweep's age rule is for a /dev/shm shared across containers.
        second.launch(env={shm_reclaim.MIN_AGE_ENV: "0"})
        # The sweep runs before sglang logs its server_args; unpatched, that line comes without it.
        _wait_until(lambda: "server_args=" in second.log_tail(200_000) or second.proc.poll() is not None,
                    STARTUP_TIMEOUT_S, poll_s=0.2)
        second.observe()
        line = re.search(r"\[edgeacc\] reclaimed (\d+) entries \(([\d.]+) MiB\)", second.log_tail(200_000))
        still_there = set(left) & set(os.listdir(SHM_DIR))
        # Every start with this patch sweeps /dev/shm: another server starting on the host may get there first.
        assert line, (f"the second start did not say what it reclaimed; {len(still_there)} of the {len(left)} "
                      f"leftovers are still there (none: another start took them first):\n{second.log_tail()}")
        assert not still_there, f"left by the killed server and not reclaimed: {sorted(still_there)}"
        assert int(line.group(1)) >= len(left)
        assert float(line.group(2)) >= round(sum(sizes.values()) / 2**20, 1) - 0.05
        for path in keep:
            assert os.path.exists(path), f"{path} was removed"
    finally:
        second.stop()
        holder.close()
        for path in (own, held, other_user):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        del live_lock
