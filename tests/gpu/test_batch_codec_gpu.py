"""GPU proof: the prefill side unpacks the next batch while the forward before it still runs.

A copy from pageable memory on the current stream waits for everything queued there, so a
batch unpacked behind a running forward waited for all of it. A message's device tensors
travel as one block, which the prefill side copies from pinned memory on a copy stream of
its own, with the forward's stream (not the host) waiting for the copy
(``batch_codec.CopyStreamPlacement``). Checked here with the real codec, a GPU spin
standing in for the forward on the current stream:

* the values, dtypes, shapes and sharing of a batch's device tensors survive the trip;
* with the placement, unpacking returns while the spin still runs; without it (torch's own
  rebuild, the control) it waits for the spin;
* a placed tensor freed while a kernel queued behind the spin still reads it keeps its
  memory until that kernel ran, so the next message's copy cannot overwrite it (the control
  without ``record_stream`` reports whether the allocator would have handed the memory over).

The decode side's way back is checked the same way: a reply's first tokens go to the device
(``decode_side.to_device_unwaited``) while a decode step still runs on the current stream, and
arrive intact even when the next reply's tokens follow at once; ``torch.tensor(..., device=...)``,
the control, waits for the step.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_batch_codec_gpu.py
    PYTHONPATH=python python3 -m tests.gpu.test_batch_codec_gpu     # without pytest
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch

try:
    import pytest
except ImportError:  # plain-script runs on a machine without pytest
    pytest = None

SPIN_S = 0.4
POOL_TOKENS = 700_000


def _spin(seconds: float) -> None:
    """Occupies the current stream for about ``seconds`` (a forward still running)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_s = 10_000_000 / (start.elapsed_time(end) / 1000)
    torch.cuda._sleep(int(cycles_per_s * seconds))


def _local():
    from sglang_edgeacc.edge_acc_server.batch_codec import LocalObjects

    return LocalObjects(req_to_token_pool=None, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
                        model_config=None)


