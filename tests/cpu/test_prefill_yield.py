"""The prefill side's yield to decode steps (``edge_acc_server.prefill_yield``) on the CPU.

The marks and the waits are module hooks; here they run on real modules, with the flag in
shared memory between two real processes, and the host's wait (the CPU platform's) stands in
for the device's, which ``tests/gpu/test_prefill_yield_gpu.py`` checks on a GPU. The real
server with the yield on answers as upstream: ``test_edge_acc_server.py``.
"""

from __future__ import annotations

import multiprocessing
import time

import torch

from sglang_edgeacc.edge_acc_server import prefill_yield


class _Recorder(torch.nn.Module):
    def __init__(self, flag, seen):
        super().__init__()
        self.flag, self.seen = flag, seen

    def forward(self, x):
        self.seen.append(int(self.flag[0]))
        return x + 1


def _decoder(layers: list) -> torch.nn.Module:
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList(layers)
    model.forward = lambda x: [x := layer(x) for layer in model.model.layers][-1]
    return model


def test_the_decode_side_holds_the_flag_up_for_its_layers_and_only_for_them():
    flag, seen = prefill_yield.new_flag("cpu"), []
    model = _decoder([_Recorder(flag, seen) for _ in range(3)])
    assert prefill_yield.raise_during_layers(model, flag)
    assert int(flag[0]) == 0
    assert model.forward(torch.zeros(1)).item() == 3
    assert seen == [1, 1, 1]
    assert int(flag[0]) == 0
    # A second step marks again.
    model.forward(torch.zeros(1))
    assert seen == [1] * 6 and int(flag[0]) == 0


def test_the_prefill_side_waits_before_every_layer_once_installed():
    flag, calls, order = prefill_yield.new_flag("cpu"), [], []

    class Layer(torch.nn.Module):
        def __init__(self, index):
            super().__init__()
            self.index = index

        def forward(self, x):
            order.append(("layer", self.index))
            return x

    def wait(f):
        calls.append(f)
        order.append(("wait", None))

    model = _decoder([Layer(i) for i in range(3)])
    assert prefill_yield.wait_before_layers(model, flag, wait)
    assert len(calls) == 1, "the wait runs once at install, before any graph could capture it"
    order.clear()
    model.forward(torch.zeros(1))
    assert order == [("wait", None), ("layer", 0), ("wait", None), ("layer", 1), ("wait", None), ("layer", 2)]
    assert all(f is flag for f in calls)


def test_a_model_without_a_layer_stack_is_left_alone():
    flag = prefill_yield.new_flag("cpu")
    model = torch.nn.Linear(2, 2)
    assert not prefill_yield.raise_during_layers(model, flag)
    assert not prefill_yield.wait_before_layers(model, flag, lambda f: None)
    assert not model._forward_pre_hooks and not model._forward_hooks


def _hold_flag(flag, hold_s, started):
    flag.fill_(1)
    started.set()
    time.sleep(hold_s)
    flag.fill_(0)


def test_the_host_wait_ends_when_another_process_lowers_the_flag():
    flag = prefill_yield.new_flag("cpu").share_memory_()
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    child = ctx.Process(target=_hold_flag, args=(flag, 0.12, started))
    child.start()
    try:
        assert started.wait(60)
        begin = time.monotonic()
        prefill_yield.host_wait(flag)
        waited = time.monotonic() - begin
    finally:
        child.join(60)
    assert int(flag[0]) == 0
    assert 0.05 < waited < prefill_yield.MAX_WAIT_S, waited


def test_the_host_wait_is_bounded_when_the_flag_stays_up():
    flag = prefill_yield.new_flag("cpu")
    flag.fill_(1)  # a decode side that died during its step
    begin = time.monotonic()
    prefill_yield.host_wait(flag)
    waited = time.monotonic() - begin
    assert prefill_yield.MAX_WAIT_S <= waited < prefill_yield.MAX_WAIT_S + 0.2


def test_the_wait_for_a_device_is_the_hosts_on_the_cpu_and_a_kernel_on_cuda():
    assert prefill_yield.wait_for(torch.device("cpu")) is prefill_yield.host_wait
    assert prefill_yield.wait_for(torch.device("cuda", 0)) is prefill_yield.device_wait
