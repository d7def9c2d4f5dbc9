"""What the decode side exports to its prefill side, and how the prefill side adopts it.

Exported once, after the decode side's pools exist: every parameter and buffer
of the model, the KV buffers (upstream's own ``[*k_buffer, *v_buffer]`` order,
the order ``MHATokenToKVPool._assign_post_capture_tensors`` maps back), and
``req_to_token``. The prefill side builds its model and pools like any scheduler,
on the decode side's memory (``patches.edge_acc``), so both sides read and write
the same weights, KV slots and request table; :func:`verify_shared_state` checks it.
"""

from __future__ import annotations

import logging
import os

import torch

from sglang_edgeacc.edge_acc.tensor_share import ImportedTensors, export_tensors, module_tensors
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


def verify_shared_state(model_runner, imported: ImportedTensors, state: SharedState) -> None:
    """Check the prefill side's model, KV pool and request table are the decode side's memory.

    All three were built around the shared tensors (see ``shared_weights_loader``
    and ``patches.edge_acc``); this verifies it, so a future upstream change that
    bypasses those hooks fails at start, not as silent divergence.
    """
    # Tied weights (lm_head = embed_tokens) are bound under either name, so a
    # parameter may sit on any imported mapping of that memory.
    shared_ptrs = {t.data_ptr() for t in imported.tensors.values()}
    for name, param in model_runner.model.named_parameters(remove_duplicate=False):
        if param.data_ptr() not in shared_ptrs:
            raise RuntimeError(f"EdgeAcc: the prefill side's weight {name!r} is not the decode side's tensor")
    local = _kv_buffers(model_runner.token_to_kv_pool)
    shared = [imported[name] for name in state.kv_buffer_names]
    if len(local) != len(shared) or any(a.data_ptr() != b.data_ptr() for a, b in zip(local, shared)):
        raise RuntimeError(
            "EdgeAcc: the prefill side's KV pool is not the decode side's memory "
            f"({len(local)} local vs {len(shared)} shared buffers)"
        )
    shared_table = imported[REQ_TO_TOKEN]
    for owner, table in request_table_readers(model_runner):
        if table is None or table.data_ptr() != shared_table.data_ptr():
            raise RuntimeError(
                f"EdgeAcc: the prefill side's {owner} reads a private req_to_token, not the decode side's; "
                "its KV reads would miss every prefix the decode side wrote"
            )


def request_table_readers(model_runner) -> list[tuple[str, object]]:
    """Everything on a model runner that holds its own reference to ``req_to_token``.

    Upstream hands the table to the KV index translator when the pool is built and
    to the attention backends when they are; each keeps the tensor it was given.
    """
    readers = [("req_to_token_pool", model_runner.req_to_token_pool.req_to_token)]
    translator = getattr(model_runner, "kv_index_translator", None)
    if translator is not None:
        readers.append(("kv_index_translator", getattr(translator, "req_to_token", None)))
    backend = getattr(model_runner, "attn_backend", None)
    if backend is not None and isinstance(getattr(backend, "req_to_token", None), torch.Tensor):
        readers.append((f"attention backend {type(backend).__name__}", backend.req_to_token))
    return readers
