"""The real sglang 0.5.23 server on the edgeacc_cpu platform, end to end.

The same generate and chat checks run on the TP 2, DP 2 and DP-attention launches in
``test_edge_acc_server.py``, on the plain and EdgeAcc servers it starts there anyway.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.harness import SHARED_LAUNCH

pytestmark = pytest.mark.server

LAUNCHES = {"tp1": SHARED_LAUNCH}


def check_generate_and_chat(server) -> None:
    out = server.generate("The capital of France is", max_new_tokens=6)
    assert out["meta_info"]["completion_tokens"] == 6
    assert len(out["output_ids"]) == 6
    assert isinstance(out["text"], str)

    batch = server.generate(["one two", "three", "four five six", "seven"], max_new_tokens=4)
    assert [len(item["output_ids"]) for item in batch] == [4, 4, 4, 4]

    chat = server.chat("Hello!", max_tokens=5)
    assert chat["object"] == "chat.completion"
    assert chat["usage"]["completion_tokens"] == 5
    # The chat template really ran: the prompt is longer than the message alone.
    assert chat["usage"]["prompt_tokens"] > 3


def test_generate_and_chat(cpu_servers):
    check_generate_and_chat(cpu_servers.get(*LAUNCHES["tp1"]))


def test_the_server_log_is_kept_with_pytests_temporary_files(cpu_servers, tmp_path_factory):
    # Not in /tmp, where the logs of every run's hundreds of servers would pile up.
    server = cpu_servers.get(*LAUNCHES["tp1"])
    log = pathlib.Path(server.log_path)
    assert log.parent.parent == tmp_path_factory.getbasetemp() and log.parent.name.startswith("server-logs")
    assert "The server is fired up" in log.read_text(errors="replace")


def test_openai_completions_and_streaming(cpu_servers):
    server = cpu_servers.get(*LAUNCHES["tp1"])
    completion = server.completion("Once upon a time", max_tokens=5)
    assert completion["usage"]["completion_tokens"] == 5
    chunks = server.generate_stream("Once upon a time", max_new_tokens=5)
    assert len(chunks) >= 2  # streamed incrementally, not in one piece
    assert chunks[-1]["meta_info"]["completion_tokens"] == 5


def test_greedy_output_is_deterministic_across_requests(cpu_servers):
    server = cpu_servers.get(*LAUNCHES["tp1"])
    first = server.generate("repeat after me", max_new_tokens=8)["output_ids"]
    second = server.generate("repeat after me", max_new_tokens=8)["output_ids"]
    assert first == second
