"""Pack a decode side's prefill ``ScheduleBatch`` into bytes for its prefill side, and unpack it there.

A ``ScheduleBatch`` points at the decode side's process-local machinery (pools,
allocator, radix tree, model config, the tokenizer every request holds). Those
are not sent: the packer replaces each with a reference by role, and the
unpacker binds the reference to the prefill side's own object -- whose pools map
the very same memory, and whose tokenizer was loaded from the same files. A
request's grammar travels as the vocab mask it filled (:mod:`grammar_mask`).
Every tensor travels as its own elements only, never the whole storage it may
be a view of (an allocator's free list, a pool-sized buffer). Everything else
(requests, sampling parameters) is pickled as is, so a message grows with the
batch, not with the tokenizer or the pool.
"""

from __future__ import annotations

import io
import pickle
import weakref
from dataclasses import dataclass
from typing import Any

import torch

# Reference tags for process-local objects.
REQ_TO_TOKEN_POOL = "req_to_token_pool"
KV_POOL = "token_to_kv_pool"
KV_ALLOCATOR = "token_to_kv_pool_allocator"
MODEL_CONFIG = "model_config"
TOKENIZER = "tokenizer"
LOCAL_ONLY = "local_only"  # decode-side bookkeeping the forward never reads (radix nodes, caches)
BACK_REFERENCE = "back_reference"  # a weak reference back to the batch; re-pointed after loading
# Objects from these modules are the decode side's bookkeeping (radix nodes,
# caches, Prometheus collectors with their locks); the forward never reads them.
LOCAL_ONLY_MODULES = ("sglang.srt.mem_cache.", "sglang.srt.observability.", "prometheus_client.")


def _local_types() -> dict[type, str]:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool

    return {
        ReqToTokenPool: REQ_TO_TOKEN_POOL,
        KVCache: KV_POOL,
        BaseTokenToKVPoolAllocator: KV_ALLOCATOR,
        ModelConfig: MODEL_CONFIG,
    }


@dataclass(frozen=True)
class LocalObjects:
    """The prefill side's own objects that stand in for the decode side's."""

    req_to_token_pool: Any
    token_to_kv_pool: Any
    token_to_kv_pool_allocator: Any
    model_config: Any
    tokenizer: Any = None


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with a storage of its own elements (a view of a larger storage would pickle all of it)."""
    storage_bytes = tensor.untyped_storage().nbytes()
    if tensor.is_contiguous() and storage_bytes == tensor.numel() * tensor.element_size():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


class _BatchPickler(pickle.Pickler):
    def __init__(self, file, local_types: dict[type, str], grammar_masks: dict | None = None,
                 local_objects: dict[int, str] | None = None):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._local_types = local_types
        self._grammar_masks = grammar_masks or {}
        self._local_objects = local_objects or {}
        self._compacted: list[torch.Tensor] = []  # alive until the dump ends: pickle memoizes by id

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and type(obj) is torch.Tensor:
            compact = _compact(obj)
            if compact is obj:
                return NotImplemented
            self._compacted.append(compact)
            return compact.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        # A request's grammar is native decode-side state: it travels as the mask it filled.
        stand_in = self._grammar_masks.get(id(obj)) if self._grammar_masks else None
        return NotImplemented if stand_in is None else stand_in.__reduce__()

    def persistent_id(self, obj):
        if isinstance(obj, (torch.Tensor, str, bytes, int, float, list, tuple, dict)):
            return None
        tag = self._local_objects.get(id(obj))
        if tag is not None:
            return tag
        if isinstance(obj, weakref.ReferenceType):
            return BACK_REFERENCE
        for cls, tag in self._local_types.items():
            if isinstance(obj, cls):
                return tag
        module = type(obj).__module__ or ""
        if module.startswith(LOCAL_ONLY_MODULES) or isinstance(obj, (torch.cuda.Event, torch.cuda.Stream)):
            return LOCAL_ONLY
        return None


class _BatchUnpickler(pickle.Unpickler):
    def __init__(self, file, local: LocalObjects):
        super().__init__(file)
        self._local = local

    def persistent_load(self, tag):
        if tag in (LOCAL_ONLY, BACK_REFERENCE):
            return None
        return getattr(self._local, tag)


def pack_prefill_batch(batch, tokenizer=None) -> bytes:
    """``batch`` as bytes; ``tokenizer`` (the scheduler's, which every request holds) travels as a reference."""
    from sglang_edgeacc.edge_acc_server.grammar_mask import prefilled_grammar_masks

    buffer = io.BytesIO()
    local_objects = {id(tokenizer): TOKENIZER} if tokenizer is not None else {}
    try:
        _BatchPickler(buffer, _local_types(), prefilled_grammar_masks(batch), local_objects).dump(batch)
    except Exception as exc:
        raise TypeError(
            f"EdgeAcc cannot send this prefill batch: {exc}; unpicklable: {_unpicklable_paths(batch)}") from exc
    return buffer.getvalue()


def _unpicklable_paths(obj, path="batch", depth=0, seen=None) -> list[str]:
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    try:
        _BatchPickler(io.BytesIO(), _local_types()).dump(obj)
        return []
    except Exception:
        pass
    children = []
    if isinstance(obj, (list, tuple)):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(obj[:4])]
    elif isinstance(obj, dict):
        children = [(f"{path}[{k!r}]", v) for k, v in list(obj.items())[:50]]
    elif hasattr(obj, "__dict__") or hasattr(obj, "__slots__"):
        names = list(getattr(obj, "__dict__", {})) + list(getattr(obj, "__slots__", ()))
        children = [(f"{path}.{n}", getattr(obj, n, None)) for n in names]
    found = []
    for child_path, child in children:
        found += _unpicklable_paths(child, child_path, depth + 1, seen)
    return found or [f"{path} ({type(obj).__name__})"]


def unpack_prefill_batch(data: bytes, local: LocalObjects):
    batch = _BatchUnpickler(io.BytesIO(data), local).load()
    orchestrator = getattr(batch.sampling_info, "penalizer_orchestrator", None)
    if orchestrator is not None and hasattr(orchestrator, "_batch_ref"):
        # The penalizers reach their batch through this reference.
        orchestrator._batch_ref = weakref.ref(batch)
    return batch
