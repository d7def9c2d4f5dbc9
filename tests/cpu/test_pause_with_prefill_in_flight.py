"""Pausing generation and updating weights while a batch is at the prefill side.

Upstream's ``/pause_generation`` with ``mode: retract`` frees the KV of every request
it finds and recomputes it after ``/continue_generation``, so that a weight update in
between (applied at once while paused: the RL loop of pause, update, continue) reaches
every request. The batch at the prefill side is in none of the places upstream looks.
Without EdgeAcc's handling its requests kept the KV and the first token of a forward
that, being slowed down here by a test fault, ran after the update; with it, the pause
waits for that batch, merges it, and retracts it with the rest: the request keeps the
first token of the weights it was sent under and continues on the new ones, as
upstream's request does. ``mode: in_place`` retracts nothing; the update itself then
waits for the batch, so that no forward reads weights being written.
"""

from __future__ import annotations

import concurrent.futures as cf
import time

import pytest
import requests

from tests.fault_injection import edgeacc_faults
from tests.harness import CpuServer, random_checkpoint

pytestmark = pytest.mark.server

SLOW = "edgeacc-test-slow"
PROMPT = [5, 17, 42, 99, 123, 7, 300, 12]
NEW_TOKENS = 8


def _greedy(server, input_ids, max_new_tokens, rid=None) -> list[int]:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    if rid is not None:
        body["rid"] = rid
    reply = requests.post(f"{server.url}/generate", json=body, timeout=300)
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()["output_ids"]


def _post(server, route, body) -> dict:
    reply = requests.post(f"{server.url}{route}", json=body, timeout=300)
    assert reply.status_code == 200, f"{route}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def _pause_update_continue(server, mode: str, checkpoint: str, rid: str) -> list[int]:
    """A greedy request whose prefill is at the prefill side while generation pauses, the weights change
    to ``checkpoint``, and generation continues; its output ids."""
    with cf.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_greedy, server, PROMPT, NEW_TOKENS, rid)
        time.sleep(0.4 * edgeacc_faults.SLOW_PREFILL_S)
        assert not pending.done()
        _post(server, "/pause_generation", {"mode": mode})
        try:
            # Kept requests keep their KV in place, so the cache stays (upstream refuses to flush it under them).
            update = {"model_path": checkpoint, "flush_cache": mode == "retract"}
            assert _post(server, "/update_weights_from_disk", update)["success"]
        finally:
            _post(server, "/continue_generation", {})
        return pending.result()


def test_a_prefill_in_flight_is_retracted_or_finished_before_a_weight_update(tmp_path):
    first = random_checkpoint(tmp_path / "first", seed=1)
    second = random_checkpoint(tmp_path / "second", seed=2)
    env = edgeacc_faults.server_env(**{edgeacc_faults.SLOW_PREFILL_RID_ENV: SLOW})
    server = CpuServer(args=("--model-path", first, "--load-format", "auto", "--enable-edge-acc")).start(env=env)
    try:
        # retract: the first token of the weights it was sent under, then the new weights' greedy
        # continuation of the prompt and that token, its KV recomputed on them.
        first_token = _greedy(server, PROMPT, 1)
        output = _pause_update_continue(server, "retract", second, f"{SLOW}-retract")
        assert output[:1] == first_token, (output, first_token)
        assert output[1:] == _greedy(server, PROMPT + first_token, NEW_TOKENS - 1), output
        assert first_token != _greedy(server, PROMPT, 1), "the two checkpoints must answer differently"

        # in_place: the batch at the prefill side finishes on the weights it was sent under.
        first_token = _greedy(server, PROMPT, 1)
        output = _pause_update_continue(server, "in_place", first, f"{SLOW}-in-place")
        assert output[:1] == first_token and len(output) == NEW_TOKENS, (output, first_token)

        log = server.log_tail(10**7)
        assert log.count("pause_generation: waiting for the prefill batch in flight") == 1, log[-3000:]
        assert log.count("update_weights_from_disk: waiting for the prefill batch in flight") == 1, log[-3000:]
        assert server.proc.poll() is None
        # Nothing left running or holding KV: the cache flushes.
        flush = requests.post(f"{server.url}/flush_cache", timeout=60)
        assert flush.status_code == 200 and "Cache flushed" in flush.text, flush.text
    finally:
        server.stop()
