"""The server suite's oracle: with the sensitive checkpoint the answer depends on earlier context; with
weights like ``--load-format dummy``'s it does not, so a wrong KV read could not show."""

from __future__ import annotations

import random

import pytest
import torch

from tests import serving_models


def _greedy(model, ids, n=12):
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[0, len(ids):].tolist()


def _prompts(seed: int = 0):
    """A prompt like the GPU suite's long one (1000 random ids of the tiny vocabulary) and its changed context."""
    rng = random.Random(seed)
    base = [rng.randrange(3, 537) for _ in range(1000)]
    return base, serving_models.changed_context(base)


def test_the_context_change_is_one_page_fifty_positions_back():
    base = list(range(10, 1010))
    changed = serving_models.changed_context(base)
    differs = [i for i, (a, b) in enumerate(zip(base, changed)) if a != b]
    assert differs == list(range(1000 - 50 - 15, 1000 - 50 + 1)) and len(changed) == len(base)


@pytest.mark.parametrize("shape", [{}, {"head_dim": 64, "dtype": "bfloat16"}], ids=["float32", "h64-bf16"])
def test_the_sensitive_checkpoint_answers_differently_when_early_context_changes(tmp_path, shape):
    """On every prompt, not one lucky one: the GPU suite's guard holds for its own prompt on every backend."""
    from transformers import AutoModelForCausalLM

    path = serving_models.sensitive_tiny_model(tmp_path / "m", **shape)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype="auto").eval()
    assert model.dtype == getattr(torch, shape.get("dtype", "float32"))
    assert model.config.head_dim == shape.get("head_dim", 16)
    with torch.no_grad():
        for seed in range(6):
            base, changed = _prompts(seed)
            assert _greedy(model, base) != _greedy(model, changed), seed


def test_weights_like_sglangs_dummy_ones_ignore_the_same_change(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(serving_models.sensitive_tiny_model(tmp_path / "m")).eval()
    with torch.no_grad():
        for param in model.state_dict().values():  # what upstream's dummy loader does: U(-1e-3, 1e-3)
            generator = torch.Generator().manual_seed(1234)
            param.uniform_(-1e-3, 1e-3, generator=generator)
        base, changed = _prompts()
        assert _greedy(model, base) == _greedy(model, changed)


def test_the_files_are_the_same_on_every_build(tmp_path):
    a = serving_models.sensitive_tiny_model(tmp_path / "a") / "model.safetensors"
    b = serving_models.sensitive_tiny_model(tmp_path / "b") / "model.safetensors"
    assert a.read_bytes() == b.read_bytes()


def test_every_merged_token_of_the_production_tokenizer_streams_as_soon_as_it_is_made():
    """sglang's detokenizer holds back text that ends inside a UTF-8 character; a benchmark tokenizer whose
    tokens did that would delay the first streamed text, which is what bench_serving times as TTFT."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(serving_models.production_tokenizer_json())
    assert tokenizer.get_vocab_size() == serving_models.PRODUCTION_TOKENS + len(serving_models.SPECIALS)
    held = [i for i in range(256, serving_models.PRODUCTION_TOKENS) if tokenizer.decode([i]).endswith("\ufffd")]
    assert held == []
    assert tokenizer.decode([300, 301]) == tokenizer.decode([300]) + tokenizer.decode([301])
