"""Take the decode side through every batch size its graphs cover before the server takes requests.

A server's first decode step at a batch size it has not run before can stall
for a one-time 100-200 ms inside the step's launch (plain sglang pays it as
well); under EdgeAcc, whose decode gaps are otherwise bounded, a user's first
burst would see it as its worst gap. sglang runs named warm-ups before it
starts listening (``--warmups``, ``sglang.srt.entrypoints.warmup``); an EdgeAcc
launch adds this one unless ``--skip-server-warmup`` is given.

One batched request of ``n`` short prompts, the i-th answered with exactly
i + 1 tokens: every prompt's first token comes from the prefill, so the first
decode step runs all ``n`` and one request finishes at each step after it,
through every size from ``n`` down to one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Iterable, Optional

logger = logging.getLogger(__name__)

NAME = "edge_acc_decode_batch_sizes"
PROMPT_TOKENS = 8
# The warm-up may hold at most this share of the KV pool, so it never retracts or queues.
POOL_SHARE = 0.5
# Token ids of the prompts: above the special tokens of common tokenizers, inside any vocabulary.
FIRST_ID, END_ID = 100, 1000
FLUSH_TRIES, FLUSH_RETRY_S = 50, 0.1


def warm_tokens(n: int) -> int:
    """KV tokens the warm-up of ``n`` prompts holds at its peak (every request admitted at once)."""
    return n * PROMPT_TOKENS + n * (n + 3) // 2


def warmup_size(graph_sizes: Iterable[int], max_running: Optional[int], token_capacity: Optional[int]) -> int:
    """How many prompts one DP rank gets: the largest decode graph, within the running and KV limits."""
    n = max(graph_sizes, default=0)
    if max_running:
        n = min(n, max_running)
    if token_capacity:
        while n > 1 and warm_tokens(n) > token_capacity * POOL_SHARE:
            n -= 1
    return max(n, 0)


def configured_max_bs() -> int:
    """The decode graphs' largest batch size as this launch resolved it (captured or not)."""
    from sglang.srt.runtime_context import get_exec

    return int(get_exec().graph.cuda_graph_config.decode.max_bs or 0)


def rank_limits(state: dict, fallback_max_bs: int) -> tuple[list[int], Optional[int], Optional[int]]:
    """A DP rank's decode graph sizes, running-request limit and KV token capacity from its internal state.

    A rank without decode graphs (the CPU, ``--disable-cuda-graph``) is warmed up to the size its
    graphs would have had: a first step at a new size may cost more than the next one without them too.
    """
    memory = state.get("memory_usage") or {}
    sizes = list(state.get("decode_cuda_graph_bs") or ()) or [fallback_max_bs]
    return sizes, state.get("effective_max_running_requests_per_dp"), memory.get("token_capacity")


def warmup_input(n: int, vocab_size: int, seed: int = 0):
    """The batched request: ``n`` prompts of PROMPT_TOKENS ids, the i-th (from 1) answered with i + 1 tokens."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    rng = random.Random(seed)
    first = FIRST_ID if vocab_size > FIRST_ID else 0
    end = min(END_ID, vocab_size)
    prompts = [[rng.randrange(first, end) for _ in range(PROMPT_TOKENS)] for _ in range(n)]
    params = [{"max_new_tokens": i + 1, "temperature": 0, "ignore_eos": True} for i in range(1, n + 1)]
    return GenerateReqInput(input_ids=prompts, sampling_params=params)


async def warm_decode_batch_sizes(disaggregation_mode: str, tokenizer_manager) -> None:
    """The registered warm-up: asks each DP rank what its graphs cover, then sends the request."""
    if disaggregation_mode != "null":
        logger.info("[edgeacc] decode warm-up skipped: PD disaggregation (%s) warms its own way",
                    disaggregation_mode)
        return
    states = await tokenizer_manager.get_internal_state()
    fallback = configured_max_bs()
    sizes = [warmup_size(*rank_limits(state, fallback)) for state in states]
    per_rank = min(sizes, default=0)
    if per_rank <= 1:
        logger.info("[edgeacc] decode warm-up skipped: no decode batch sizes above one to warm (%s)", sizes)
        return
    # The DP controller spreads a batch's requests over the ranks: about per_rank each.
    n = per_rank * len(states)
    logger.info("[edgeacc] warming decode batch sizes %d down to 1 (%d prompts, %d DP rank(s))",
                per_rank, n, len(states))
    started = time.monotonic()
    request = warmup_input(n, tokenizer_manager.model_config.vocab_size)
    answers = None
    async for answers in tokenizer_manager.generate_request(request, None):
        pass
    lengths = answer_lengths(answers)
    flushed = await flush_prefix_cache(tokenizer_manager)
    logger.info("[edgeacc] decode warm-up done in %.1f s: %d answers of %s tokens%s", time.monotonic() - started,
                len(lengths), f"{min(lengths)} to {max(lengths)}" if lengths else "no",
                "; prefix cache flushed" if flushed else "")


async def flush_prefix_cache(tokenizer_manager) -> bool:
    """Drop what the warm-up left in the prefix cache, so the server starts as it would without it.

    Its prompts would otherwise give a user's prompt that begins with the same token ids a
    prefix hit computed in another batch, which rounds otherwise. Upstream flushes only an
    idle server; the warm-up's last requests may still be leaving, so it asks a few times.
    """
    for _ in range(FLUSH_TRIES):
        if (await tokenizer_manager.flush_cache()).success:
            return True
        await asyncio.sleep(FLUSH_RETRY_S)
    logger.warning("[edgeacc] the decode warm-up's prompts stay in the prefix cache: the server did not become "
                   "idle within %.1f s", FLUSH_TRIES * FLUSH_RETRY_S)
    return False


def answer_lengths(answers) -> list[int]:
    """The completion lengths of a batched request's answers (what the warm-up actually ran)."""
    if isinstance(answers, dict):
        answers = [answers]
    return [int(a["meta_info"]["completion_tokens"]) for a in answers or () if "meta_info" in a]


def add_to_launch(server_args) -> bool:
    """Add the warm-up to an EdgeAcc launch's ``--warmups``; False where it is left out.

    Left out under ``--skip-server-warmup``, and with several tokenizer workers, whose HTTP
    servers run in processes of their own (the warm-up is registered in the launcher's).
    """
    if getattr(server_args, "skip_server_warmup", False) or (server_args.tokenizer_worker_num or 1) > 1:
        return False
    named = [name for name in (server_args.warmups or "").split(",") if name]
    if NAME not in named:
        server_args.warmups = ",".join([*named, NAME])
    return True
