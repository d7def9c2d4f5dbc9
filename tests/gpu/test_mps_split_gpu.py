"""GPU proof (c): the SM split each EdgeAcc side is spawned with is really enforced.

Children are spawned with edge_acc.sm_partition.child_env(...) in their environment and
report the SMs their context sees and the time of an 8192^3 bf16 matmul: under MPS the
prefill side's percentage caps it, decode at 100% keeps the whole GPU, and a green-context
stream of 25% of the SMs runs the matmul about 4x slower. Needs the MPS control daemon
(tests/gpu/run_all_on_device.sh starts one with a private pipe directory).

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_mps_split_gpu.py
"""

from __future__ import annotations

import json
import os

import torch

from sglang_edgeacc.edge_acc.sm_partition import (
    MPS_PERCENT_VAR,
    SmPartitionError,
    child_env,
    green_context_stream,
    green_context_stream_from_env,
    sm_count_for_percent,
    sm_granularity,
    visible_sm_count,
)
from tests.gpu.proof_support import Child, child_send, mps_daemon_running, mps_expected

try:
    import pytest
except ImportError:
    pytest = None

TIMEOUT_S = 180
N = 8192


def _matmul_ms(stream=None) -> float:
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    stream = stream or torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(10):
            a @ b
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 10


def probe_main(conn, what: str) -> None:
    report = {"what": what, "mps_env": os.environ.get(MPS_PERCENT_VAR)}
    try:
        torch.cuda.set_device(0)
        report["sms"] = visible_sm_count(0)
        report["matmul_ms"] = _matmul_ms()
        if what == "green-context":
            gcs = green_context_stream_from_env(0, role="prefill")
            report["green_sms"] = gcs.num_sms
            report["green_matmul_ms"] = _matmul_ms(gcs.stream)
        elif what == "green-in-mps-client":
            try:
                green_context_stream(16, 0)
                report["green_error"] = None
            except SmPartitionError as exc:
                report["green_error"] = str(exc)
        report["ok"] = True
    except Exception:
        import traceback

        report["ok"] = False
        report["error"] = traceback.format_exc()
    child_send(conn, report)


def probe(env: dict, what: str = "mps") -> dict:
    child = Child(probe_main, (what,), env)
    try:
        return child.recv(TIMEOUT_S)
    finally:
        child.close()


if pytest is not None:
    gpu = pytest.mark.gpu
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)")

    # When the device script promises MPS (EDGEACC_EXPECT_MPS=1), a missing daemon fails instead of skipping.
    needs_mps = pytest.mark.skipif(
        not mps_daemon_running() and not mps_expected(), reason="no MPS control daemon in CUDA_MPS_PIPE_DIRECTORY"
    )

    @pytest.fixture(scope="module")
    def full():
        return probe({MPS_PERCENT_VAR: "100"} if mps_daemon_running() else {}, "full")

    @gpu
    @needs_cuda
    @needs_mps
    @pytest.mark.parametrize("percent", [25, 50])
    def test_mps_percentage_caps_the_prefill_side(full, percent):
        part = probe(child_env("prefill", percent, "mps"))
        print("MPS_SPLIT_REPORT " + json.dumps({"full": full, "part": part}))
        assert full["ok"] and part["ok"], (full.get("error"), part.get("error"))
        expected = full["sms"] * percent / 100
        assert abs(part["sms"] - expected) <= 4, (part["sms"], expected)
        # Time scales with the SMs: at least 70% of the ideal slowdown.
        assert part["matmul_ms"] / full["matmul_ms"] > 0.7 * (full["sms"] / part["sms"])

    @gpu
    @needs_cuda
    @needs_mps
    def test_decode_side_at_100_keeps_the_whole_gpu(full):
        dec = probe(child_env("decode", 100, "mps"))
        assert dec["ok"], dec.get("error")
        assert dec["sms"] == torch.cuda.get_device_properties(0).multi_processor_count

    @gpu
    @needs_cuda
    def test_green_context_stream_runs_on_a_quarter_of_the_sms():
        # Under a running daemon this child is an MPS client without a percentage: the
        # combination in which green contexts work (child_env never sets the MPS variable here).
        env = child_env("prefill", 25, "green-context")
        assert MPS_PERCENT_VAR not in env and MPS_PERCENT_VAR not in os.environ
        rep = probe(env, "green-context")
        print("GREEN_CONTEXT_REPORT " + json.dumps(rep))
        if not rep["ok"] and "SmPartitionError" in rep.get("error", ""):
            pytest.skip(f"green contexts unavailable here: {rep['error'].splitlines()[-1]}")
        assert rep["ok"], rep.get("error")
        minimum, multiple = sm_granularity(0)
        assert rep["green_sms"] == sm_count_for_percent(25, rep["sms"], minimum, multiple)  # 132 SMs -> 32
        assert rep["green_matmul_ms"] / rep["matmul_ms"] > 0.7 * (rep["sms"] / rep["green_sms"])

    @gpu
    @needs_cuda
    def test_green_context_refused_clearly_inside_an_mps_percentage_client():
        rep = probe(child_env("prefill", 50, "mps"), "green-in-mps-client")
        assert rep["ok"], rep.get("error")
        assert rep["green_error"] and MPS_PERCENT_VAR in rep["green_error"]
