"""What the decode side exports to its prefill side, and how the prefill side adopts it.

Exported once, after the decode side's pools exist: every parameter and buffer
of the model, the KV buffers (upstream's own ``[*k_buffer, *v_buffer]`` order,
the order ``MHATokenToKVPool._assign_post_capture_tensors`` maps back), and
``req_to_token``. The prefill side builds its model and pools like any scheduler,
on the decode side's memory (patch ``edge_acc``; why, in the patch table of
``sglang_edgeacc/patches/__init__.py``), so both sides read and write the same
weights, KV slots and request table; :func:`verify_shared_state` checks it.

On the prefill side, what was mapped has one owner, :class:`PrefillSharedState`:
set once when the prefill side connects (before its scheduler builds anything),
and read through :func:`prefill_shared_state` by the hooks of ``patches.edge_acc``
that build the model and the pools around it. Those hooks are module-level
functions that upstream calls deep inside the scheduler's construction, with no
handle on the scheduler, hence one process-wide accessor rather than an attribute.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

from sglang_edgeacc.edge_acc.tensor_export import export_tensors, module_tensors
from sglang_edgeacc.edge_acc.tensor_import import ImportedTensors
from sglang_edgeacc.edge_acc_server.messages import SharedState
from sglang_edgeacc.edge_acc_server.table_readers import request_table_readers

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


@dataclass(frozen=True)
class PrefillSharedState:
    """Everything a prefill side mapped from its decode side: the message and its mappings."""

    state: SharedState
    imported: ImportedTensors

    @property
    def decode_pid(self) -> int:
        return self.state.decode_pid

    @property
    def mapped_bytes(self) -> int:
        return self.state.tensors.total_bytes()

    @property
    def memory_pool_config(self):
        return self.state.memory_pool_config

    def weights(self) -> dict:
        """Parameters and buffers by their name in the model, as the meta-device loader binds them."""
        return {name[len(WEIGHT_PREFIX):]: t for name, t in self.imported.tensors.items()
                if name.startswith(WEIGHT_PREFIX)}

    def kv_buffers(self) -> list:
        """In upstream's own k-then-v order, as ``_assign_post_capture_tensors`` takes them."""
        return [self.imported[name] for name in self.state.kv_buffer_names]

    def req_to_token(self):
        return self.imported[REQ_TO_TOKEN]

    def verify(self, model_runner) -> None:
        verify_shared_state(model_runner, self.imported, self.state)

    def release(self) -> None:
        self.imported.release()


_prefill_shared_state: Optional[PrefillSharedState] = None


def set_prefill_shared_state(shared: PrefillSharedState) -> None:
    """Once per prefill process, when it has mapped what its decode side sent."""
    global _prefill_shared_state
    if _prefill_shared_state is not None:
        raise RuntimeError("EdgeAcc: this prefill side already holds its decode side's shared state")
    _prefill_shared_state = shared


def prefill_shared_state() -> Optional[PrefillSharedState]:
    """This prefill side's shared state; None before it connected and in every other process."""
    return _prefill_shared_state
