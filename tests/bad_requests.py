"""Bad requests a server must refuse with a 4xx and survive, shared by the CPU tests and the GPU fault run.

Each entry is ``name -> (request body for /generate, text the error message must contain)``.
"""

from __future__ import annotations

import socket
import time

# Well over the tiny model's 4096 positions once tokenized (about 4-5 tokens a word).
TOO_LONG = " ".join(f"token{i}" for i in range(2000))

BAD_INPUTS = {
    "empty_text": ({"text": ""}, "empty after tokenization"),
    "empty_text_in_batch": ({"text": ["Hello", ""]}, "empty after tokenization"),
    "empty_input_ids": ({"input_ids": []}, "input_ids cannot be empty"),
    "empty_input_ids_in_batch": ({"input_ids": [[5, 6], []]}, "is empty"),
    "empty_input_ids_batch_of_one": ({"input_ids": [[]]}, "is empty"),
    "longer_than_context": ({"text": TOO_LONG}, "longer than the model's context length"),
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
