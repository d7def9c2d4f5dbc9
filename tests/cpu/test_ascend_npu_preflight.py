"""The preflight at server start (patches/npu_preflight.py) on real sglang ServerArgs records.

`--device npu` cannot launch on this machine, so the tests call the resolution
step wrapper directly with a record from sglang's own `prepare_server_args`, and
once drive `ServerArgs.resolve_once()` through the real pipeline to show the
wrapper sits where it should (before upstream's NPU defaults touch the device).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import pytest

pytest.importorskip("sglang.srt.server_args")

from sglang.srt.arg_groups import resolution_hooks  # noqa: E402
from sglang.srt.server_args import prepare_server_args  # noqa: E402

from sglang_edgeacc.flags import EdgeAccFlags, attach_flags  # noqa: E402
from sglang_edgeacc.patches import _base  # noqa: E402
from sglang_edgeacc.patches import npu_preflight  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "ascend")
NO_MTP = os.path.join(FIXTURES, "dsv32_w8a8_no_mtp")

CHECKED_VARS = (
    "HCCL_BUFFSIZE", "DEEPEP_HCCL_BUFFSIZE", "DEEPEP_NORMAL_LONG_SEQ_ROUND", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS",
    "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", "SGLANG_ENABLE_SPEC_V2", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM",
    "HCCL_INTRA_PCIE_ENABLE", "HCCL_INTRA_ROCE_ENABLE", "HCCL_OP_EXPANSION_MODE", "HCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME", "SGLANG_EDGEACC_ASCEND_HARDWARE", "SGLANG_DEEPEP_BF16_DISPATCH",
)  # fmt: skip
CLUSTER_ENV = {
    "SGLANG_EDGEACC_ASCEND_HARDWARE": "a2", "HCCL_INTRA_PCIE_ENABLE": "1", "HCCL_INTRA_ROCE_ENABLE": "0",
    "HCCL_SOCKET_IFNAME": "enp189s0f0", "GLOO_SOCKET_IFNAME": "enp189s0f0",
}  # fmt: skip
NODE0 = [
    "--model-path", NO_MTP, "--device", "npu", "--tp", "16", "--nnodes", "2", "--node-rank", "0",
    "--dist-init-addr", "10.0.0.1:5000", "--attention-backend", "ascend", "--quantization", "modelslim",
    "--moe-a2a-backend", "deepep", "--deepep-mode", "auto", "--cuda-graph-bs-decode", "4", "8",
]  # fmt: skip
NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
SEED_EXTRA_ENV = {
    "HCCL_BUFFSIZE": "400", "SGLANG_ENABLE_SPEC_V2": "1", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM": "1",
    "DEEPEP_NORMAL_LONG_SEQ_ROUND": "8", "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS": "512",
}  # fmt: skip


@pytest.fixture
def environ(monkeypatch):
    """os.environ with only the cluster variables the checks read; restored afterwards."""
    for name in CHECKED_VARS:
        monkeypatch.delenv(name, raising=False)
    for key, value in CLUSTER_ENV.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


@pytest.fixture
def logged():
    """Messages of the patch's logger (sglang's logging setup may not propagate to caplog)."""
    messages = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(f"{record.levelname} {record.getMessage()}")
    log = logging.getLogger(npu_preflight.__name__)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield messages
    log.removeHandler(handler)
    log.setLevel(old_level)


class StepRecorder:
    """Stands in for upstream's handle_npu_backends, which queries NPU memory."""

    def __init__(self):
        self.calls = []

    def __call__(self, server_args):
        self.calls.append(server_args)


def test_patch_targets_match_the_installed_sglang():
    _base.verify(npu_preflight.PATCH)


def test_install_registers_the_wrapper_on_the_npu_step(monkeypatch):
    monkeypatch.setattr(resolution_hooks, "_HOOKS", {})
    monkeypatch.setattr(npu_preflight, "_installed", False)
    npu_preflight.PATCH.install()
    npu_preflight.PATCH.install()  # idempotent
    assert resolution_hooks._HOOKS == {"handle_npu_backends": [npu_preflight.preflight_then_npu_defaults]}


@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_does_nothing_at_all_without_device_npu(environ, device):
    argv = [a for a in NODE0 if a not in ("--device", "npu")] + NEXTN + (["--device", device] if device else [])
    for key, value in SEED_EXTRA_ENV.items():
        environ.setenv(key, value)
    record = prepare_server_args(argv)
    before = dict(os.environ)
    step = StepRecorder()
    npu_preflight.preflight_then_npu_defaults(record, step)  # the seed's failing setup, but not on npu
    assert step.calls == [record]
    assert dict(os.environ) == before


def test_reads_the_0_5_23_spellings_of_dp_attention_and_graphs():
    record = prepare_server_args(
        ["--model-path", NO_MTP, "--device", "npu", "--tp", "16", "--attn-dp-size", "4",
         "--cuda-graph-backend-decode", "disabled", "--max-running-requests", "64"]  # fmt: skip
    )
    settings = npu_preflight._settings_of(record)
    assert (settings.attn_dp_size, settings.disable_cuda_graph, settings.max_running_requests) == (4, True, 64)


