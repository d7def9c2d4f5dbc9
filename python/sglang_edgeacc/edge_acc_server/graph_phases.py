"""Each side captures only the CUDA graphs it replays.

The decode side never runs a prefill forward (every extend goes to the prefill
side) and the prefill side never runs a decode step, yet upstream captures both
phases in every scheduler. Capture is most of a scheduler's start on a large
model (a Qwen3-8B shape spends close to a minute on its prefill shapes) and its
memory pool is held for the life of the process. Upstream's own PD-disaggregated
prefill instances run with decode graphs off in the same way.

The switch is upstream's resolved-config override, which changes this
process's resolved config only: the server arguments the decode side hands its
prefill side keep both phases, and each side turns off the phase it never runs.
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
    """Turn off the CUDA graphs of the phase ``role`` never runs; returns that phase, or None if already off.

    Call before upstream captures the graphs (``Scheduler.init_all_cuda_graphs``).
    """
    from sglang.srt.model_executor.cuda_graph_config import Backend, with_phase
    from sglang.srt.runtime_context import get_context, get_exec

    config = get_exec().graph.cuda_graph_config
    phase = unused_phase(role)
    if config is None or getattr(config, phase).backend == Backend.DISABLED:
        return None
    get_context().override(f"edgeacc.{role}_side",
                           cuda_graph_config=with_phase(config, phase, backend=Backend.DISABLED))
    logger.info("%s %s CUDA graphs off: the %s side never runs a %s forward", log_prefix, phase, role, phase)
    return phase
