"""GPU proof: the prefill fence waits for a running decode step exactly when the guard says so.

A "decode step" is a GPU spin on a forward stream. With no slot given back since it
was launched, the fence's event (what the prefill side's stream waits on) completes
while the spin still runs; after a slot was given back it completes only after the
spin, and the guard lets go once the spin has ended.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_freed_slots_gpu.py
"""

from __future__ import annotations

import time

import pytest
import torch

from sglang_edgeacc.edge_acc.ordering import WriteFence
from sglang_edgeacc.edge_acc_server.freed_slots import FreedSlotGuard
from sglang_edgeacc.edge_acc_server.prefill_link import PrefillLink

SPIN_CYCLES = 400_000_000  # about 0.2 s at H200 clocks: far longer than the checks below take

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)")]


def _link() -> PrefillLink:
    link = PrefillLink(server_args=None, decode_port_args=None, log_prefix=lambda: "[edgeacc decode tp0]")
    link._fence = WriteFence(0)
    return link


def _fence_event(link: PrefillLink, token) -> torch.cuda.Event:
    return link._fence._events[token.slot]


def _wait_for(predicate, timeout_s: float = 5.0) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.0005)
    return time.monotonic() - start


@pytest.mark.parametrize("given_back", [False, True])
def test_the_fence_covers_the_running_decode_step_only_after_a_slot_was_given_back(given_back):
    torch.cuda.set_device(0)
    forward = torch.cuda.Stream()
    link, guard = _link(), FreedSlotGuard.for_device("cuda:0")
    torch.cuda.synchronize()
    with torch.cuda.stream(forward):
        torch.cuda._sleep(SPIN_CYCLES)  # the decode step in flight
    guard.launched(forward)
    step_done = guard._last_launch
    if given_back:
        guard.freed()  # its previous result gave slots back
    token = link.signal_inputs(forward, after_decode_steps=guard.prefill_must_wait())
    fence = _fence_event(link, token)
    _wait_for(lambda: fence.query() or step_done.query())
    if given_back:
        assert step_done.query(), "the fence completed while the decode step that may write a freed slot ran"
        assert guard.prefill_must_wait() is False  # the step has ended: the slots are safe now
    else:
        assert fence.query() and not step_done.query(), "the fence waited for a decode step it need not wait for"
    torch.cuda.synchronize()
