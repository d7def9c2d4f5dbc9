"""A prefill batch waits for the decode step in flight only while that step may write a slot given back.

The guard's rule runs here on events that end when the test says so (the GPU
test ``tests/gpu/test_freed_slots_gpu.py`` runs it on CUDA events and the real
fence); the decode side's loop and hand-off run against recording stand-ins for
the scheduler around them, with upstream's real token allocator giving slots back.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_edgeacc.edge_acc_server import upstream_mirror
from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler
from sglang_edgeacc.edge_acc_server.freed_slots import FreedSlotGuard
from tests.cpu.test_decode_loop_order import _RecordingDecodeSide


class _Steps:
    """The GPU's progress: a step's event has completed once the step has ended."""

    def __init__(self):
        self.launched = 0
        self.ended = 0

    def new_event(self):
        steps = self

        class _StepEvent:
            step = None

            def record(self, stream=None):
                self.step = steps.launched

            def query(self):
                return self.step <= steps.ended

        return _StepEvent()


def _guard():
    steps = _Steps()
    return FreedSlotGuard(steps.new_event), steps


def _launch(guard, steps):
    steps.launched += 1
    guard.launched(stream=None)


def test_no_slot_given_back_never_waits():
    guard, steps = _guard()
    _launch(guard, steps)
    assert guard.prefill_must_wait() is False


def test_a_slot_given_back_while_a_step_runs_waits_until_that_step_ends():
    guard, steps = _guard()
    _launch(guard, steps)  # step 1
    _launch(guard, steps)  # step 2, while step 1's result is processed
    guard.freed()  # that processing gave slots back: step 2 may still write one of them
    steps.ended = 1
    assert guard.prefill_must_wait() is True
    steps.ended = 2
    assert guard.prefill_must_wait() is False
    # Once that step has ended the slots are safe for good: a later step never wrote them.
    _launch(guard, steps)
    assert guard.prefill_must_wait() is False


def test_the_latest_step_launched_before_the_free_is_the_one_waited_for():
    guard, steps = _guard()
    _launch(guard, steps)
    guard.freed()
    _launch(guard, steps)
    guard.freed()
    steps.ended = 1
    assert guard.prefill_must_wait() is True  # step 2 was launched before the second free


def test_nothing_launched_or_no_events_never_waits():
    guard, _ = _guard()
    guard.freed()
    assert guard.prefill_must_wait() is False
    cpu = FreedSlotGuard.for_device("cpu")
    cpu.launched(stream=None)
    cpu.freed()
    assert cpu.prefill_must_wait() is False


def _real_allocator(size=64):
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(size=size, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=True)


class _FreeingDecodeSide(_RecordingDecodeSide):
    """The decode loop, where processing step ``frees_at``'s result gives slots back to the real allocator."""

    def __init__(self, frees_at: int):
        super().__init__(overlap=True, steps=4)
        self.gpu = _Steps()
        self.freed_slots = FreedSlotGuard(self.gpu.new_event)
        self.forward_stream = None
        self.token_to_kv_pool_allocator = _real_allocator()
        self._held = self.token_to_kv_pool_allocator.alloc(8)
        self._frees_at = frees_at
        self.writer_when_freed = None

    def run_batch(self, batch):
        self.gpu.launched += 1
        return super().run_batch(batch)

    def process_batch_result(self, batch, result):
        super().process_batch_result(batch, result)
        if batch.step == self._frees_at:
            self.token_to_kv_pool_allocator.free(self._held)


def test_the_decode_loop_marks_slots_given_back_by_result_processing_against_the_step_in_flight():
    side = _FreeingDecodeSide(frees_at=2)
    side.gpu.ended = 10**6  # the GPU is idle; the writer is read back below
    side.event_loop_edge_acc_decode()
    # Step 2's result was processed after step 3 was launched (overlap): step 3 may write the freed slot.
    assert side.freed_slots._writer.step == 3
    side.gpu.ended = 2
    assert side.freed_slots.prefill_must_wait() is True
    side.gpu.ended = 3
    assert side.freed_slots.prefill_must_wait() is False


def test_result_processing_that_frees_nothing_marks_nothing():
    side = _FreeingDecodeSide(frees_at=99)
    side.event_loop_edge_acc_decode()
    assert side.freed_slots._writer is None


class _HandoffSide(DecodeSideScheduler):
    """The hand-off alone: get_new_batch_prefill and the link are stand-ins; the guard is real."""

    def __init__(self, preempts: bool):
        self.gpu = _Steps()
        self.freed_slots = FreedSlotGuard(self.gpu.new_event)
        self.forward_stream = "forward"
        self.running_batch = SimpleNamespace(batch_size=lambda: 3)
        self._preempts = preempts
        self.decode_step_window = SimpleNamespace(enabled=False)
        self.edge_acc_stats = SimpleNamespace(record_message=lambda n: None)
        self.signals = []
        self.prefill_link = SimpleNamespace(
            signal_inputs=lambda stream, after_decode_steps: self.signals.append((stream, after_decode_steps)),
            send=lambda *a: None)

    def process_pending_chunked_abort(self):
        pass

    def get_new_batch_prefill(self, running):
        left = 2 if self._preempts else 3
        return SimpleNamespace(running_batch=SimpleNamespace(batch_size=lambda: left),
                               batch_to_run=SimpleNamespace(reqs=[]))

    def _edge_pack(self, batch):
        return b""


@pytest.mark.parametrize("preempts", [False, True])
def test_the_hand_off_waits_for_the_step_in_flight_only_when_slots_were_given_back(monkeypatch, preempts):
    monkeypatch.setattr(upstream_mirror, "before_forward", lambda scheduler, batch: None)
    side = _HandoffSide(preempts=preempts)
    side.gpu.launched = 1
    side.freed_slots.launched(stream=None)  # a decode step is running
    side._edge_dispatch_prefill()
    # A preemption for this very batch gives a running request's slots back while its step runs.
    assert side.signals == [("forward", preempts)]