def test_seed_configuration_is_refused_before_the_npu_step(environ):
    for key, value in SEED_EXTRA_ENV.items():
        environ.setenv(key, value)
    record = prepare_server_args([*NODE0, *NEXTN])
    step = StepRecorder()
    with pytest.raises(SystemExit) as stopped:
        npu_preflight.preflight_then_npu_defaults(record, step)
    assert isinstance(stopped.value, npu_preflight.NpuPreflightFailed)
    assert step.calls == []  # upstream's NPU defaults (device memory query) never ran
    text = str(stopped.value.code)
    assert "FAIL speculative-mtp" in text and "FAIL ant-moving" in text and "FAIL hccl-buffer" in text
    assert "--edge-acc-skip-preflight" in text
    assert "DEEPEP_HCCL_BUFFSIZE" not in os.environ  # an explicit (too small) value is never overridden


def test_skip_preflight_starts_anyway_with_a_warning(environ, logged):
    for key, value in SEED_EXTRA_ENV.items():
        environ.setenv(key, value)
    record = prepare_server_args([*NODE0, *NEXTN])
    attach_flags(record, EdgeAccFlags(edge_acc_skip_preflight=True))
    step = StepRecorder()
    npu_preflight.preflight_then_npu_defaults(record, step)
    assert step.calls == [record]
    warning = next(m for m in logged if m.startswith("WARNING"))
    assert "--edge-acc-skip-preflight" in warning and "FAIL speculative-mtp" in warning


def test_auto_sizing_sets_the_environment_the_schedulers_inherit(environ, logged):
    record = prepare_server_args(NODE0)
    step = StepRecorder()
    npu_preflight.preflight_then_npu_defaults(record, step)
    assert step.calls == [record]
    # requirement 1256 MB (A2 layered low-latency at 128 tokens/rank) + max(200 MB, 10%)
    assert os.environ["DEEPEP_HCCL_BUFFSIZE"] == "1456"
    assert "HCCL_BUFFSIZE" not in os.environ
    sized = next(m for m in logged if "export DEEPEP_HCCL_BUFFSIZE=1456" in m)
    assert sized.startswith("INFO") and "requirement 1256 MB" in sized and "margin 200 MB" in sized
    # A process started now (as sglang's spawned schedulers are) sees it.
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('DEEPEP_HCCL_BUFFSIZE'))"],
        capture_output=True, text=True, timeout=60,
    )
    assert child.stdout.strip() == "1456"


def test_sglang_builds_its_hccl_options_from_the_auto_size(environ, monkeypatch):
    npu_preflight.run_npu_preflight(prepare_server_args(NODE0))
    from sglang.srt.distributed import parallel_state

    class Options:  # torch_npu's ProcessGroupHCCL.Options, reduced to the attribute sglang sets
        hccl_config = None

    fake = types.ModuleType("torch_npu")
    fake._C = types.SimpleNamespace(_distributed_c10d=types.SimpleNamespace(ProcessGroupHCCL=types.SimpleNamespace(Options=Options)))
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(parallel_state, "_is_npu", True)
    assert parallel_state.get_torch_distributed_pg_options(None).hccl_config == {"hccl_buffer_size": 1456}
    assert parallel_state.get_torch_distributed_pg_options("moe_ep").hccl_config == {"hccl_buffer_size": 1456}
    assert parallel_state.get_torch_distributed_pg_options("tp") is None  # other groups keep HCCL's default


def test_explicit_setting_is_never_overridden(environ):
    environ.setenv("HCCL_BUFFSIZE", "5000")
    report = npu_preflight.run_npu_preflight(prepare_server_args(NODE0))
    assert report.ok and report.auto_sizing is None
    assert os.environ["HCCL_BUFFSIZE"] == "5000" and "DEEPEP_HCCL_BUFFSIZE" not in os.environ


def test_too_small_explicit_setting_is_a_refusal(environ):
    environ.setenv("DEEPEP_HCCL_BUFFSIZE", "1000")
    with pytest.raises(npu_preflight.NpuPreflightFailed) as stopped:
        npu_preflight.run_npu_preflight(prepare_server_args(NODE0))
    assert [c.id for c in stopped.value.report.failures] == ["hccl-buffer"]
    assert os.environ["DEEPEP_HCCL_BUFFSIZE"] == "1000"


def test_resolve_once_runs_the_preflight_in_the_real_pipeline(environ, monkeypatch):
    # Only our wrapper on the step, whatever plugins this process has loaded.
    monkeypatch.setattr(resolution_hooks, "_HOOKS", {"handle_npu_backends": [npu_preflight.preflight_then_npu_defaults]})
    for key, value in SEED_EXTRA_ENV.items():
        environ.setenv(key, value)
    record = prepare_server_args([*NODE0, *NEXTN])
    with pytest.raises(npu_preflight.NpuPreflightFailed) as stopped:
        record.resolve_once()
    assert {"speculative-mtp", "ant-moving", "hccl-buffer"} <= {c.id for c in stopped.value.report.failures}
    assert getattr(record, "_resolution_failed", False)  # sglang marks the record, as for any refusal
