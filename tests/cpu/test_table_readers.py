"""The start-up check names every attention backend that holds ``req_to_token``, nested ones too.

Upstream's backend classes are built with ``__new__`` and given only the
attributes their constructors keep (a constructor needs a whole model runner).
FlashAttention (FA3) cannot be imported without a GPU build of ``sgl_kernel``;
a subclass of upstream's ``AttentionBackend`` of that name keeps the table as
FA3's constructor does (``self.req_to_token = model_runner.req_to_token_pool.req_to_token``).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
from sglang.srt.layers.attention.tbo_backend import TboAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

from sglang_edgeacc.edge_acc_server.table_readers import request_table_readers


class FlashAttentionBackend(AttentionBackend):
    def __init__(self, model_runner):
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.req_to_token = model_runner.req_to_token_pool.req_to_token


def _built(cls, model_runner, **attrs):
    backend = cls.__new__(cls)
    backend.model_runner = model_runner
    backend.req_to_token_pool = model_runner.req_to_token_pool
    for name, value in attrs.items():
        setattr(backend, name, value)
    return backend


def _runner():
    shared = torch.zeros(4, 32, dtype=torch.int32)
    runner = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=shared),
                             kv_index_translator=SimpleNamespace(req_to_token=shared))
    return runner, shared


def _private(readers, shared):
    return [owner for owner, table in readers if table is None or table.data_ptr() != shared.data_ptr()]


def test_a_private_table_in_a_nested_fa3_backend_is_named():
    runner, shared = _runner()
    fa3 = FlashAttentionBackend(runner)
    runner.attn_backend = _built(HybridAttnBackend, runner, prefill_backend=_built(TritonAttnBackend, runner),
                                 decode_backend=fa3, kv_index_translator=runner.kv_index_translator)
    runner.decode_attn_backend = fa3  # the same backend under two names is listed once
    assert _private(request_table_readers(runner), shared) == []

    # What a prefill side would hold had FA3 built its table before the pool was shared.
    fa3.req_to_token = torch.zeros_like(shared)
    owners = [owner for owner, _ in request_table_readers(runner)]
    assert owners.count("attention backend attn_backend.decode_backend (FlashAttentionBackend)") == 1
    assert _private(request_table_readers(runner), shared) == [
        "attention backend attn_backend.decode_backend (FlashAttentionBackend)"]


def test_children_of_two_batch_overlap_and_a_private_pool_are_named():
    runner, shared = _runner()
    private_pool = SimpleNamespace(req_to_token=torch.zeros_like(shared))
    children = [_built(FlashInferAttnBackend, runner), _built(FlashInferAttnBackend, runner)]
    children[1].req_to_token_pool = private_pool
    primary = _built(FlashInferAttnBackend, runner)
    runner.attn_backend = _built(TboAttnBackend, runner, primary=primary, children=children)
    runner.decode_attn_backend_group = []
    assert _private(request_table_readers(runner), shared) == [
        "attention backend attn_backend.children[1] (FlashInferAttnBackend).req_to_token_pool"]


def test_the_pool_and_the_translator_are_always_checked():
    runner, shared = _runner()
    runner.kv_index_translator = SimpleNamespace(req_to_token=None)
    assert _private(request_table_readers(runner), shared) == ["kv_index_translator"]
