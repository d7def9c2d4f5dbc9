"""Each EdgeAcc side turns off the CUDA graph phase it never runs, in its own process only.

Runs upstream's real config resolution and runtime context in a fresh
interpreter (the context is process-wide), with both phases on as on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
from sglang_edgeacc.tiny_model import model_dir
from sglang.srt.server_args import ServerArgs
from sglang.srt.runtime_context import publish, get_context, get_exec
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
from sglang_edgeacc.edge_acc_server.graph_phases import skip_unused_graph_phase

args = ServerArgs(model_path=str(model_dir()), load_format="dummy")
publish(args, role="scheduler")
# The CPU platform turns graphs off; start from what a GPU resolves (both phases captured).
config = get_exec().graph.cuda_graph_config
config = with_phase(with_phase(config, Phase.DECODE, backend=Backend.FULL), Phase.PREFILL, backend=Backend.BREAKABLE)
get_context().override("test", cuda_graph_config=config)
first = skip_unused_graph_phase(sys.argv[1], "[test]")
again = skip_unused_graph_phase(sys.argv[1], "[test]")
after = get_exec().graph.cuda_graph_config
print(json.dumps({"first": first, "again": again, "decode": after.decode.backend, "prefill": after.prefill.backend,
                  "decode_bs": after.decode.bs, "raw": repr(args.cuda_graph_config)}))
"""


def _run(role: str) -> dict:
    env = {**os.environ, "SGLANG_PLATFORM": "edgeacc_cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, role], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("role, off, kept", [("decode", "prefill", "decode"), ("prefill", "decode", "prefill")])
def test_a_side_turns_off_only_the_phase_it_never_runs(role, off, kept):
    result = _run(role)
    assert result["first"] == off and result["again"] is None
    assert result[off] == "disabled"
    assert result[kept] == ("full" if kept == "decode" else "breakable")
    if kept == "decode":
        assert result["decode_bs"], "the decode phase keeps its batch sizes"
    # The server arguments (what the decode side hands its prefill side) are untouched.
    assert result["raw"] == "None"
