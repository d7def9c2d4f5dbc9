"""Each EdgeAcc side turns off the CUDA graph phase it never runs, in its own process only.

Runs upstream's real config resolution and runtime context in a fresh
interpreter (the context is process-wide), with both phases on as on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
from sglang_edgeacc.tiny_model import model_dir
from sglang.srt.server_args import ServerArgs
from sglang.srt.runtime_context import publish, get_context, get_exec, get_flags
from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase
from sglang_edgeacc.edge_acc_server.graph_phases import skip_unused_graph_phase

args = ServerArgs(model_path=str(model_dir()), load_format="dummy", enable_torch_compile=sys.argv[2] == "compile")
publish(args, role="scheduler")
# The CPU platform turns graphs off; start from what a GPU resolves (both phases captured).
config = get_exec().graph.cuda_graph_config
config = with_phase(with_phase(config, Phase.DECODE, backend=Backend.FULL), Phase.PREFILL, backend=Backend.BREAKABLE)
get_context().override("test", cuda_graph_config=config)
first = skip_unused_graph_phase(sys.argv[1], "[test]")
again = skip_unused_graph_phase(sys.argv[1], "[test]")
after = get_exec().graph.cuda_graph_config
print(json.dumps({"compile": get_flags().capture.enable_torch_compile, "first": first, "again": again, "decode": after.decode.backend, "prefill": after.prefill.backend,
                  "decode_bs": after.decode.bs, "raw": repr(args.cuda_graph_config)}))
"""


def _run(role: str, compile_mode: str = "eager") -> dict:
    env = {**os.environ, "SGLANG_PLATFORM": "edgeacc_cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, role, compile_mode], capture_output=True, text=True,
                          env=env, timeout=300)
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


def test_under_torch_compile_the_decode_side_keeps_its_prefill_graphs():
    # Upstream captures its prefill graphs before the compiled decode graphs, and the decode graphs'
    # tracing reads what those eager forwards set (a rotary cache cast to the activation dtype), so the
    # decode side goes through the same capture; the prefill side still skips the decode phase.
    decode = _run("decode", "compile")
    assert decode["compile"] is True
    assert decode["first"] is None and decode["again"] is None
    assert decode["prefill"] == "breakable" and decode["decode"] == "full"
    prefill = _run("prefill", "compile")
    assert prefill["first"] == "decode" and prefill["decode"] == "disabled" and prefill["prefill"] == "breakable"


@pytest.mark.skipif(not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")),
                    reason="inductor compiles CPU kernels with a C++ compiler; none found")
def test_compiled_rotary_embedding_reads_a_float32_cache_otherwise_than_its_float16_cast():
    # Why the decode side keeps that capture: upstream's compile-safe rotary path (forward_native ->
    # apply_rotary_emb) casts cos and sin to the query's dtype. Eager, a float32 cache and its float16 cast
    # give the same result; compiled, inductor elides the cast inside its fused kernel, so the result
    # depends on whether an eager forward had already cast the module's cache. Should upstream keep its
    # cache in one dtype, this fails and the decode side can skip its prefill graphs again.
    import torch

    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    def rope(x, cache, positions):
        cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
        return apply_rotary_emb(x, cos, sin, True)

    generator = torch.Generator().manual_seed(0)
    cache = torch.randn(4096, 16, generator=generator)
    query = torch.randn(8, 4, 16, generator=generator).half()
    positions = torch.arange(100, 108)
    assert torch.equal(rope(query, cache, positions), rope(query, cache.half(), positions))
    compiled = torch.compile(rope, dynamic=False)
    assert not torch.equal(compiled(query, cache, positions), compiled(query, cache.half(), positions))
