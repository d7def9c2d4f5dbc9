"""A prefill batch's message grows with the batch, not with the tokenizer or the pool it points into."""

from __future__ import annotations

import pathlib
import sys
from types import SimpleNamespace

import torch

from sglang_edgeacc.edge_acc_server.batch_codec import LocalObjects, pack_prefill_batch, unpack_prefill_batch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import serving_models  # noqa: E402


def _production_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    directory = tmp_path / "tok"
    serving_models.write_production_tokenizer(directory)
    return AutoTokenizer.from_pretrained(directory)


def _batch(tokenizer, pool: torch.Tensor, n: int = 4):
    reqs = [SimpleNamespace(rid=f"r{i}", origin_input_ids=list(range(50)), tokenizer=tokenizer, grammar=None)
            for i in range(n)]
    # Slots handed out as a view of the allocator's pool-sized free list.
    return SimpleNamespace(reqs=reqs, out_cache_loc=pool[100:100 + 50 * n], sampling_info=None,
                           seq_lens=torch.full((n,), 50))


def test_the_tokenizer_travels_by_reference_and_tensors_without_their_storage(tmp_path):
    tokenizer = _production_tokenizer(tmp_path)
    assert len(tokenizer) > 150_000
    pool = torch.arange(700_000, dtype=torch.int64)  # a 700k-token pool's free list: 5.6 MB
    packed = pack_prefill_batch(_batch(tokenizer, pool), tokenizer=tokenizer)
    # Four requests of 50 tokens: kilobytes, not the 7.8 MB tokenizer nor the 5.6 MB pool.
    assert len(packed) < 64_000, len(packed)
    local_tokenizer = object()
    local = LocalObjects(req_to_token_pool=None, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
                         model_config=None, tokenizer=local_tokenizer)
    batch = unpack_prefill_batch(packed, local)
    assert all(req.tokenizer is local_tokenizer for req in batch.reqs)
    assert torch.equal(batch.out_cache_loc, torch.arange(100, 300))
    assert batch.out_cache_loc.untyped_storage().nbytes() == 200 * 8


def test_without_the_reference_the_tokenizer_would_be_in_every_message(tmp_path):
    tokenizer = _production_tokenizer(tmp_path)
    small_pool = torch.arange(1000, dtype=torch.int64)
    # The control: the same batch packed without naming the tokenizer carries all of it.
    assert len(pack_prefill_batch(_batch(tokenizer, small_pool))) > 5_000_000
