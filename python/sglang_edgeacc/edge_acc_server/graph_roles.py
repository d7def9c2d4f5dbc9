"""Which CUDA graphs each EdgeAcc side captures: the decode side's decode graphs, the prefill side's prefill graphs.

Upstream captures both kinds in every scheduler. Under EdgeAcc the decode side
never runs a prefill forward and the prefill side never runs a decode step, so
each side skipping the other's graphs saves their capture time at start and
their memory pools for as long as the server runs. The launcher resolves the
CUDA graph config once; :func:`keep_decode_graphs_only` is applied to the
record every process inherits (the decode sides), and
:func:`prefill_side_server_args` gives the prefill side a copy with the user's
prefill graphs back and no decode graphs. Where the platform has no CUDA graph
config (the CPU platform), both leave the record as it is.
"""

from __future__ import annotations

import copy
import logging

logger = logging.getLogger(__name__)

# Non-field attribute of the record: the prefill backend the user's flags resolved to.
PREFILL_BACKEND_ATTR = "_edge_acc_prefill_graph_backend"
_DISABLED = "disabled"


def _phases(server_args):
    config = getattr(server_args, "cuda_graph_config", None)
    decode, prefill = getattr(config, "decode", None), getattr(config, "prefill", None)
    if decode is None or prefill is None or not hasattr(prefill, "backend") or not hasattr(decode, "backend"):
        return None
    return decode, prefill


def keep_decode_graphs_only(server_args) -> None:
    """On the launcher's record, after upstream resolved it: the decode sides capture no prefill graphs."""
    phases = _phases(server_args)
    if phases is None:
        return
    _, prefill = phases
    setattr(server_args, PREFILL_BACKEND_ATTR, (prefill.backend, bool(server_args.disable_prefill_cuda_graph)))
    if prefill.backend != _DISABLED:
        logger.info("[edgeacc] decode sides capture no prefill CUDA graphs (the prefill side runs every prefill)")
    prefill.backend = _DISABLED
    server_args.disable_prefill_cuda_graph = True


def prefill_side_server_args(server_args):
    """A copy of the decode side's record for its prefill side: the user's prefill graphs, no decode graphs."""
    saved = getattr(server_args, "__dict__", {}).get(PREFILL_BACKEND_ATTR)
    if _phases(server_args) is None or saved is None:
        return server_args
    copied = copy.deepcopy(server_args)
    decode, prefill = _phases(copied)
    prefill.backend, copied.disable_prefill_cuda_graph = saved
    decode.backend = _DISABLED
    copied.disable_decode_cuda_graph = True
    return copied
