"""Bad requests to a real server, plain and EdgeAcc: a 4xx with a message, and the server keeps serving.

Each bad input goes to a plain server and to an EdgeAcc server of the same
launch. Both must refuse it with the same 4xx status and a message that says
what is wrong, stay up, and answer the next valid greedy request with the same
output ids as before the bad input. An empty prompt, a token id outside the
vocabulary, more top logprobs than the vocabulary has and a ``logprob_start_len``
below -1 each kill upstream's scheduler (the prefill side with EdgeAcc); the
``request_validation`` patch makes them a 400.
"""

from __future__ import annotations

import json

import pytest
import requests

from sglang_edgeacc.tiny_model import model_dir
from tests.bad_requests import BAD_INPUTS, empty_prompt_outcome, send_half_a_request
from tests.fault_injection import edgeacc_faults
from tests.harness import SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH, CpuServer

pytestmark = pytest.mark.server

# The shared launch: the pooled servers of most server tests.
PLAIN, EDGE = SHARED_LAUNCH, SHARED_EDGE_ACC_LAUNCH
LAUNCHES = {"plain": PLAIN, "edge_acc": EDGE}

PROBE = "The quick brown fox"


def _server(cpu_servers, launch: str):
    """The pooled server of a launch; one that died in an earlier test is replaced by a fresh one."""
    server = cpu_servers.get(*LAUNCHES[launch])
    if server.proc.poll() is not None:
        cpu_servers.release(*LAUNCHES[launch])
        server = cpu_servers.get(*LAUNCHES[launch])
    return server


def _probe_ids(server) -> list[int]:
    return server.generate(PROBE, max_new_tokens=8)["output_ids"]


def _assert_still_serving(server, before: list[int], what: str) -> None:
    try:
        after = _probe_ids(server)
    except requests.RequestException as exc:
        raise AssertionError(f"no valid request served after {what}: {exc!r}\n{server.log_tail()}") from exc
    assert after == before, f"greedy output changed after {what}"
    assert server.proc.poll() is None


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_refused_and_the_server_keeps_serving(cpu_servers, case):
    body, pattern = BAD_INPUTS[case]
    replies = {}
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)
        try:
            response = requests.post(f"{server.url}/generate", json=body, timeout=120)
        except requests.RequestException as exc:
            raise AssertionError(f"{launch}: no reply to {case}: {exc!r}\n{server.log_tail()}") from exc
        replies[launch] = response
        assert 400 <= response.status_code < 500, f"{launch}: {response.status_code} {response.text[:500]}"
        message = response.json()["error"]["message"]
        assert pattern.lower() in message.lower(), f"{launch}: {message!r}"
        _assert_still_serving(server, before, f"{case} on {launch}")
    assert replies["edge_acc"].status_code == replies["plain"].status_code


def test_empty_prompt_in_a_stream_is_an_error_event(cpu_servers):
    """A streamed request is answered 200 before it is validated: the refusal comes as an SSE error event."""
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)
        payload = {"text": "", "stream": True, "sampling_params": {"max_new_tokens": 4}}
        with requests.post(f"{server.url}/generate", json=payload, stream=True, timeout=120) as response:
            events = [line[5:].strip() for line in response.iter_lines() if line.startswith(b"data:")]
        assert events[-1] == b"[DONE]", events
        error = json.loads(events[0])["error"]
        assert error["code"] == 400 and "empty after tokenization" in error["message"], error
        _assert_still_serving(server, before, f"a streamed empty prompt on {launch}")


