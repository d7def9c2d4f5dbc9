"""A request holding what cannot cross to the prefill side fails alone; the server goes on serving.

The decode side pickles each prefill batch for its prefill side. A request that
holds an object pickle cannot take (here one built to refuse, attached on the
decode side by a test fault) used to take the whole EdgeAcc server down. Now that
request is answered with a 400 that names the object, the requests sent with it
are served as usual, and so is every later request.
"""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests

from tests.fault_injection import edgeacc_faults

pytestmark = pytest.mark.server

EDGE = ("--chunked-prefill-size", "128", "--enable-edge-acc")
MARKER = "edgeacc-test-unpicklable"
FAULT_ENV = edgeacc_faults.server_env(**{edgeacc_faults.UNPICKLABLE_RID_ENV: MARKER})
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
