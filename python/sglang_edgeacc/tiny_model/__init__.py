"""A 2-layer Qwen3 with a 1k-token byte-level BPE tokenizer, shipped for the CPU platform.

Served with ``--load-format dummy`` the weights are random, so the text is
nonsense, but every stage of the real pipeline runs: tokenizer, chat template,
scheduler, model forward, sampler, detokenizer.

    python -m sglang.launch_server --model-path "$(sglang-edgeacc tiny-model)" --load-format dummy
"""

from __future__ import annotations

import argparse
import pathlib


def model_dir() -> pathlib.Path:
    return pathlib.Path(__file__).resolve().parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options: prints the directory


def run(args: argparse.Namespace) -> int:
    del args
    print(model_dir())
    return 0
