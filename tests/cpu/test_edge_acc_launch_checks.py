"""Launcher-side checks of an accepted EdgeAcc launch on CUDA, before anything is spawned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_edgeacc.tiny_model import model_dir

PARSE = textwrap.dedent(
    """
    import sys
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    load_plugins()
    prepare_server_args(sys.argv[1:])
    print("ACCEPTED")
    """
)


def _parse(args: list[str], env_extra: dict[str, str], tmp_path: Path,
           device: tuple[str, ...] = ("--device", "cuda")) -> subprocess.CompletedProcess:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_MPS_", "PYTORCH_"))}
    # No nvidia-cuda-mps-control reachable: only this interpreter's directory and an empty one.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{empty_bin}"
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", PARSE, "--model-path", str(model_dir()), *device, *args],
        env=env, capture_output=True, text=True, timeout=300,
    )


def test_mps_split_without_a_daemon_is_refused_with_the_command_that_starts_one(tmp_path):
    result = _parse(["--enable-edge-acc"], {}, tmp_path)
    assert result.returncode != 0
    assert "ACCEPTED" not in result.stdout
    assert "--edge-acc-sm-partition mps needs a running CUDA MPS control daemon" in result.stderr
    assert "--edge-acc-sm-partition none" in result.stderr


@pytest.mark.parametrize("split", [(), ("--edge-acc-sm-partition", "none")], ids=["default", "time_sliced"])
def test_a_launch_without_a_gpu_is_told_to_select_the_cpu_platform(tmp_path, split):
    # No GPU, also on a GPU host; the device left to upstream's detection, as a user leaves it.
    result = _parse(["--enable-edge-acc", *split], {"CUDA_VISIBLE_DEVICES": ""}, tmp_path, device=())
    assert result.returncode != 0
    assert "ACCEPTED" not in result.stdout
    assert "--enable-edge-acc found no CUDA GPU on this host" in result.stderr, result.stderr[-2000:]
    assert "SGLANG_PLATFORM=edgeacc_cpu" in result.stderr
    # Not the MPS daemon's advice: time-slicing needs a GPU as much as the MPS split does.
    assert "--edge-acc-sm-partition none" not in result.stderr


def test_time_sliced_launch_needs_no_daemon_but_refuses_expandable_segments(tmp_path):
    accepted = _parse(["--enable-edge-acc", "--edge-acc-sm-partition", "none"], {}, tmp_path)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert "ACCEPTED" in accepted.stdout

    refused = _parse(["--enable-edge-acc", "--edge-acc-sm-partition", "none"],
                     {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, tmp_path)
    assert refused.returncode != 0
    assert "PYTORCH_CUDA_ALLOC_CONF" in refused.stderr


PRINT_PREFILL_BACKEND = PARSE.replace(
    'prepare_server_args(sys.argv[1:])\nprint("ACCEPTED")',
    "from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config\n"
    "from sglang.srt.arg_groups.model_override_base import resolved_view\n"
    "sa = prepare_server_args(sys.argv[1:])\n"
    "parse_cuda_graph_config(sa)  # upstream's own step (its pipeline skips it on a host without CUDA)\n"
    'print("ACCEPTED", "off-switch:", sa.disable_prefill_cuda_graph,'
    ' "prefill-graph:", resolved_view(sa).cuda_graph_config.prefill.backend)',
)


def _fake_mps_daemon(tmp_path: Path) -> dict[str, str]:
    """A control binary that answers every command, so the launch gets past the daemon check."""
    fake = tmp_path / "bin" / "nvidia-cuda-mps-control"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\ncat > /dev/null\nexit 0\n")
    fake.chmod(0o755)
    return {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")}


def _parse_printing(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_MPS_", "PYTORCH_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{tmp_path / 'bin'}"
    env.update(_fake_mps_daemon(tmp_path))
    return subprocess.run(
        [sys.executable, "-c", PRINT_PREFILL_BACKEND, "--model-path", str(model_dir()), "--device", "cuda", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )


def test_green_context_splits_turn_prefill_graphs_off_and_refuse_an_explicit_one(tmp_path):
    # The MPS split leaves upstream's prefill graphs alone, an explicit backend included.
    mps = _parse_printing(["--enable-edge-acc", "--edge-acc-sm-partition", "mps",
                           "--cuda-graph-backend-prefill", "breakable"], tmp_path)
    assert mps.returncode == 0, mps.stderr[-2000:]
    assert "off-switch: False prefill-graph: breakable" in mps.stdout
    for mode in ("adaptive", "green-context"):
        off = _parse_printing(["--enable-edge-acc", "--edge-acc-sm-partition", mode], tmp_path)
        assert off.returncode == 0, off.stderr[-2000:]
        assert "off-switch: True prefill-graph: disabled" in off.stdout
        assert "prefill CUDA graphs off" in off.stderr
    refused = _parse_printing(["--enable-edge-acc", "--edge-acc-sm-partition", "adaptive",
                               "--cuda-graph-backend-prefill", "breakable"], tmp_path)
    assert refused.returncode != 0
    assert "ACCEPTED" not in refused.stdout
    assert "--cuda-graph-backend-prefill breakable" in refused.stderr
    assert "--cuda-graph-backend-prefill disabled" in refused.stderr
    in_config = _parse_printing(["--enable-edge-acc", "--edge-acc-sm-partition", "adaptive",
                                 "--cuda-graph-config", '{"prefill": {"backend": "breakable"}}'], tmp_path)
    assert in_config.returncode != 0
    assert "--cuda-graph-backend-prefill breakable" in in_config.stderr
