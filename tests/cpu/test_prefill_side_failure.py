"""A failing prefill side must take its decode side down through the decode side's error path.

Real processes and real signals: a "decode side" process that blocks waiting for its
child, as the decode side does while its prefill side starts, and a "prefill side"
child that fails the way upstream's scheduler process does (SIGQUIT to its parent).
"""

from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest


# What upstream's scheduler error path does, in a process of its own.
_PREFILL_SIDE_THAT_FAILS = (
    "import psutil, signal, time; time.sleep(0.5); "
    "psutil.Process().parent().send_signal(signal.SIGQUIT); time.sleep(30)"
)


def _decode_side(install_handler: bool, result) -> None:
    from sglang_edgeacc.edge_acc_server.child_failure import PrefillSideFailed, fail_on_prefill_side_sigquit

    if install_handler:
        assert fail_on_prefill_side_sigquit("[test decode]")
    else:
        # The default action, whatever disposition this process inherited (an ignored
        # signal survives exec: a CI run once saw the decode side outlive the signal).
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    # The writer stays open here (the real prefill side holds it): "ready" never comes.
    reader, _writer = mp.get_context("spawn").Pipe(duplex=False)
    child = subprocess.Popen([sys.executable, "-c", _PREFILL_SIDE_THAT_FAILS])
    try:
        deadline = time.monotonic() + 45  # the child signals after 0.5 s; a loaded 2-core CI box is slow
        while not reader.poll(0.2) and time.monotonic() < deadline:  # as the decode side waits for "ready"
            pass
        result.put("no signal seen")
    except PrefillSideFailed as exc:  # the decode side's error path runs: here, report it
        result.put(f"error path: {exc}")
    finally:
        child.kill()


@pytest.mark.parametrize("install_handler", [True, False], ids=["handler", "default"])
def test_prefill_side_sigquit_reaches_the_decode_sides_error_path(install_handler):
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    decode = ctx.Process(target=_decode_side, args=(install_handler, result))
    decode.start()
    decode.join(90)
    assert not decode.is_alive()
    if install_handler:
        assert decode.exitcode == 0
        message = result.get(timeout=5)
        assert message.startswith("error path:") and "prefill side failed" in message
    else:
        # What the handler exists for: by default the signal kills the decode side outright,
        # and nothing it would have told its own parent gets told.
        assert decode.exitcode == -signal.SIGQUIT
        assert result.empty()


def test_upstream_scheduler_error_path_still_signals_its_parent():
    """The contract the handler relies on, read from the installed sglang."""
    from sglang.srt.managers import scheduler

    source = inspect.getsource(scheduler.run_scheduler_process)
    assert "parent_process.send_signal(signal.SIGQUIT)" in source


def test_only_the_main_thread_can_install_it():
    import threading

    from sglang_edgeacc.edge_acc_server import child_failure
    from sglang_edgeacc.edge_acc_server.child_failure import fail_on_prefill_side_sigquit

    seen = []
    thread = threading.Thread(target=lambda: seen.append(fail_on_prefill_side_sigquit("[test]")))
    thread.start()
    thread.join()
    assert seen == [False]
    assert signal.getsignal(signal.SIGQUIT) is not child_failure._raise_prefill_side_failed


# A prefill side as far as binding to its decode side goes: "imports" (the sleep), binds, then
# waits as for the shared state. It writes "bound" once it is past the check.
_PREFILL_SIDE_THAT_BINDS = (
    "import pathlib, sys, time; time.sleep(float(sys.argv[1])); "
    "from sglang_edgeacc.edge_acc_server.child_failure import die_with_decode_side; "
    "die_with_decode_side('[test prefill]'); pathlib.Path(sys.argv[2]).write_text('bound'); time.sleep(120)"
)


def _decode_side_that_dies(import_s: float, marker: str, log: str, pids) -> None:
    from sglang_edgeacc.edge_acc_server import roles

    env = {**os.environ, roles.DECODE_PID_ENV: str(os.getpid())}
    with open(log, "w") as out:
        child = subprocess.Popen([sys.executable, "-c", _PREFILL_SIDE_THAT_BINDS, str(import_s), marker],
                                 env=env, stdout=out, stderr=subprocess.STDOUT)
    pids.send(child.pid)  # a pipe, not a queue: os._exit below would drop a queue's buffer
    if import_s == 0:  # die once the child is bound; else die at once, while it is still "importing"
        deadline = time.monotonic() + 60
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
    os._exit(0)  # no cleanup, as under SIGKILL


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("dies", ["while_the_prefill_side_starts", "after_it_is_bound"])
def test_a_prefill_side_does_not_outlive_its_decode_side(dies, tmp_path):
    """CI found a prefill side left behind: its decode side was killed while it was still importing,
    before upstream arms the parent-death signal, and it then waited for shared state that never came."""
    ctx = mp.get_context("spawn")
    pids, pid_writer = ctx.Pipe(duplex=False)
    marker, log = tmp_path / "bound", tmp_path / "prefill.log"
    import_s = 3.0 if dies == "while_the_prefill_side_starts" else 0.0
    decode = ctx.Process(target=_decode_side_that_dies, args=(import_s, str(marker), str(log), pid_writer))
    decode.start()
    assert pids.poll(60), "the decode side never started its prefill side"
    child = pids.recv()
    decode.join(60)
    deadline = time.monotonic() + 60
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert _gone(child), f"the prefill side outlived its decode side:\n{log.read_text()}"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
    if import_s:
        assert not marker.exists()
        assert "exited while this prefill side was starting" in log.read_text()
    else:
        assert marker.read_text() == "bound"  # killed by the kernel, not by the check


def test_a_signal_during_the_handover_keeps_its_own_error():
    """A prefill side that fails once it has the shared state may signal while the decode side still
    waits for the handover to finish: its decode side must report that failure, not a child that
    "exited with code None" (PrefillSideFailed is a PeerLost, which the wait turns into that)."""
    import threading

    from sglang_edgeacc.edge_acc_server.channel import PeerLost
    from sglang_edgeacc.edge_acc_server.child_failure import PrefillSideFailed, fail_on_prefill_side_sigquit
    from sglang_edgeacc.edge_acc_server.prefill_link import PrefillLink

    class Handover:  # the background send, still running when the signal comes
        def wait(self):
            os.kill(os.getpid(), signal.SIGQUIT)
            threading.Event().wait(5)

    child = mp.get_context("spawn").Process(target=time.sleep, args=(30,))
    child.start()
    link = PrefillLink(server_args=None, decode_port_args=None, log_prefix=lambda: "[test decode]")
    link._proc, link._handover = child, Handover()
    link._ready_pipe, _writer = mp.get_context("spawn").Pipe(duplex=False)
    previous = signal.getsignal(signal.SIGQUIT)
    try:
        assert fail_on_prefill_side_sigquit("[test decode]")
        with pytest.raises(PeerLost) as caught:
            link.wait_ready()
        assert isinstance(caught.value, PrefillSideFailed), caught.value
    finally:
        signal.signal(signal.SIGQUIT, previous)
        child.kill()
        child.join()
