"""Regenerate the tiny model's tokenizer files (python/sglang_edgeacc/tiny_model/).

A byte-level BPE trained on a fixed in-repo corpus, so the output is reproducible
and covers any UTF-8 text; Qwen-style special tokens and chat template, so the
OpenAI chat endpoint exercises the real template path.

    python scripts/make_tiny_tokenizer.py
"""

import json
import pathlib

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = pathlib.Path(__file__).resolve().parents[1] / "python" / "sglang_edgeacc" / "tiny_model"
VOCAB_SIZE = 1024
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "SGLang serves large language models with a radix cache and continuous batching.",
    "Prefill processes the prompt; decode generates one token per step.",
    "EdgeAcc runs prefill and decode as two processes on the same GPU.",
    "user assistant system You are a helpful assistant. Hello! How are you today?",
    "What is the capital of France? Paris is the capital of France.",
    "1 2 3 4 5 6 7 8 9 10 11 12 0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \"",
    "def main():\n    print('hello world')\n    return 0\n",
    "Once upon a time, there was a small model that answered every question.",
]


def main() -> None:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer.save(str(OUT / "tokenizer.json"))

    chat_template = (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "chat_template": chat_template,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"vocab={tokenizer.get_vocab_size()} ids: " + ", ".join(f"{t}={tokenizer.token_to_id(t)}" for t in SPECIALS))


if __name__ == "__main__":
    main()
