"""The decode warm-up's sizing and request, and how an EdgeAcc launch takes it up (the server test is in
test_edge_acc_server.py)."""

from __future__ import annotations

import argparse

import pytest

from sglang_edgeacc.server_start import decode_warmup


def test_one_prompt_per_size_each_answered_one_token_longer_than_the_one_before():
    request = decode_warmup.warmup_input(5, vocab_size=151_936)
    assert [p["max_new_tokens"] for p in request.sampling_params] == [2, 3, 4, 5, 6]
    assert all(p["ignore_eos"] and p["temperature"] == 0 for p in request.sampling_params)
    assert [len(ids) for ids in request.input_ids] == [decode_warmup.PROMPT_TOKENS] * 5
    assert all(decode_warmup.FIRST_ID <= t < decode_warmup.END_ID for ids in request.input_ids for t in ids)


@pytest.mark.parametrize("vocab_size", [300, 64])
def test_prompt_ids_stay_inside_a_small_vocabulary(vocab_size):
    request = decode_warmup.warmup_input(50, vocab_size=vocab_size)
    assert all(0 <= t < vocab_size for ids in request.input_ids for t in ids)


@pytest.mark.parametrize("graphs, running, capacity, expected", [
    ([1, 2, 4, 8, 16, 128], None, None, 128),  # the largest graph
    ([1, 2, 4, 8, 16, 128], 48, None, 48),  # no more than may run at once
    ([], 48, None, 0),  # nothing to warm
])
def test_the_warm_up_size_follows_the_graphs_and_the_running_limit(graphs, running, capacity, expected):
    assert decode_warmup.warmup_size(graphs, running, capacity) == expected


def test_the_warm_up_holds_at_most_half_the_kv_pool():
    n = decode_warmup.warmup_size([512], None, 4096)
    assert decode_warmup.warm_tokens(n) <= 2048 < decode_warmup.warm_tokens(n + 1)


def test_a_rank_without_decode_graphs_is_warmed_to_the_configured_largest_size():
    state = {"decode_cuda_graph_bs": [], "effective_max_running_requests_per_dp": 64,
             "memory_usage": {"token_capacity": 700_000}}
    assert decode_warmup.rank_limits(state, 32) == ([32], 64, 700_000)
    state["decode_cuda_graph_bs"] = [1, 2, 4]
    assert decode_warmup.rank_limits(state, 32)[0] == [1, 2, 4]


def _server_args(*extra):
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(["--model-path", "python/sglang_edgeacc/tiny_model",
                                                       "--device", "cpu", *extra]))


def test_an_edge_acc_launch_adds_the_warm_up_after_the_users_own():
    server_args = _server_args("--warmups", "prefill_shapes")
    assert decode_warmup.add_to_launch(server_args)
    assert server_args.warmups == f"prefill_shapes,{decode_warmup.NAME}"
    assert decode_warmup.add_to_launch(server_args)  # once only
    assert server_args.warmups == f"prefill_shapes,{decode_warmup.NAME}"


@pytest.mark.parametrize("flags", [("--skip-server-warmup",), ("--tokenizer-worker-num", "2")])
def test_no_warm_up_where_the_launch_skips_warm_ups_or_serves_http_from_other_processes(flags):
    server_args = _server_args(*flags)
    assert not decode_warmup.add_to_launch(server_args)
    assert server_args.warmups is None


def test_the_answer_lengths_come_from_the_answers():
    answers = [{"meta_info": {"completion_tokens": 2}}, {"meta_info": {"completion_tokens": 3}}]
    assert decode_warmup.answer_lengths(answers) == [2, 3]
    assert decode_warmup.answer_lengths({"meta_info": {"completion_tokens": 4}}) == [4]


class _FlushingManager:
    """Answers flush_cache as upstream does: not flushed while requests are still leaving."""

    def __init__(self, busy_answers: int):
        self.busy_answers = busy_answers
        self.asked = 0

    async def flush_cache(self, timeout_s=None):
        from sglang.srt.managers.io_struct import FlushCacheReqOutput

        self.asked += 1
        return FlushCacheReqOutput(success=self.asked > self.busy_answers)


def test_the_prefix_cache_is_flushed_once_the_server_is_idle(monkeypatch):
    import asyncio

    monkeypatch.setattr(decode_warmup, "FLUSH_RETRY_S", 0.0)
    manager = _FlushingManager(busy_answers=3)
    assert asyncio.run(decode_warmup.flush_prefix_cache(manager))
    assert manager.asked == 4


def test_a_server_that_never_becomes_idle_keeps_the_warm_up_in_its_cache_and_says_so(monkeypatch, caplog):
    import asyncio

    monkeypatch.setattr(decode_warmup, "FLUSH_RETRY_S", 0.0)
    manager = _FlushingManager(busy_answers=10**6)
    assert not asyncio.run(decode_warmup.flush_prefix_cache(manager))
    assert manager.asked == decode_warmup.FLUSH_TRIES
    assert "stay in the prefix cache" in caplog.text
