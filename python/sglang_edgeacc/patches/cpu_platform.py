"""Patch ``cpu_platform``: the CUDA assumptions the ``edgeacc_cpu`` platform meets with several ranks.

Installed only when ``SGLANG_PLATFORM=edgeacc_cpu``. Rebinds ``forward_batch_info._is_cpu``
and ``parallel_state._is_cpu`` to True, replaces ``dp_attention.memcpy`` with upstream's own
``memcpy_cpu``, and gives ``TorchNativeAttnBackend`` the padding value its CUDA-graph path
would use. Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

import importlib

from sglang_edgeacc.patches._base import Patch, Target
from sglang_edgeacc.platform import is_selected

FORWARD_BATCH_INFO = "sglang.srt.model_executor.forward_batch_info"
PARALLEL_STATE = "sglang.srt.distributed.parallel_state"
DP_ATTENTION = "sglang.srt.layers.dp_attention"
TORCH_NATIVE_BACKEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend"

# A padded (absent) request in a gathered DP batch is given sequence length 1:
# the smallest length every attention kernel accepts.
PADDED_SEQ_LEN = 1


def _padded_seq_len(self) -> int:
    del self
    return PADDED_SEQ_LEN


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for module_name in (FORWARD_BATCH_INFO, PARALLEL_STATE):
        importlib.import_module(module_name)._is_cpu = True

    dp_attention = importlib.import_module(DP_ATTENTION)
    HookRegistry.register(f"{DP_ATTENTION}.memcpy", dp_attention.memcpy_cpu, HookType.REPLACE)

    backend_module, _, backend_name = TORCH_NATIVE_BACKEND.rpartition(".")
    backend = getattr(importlib.import_module(backend_module), backend_name)
    if not hasattr(backend, "get_cpu_graph_seq_len_fill_value"):
        backend.get_cpu_graph_seq_len_fill_value = _padded_seq_len


PATCH = Patch(
    name="cpu_platform",
    summary="DP attention on the edgeacc_cpu platform: CPU branches for three CUDA-only paths",
    targets=(
        Target(f"{FORWARD_BATCH_INFO}._is_cpu", is_attribute=True),
        Target(f"{PARALLEL_STATE}._is_cpu", is_attribute=True),
        Target(f"{DP_ATTENTION}.memcpy", params=("dst", "src", "dim", "offset", "sz", "offset_src")),
        Target(f"{DP_ATTENTION}.memcpy_cpu", params=("dst", "src", "dim", "offset", "sz", "offset_src")),
        Target(TORCH_NATIVE_BACKEND),
    ),
    install=_install,
    applies=is_selected,
)
