"""Patch ``graph_input_copy``: a decode step never waits for a Triton compile of the graph-input copy.

Target: ``sglang.kernels.ops.memory.small_copy.try_small_copy`` (REPLACE through
``HookRegistry``), which upstream's CUDA-graph runners call each step to copy a batch's
inputs into the graphs' buffers; it declines, so the callers take their own fallback,
torch's foreach copy. Installed only in processes of a launch with ``--enable-edge-acc``.
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

from sglang_edgeacc.edge_acc_server.roles import edge_acc_enabled
from sglang_edgeacc.patches._base import Patch, Target, hook_installer

SMALL_COPY = "sglang.kernels.ops.memory.small_copy.try_small_copy"
# The callers: each imports the function at call time and falls back when it returns False.
CALLERS = (
    "sglang.srt.model_executor.cuda_graph_buffer_registry._grouped_foreach_copy_",
    "sglang.srt.model_executor.runner_utils.buffers._grouped_foreach_copy_",
)


def decline_small_copy(dsts, srcs) -> bool:
    """Leave the copy to the caller's fallback (torch's foreach copy, no kernel compiled at run time).

    Triton compiles upstream's kernel once per specialization of its arguments (for pointers, as Triton
    does by default, whether each is 16-byte aligned: sources one element off alignment compiled it
    again on an H100, 154 ms), so a batch whose inputs specialize it anew compiles a kernel inside the
    decode step (118 ms without a decode result on an H100, for every running request).
    """
    del dsts, srcs
    return False


PATCH = Patch(
    name="graph_input_copy",
    summary="a decode step copies its inputs into the CUDA graph's buffers without a kernel compiled at run time",
    targets=(
        Target(SMALL_COPY, params=("dsts", "srcs")),
        Target(CALLERS[0], params=("dsts", "srcs")),
        Target(CALLERS[1], params=("dsts", "srcs")),
    ),
    install=hook_installer((SMALL_COPY, decline_small_copy, "REPLACE")),
    applies=edge_acc_enabled,
)
