"""Launcher-side checks of an accepted EdgeAcc launch on CUDA, before anything is spawned.

Each check is one interpreter that imports sglang and resolves a command line; the
module runs them all up front, a few at a time (two cores; each holds about 1 GB).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
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

PRINT_PREFILL_BACKEND = PARSE.replace(
    'prepare_server_args(sys.argv[1:])\nprint("ACCEPTED")',
    "from sglang.srt.arg_groups.cuda_graph_hook import parse_cuda_graph_config\n"
    "from sglang.srt.arg_groups.model_override_base import resolved_view\n"
    "sa = prepare_server_args(sys.argv[1:])\n"
    "parse_cuda_graph_config(sa)  # upstream's own step (its pipeline skips it on a host without CUDA)\n"
    'print("ACCEPTED", "off-switch:", sa.disable_prefill_cuda_graph,'
    ' "prefill-graph:", resolved_view(sa).cuda_graph_config.prefill.backend)',
)


@dataclass(frozen=True)
class Launch:
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    device: tuple[str, ...] = ("--device", "cuda")
    # Prints the resolved prefill graph backend, with a stub MPS daemon on PATH; otherwise no
    # nvidia-cuda-mps-control is reachable (only this interpreter's directory and an empty one).
    prints_prefill_graph: bool = False


EDGE, NONE = ("--enable-edge-acc",), ("--edge-acc-sm-partition", "none")
# No GPU, also on a GPU host; the device left to upstream's detection, as a user leaves it.
NO_GPU = dict(env=(("CUDA_VISIBLE_DEVICES", ""),), device=())
LAUNCHES = {
    "mps_without_daemon": Launch(EDGE),
    "no_gpu_default": Launch(EDGE, **NO_GPU),
    "no_gpu_time_sliced": Launch((*EDGE, *NONE), **NO_GPU),
    "time_sliced": Launch((*EDGE, *NONE)),
    "time_sliced_expandable": Launch((*EDGE, *NONE), env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
    "mps_explicit_prefill_graph": Launch((*EDGE, "--edge-acc-sm-partition", "mps", "--cuda-graph-backend-prefill",
                                          "breakable"), prints_prefill_graph=True),
    "green-context": Launch((*EDGE, "--edge-acc-sm-partition", "green-context"), prints_prefill_graph=True),
    "green_explicit_prefill_graph": Launch((*EDGE, "--edge-acc-sm-partition", "green-context",
                                            "--cuda-graph-backend-prefill", "breakable"), prints_prefill_graph=True),
    "green_prefill_graph_in_config": Launch((*EDGE, "--edge-acc-sm-partition", "green-context", "--cuda-graph-config",
                                             '{"prefill": {"backend": "breakable"}}'), prints_prefill_graph=True),
}
AT_ONCE = 3


def _fake_mps_daemon(bin_dir: Path) -> None:
    """A control binary that answers every command, so the launch gets past the daemon check."""
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text("#!/bin/sh\ncat > /dev/null\nexit 0\n")
    fake.chmod(0o755)


def _run(launch: Launch, workdir: Path) -> subprocess.CompletedProcess:
    bin_dir = workdir / ("bin-mps" if launch.prints_prefill_graph else "bin-empty")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_MPS_", "PYTORCH_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}"
    if launch.prints_prefill_graph:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(workdir / "pipe")
    env.update(launch.env)
    script = PRINT_PREFILL_BACKEND if launch.prints_prefill_graph else PARSE
    return subprocess.run(
        [sys.executable, "-c", script, "--model-path", str(model_dir()), *launch.device, *launch.args],
        env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def parsed(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    workdir = tmp_path_factory.mktemp("launch-checks")
    (workdir / "bin-empty").mkdir()
    (workdir / "bin-mps").mkdir()
    _fake_mps_daemon(workdir / "bin-mps")
    with cf.ThreadPoolExecutor(AT_ONCE) as pool:
        futures = {name: pool.submit(_run, launch, workdir) for name, launch in LAUNCHES.items()}
        return {name: future.result() for name, future in futures.items()}


def test_mps_split_without_a_daemon_is_refused_with_the_command_that_starts_one(parsed):
    result = parsed["mps_without_daemon"]
    assert result.returncode != 0
    assert "ACCEPTED" not in result.stdout
    assert "--edge-acc-sm-partition mps needs a running CUDA MPS control daemon" in result.stderr
    assert "--edge-acc-sm-partition none" in result.stderr


@pytest.mark.parametrize("split", ["default", "time_sliced"])
def test_a_launch_without_a_gpu_is_told_to_select_the_cpu_platform(parsed, split):
    result = parsed[f"no_gpu_{split}"]
    assert result.returncode != 0
    assert "ACCEPTED" not in result.stdout
    assert "--enable-edge-acc found no CUDA GPU on this host" in result.stderr, result.stderr[-2000:]
    assert "SGLANG_PLATFORM=edgeacc_cpu" in result.stderr
    # Not the MPS daemon's advice: time-slicing needs a GPU as much as the MPS split does.
    assert "--edge-acc-sm-partition none" not in result.stderr


def test_time_sliced_launch_needs_no_daemon_but_refuses_expandable_segments(parsed):
    accepted = parsed["time_sliced"]
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert "ACCEPTED" in accepted.stdout

    refused = parsed["time_sliced_expandable"]
    assert refused.returncode != 0
    assert "PYTORCH_CUDA_ALLOC_CONF" in refused.stderr


def test_the_green_context_split_turns_prefill_graphs_off_and_refuses_an_explicit_one(parsed):
    # The MPS split leaves upstream's prefill graphs alone, an explicit backend included.
    mps = parsed["mps_explicit_prefill_graph"]
    assert mps.returncode == 0, mps.stderr[-2000:]
    assert "off-switch: False prefill-graph: breakable" in mps.stdout
    off = parsed["green-context"]
    assert off.returncode == 0, off.stderr[-2000:]
    assert "off-switch: True prefill-graph: disabled" in off.stdout
    assert "prefill CUDA graphs off" in off.stderr
    refused = parsed["green_explicit_prefill_graph"]
    assert refused.returncode != 0
    assert "ACCEPTED" not in refused.stdout
    assert "--cuda-graph-backend-prefill breakable" in refused.stderr
    assert "--cuda-graph-backend-prefill disabled" in refused.stderr
    in_config = parsed["green_prefill_graph_in_config"]
    assert in_config.returncode != 0
    assert "--cuda-graph-backend-prefill breakable" in in_config.stderr
