"""GPU proof: a prefill batch's fence waits for the decode step on the device only when asked to.

The decode side's link (``PrefillLink.signal_inputs``) signals the fence the prefill side waits
on before its forward. Here a long GPU spin on the forward stream stands for a decode step still
running; the schedule stream (current) writes a shared buffer behind a short spin of its own, as
scheduling writes a batch's slots and rows. A spawned reader, as the prefill side, waits on the
token on its own stream, checks the buffer holds the write, and reports how long its stream took
to pass the wait. With ``after_decode_steps=False`` it passes while the step still runs and sees
the write; with ``True`` (the control) it waits for the step.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_prefill_fence_gpu.py
    PYTHONPATH=python python3 -m tests.gpu.test_prefill_fence_gpu     # without pytest
"""

from __future__ import annotations

import json
import pickle
import time

import torch

from sglang_edgeacc.edge_acc.ordering import ReadFence, WriteFence
from sglang_edgeacc.edge_acc.tensor_export import export_tensors
from sglang_edgeacc.edge_acc.tensor_import import import_tensors
from sglang_edgeacc.edge_acc_server.prefill_link import PrefillLink
from tests.gpu.proof_support import Child, child_recv, child_send

try:
    import pytest
except ImportError:
    pytest = None

TIMEOUT_S = 120
ROUNDS = 20
STEP_S = 0.1  # the decode step's spin
WRITE_SPIN_CYCLES = 1_000_000  # the scheduling write lands after the token is sent


def reader_main(conn, bundle_bytes: bytes, rounds: int) -> None:
    torch.cuda.set_device(0)
    imported = import_tensors(pickle.loads(bundle_bytes))
    buf = imported["buf"]
    fence = ReadFence(0)
    stream = torch.cuda.Stream()
    child_send(conn, "ready")
    stale, waited_s = 0, []
    for _ in range(rounds):
        step, token = child_recv(conn, TIMEOUT_S)
        start = time.perf_counter()
        fence.wait(token, stream)
        with torch.cuda.stream(stream):
            bad = bool((buf != step).any())  # syncs: the stream has passed the wait
        waited_s.append(time.perf_counter() - start)
        stale += bad
        child_send(conn, "read")
    del buf
    imported.release()
    child_send(conn, {"stale": stale, "waited_s": waited_s})


def _spin_cycles_for(seconds: float) -> int:
    """GPU spin cycles that take about ``seconds`` on this device."""
    probe = 50_000_000
    torch.cuda.synchronize()
    start = time.perf_counter()
    torch.cuda._sleep(probe)
    torch.cuda.synchronize()
    return int(probe * seconds / (time.perf_counter() - start))


def run_rounds(after_decode_steps: bool, rounds: int = ROUNDS) -> dict:
    torch.cuda.set_device(0)
    buf = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    link = PrefillLink(server_args=None, decode_port_args=None, log_prefix=lambda: "[fence proof]")
    link._fence = WriteFence(0)  # what the link holds once its prefill side is ready
    forward, schedule = torch.cuda.Stream(), torch.cuda.Stream()
    step_cycles = _spin_cycles_for(STEP_S)
    child = Child(reader_main, (pickle.dumps(export_tensors({"buf": buf})), rounds), {})
    try:
        assert child.recv(TIMEOUT_S) == "ready"
        for step in range(1, rounds + 1):
            with torch.cuda.stream(forward):
                torch.cuda._sleep(step_cycles)  # the decode step just launched
            with torch.cuda.stream(schedule):
                torch.cuda._sleep(WRITE_SPIN_CYCLES)
                buf.fill_(step)
                token = link.signal_inputs(forward, after_decode_steps=after_decode_steps)
            child.send((step, token))
            assert child.recv(TIMEOUT_S) == "read"
            torch.cuda.synchronize()
        result = child.recv(TIMEOUT_S)
    finally:
        exitcode = child.close()
    waited = sorted(result["waited_s"])
    return {"after_decode_steps": after_decode_steps, "exitcode": exitcode, "stale": result["stale"],
            "rounds": rounds, "step_ms": STEP_S * 1000, "waited_ms_median": round(waited[len(waited) // 2] * 1000, 2),
            "waited_ms_max": round(waited[-1] * 1000, 2)}


if pytest is not None:
    gpu = pytest.mark.gpu
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)")

    @gpu
    @needs_cuda
    def test_a_batch_starts_beside_the_decode_step_and_sees_its_scheduling_writes():
        result = run_rounds(after_decode_steps=False)
        print("PREFILL_FENCE_REPORT " + json.dumps(result))
        assert result["exitcode"] == 0 and result["stale"] == 0, result
        assert result["waited_ms_median"] < 0.25 * result["step_ms"], result

    @gpu
    @needs_cuda
    def test_a_batch_after_a_step_that_gave_kv_back_waits_for_that_step():
        result = run_rounds(after_decode_steps=True)
        print("PREFILL_FENCE_REPORT " + json.dumps(result))
        assert result["exitcode"] == 0 and result["stale"] == 0, result
        assert result["waited_ms_median"] > 0.75 * result["step_ms"], result


if __name__ == "__main__":
    for after in (False, True):
        print("PREFILL_FENCE_REPORT " + json.dumps(run_rounds(after)))
