"""Every holder of ``req_to_token`` on a model runner, named, for the start-up check.

The prefill side must read the decode side's request table wherever a kernel
reads one: the pool, the KV index translator, and each attention backend that
keeps its own reference. Backends nest: a hybrid backend holds a prefill and a
decode backend (``--prefill-attention-backend`` / ``--decode-attention-backend``),
two-batch overlap holds a primary and its children, PD multiplexing a group of
decode backends beside ``attn_backend``. FlashAttention (FA3) keeps
``self.req_to_token`` from its construction, FlashInfer and Triton the pool
itself. The walk follows every attribute that is an attention backend, or a
list of them, so a backend nested in another is named where it sits
("attn_backend.decode_backend (FlashAttentionBackend)"), and a backend upstream
adds later is checked without a change here.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

# Where a model runner keeps attention backends; the walk finds the nested ones.
ROOTS = ("attn_backend", "decode_attn_backend", "decode_attn_backend_group")


def _table(holder) -> Optional[torch.Tensor]:
    table = getattr(holder, "req_to_token", None)
    return table if isinstance(table, torch.Tensor) else None


def _backends(where: str, value) -> Iterator[tuple[str, AttentionBackend]]:
    if isinstance(value, AttentionBackend):
        yield where, value
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if isinstance(item, AttentionBackend):
                yield f"{where}[{index}]", item


def attention_backends(model_runner) -> list[tuple[str, AttentionBackend]]:
    """(where, backend) for every attention backend reachable from the runner, each once."""
    found, seen = [], set()
    stack = [pair for root in ROOTS for pair in _backends(root, getattr(model_runner, root, None))]
    stack.reverse()
    while stack:
        where, backend = stack.pop()
        if id(backend) in seen:
            continue
        seen.add(id(backend))
        found.append((where, backend))
        attributes = getattr(backend, "__dict__", {})  # a backend with __slots__ holds no nested one here
        nested = [pair for name, value in attributes.items() for pair in _backends(f"{where}.{name}", value)]
        stack.extend(reversed(nested))
    return found


def request_table_readers(model_runner) -> list[tuple[str, Optional[torch.Tensor]]]:
    """(owner, table) for everything on the runner that holds its own reference to
    ``req_to_token`` (the patch table's ``edge_acc`` row says why each must hold the
    shared table). The pool and the runner's translator are always listed: a missing
    table there is itself a failure."""
    readers = [("req_to_token_pool", _table(model_runner.req_to_token_pool))]
    translator = getattr(model_runner, "kv_index_translator", None)
    if translator is not None:
        readers.append(("kv_index_translator", _table(translator)))
    for where, backend in attention_backends(model_runner):
        owner = f"attention backend {where} ({type(backend).__name__})"
        if _table(backend) is not None:
            readers.append((owner, _table(backend)))
        for attribute in ("req_to_token_pool", "kv_index_translator"):
            table = _table(getattr(backend, attribute, None))
            if table is not None:
                readers.append((f"{owner}.{attribute}", table))
    return readers