def test_an_empty_prompt_in_a_session_is_left_to_upstream(cpu_servers):
    """A session's history may supply the whole prompt: an empty one continues it, and upstream's
    session controller refuses one that is still empty (a session with no history)."""
    greedy = {"max_new_tokens": 4, "temperature": 0}
    replies = {}
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)

        def open_session():
            response = requests.post(f"{server.url}/open_session", json={"capacity_of_str_len": 1000}, timeout=60)
            response.raise_for_status()
            return response.json()

        session = open_session()
        first = server.generate([5, 6], max_new_tokens=4, session_params={"id": session})
        follow = requests.post(f"{server.url}/generate", json={
            "input_ids": [], "session_params": {"id": session, "rid": first["meta_info"]["id"]},
            "sampling_params": greedy}, timeout=120)
        assert follow.status_code == 200, follow.text[:500]
        assert follow.json()["meta_info"]["prompt_tokens"] > 0
        fresh = requests.post(f"{server.url}/generate", json={
            "input_ids": [], "session_params": {"id": open_session()}, "sampling_params": greedy}, timeout=120)
        assert fresh.status_code == 400 and "session" in fresh.json()["error"]["message"], fresh.text[:500]
        replies[launch] = (first["output_ids"], follow.json()["output_ids"])
        _assert_still_serving(server, before, f"empty prompts in sessions on {launch}")
    assert replies["edge_acc"] == replies["plain"]


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 10**7}),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 10**7}),
], ids=["chat", "completions"])
def test_openai_routes_refuse_more_top_logprobs_than_the_vocabulary(cpu_servers, route, body):
    """The OpenAI routes pass top_logprobs through to the same scheduler code that raised on it."""
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)
        response = requests.post(f"{server.url}{route}", json={"model": "m", "max_tokens": 4, **body}, timeout=120)
        assert response.status_code == 400, f"{launch}: {response.status_code} {response.text[:500]}"
        assert "top_logprobs" in response.text, response.text[:500]
        _assert_still_serving(server, before, f"{route} with top_logprobs 10**7 on {launch}")


def test_the_edges_of_the_vocabulary_are_still_served(cpu_servers):
    """What request_validation refuses stops just past what upstream serves: the last token id, as many
    top logprobs as the vocabulary has, and logprob_start_len -1 are answered, alike in both modes."""
    vocab = json.loads((model_dir() / "config.json").read_text())["vocab_size"]
    replies = {}
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        response = requests.post(f"{server.url}/generate", timeout=120, json={
            "input_ids": [5, vocab - 1, 0], "return_logprob": True, "top_logprobs_num": vocab,
            "logprob_start_len": -1, "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
        assert response.status_code == 200, f"{launch}: {response.text[:500]}"
        meta = response.json()["meta_info"]
        assert [len(top) for top in meta["output_top_logprobs"]] == [vocab, vocab], launch
        replies[launch] = response.json()["output_ids"]
    assert replies["edge_acc"] == replies["plain"]


def test_zero_new_tokens_returns_no_tokens(cpu_servers):
    replies = {}
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)
        reply = server.generate(PROBE, max_new_tokens=0)
        assert reply["output_ids"] == [] and reply["meta_info"]["completion_tokens"] == 0, reply
        replies[launch] = reply["meta_info"]["finish_reason"]
        _assert_still_serving(server, before, f"max_new_tokens 0 on {launch}")
    assert replies["edge_acc"] == replies["plain"]


def test_a_client_that_closes_halfway_through_its_body_does_not_harm_the_server(cpu_servers):
    for launch in LAUNCHES:
        server = _server(cpu_servers, launch)
        before = _probe_ids(server)
        send_half_a_request(server.port)
        _assert_still_serving(server, before, f"a half-sent body on {launch}")


def test_without_request_validation_an_empty_prompt_takes_the_server_down(cpu_servers):
    """What the ``request_validation`` patch prevents, on the same sglang: the tests above fail without it."""
    server = CpuServer(args=PLAIN)
    server.start(env=edgeacc_faults.server_env(**{edgeacc_faults.WITHOUT_PATCHES_ENV: "request_validation"}))
    try:
        outcome = empty_prompt_outcome(server, probe_ids=[5, 6, 7, 8])
    finally:
        server.stop()
    assert outcome["served_before"], outcome
    assert outcome["status"] != 400, outcome
    assert not outcome["served_after"] and outcome["server_exited"], outcome
    assert outcome["index_error_in_log"], outcome
