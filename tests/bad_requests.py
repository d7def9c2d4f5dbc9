"""Bad requests a server must refuse with a 4xx and survive, shared by the CPU tests and the GPU fault run.

Each entry is ``name -> (request body for /generate, text the error message must contain)``.
"""

from __future__ import annotations

import socket
import time

import requests

# Well over the tiny model's 4096 positions once tokenized (about 4-5 tokens a word).
TOO_LONG = " ".join(f"token{i}" for i in range(2000))

BAD_INPUTS = {
    "empty_text": ({"text": ""}, "empty after tokenization"),
    "empty_text_in_batch": ({"text": ["Hello", ""]}, "empty after tokenization"),
    "empty_input_ids": ({"input_ids": []}, "input_ids cannot be empty"),
    "empty_input_ids_in_batch": ({"input_ids": [[5, 6], []]}, "is empty"),
    "empty_input_ids_batch_of_one": ({"input_ids": [[]]}, "is empty"),
    "longer_than_context": ({"text": TOO_LONG}, "longer than the model's context length"),
    # Beyond any model's vocabulary: upstream embeds them (an IndexError on the CPU, a device-side assert on a GPU).
    "token_id_beyond_vocab": ({"input_ids": [5, 6, 10**7]}, "outside the model's vocabulary"),
    "negative_token_id": ({"input_ids": [5, -3, 7]}, "outside the model's vocabulary"),
    "token_id_beyond_vocab_in_batch": ({"input_ids": [[5, 6], [7, 10**7]]}, "outside the model's vocabulary"),
    "more_top_logprobs_than_vocab": (
        {"text": "Hello", "return_logprob": True, "top_logprobs_num": 10**7}, "top_logprobs_num",
    ),
    # Upstream answers a bare 500; the server survives it.
    "stop_regex_that_does_not_compile": (
        {"text": "Hello", "sampling_params": {"stop_regex": "(["}}, "not a valid regular expression",
    ),
    "logprob_start_len_below_minus_one": (
        {"text": "Hello", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len",
    ),
    "negative_temperature": ({"text": "Hello", "sampling_params": {"temperature": -1}}, "temperature"),
    "top_p_above_one": ({"text": "Hello", "sampling_params": {"top_p": 2}}, "top_p"),
    "negative_max_new_tokens": ({"text": "Hello", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
    "unparsable_json_schema": (
        {"text": "Hello", "sampling_params": {"json_schema": "{not json", "max_new_tokens": 4}},
        "json grammar",
    ),
}


def send_half_a_request(port: int) -> None:
    """Announce a 200-byte JSON body, send part of it, and close the connection."""
    head = (b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head + b'{"text": "Hello world", "sampling_params": {"max_new_to')
        time.sleep(0.5)


def empty_prompt_outcome(server, probe_ids: list[int], settle_s: float = 60.0) -> dict:
    """Send ``{"text": ""}`` to a healthy server and report what became of the server.

    For a server without the ``request_validation`` patch: whether upstream refuses
    the request itself, or its scheduler dies (and the launcher with it). ``probe_ids``
    is a valid prompt whose greedy answer is asked for before and after.
    """
    def probe():
        try:
            response = requests.post(f"{server.url}/generate", timeout=60, json={
                "input_ids": probe_ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            return response.json().get("output_ids") if response.status_code == 200 else None
        except (requests.RequestException, ValueError):
            return None

    before = probe()
    try:
        response = requests.post(f"{server.url}/generate", json={"text": ""}, timeout=120)
        status, body = response.status_code, response.text[:300]
    except requests.RequestException as exc:
        status, body = None, repr(exc)[:300]
    deadline = time.monotonic() + settle_s
    after = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        after = probe()
        if after is not None:
            break
        time.sleep(1.0)
    log = server.log_tail(200_000)
    return {
        "status": status,
        "body": body,
        "served_before": before is not None,
        "served_after": after is not None and after == before,
        "server_exited": server.proc.poll() is not None,
        "index_error_in_log": "IndexError" in log,
        "device_assert_in_log": "device-side assert" in log,
    }
