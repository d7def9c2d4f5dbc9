"""ordering on the CPU platform: no-op fences that still carry tokens across real processes."""

from __future__ import annotations

import multiprocessing as mp
import pickle

import pytest
import torch

from sglang_edgeacc.edge_acc.ordering import (
    OrderingError,
    OrderingToken,
    ReadFence,
    WriteFence,
    default_fence_mode,
)
from sglang_edgeacc.edge_acc.tensor_export import export_tensors
from sglang_edgeacc.edge_acc.tensor_import import import_tensors

TIMEOUT_S = 120
HANDOFFS = 300


def test_cpu_fence_defaults_to_none_and_tokens_pickle():
    assert default_fence_mode("cpu") == "none"
    fence = WriteFence("cpu")
    tokens = [fence.signal() for _ in range(3)]
    assert [t.sequence for t in tokens] == [1, 2, 3]
    assert all(t.mode == "none" for t in tokens)
    again = pickle.loads(pickle.dumps(tokens[-1]))
    assert again == tokens[-1] and isinstance(again, OrderingToken)
    reader = ReadFence("cpu")
    reader.wait(again)
    assert reader.last_sequence == 3


def test_reader_rejects_what_is_not_a_token():
    with pytest.raises(OrderingError, match="OrderingToken"):
        ReadFence("cpu").wait((1, b"x"))  # type: ignore[arg-type]


def test_bad_mode_and_ring_size_are_refused():
    with pytest.raises(ValueError, match="mode"):
        WriteFence("cpu", mode="sometimes")
    with pytest.raises(ValueError, match="ring_size"):
        WriteFence("cpu", ring_size=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only host")
@pytest.mark.parametrize("mode", ["event", "host"])
def test_gpu_modes_need_cuda(mode):
    with pytest.raises(OrderingError, match="CUDA"):
        WriteFence(None, mode=mode)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only host")
def test_event_token_on_a_cpu_reader_is_an_error():
    token = OrderingToken(mode="event", sequence=1, device_index=0, slot=1, event_handle=b"\0" * 64)
    with pytest.raises(OrderingError, match="one platform"):
        ReadFence("cpu").wait(token)


def _reader(conn, bundle_bytes: bytes) -> None:
    shared = import_tensors(pickle.loads(bundle_bytes))
    buf = shared["buf"]
    fence = ReadFence("cpu")
    wrong = 0
    for _ in range(HANDOFFS):
        step, token = pickle.loads(conn.recv_bytes())
        fence.wait(token)
        wrong += int((buf != step).sum())
        conn.send_bytes(pickle.dumps(fence.last_sequence))
    shared.release()
    conn.send_bytes(pickle.dumps(wrong))


def test_write_then_read_handoffs_between_spawned_processes():
    buf = torch.zeros(4096, dtype=torch.int64)
    bundle = export_tensors({"buf": buf})
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_reader, args=(child, pickle.dumps(bundle)))
    proc.start()
    fence = WriteFence("cpu")
    try:
        for step in range(1, HANDOFFS + 1):
            buf.fill_(step)
            parent.send_bytes(pickle.dumps((step, fence.signal())))
            assert parent.poll(TIMEOUT_S)
            assert pickle.loads(parent.recv_bytes()) == step
        assert parent.poll(TIMEOUT_S)
        wrong = pickle.loads(parent.recv_bytes())
    finally:
        proc.join(TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert wrong == 0
