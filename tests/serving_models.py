"""Model directories for the server tests and the serving benchmark, built on the spot.

* :func:`sensitive_tiny_model`: the shipped tiny Qwen3 with a real checkpoint of
  random weights large enough that every output token depends on the whole
  context. sglang's ``--load-format dummy`` fills weights from [-1e-3, 1e-3],
  and a model that small answers the same tokens whatever the earlier context
  says (checked in ``tests/cpu/test_serving_models.py``), so it cannot show a
  KV cache read from the wrong slots. This one can: change one page of tokens
  fifty positions back (:func:`changed_context`) and the continuation changes.
* :func:`qwen3_8b_shaped_model`: a Qwen3-8B-shaped config (served with
  ``--load-format dummy``) beside a byte-level BPE tokenizer with Qwen3's
  151,936-entry vocabulary, so per-request costs that grow with the tokenizer
  show as they would with the real one.

Both are deterministic: the same call writes the same files.
"""

from __future__ import annotations

import functools
import json
import pathlib
import random
import shutil

from sglang_edgeacc.tiny_model import model_dir as shipped_tiny_model

SENSITIVE_WEIGHT_STD = 0.2
SENSITIVE_SEED = 20261201
# What the oracle guard changes: a run of tokens as long as a KV page of 16 (one wrong page read),
# ending this many positions before the end of the prompt. One token alone moves the random
# model's logits by about 0.1 and its greedy answer on some prompts only.
CONTEXT_CHANGE_TOKENS = 16
CONTEXT_CHANGE_BACK = 50
QWEN3_VOCAB = 151936
# Regular tokens of the production tokenizer; the rest of the vocabulary is specials and padding, as in Qwen3.
PRODUCTION_TOKENS = 151643
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": QWEN3_VOCAB,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}


def _copy_tokenizer(src: pathlib.Path, dst: pathlib.Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


def changed_context(ids: list[int]) -> list[int]:
    """``ids`` with the run of :data:`CONTEXT_CHANGE_TOKENS` tokens that ends :data:`CONTEXT_CHANGE_BACK`
    positions before its end replaced (by token 3, or 4 where it already is 3)."""
    changed = list(ids)
    end = len(changed) - CONTEXT_CHANGE_BACK
    for position in range(max(0, end - CONTEXT_CHANGE_TOKENS + 1), end + 1):
        changed[position] = 3 if changed[position] != 3 else 4
    return changed


def sensitive_tiny_model(out: pathlib.Path | str, head_dim: int | None = None,
                         dtype: str = "float32") -> pathlib.Path:
    """The tiny Qwen3 with random weights of std 0.2 (norms 1), as a safetensors checkpoint.

    ``head_dim`` and ``dtype`` give a shape that kernels with fixed head dims and no float32
    path serve (FlashInfer: ``head_dim=64, dtype="bfloat16"``)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = pathlib.Path(out)
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    src = shipped_tiny_model()
    config_dict = json.loads((src / "config.json").read_text())
    if head_dim is not None:
        config_dict["head_dim"] = head_dim
    config = Qwen3Config(**{k: v for k, v in config_dict.items() if k not in ("architectures", "torch_dtype")})
    generator = torch.Generator().manual_seed(SENSITIVE_SEED)
    model = Qwen3ForCausalLM(config).float()
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * SENSITIVE_WEIGHT_STD)
    model.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    config_dict["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config_dict, indent=2) + "\n")
    _copy_tokenizer(src, out)
    return out


@functools.lru_cache(maxsize=2)  # about 30 s to build; several tests of one session read it
def production_tokenizer_json(vocab_size: int = PRODUCTION_TOKENS, seed: int = 0) -> str:
    """A byte-level BPE with ``vocab_size`` regular tokens and Qwen-style specials.

    The 256 byte tokens come first; every merge joins two pieces of printable ASCII (space
    included), so each merged token decodes to whole text. Random weights pick random tokens,
    and the detokenizer holds back any text that ends inside a UTF-8 character: merges over all
    256 bytes would end about half the tokens that way, which delays the first streamed text
    (``bench_serving``'s first-token time) by a number of decode steps that depends on the
    schedule rather than on the prefill.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {}
    for token in alphabet:
        vocab[token] = len(vocab)
    merges: list[tuple[str, str]] = []
    printable_ascii = "".join(map(chr, range(ord(" "), ord("~") + 1)))
    # The pre-tokenizer's own byte-to-character table, read for these 95 bytes.
    [(byte_chars, _)] = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(
        printable_ascii)
    tokens = list(byte_chars)
    rng = random.Random(seed)
    while len(vocab) < vocab_size:
        left, right = rng.choice(tokens), rng.choice(tokens)
        merged = left + right
        if merged in vocab or len(merged) > 12:
            continue
        vocab[merged] = len(vocab)
        merges.append((left, right))
        tokens.append(merged)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS))
    return tokenizer.to_str()


def write_production_tokenizer(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(production_tokenizer_json())
    shipped = json.loads((shipped_tiny_model() / "tokenizer_config.json").read_text())
    shipped["model_max_length"] = QWEN3_8B_CONFIG["max_position_embeddings"]
    (out / "tokenizer_config.json").write_text(json.dumps(shipped, indent=2) + "\n")


# The reference deployment's model: Qwen3-32B's published shape.
QWEN3_32B_CONFIG = {**QWEN3_8B_CONFIG, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                    "num_attention_heads": 64, "max_window_layers": 64}
QWEN3_SHAPES = {"8b": QWEN3_8B_CONFIG, "32b": QWEN3_32B_CONFIG}


def qwen3_8b_shaped_model(out: pathlib.Path | str) -> pathlib.Path:
    """Qwen3-8B's config (serve with ``--load-format dummy``) and a production-sized tokenizer."""
    return qwen3_shaped_model(out, "8b")


def qwen3_shaped_model(out: pathlib.Path | str, shape: str) -> pathlib.Path:
    """A Qwen3 config of ``shape`` (a key of QWEN3_SHAPES; serve with ``--load-format dummy``) and a
    production-sized tokenizer."""
    out = pathlib.Path(out)
    if (out / "tokenizer.json").exists() and (out / "config.json").exists():
        return out
    write_production_tokenizer(out)
    (out / "config.json").write_text(json.dumps(QWEN3_SHAPES[shape], indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}) + "\n")
    return out


def tiny_model_with_production_tokenizer(out: pathlib.Path | str) -> pathlib.Path:
    """The tiny Qwen3's shape with Qwen3's vocabulary and the production-sized tokenizer (dummy weights)."""
    out = pathlib.Path(out)
    if (out / "tokenizer.json").exists():
        return out
    write_production_tokenizer(out)
    config = json.loads((shipped_tiny_model() / "config.json").read_text())
    config["vocab_size"] = QWEN3_VOCAB
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