def _message(tokens: int = 8192, fill: int = 0) -> tuple[bytes, SimpleNamespace]:
    """A prefill batch's tensors as the decode side holds them: slots as a view of a pool-sized free list,
    a tensor two fields share, sampling parameters of several dtypes, a 0-dim one."""
    from sglang_edgeacc.edge_acc_server.batch_codec import pack_prefill_batch

    pool = torch.arange(POOL_TOKENS, dtype=torch.int64, device="cuda") + fill
    input_ids = torch.randint(0, 151_000, (tokens,), device="cuda")
    batch = SimpleNamespace(
        reqs=[], input_ids=input_ids, fill_ids=input_ids, out_cache_loc=pool[100:100 + tokens],
        seq_lens=torch.full((8,), tokens // 8, dtype=torch.int32, device="cuda"),
        sampling_info=SimpleNamespace(temperatures=torch.rand(8, 1, device="cuda"),
                                      top_ks=torch.full((8,), 20, dtype=torch.int32, device="cuda"),
                                      penalizer_orchestrator=None),
        scale=torch.tensor(0.5, device="cuda"), positions_t=torch.arange(16, device="cuda").view(4, 4).t(),
    )
    return pack_prefill_batch(batch), batch


def check_values_survive() -> dict:
    from sglang_edgeacc.edge_acc_server.batch_codec import CopyStreamPlacement, unpack_prefill_batch

    packed, sent = _message()
    got = unpack_prefill_batch(packed, _local(), CopyStreamPlacement(torch.device("cuda", 0)))
    torch.cuda.synchronize()
    pairs = [(sent.input_ids, got.input_ids), (sent.out_cache_loc, got.out_cache_loc), (sent.seq_lens, got.seq_lens),
             (sent.sampling_info.temperatures, got.sampling_info.temperatures),
             (sent.sampling_info.top_ks, got.sampling_info.top_ks), (sent.scale, got.scale),
             (sent.positions_t, got.positions_t)]
    return {
        "equal": all(a.dtype == b.dtype and a.shape == b.shape and b.is_cuda and torch.equal(a, b) for a, b in pairs),
        "shared_stays_shared": got.fill_ids is got.input_ids,
        # The block on the device holds the message's tensors, not the pool-sized list a slot view came from.
        "view_sent_without_its_pool": got.out_cache_loc.untyped_storage().nbytes() < len(packed),
        "one_block": len({t.untyped_storage().data_ptr() for _, t in pairs}) == 1,
        "message_bytes": len(packed),
    }


def time_unpack_behind_spin(placed: bool) -> dict:
    from sglang_edgeacc.edge_acc_server.batch_codec import CopyStreamPlacement, unpack_prefill_batch

    placement = CopyStreamPlacement(torch.device("cuda", 0)) if placed else None
    packed, _ = _message()
    unpack_prefill_batch(packed, _local(), placement)  # warm the copy stream and the allocator
    torch.cuda.synchronize()
    _spin(SPIN_S)
    start = time.perf_counter()
    unpack_prefill_batch(packed, _local(), placement)
    elapsed = time.perf_counter() - start
    spin_still_running = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return {"placed": placed, "unpack_ms": round(elapsed * 1e3, 2), "spin_ms": SPIN_S * 1e3,
            "spin_still_running_after_unpack": spin_still_running}


class _PlacementWithoutRecord:
    """The control: the same copy stream, without marking the tensors used on the forward's stream."""

    def __init__(self):
        self._stream = torch.cuda.Stream()

    def place(self, host, device):
        with torch.cuda.stream(self._stream):
            return host.to(device)  # from pageable memory: the host waits for the copy


def check_freed_tensor_outlives_its_reader(record: bool) -> dict:
    from sglang_edgeacc.edge_acc_server.batch_codec import CopyStreamPlacement, unpack_prefill_batch

    placement = CopyStreamPlacement(torch.device("cuda", 0)) if record else _PlacementWithoutRecord()
    first, _ = _message(fill=0)
    second, _ = _message(fill=10_000_000)  # the same sizes: the allocator would hand out the same blocks
    batch = unpack_prefill_batch(first, _local(), placement)
    expected = batch.out_cache_loc.clone()
    torch.cuda.synchronize()
    _spin(SPIN_S)
    read = batch.out_cache_loc + 0  # queued behind the spin: reads the slots once the "forward" ran
    del batch  # the scheduler drops the batch while the kernel that reads it is still queued
    unpack_prefill_batch(second, _local(), placement)
    torch.cuda.synchronize()
    return {"record_stream": record, "reader_saw_its_own_values": bool(torch.equal(read, expected))}


def time_first_tokens_behind_spin(unwaited: bool) -> dict:
    from sglang_edgeacc.edge_acc_server.decode_side import to_device_unwaited

    ids = list(range(1000, 1064))
    for _ in range(2):  # the pinned allocator then holds the two blocks the timed calls take
        to_device_unwaited(torch.tensor(ids), torch.device("cuda", 0))
    torch.cuda.synchronize()
    _spin(SPIN_S)
    start = time.perf_counter()
    if unwaited:
        first = to_device_unwaited(torch.tensor(ids), torch.device("cuda", 0))
        # The next reply's tokens, at once: a pinned buffer handed over before the first copy ran would
        # give the first tensor these values.
        to_device_unwaited(torch.tensor([7] * len(ids)), torch.device("cuda", 0))
    else:
        first = torch.tensor(ids, device="cuda")
    elapsed = time.perf_counter() - start
    spin_still_running = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return {"unwaited": unwaited, "to_device_ms": round(elapsed * 1e3, 2), "spin_ms": SPIN_S * 1e3,
            "spin_still_running_after_copy": spin_still_running, "values_intact": first.tolist() == ids}


def run_all() -> dict:
    return {
        "first_tokens_unwaited": time_first_tokens_behind_spin(unwaited=True),
        "first_tokens_torch_tensor": time_first_tokens_behind_spin(unwaited=False),
        "values": check_values_survive(),
        "placed": time_unpack_behind_spin(placed=True),
        "torch_rebuild": time_unpack_behind_spin(placed=False),
        "freed_with_record": check_freed_tensor_outlives_its_reader(record=True),
        "freed_without_record": check_freed_tensor_outlives_its_reader(record=False),
    }


def _check(results: dict) -> None:
    values, placed, plain = results["values"], results["placed"], results["torch_rebuild"]
    assert values["equal"] and values["shared_stays_shared"] and values["view_sent_without_its_pool"], values
    assert values["one_block"], values
    # The control: torch's own rebuild waits for the spin on the current stream.
    assert plain["unpack_ms"] > 0.5 * plain["spin_ms"] and not plain["spin_still_running_after_unpack"], plain
    assert placed["unpack_ms"] < 0.25 * placed["spin_ms"] and placed["spin_still_running_after_unpack"], placed
    assert results["freed_with_record"]["reader_saw_its_own_values"], results["freed_with_record"]
    tokens, control = results["first_tokens_unwaited"], results["first_tokens_torch_tensor"]
    assert control["to_device_ms"] > 0.5 * control["spin_ms"] and control["values_intact"], control
    assert tokens["to_device_ms"] < 0.25 * tokens["spin_ms"] and tokens["spin_still_running_after_copy"], tokens
    assert tokens["values_intact"], tokens


if pytest is not None:
    @pytest.mark.gpu
    def test_the_next_batch_unpacks_while_the_forward_before_it_runs():
        results = run_all()
        print(json.dumps(results, indent=1))
        _check(results)


if __name__ == "__main__":
    results = run_all()
    print(json.dumps(results, indent=1))
    _check(results)
    print("OK")
