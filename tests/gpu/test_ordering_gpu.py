"""GPU proof (b): thousands of write-then-read handoffs between two processes, zero stale reads.

The writer (this process) delays each write on its stream with a GPU spin, fills a shared
buffer with the step number, signals a WriteFence and sends the token; the reader (a
spawned MPS client at 50%) waits on the token on its stream and counts, on the GPU, the
handoffs where the buffer did not hold the step. The reader then signals its own fence so
the writer's next write cannot overtake the read (the reverse hazard). Without fences the
same loop reads stale data: that run shows the fence is what makes it right.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_ordering_gpu.py
    PYTHONPATH=python python3 -m tests.gpu.test_ordering_gpu     # without pytest
"""

from __future__ import annotations

import json
import pickle
import time

import torch

from sglang_edgeacc.edge_acc.ordering import ReadFence, WriteFence
from sglang_edgeacc.edge_acc.sm_partition import child_env
from sglang_edgeacc.edge_acc.tensor_export import export_tensors
from sglang_edgeacc.edge_acc.tensor_import import import_tensors
from tests.gpu.proof_support import Child, child_recv, child_send

try:
    import pytest
except ImportError:
    pytest = None

TIMEOUT_S = 120
BUF_ELEMS = 4 << 20  # 16 MiB of int32
SPIN_CYCLES = 1_000_000  # ~0.5 ms at H200 clocks: the write lands well after the message arrives


def reader_main(conn, bundle_bytes: bytes, n: int, use_fence: bool, mode: str) -> None:
    torch.cuda.set_device(0)
    imported = import_tensors(pickle.loads(bundle_bytes))
    buf = imported["buf"]
    reader = ReadFence(0)
    back = WriteFence(0, mode=mode)
    stale = torch.zeros((), dtype=torch.int64, device="cuda")
    child_send(conn, "ready")
    t0 = time.perf_counter()
    for _ in range(n):
        step, token = child_recv(conn, TIMEOUT_S)
        if use_fence:
            reader.wait(token)
        stale += (buf != step).any().to(torch.int64)
        child_send(conn, back.signal() if use_fence else None)
    result = {"stale": int(stale), "handoffs": n, "seconds": round(time.perf_counter() - t0, 3)}
    del buf
    imported.release()
    child_send(conn, result)


def run_handoffs(n: int, use_fence: bool, mode: str = "event", reader_percent: int = 50) -> dict:
    torch.cuda.set_device(0)
    buf = torch.zeros(BUF_ELEMS, dtype=torch.int32, device="cuda")
    bundle = export_tensors({"buf": buf})
    stream = torch.cuda.Stream()
    # A small ring wraps 250 times in 4000 handoffs: slot reuse is what this exercises.
    fence = WriteFence(0, mode=mode, ring_size=16)
    back = ReadFence(0)
    child = Child(reader_main, (pickle.dumps(bundle), n, use_fence, mode), child_env("prefill", reader_percent, "mps"))
    try:
        assert child.recv(TIMEOUT_S) == "ready"
        for step in range(1, n + 1):
            with torch.cuda.stream(stream):
                torch.cuda._sleep(SPIN_CYCLES)
                buf.fill_(step)
            child.send((step, fence.signal(stream)))
            ack = child.recv(TIMEOUT_S)
            if use_fence:
                back.wait(ack, stream)
        result = child.recv(TIMEOUT_S)
    finally:
        exitcode = child.close()
    torch.cuda.synchronize()
    result.update(exitcode=exitcode, use_fence=use_fence, mode=mode, ring=fence.ring_size if mode == "event" else 0)
    return result


if pytest is not None:
    gpu = pytest.mark.gpu
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)")

    @gpu
    @needs_cuda
    def test_event_fence_gives_zero_stale_reads_over_thousands_of_handoffs():
        result = run_handoffs(4000, use_fence=True, mode="event")
        print("ORDERING_REPORT " + json.dumps(result))
        assert result["exitcode"] == 0
        assert result["stale"] == 0, result

    @gpu
    @needs_cuda
    def test_host_fence_gives_zero_stale_reads():
        result = run_handoffs(500, use_fence=True, mode="host")
        print("ORDERING_REPORT " + json.dumps(result))
        assert result["exitcode"] == 0
        assert result["stale"] == 0, result

    @gpu
    @needs_cuda
    def test_without_a_fence_the_reader_sees_stale_data():
        """The control: a socket message is not a memory fence."""
        result = run_handoffs(1000, use_fence=False)
        print("ORDERING_REPORT " + json.dumps(result))
        assert result["exitcode"] == 0
        assert result["stale"] > 0, result


if __name__ == "__main__":
    for n, fence, mode in ((4000, True, "event"), (500, True, "host"), (1000, False, "event")):
        print(json.dumps(run_handoffs(n, fence, mode)))
