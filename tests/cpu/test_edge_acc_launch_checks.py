"""Launcher-side checks of an accepted EdgeAcc launch on CUDA, before anything is spawned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def _parse(args: list[str], env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_MPS_", "PYTORCH_"))}
    # No nvidia-cuda-mps-control reachable: only this interpreter's directory and an empty one.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{empty_bin}"
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", PARSE, "--model-path", str(model_dir()), "--device", "cuda", *args],
        env=env, capture_output=True, text=True, timeout=300,
    )


def test_mps_split_without_a_daemon_is_refused_with_the_command_that_starts_one(tmp_path):
    result = _parse(["--enable-edge-acc"], {}, tmp_path)
    assert result.returncode != 0
    assert "ACCEPTED" not in result.stdout
    assert "--edge-acc-sm-partition mps needs a running CUDA MPS control daemon" in result.stderr
    assert "--edge-acc-sm-partition none" in result.stderr


def test_time_sliced_launch_needs_no_daemon_but_refuses_expandable_segments(tmp_path):
    accepted = _parse(["--enable-edge-acc", "--edge-acc-sm-partition", "none"], {}, tmp_path)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    assert "ACCEPTED" in accepted.stdout

    refused = _parse(["--enable-edge-acc", "--edge-acc-sm-partition", "none"],
                     {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, tmp_path)
    assert refused.returncode != 0
    assert "PYTORCH_CUDA_ALLOC_CONF" in refused.stderr
