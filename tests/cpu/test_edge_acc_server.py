"""EdgeAcc end to end on the edgeacc_cpu platform: the real sglang server, real processes.

Each EdgeAcc launch is compared with the same launch without EdgeAcc: greedy
outputs, logprobs (first token included) and radix-cache hits must be
identical, with prompts that are short, long (chunked), share prefixes,
stream, and are aborted mid-stream.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import psutil
import pytest
import requests

from harness import CpuServer

pytestmark = pytest.mark.server

LONG = " ".join(f"token{i}" for i in range(300))
PROMPTS = ["Hello world", "The quick brown fox", LONG, LONG + " tail one", LONG + " tail two", "a b c d e f g"]


def _outputs(server) -> dict:
    """A fingerprint of the server's behaviour on a fixed workload."""
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        burst = list(pool.map(lambda p: server.generate(p, max_new_tokens=10), PROMPTS))
    prefix_hits = [server.generate(LONG + f" again {i}", max_new_tokens=6) for i in range(2)]
    logprobs = server.generate("The quick brown fox", max_new_tokens=4, return_logprob=True,
                               top_logprobs_num=2, logprob_start_len=0)["meta_info"]
    stream = server.generate_stream("Once upon a time", max_new_tokens=6)
    return {
        "burst": [r["output_ids"] for r in burst],
        "prefix_hits": [r["output_ids"] for r in prefix_hits],
        "prefix_cached": [r["meta_info"]["cached_tokens"] > 0 for r in prefix_hits],
        "first_token_logprob": [round(x[0], 4) for x in logprobs["output_token_logprobs"]],
        "input_logprobs": len(logprobs["input_token_logprobs"]),
        "top_logprobs": [[t[1] for t in x] for x in logprobs["output_top_logprobs"]],
        "stream_chunks": len(stream) > 1,
        "stream_final": stream[-1]["output_ids"] if "output_ids" in stream[-1] else stream[-1]["text"],
    }


def _abort_mid_stream(server) -> None:
    payload = {"text": LONG, "stream": True, "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
    with requests.post(f"{server.url}/generate", json=payload, stream=True, timeout=120) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 2:
                break  # closing the connection aborts the request upstream


LAUNCHES = {
    "tp1": ("--chunked-prefill-size", "128"),
    "tp2_page16": ("--tp", "2", "--page-size", "16", "--chunked-prefill-size", "128"),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_edge_acc_matches_upstream(cpu_servers, launch):
    args = LAUNCHES[launch]
    expected = _outputs(cpu_servers.get(*args))
    cpu_servers.release(*args)  # two cores: one server at a time
    edge = cpu_servers.get(*args, "--enable-edge-acc")
    assert _outputs(edge) == expected
    assert all(expected["prefix_cached"]), "the shared prefix must hit the radix cache"

    _abort_mid_stream(edge)
    # The aborted request's slots are freed and the server keeps serving identically.
    assert _outputs(edge)["burst"] == expected["burst"]
    assert "[edgeacc decode tp0] prefill side pid" in edge.log_tail(10**7)


def _lone_then_burst(server) -> dict:
    lone = server.generate("only one request, so one DP group stays idle", max_new_tokens=8)
    with cf.ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda i: server.generate(f"request number {i} " * (i + 1), max_new_tokens=8), range(8)))
    return {"lone": lone["output_ids"], "burst": [r["output_ids"] for r in burst],
            "dp_ranks": sorted({r["meta_info"].get("dp_rank") for r in burst} - {None})}


@pytest.mark.parametrize(
    "launch",
    [("--tp", "2", "--dp", "2", "--enable-dp-attention"), ("--dp", "2")],
    ids=["dp_attention_tp2_dp2", "dp2"],
)
def test_edge_acc_with_data_parallelism_matches_upstream(cpu_servers, launch):
    expected = _lone_then_burst(cpu_servers.get(*launch))
    cpu_servers.release(*launch)  # two cores: one server at a time
    got = _lone_then_burst(cpu_servers.get(*launch, "--enable-edge-acc"))
    cpu_servers.release(*launch, "--enable-edge-acc")
    assert got["lone"] == expected["lone"]
    assert got["burst"] == expected["burst"]
    # Both DP groups served: requests of one group never came back from the other.
    assert got["dp_ranks"] == [0, 1]


def test_idle_dp_group_deadlocks_without_the_idle_batch_fix():
    """The regression test bites: with the idle-group sync switched off, a lone request hangs."""
    server = CpuServer(args=("--tp", "2", "--dp", "2", "--enable-dp-attention", "--enable-edge-acc",
                             "--skip-server-warmup"))
    server.start(env={"SGLANG_EDGEACC_TEST_SKIP_IDLE_SYNC": "1"})
    try:
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{server.url}/generate",
                          json={"text": "lone", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                          timeout=45)
    finally:
        server.stop()


def _side_pid(server, role: str) -> int:
    """The decode side is upstream's scheduler process; the prefill side is its child."""
    for proc in server.descendants():
        name = proc.name()
        if role == "prefill" and name.startswith("sglang::scheduler_edgeacc_prefill"):
            return proc.pid
        if role == "decode" and name == "sglang::scheduler" and any(
            c.name().startswith("sglang::scheduler_edgeacc_prefill") for c in proc.children()
        ):
            return proc.pid
    raise AssertionError(f"no {role} side among {[(p.pid, p.name()) for p in server.descendants()]}")


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_killing_either_side_takes_the_server_down(role):
    server = CpuServer(args=("--enable-edge-acc", "--skip-server-warmup")).start()
    try:
        tree = [psutil.Process(server.proc.pid)] + server.descendants()
        os.kill(_side_pid(server, role), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and server.proc.poll() is None:
            time.sleep(0.2)
        assert server.proc.poll() is not None, f"server still up 10 s after the {role} side was killed"
        gone, alive = psutil.wait_procs(tree, timeout=5)
        assert not [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "orphans left"
    finally:
        server.stop()


def test_edge_acc_metrics_on_upstream_endpoint(cpu_servers):
    server = cpu_servers.get("--enable-edge-acc", "--enable-metrics")
    server.generate("metrics please", max_new_tokens=4)
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for series in ("sglang_edgeacc_prefill_handoff_seconds", "sglang_edgeacc_prefill_batches",
                   "sglang_edgeacc_decode_running_requests", "sglang_edgeacc_sm_percent"):
        assert series in text, series
