"""The prefill side's process, started before its decode side has anything to give it: it never outlives
a decode side that ends its start first, and never keeps one from exiting."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time

import psutil

from sglang_edgeacc.edge_acc_server import roles
from sglang_edgeacc.edge_acc_server.prefill_process import run_prefill_side

# A decode side as far as the prefill side's process goes: starts it as the scheduler does, prints its pid,
# and exits (normally, or killed by the test) without ever giving it its start.
_DECODE_SIDE_THAT_ENDS_EARLY = (
    "import sys, time; from sglang_edgeacc.edge_acc_server.prefill_link import PrefillLink; "
    "link = PrefillLink(server_args=None, decode_port_args=None, log_prefix=lambda: '[test decode]'); "
    "link.prestart('cpu'); print(link._proc.pid, flush=True); time.sleep(float(sys.argv[1]))"
)


def _decode_side(stay_s: float) -> tuple[subprocess.Popen, psutil.Process]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-c", _DECODE_SIDE_THAT_ENDS_EARLY, str(stay_s)], env=env,
                            stdout=subprocess.PIPE, text=True)
    return proc, psutil.Process(int(proc.stdout.readline()))


def test_a_process_given_no_start_ends_without_running_a_scheduler():
    ctx = mp.get_context("spawn")
    start_reader, start_writer = ctx.Pipe(duplex=False)
    ready_reader, ready_writer = ctx.Pipe(duplex=False)
    os.environ[roles.DECODE_PID_ENV] = str(os.getpid())
    try:
        proc = ctx.Process(target=run_prefill_side, args=(start_reader, ready_writer))
        proc.start()
    finally:
        del os.environ[roles.DECODE_PID_ENV]
    start_reader.close()
    ready_writer.close()
    start_writer.close()  # the decode side ends its start
    proc.join(timeout=180)
    assert proc.exitcode == 0
    assert ready_reader.poll(0) is False or _eof(ready_reader)  # nothing reported ready


def _eof(reader) -> bool:
    try:
        reader.recv()
    except EOFError:
        return True
    return False


def _stop(decode: subprocess.Popen, prefill: psutil.Process) -> None:
    for proc in (decode, prefill):
        try:
            proc.kill()
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass


def test_a_decode_side_that_exits_without_giving_the_start_is_not_held_by_the_process():
    """multiprocessing joins a started child at exit; one still waiting for its start would wait for good."""
    decode, prefill = _decode_side(stay_s=0)
    try:
        assert decode.wait(timeout=120) == 0
        prefill.wait(timeout=30)
    finally:
        _stop(decode, prefill)


def test_a_decode_side_killed_while_the_process_imports_takes_it_down_at_once():
    decode, prefill = _decode_side(stay_s=60)
    try:
        time.sleep(1.0)  # the process is importing sglang (about 10 s here)
        decode.kill()
        killed_at = time.monotonic()
        decode.wait(timeout=30)
        prefill.wait(timeout=30)
        assert time.monotonic() - killed_at < 5, "the prefill side's process outlived its decode side"
    finally:
        _stop(decode, prefill)
