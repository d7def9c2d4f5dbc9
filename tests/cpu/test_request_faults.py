"""Requests in trouble on their way through the prefill side, in one EdgeAcc server with test faults.

A request that holds what cannot cross to the prefill side fails alone: the decode
side pickles each prefill batch, and a request holding an object pickle cannot take
(here one built to refuse, attached on the decode side by a test fault) used to take
the whole server down. Now it is answered with a 400 that names the object, and the
requests sent with it, and every later one, are served as usual.

An abort reaches a request whose prefill is in flight: the batch at the prefill side
is in neither upstream's running batch nor its last batch, where upstream's abort
looks, so such a request used to be decoded to its last token after the client gave
up on it. A test fault slows the prefill side down for marked requests, so that the
abort lands while their batch (or one chunk of their prompt) is there.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time

import pytest
import requests

from tests.fault_injection import edgeacc_faults

pytestmark = pytest.mark.server

EDGE = ("--chunked-prefill-size", "128", "--enable-edge-acc")
MARKER = "edgeacc-test-unpicklable"
SLOW = "edgeacc-test-slow"
STALL = "edgeacc-test-stall"
FAULT_ENV = edgeacc_faults.server_env(**{edgeacc_faults.UNPICKLABLE_RID_ENV: MARKER,
                                         edgeacc_faults.SLOW_PREFILL_RID_ENV: SLOW,
                                         edgeacc_faults.STALL_DISPATCH_RID_ENV: STALL})
PROMPTS = ["The quick brown fox", "Hello world", "a b c d e f g"]


def _generate(server, text: str, rid: str) -> requests.Response:
    return requests.post(f"{server.url}/generate", timeout=120, json={
        "text": text, "rid": rid, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})


def test_a_request_that_cannot_be_handed_over_fails_alone(cpu_servers):
    server = cpu_servers.get(*EDGE, env=FAULT_ENV)
    expected = {text: server.generate(text, max_new_tokens=6)["output_ids"] for text in PROMPTS}

    # Sent together so that they can share a prefill batch with the marked one.
    rids = [f"{MARKER}-0", "ordinary-1", "ordinary-2"]
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(lambda pair: _generate(server, *pair), zip(PROMPTS, rids)))

    marked, *others = replies
    assert marked.status_code == 400, marked.text[:500]
    message = marked.json()["error"]["message"]
    assert "cannot hand this request to its prefill side" in message, message
    assert "edgeacc_test_payload (BuiltToBeUnpicklable) cannot be pickled" in message, message
    for text, reply in zip(PROMPTS[1:], others):
        assert reply.status_code == 200, reply.text[:500]
        assert reply.json()["output_ids"] == expected[text]

    assert server.proc.poll() is None, server.log_tail()
    for text in PROMPTS:
        assert server.generate(text, max_new_tokens=6)["output_ids"] == expected[text]
    log = server.log_tail(400_000)
    assert f"request {MARKER}-0 cannot be handed to the prefill side" in log
    assert "edgeacc_test_payload (BuiltToBeUnpicklable)" in log


def _abort_while_at_the_prefill_side(server, rid: str, prompt: str, abort_after_s: float) -> tuple[dict, float]:
    """A long generation, aborted by rid ``abort_after_s`` after it was sent; its reply and how long it took."""
    payload = {"text": prompt, "rid": rid,
               "sampling_params": {"max_new_tokens": 2500, "temperature": 0, "ignore_eos": True}}
    started = time.monotonic()
    with cf.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(requests.post, f"{server.url}/generate", json=payload, timeout=300)
        time.sleep(abort_after_s)
        assert not pending.done(), "the request ended before the abort was sent"
        requests.post(f"{server.url}/abort_request", json={"rid": rid}, timeout=30).raise_for_status()
        reply = pending.result()
    return reply.json(), time.monotonic() - started


@pytest.mark.parametrize("case", ["one_batch", "chunked"])
def test_an_abort_reaches_a_request_whose_prefill_is_in_flight(cpu_servers, case):
    server = cpu_servers.get(*EDGE, env=FAULT_ENV)
    slow_s = edgeacc_faults.SLOW_PREFILL_S
    # chunked: a prompt of ten 128-token chunks (1,175 tokens), each at the prefill side for slow_s; the abort
    # lands while the second chunk is there and the request is upstream's chunked request.
    prompt, abort_after_s = (("Hello world", 0.4 * slow_s) if case == "one_batch" else
                             (" ".join(f"word{i}" for i in range(250)), 1.5 * slow_s))
    reply, took_s = _abort_while_at_the_prefill_side(server, f"{SLOW}-{case}", prompt, abort_after_s)
    meta = reply["meta_info"]
    assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
    # Not decoded to its 2500th token; a chunked prompt is not prefilled to its last chunk either
    # (it has at least eight, each slow_s): the abort ends it once the chunk in flight is back.
    assert meta["completion_tokens"] <= 1, meta
    assert took_s < abort_after_s + slow_s + 3, took_s
    if case == "chunked":
        assert meta["completion_tokens"] == 0, meta
    # Its slots were freed by the usual path: the server goes on serving as before.
    for text in PROMPTS:
        assert server.generate(text, max_new_tokens=6)["output_ids"]
    assert server.proc.poll() is None, server.log_tail()


LONG_GAP = re.compile(r"\[edgeacc decode tp0\] (\d+) ms between two decode results of \d+ running requests"
                      r"(?:, the first step of that many)? \(reported from (\d+) ms\); "
                      r"the loop's parts in ms: ([a-z -]+) (\d+)")


def test_a_long_gap_between_decode_results_is_logged_with_the_part_of_the_loop_that_took_it(cpu_servers):
    server = cpu_servers.get(*EDGE, env=FAULT_ENV)
    seen = len(server.log_tail(10**8))
    # A request decoding while the loop stalls: its stream has the gap. The stalled one is sent once this
    # one's tokens stream, and this one must still be decoding when the stalled one is answered.
    with requests.post(f"{server.url}/generate", stream=True, timeout=300, json={
            "text": "The quick brown fox", "rid": "ordinary-long", "stream": True,
            "sampling_params": {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}}) as decoding:
        assert decoding.status_code == 200
        chunks = (line for line in decoding.iter_lines() if line.startswith(b"data: {"))
        for _ in range(4):
            next(chunks)
        stalled = _generate_n(server, "Hello world", f"{STALL}-0", 6)
        assert stalled.status_code == 200, stalled.text[:500]
        last = json.loads(next(chunks)[len(b"data: "):])
        assert last["meta_info"]["completion_tokens"] < 2000, "the decoding request ended before the stall"
        requests.post(f"{server.url}/abort_request", json={"rid": "ordinary-long"}, timeout=30).raise_for_status()
    stall_ms = edgeacc_faults.STALL_DISPATCH_S * 1000
    log = server.log_tail(10**8)[seen:]
    reports = [m for m in LONG_GAP.finditer(log)]
    assert reports, server.log_tail(3000)
    longest = max(reports, key=lambda m: int(m.group(1)))
    gap_ms, from_ms, part, part_ms = longest.groups()
    assert int(from_ms) == 100  # two inter-token targets of 50 ms
    assert int(gap_ms) >= stall_ms and part == "prefill hand-off" and int(part_ms) >= stall_ms
    # While the gap lasted, the decode loop's stack was logged: it names the call that stalled the loop,
    # inside the loop's own hand-off, and the line points to it.
    stack = log[log.rindex("[edgeacc decode tp0] no decode result for ", 0, longest.start()):longest.start()]
    assert "in _stall_dispatch" in stack and "in event_loop_edge_acc_decode" in stack, stack[-3000:]
    line_end = log.index("\n", longest.start())
    assert "the decode loop's stack 100 ms into it is logged above" in log[longest.start():line_end]
    assert server.proc.poll() is None, server.log_tail()


def _generate_n(server, text: str, rid: str, new_tokens: int) -> requests.Response:
    return requests.post(f"{server.url}/generate", timeout=300, json={
        "text": text, "rid": rid, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0,
                                                       "ignore_eos": True}})
