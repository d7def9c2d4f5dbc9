"""Each side captures only the CUDA graphs it replays (under torch.compile the decode side keeps upstream's order).

The decode side never runs a prefill forward (every extend goes to the prefill
side) and the prefill side never runs a decode step, yet upstream captures both
phases in every scheduler. Capture is most of a scheduler's start on a large
model (a Qwen3-8B shape spends close to a minute on its prefill shapes) and its
memory pool is held for the life of the process. Upstream's own PD-disaggregated
prefill instances run with decode graphs off in the same way.

The switch is upstream's resolved-config override, which changes this
process's resolved config only: the server arguments the decode side hands its
prefill side keep both phases, and each side turns off the phase it never runs.

Under ``--enable-torch-compile`` the decode side keeps its prefill graphs. Upstream
captures them first, and their eager forwards set module state that the decode
graphs, compiled after them, read: a rotary embedding without a fused kernel for
its head size casts its float32 cos/sin cache to the activation dtype on its
first eager forward, while its compile-safe path leaves the cache as it finds it,
and inductor, which elides the cast back down inside a fused kernel, then
computes with other values. Compiled without that capture first, the decode side
answers differently from upstream by rounding; with it, its process goes through
upstream's start-up in upstream's order. The graphs cost what they cost upstream.
"""

from __future__ import annotations

import logging
from typing import Optional

from sglang_edgeacc.edge_acc_server import roles

logger = logging.getLogger(__name__)


def unused_phase(role: str) -> str:
    from sglang.srt.model_executor.cuda_graph_config import Phase

    return {roles.DECODE: Phase.PREFILL, roles.PREFILL: Phase.DECODE}[role]


def skip_unused_graph_phase(role: str, log_prefix: str) -> Optional[str]:
    """Turn off the CUDA graphs of the phase ``role`` never runs; returns that phase, or None where it stays
    as it is (already off, or kept for torch.compile).

    Call before upstream captures the graphs (``Scheduler.init_all_cuda_graphs``).
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend, with_phase
    from sglang.srt.runtime_context import get_context, get_exec, get_flags

    config = get_exec().graph.cuda_graph_config
    phase = unused_phase(role)
    if config is None or getattr(config, phase).backend == Backend.DISABLED:
        return None
    if role == roles.DECODE and get_flags().capture.enable_torch_compile:
        logger.info("%s %s CUDA graphs kept under torch.compile: upstream captures them before its compiled "
                    "decode graphs, whose tracing reads the module state their eager forwards set",
                    log_prefix, phase)
        return None
    get_context().override(f"edgeacc.{role}_side",
                           cuda_graph_config=with_phase(config, phase, backend=Backend.DISABLED))
    logger.info("%s %s CUDA graphs off: the %s side never runs a %s forward", log_prefix, phase, role, phase)
    return phase
