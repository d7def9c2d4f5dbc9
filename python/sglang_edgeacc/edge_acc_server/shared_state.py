"""What the decode side exports to its prefill side, and how the prefill side adopts it.

Exported once, after the decode side's pools exist: every parameter and buffer
of the model, the KV buffers (upstream's own ``[*k_buffer, *v_buffer]`` order,
the order ``MHATokenToKVPool._assign_post_capture_tensors`` maps back), and
``req_to_token``. The prefill side builds its model and pools like any scheduler
and then points them at the decode side's memory, so both sides read and write
the same weights, KV slots and request table.
"""

from __future__ import annotations

import os

import logging

from sglang_edgeacc.edge_acc.tensor_share import (
    ImportedTensors,
    bind_into_module,
    export_tensors,
    module_tensors,
)
from sglang_edgeacc.edge_acc_server.messages import SharedState

logger = logging.getLogger(__name__)

WEIGHT_PREFIX = "model."
KV_PREFIX = "kv."
REQ_TO_TOKEN = "req_to_token"


class UnsupportedKVPool(RuntimeError):
    pass


def _kv_buffers(kv_pool) -> list:
    if not (hasattr(kv_pool, "k_buffer") and hasattr(kv_pool, "v_buffer")
            and hasattr(kv_pool, "_assign_post_capture_tensors")):
        raise UnsupportedKVPool(
            f"EdgeAcc shares MHA-style KV pools (k_buffer/v_buffer); this model uses "
            f"{type(kv_pool).__name__}. Serve it without --enable-edge-acc."
        )
    return [*kv_pool.k_buffer, *kv_pool.v_buffer]


def export_model_runner_state(model_runner) -> SharedState:
    tensors = {WEIGHT_PREFIX + name: t for name, t in module_tensors(model_runner.model).items()}
    kv_names = []
    for index, buffer in enumerate(_kv_buffers(model_runner.token_to_kv_pool)):
        name = f"{KV_PREFIX}{index}"
        tensors[name] = buffer
        kv_names.append(name)
    tensors[REQ_TO_TOKEN] = model_runner.req_to_token_pool.req_to_token


    return SharedState(
        tensors=export_tensors(tensors),
        memory_pool_config=model_runner.memory_pool_config,
        kv_buffer_names=tuple(kv_names),
        decode_pid=os.getpid(),
    )


def adopt_shared_state(model_runner, imported: ImportedTensors, state: SharedState) -> int:
    """Point the prefill side's model and pools at the decode side's memory; returns bytes mapped."""
    weights = {name[len(WEIGHT_PREFIX):]: t for name, t in imported.tensors.items() if name.startswith(WEIGHT_PREFIX)}
    bind_into_module(model_runner.model, weights)

    kv_pool = model_runner.token_to_kv_pool
    local = _kv_buffers(kv_pool)
    shared = [imported[name] for name in state.kv_buffer_names]
    if len(local) != len(shared) or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(local, shared)):
        raise RuntimeError(
            "EdgeAcc: the prefill side's KV pool does not match the decode side's "
            f"({len(local)} vs {len(shared)} buffers); both sides must resolve the same server arguments"
        )
    kv_pool._assign_post_capture_tensors(shared)
    if hasattr(kv_pool, "_init_data_ptrs_and_strides"):
        kv_pool._init_data_ptrs_and_strides()

    req_to_token = imported[REQ_TO_TOKEN]
    if req_to_token.shape != model_runner.req_to_token_pool.req_to_token.shape:
        raise RuntimeError("EdgeAcc: req_to_token shapes differ between the two sides")
    model_runner.req_to_token_pool.req_to_token = req_to_token
    return state.tensors.total_bytes()
