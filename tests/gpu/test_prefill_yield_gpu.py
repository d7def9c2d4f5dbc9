"""GPU proof of the prefill side's yield (``edge_acc_server.prefill_yield``), on its own streams.

One stream stands for the prefill side, one for the decode side (the server puts them in two
processes; the flag is the same word of device memory either way):

* with the flag down, the wait kernel ends at once;
* with the flag up, work queued behind the wait on the prefill stream runs only after the decode
  stream lowered it, and the host never waits for either;
* the wait is bounded: a flag left up ends it after a fraction of a second;
* captured in a CUDA graph, the wait reads the flag at replay;
* a model whose layers are marked (``raise_during_layers``) holds the flag up for exactly its
  layers: a wait launched while they run ends when the last layer does.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_prefill_yield_gpu.py
    PYTHONPATH=python python3 -m tests.gpu.test_prefill_yield_gpu     # without pytest
"""

from __future__ import annotations

import json
import time

import torch

try:
    import pytest
except ImportError:  # plain-script runs on a machine without pytest
    pytest = None

SPIN_S = 0.05


def _cycles_per_s() -> float:
    """An estimate only (a first sleep runs slower): each check times the decode step it ran."""
    torch.cuda._sleep(1_000_000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) / 1000)


def _decode_step(decode, flag, cycles: int) -> tuple:
    """On the decode stream: a step of ``cycles``, then the flag lowered; its timing events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(decode):
        start.record()
        torch.cuda._sleep(cycles)
        flag.fill_(0)
        end.record()
    return start, end


def _timed_wait(flag, stream) -> tuple:
    """Queue the wait on ``stream`` between two timing events; the host returns at once."""
    from sglang_edgeacc.edge_acc_server.prefill_yield import device_wait

    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        before.record()
        device_wait(flag)
        after.record()
    return before, after


def gate_open() -> dict:
    from sglang_edgeacc.edge_acc_server.prefill_yield import new_flag

    flag, stream = new_flag("cuda"), torch.cuda.Stream()
    _timed_wait(flag, stream)  # built and loaded
    before, after = _timed_wait(flag, stream)
    after.synchronize()
    return {"wait_ms": round(before.elapsed_time(after), 3)}


def gate_holds(cycles_per_s: float) -> dict:
    from sglang_edgeacc.edge_acc_server.prefill_yield import new_flag

    flag, prefill, decode = new_flag("cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    marker = torch.zeros(1, device="cuda")
    flag.fill_(1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    before, after = _timed_wait(flag, prefill)
    with torch.cuda.stream(prefill):
        marker.fill_(1.0)  # the prefill side's next layer
    step_start, step_end = _decode_step(decode, flag, int(cycles_per_s * SPIN_S))
    host_ms = (time.perf_counter() - start) * 1e3
    next_layer_ran_early = bool(prefill.query())
    torch.cuda.synchronize()
    return {"wait_ms": round(before.elapsed_time(after), 2),
            "decode_step_ms": round(step_start.elapsed_time(step_end), 2),
            "host_ms": round(host_ms, 2), "next_layer_ran_before_the_step_ended": next_layer_ran_early,
            "next_layer_ran": marker.item() == 1.0}


def gate_bounded() -> dict:
    from sglang_edgeacc.edge_acc_server.prefill_yield import MAX_POLLS, new_flag

    flag, stream = new_flag("cuda"), torch.cuda.Stream()
    flag.fill_(1)  # never lowered: a decode side that died during its step
    before, after = _timed_wait(flag, stream)
    after.synchronize()
    return {"wait_ms": round(before.elapsed_time(after), 2), "polls": MAX_POLLS}


def gate_captured(cycles_per_s: float) -> dict:
    from sglang_edgeacc.edge_acc_server.prefill_yield import device_wait, new_flag

    flag, prefill, decode = new_flag("cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    marker = torch.zeros(1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(prefill):
        device_wait(flag)  # built outside the capture, as wait_before_layers does
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=prefill):
        device_wait(flag)
        marker.add_(1.0)
    torch.cuda.synchronize()
    marker.zero_()
    flag.fill_(1)
    torch.cuda.synchronize()
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(prefill):
        before.record()
        graph.replay()
        after.record()
    step_start, step_end = _decode_step(decode, flag, int(cycles_per_s * SPIN_S))
    torch.cuda.synchronize()
    return {"replay_ms": round(before.elapsed_time(after), 2),
            "decode_step_ms": round(step_start.elapsed_time(step_end), 2),
            "marker": marker.item()}


class _Step(torch.nn.Module):
    def __init__(self, cycles: int):
        super().__init__()
        self.cycles = cycles

    def forward(self, x):
        torch.cuda._sleep(self.cycles)
        return x + 1


class _Decoder(torch.nn.Module):
    """The shape ``decoder_layers`` looks for: ``model.model.layers``."""

    def __init__(self, layers: int, cycles: int):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(_Step(cycles) for _ in range(layers))

    def forward(self, x):
        for layer in self.model.layers:
            x = layer(x)
        return x


def marked_layers(cycles_per_s: float) -> dict:
    from sglang_edgeacc.edge_acc_server.prefill_yield import new_flag, raise_during_layers

    flag, prefill, decode = new_flag("cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    layers = 4
    model = _Decoder(layers, int(cycles_per_s * SPIN_S / layers))
    assert raise_during_layers(model, flag)
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    step_start, step_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(decode):
        step_start.record()
        y = model(x)
        step_end.record()
    time.sleep(SPIN_S / 4)  # the step is in its layers
    before, after = _timed_wait(flag, prefill)
    torch.cuda.synchronize()
    return {"step_ms": round(step_start.elapsed_time(step_end), 2),
            "wait_ended_ms_after_step_start": round(step_start.elapsed_time(after), 2),
            "flag_after_step": int(flag.item()), "output": y.item()}


def run_all() -> dict:
    cycles_per_s = _cycles_per_s()
    return {
        "open": gate_open(),
        "holds": gate_holds(cycles_per_s),
        "bounded": gate_bounded(),
        "captured": gate_captured(cycles_per_s),
        "marked_layers": marked_layers(cycles_per_s),
    }


def _check(results: dict) -> None:
    assert results["open"]["wait_ms"] < 1.0, results["open"]
    holds = results["holds"]
    assert holds["wait_ms"] > 0.8 * holds["decode_step_ms"], holds
    assert not holds["next_layer_ran_before_the_step_ended"] and holds["next_layer_ran"], holds
    assert holds["host_ms"] < 0.25 * holds["decode_step_ms"], holds  # the host never waited
    assert 1.0 < results["bounded"]["wait_ms"] < 2000.0, results["bounded"]
    captured = results["captured"]
    assert captured["replay_ms"] > 0.8 * captured["decode_step_ms"] and captured["marker"] == 1.0, captured
    marked = results["marked_layers"]
    assert marked["flag_after_step"] == 0 and marked["output"] == 4.0, marked
    assert marked["wait_ended_ms_after_step_start"] > 0.9 * marked["step_ms"], marked


if pytest is not None:
    @pytest.mark.gpu
    def test_the_prefill_stream_waits_while_a_decode_step_runs():
        results = run_all()
        print(json.dumps(results, indent=1))
        _check(results)


if __name__ == "__main__":
    results = run_all()
    print(json.dumps(results, indent=1))
    _check(results)
    print("OK")
