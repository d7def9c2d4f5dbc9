"""EdgeAcc end to end on the edgeacc_cpu platform: the real sglang server, real processes.

Each EdgeAcc launch is compared with the same launch without EdgeAcc: greedy
outputs, logprobs (first token included) and radix-cache hits must be
identical, with prompts that are short, long (chunked), share prefixes,
stream, and are aborted mid-stream.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import tempfile
import time

import psutil
import pytest
import requests

from sglang_edgeacc.server_start.decode_warmup import warmup_input
from tests import harness
from tests.fault_injection import edgeacc_faults
from tests.harness import SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH, CpuServer, assert_nothing_left, random_checkpoint
from tests.cpu.test_server_cpu_platform import check_generate_and_chat

pytestmark = pytest.mark.server

LONG = " ".join(f"token{i}" for i in range(300))
PROMPTS = ["Hello world", "The quick brown fox", LONG, LONG + " tail one", LONG + " tail two", "a b c d e f g"]
ANSWER_REGEX = "(yes|no) [0-9]{3}"
# Structured output: a regex, a JSON schema and an unconstrained request in one batch.
CONSTRAINED = [{"regex": ANSWER_REGEX},
               {"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})},
               {}]


# Sampling parameters the prefill side applies to the first token (penalties,
# min_new_tokens, logit_bias) and ones the decode side's processing handles.
SAMPLING_FEATURES = [
    {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repetition_penalty": 1.3},
    {"min_new_tokens": 8},
    {"logit_bias": {"5": 100.0}},
    {"stop": ["a"]},
    {"ignore_eos": True},
    {"n": 2},
]


def _leading_values(hidden):
    """The first values of a hidden-state vector, or of each row of a prompt's matrix."""
    if hidden and isinstance(hidden[0], list):
        return [_leading_values(row) for row in hidden]
    return [float(f"{x:.4g}") for x in hidden[:8]]


def _outputs(server, hidden_states: bool = False) -> dict:
    """A fingerprint of the server's behaviour on a fixed workload."""
    with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
        burst = list(pool.map(lambda p: server.generate(p, max_new_tokens=10), PROMPTS))
    prefix_hits = [server.generate(LONG + f" again {i}", max_new_tokens=6) for i in range(2)]
    logprobs = server.generate("The quick brown fox", max_new_tokens=4, return_logprob=True,
                               top_logprobs_num=2, logprob_start_len=0)["meta_info"]
    stream = server.generate_stream("Once upon a time", max_new_tokens=6)
    with cf.ThreadPoolExecutor(len(CONSTRAINED)) as pool:
        constrained = list(pool.map(lambda s: server.generate("Answer:", max_new_tokens=12, sampling=s), CONSTRAINED))
    features = [server.generate("Tell me a story about", max_new_tokens=8, sampling=s) for s in SAMPLING_FEATURES]
    hidden = None
    if hidden_states:
        reply = server.generate("The quick brown fox", max_new_tokens=3, return_hidden_states=True)
        hidden = [_leading_values(h) for h in reply["meta_info"]["hidden_states"]]
    return {
        "burst": [r["output_ids"] for r in burst],
        "prefix_hits": [r["output_ids"] for r in prefix_hits],
        "prefix_cached": [r["meta_info"]["cached_tokens"] > 0 for r in prefix_hits],
        "first_token_logprob": [round(x[0], 4) for x in logprobs["output_token_logprobs"]],
        "input_logprobs": len(logprobs["input_token_logprobs"]),
        "top_logprobs": [[t[1] for t in x] for x in logprobs["output_top_logprobs"]],
        "stream_chunks": len(stream) > 1,
        "stream_final": stream[-1]["output_ids"] if "output_ids" in stream[-1] else stream[-1]["text"],
        "constrained": [r["text"] for r in constrained],
        "sampling_features": [[x["output_ids"] for x in r] if isinstance(r, list) else r["output_ids"]
                              for r in features],
        "hidden_states": hidden,
    }


def _abort_mid_stream(server) -> None:
    payload = {"text": LONG, "stream": True, "sampling_params": {"max_new_tokens": 200, "temperature": 0}}
    with requests.post(f"{server.url}/generate", json=payload, stream=True, timeout=120) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i >= 2:
                break  # closing the connection aborts the request upstream


LAUNCHES = {
    "tp1": SHARED_LAUNCH,
    # The overlap schedule is on in every other launch here (upstream's default), so this one turns it off.
    "tp2_page16_no_overlap": ("--tp", "2", "--page-size", "16", "--chunked-prefill-size", "128",
                              "--disable-overlap-schedule"),
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_edge_acc_matches_upstream(cpu_servers, launch):
    args = LAUNCHES[launch]
    cpu_servers.prepare((args, None), ((*args, "--enable-edge-acc"), None))
    hidden = "--enable-return-hidden-states" in args
    expected = _outputs(cpu_servers.get(*args), hidden)
    edge = cpu_servers.get(*args, "--enable-edge-acc")
    assert _outputs(edge, hidden) == expected
    if hidden:  # the prompt's last position (computed by the prefill side), then one per decode step
        assert len(expected["hidden_states"]) == 3 and any(expected["hidden_states"][0][0])
    assert all(expected["prefix_cached"]), "the shared prefix must hit the radix cache"
    # The first token is sampled on the prefill side under the grammar's mask.
    assert re.fullmatch(ANSWER_REGEX, expected["constrained"][0]), expected["constrained"]
    assert expected["constrained"][1].lstrip().startswith("{")

    _abort_mid_stream(edge)
    # The aborted request's slots are freed and the server keeps serving identically.
    assert _outputs(edge)["burst"] == expected["burst"]
    log = edge.log_tail(10**7)
    assert "[edgeacc decode tp0] prefill side pid" in log
    overlap = "--disable-overlap-schedule" not in args
    assert f"[edgeacc decode tp0] decode loop, overlap schedule {'on' if overlap else 'off'}" in log
    # One startup line for the TP group, with every rank's pair of pids.
    started = [line for line in log.splitlines() if "EdgeAcc on." in line]
    tp = 2 if "--tp" in args else 1
    assert len(started) == 1 and all(f"tp{rank}: decode side pid" in started[0] for rank in range(tp)), started
    if args != SHARED_LAUNCH:  # test_server_cpu_platform.py checks the shared launch's plain server
        check_generate_and_chat(edge)
        check_generate_and_chat(cpu_servers.get(*args))
    if args != SHARED_LAUNCH:  # used here only
        cpu_servers.release(*args)
        cpu_servers.release(*args, "--enable-edge-acc")


def _lone_then_burst(server) -> dict:
    lone = server.generate("only one request, so one DP group stays idle", max_new_tokens=8)
    with cf.ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda i: server.generate(f"request number {i} " * (i + 1), max_new_tokens=8), range(8)))
    return {"lone": lone["output_ids"], "burst": [r["output_ids"] for r in burst],
            "dp_ranks": sorted({r["meta_info"].get("dp_rank") for r in burst} - {None})}


DP_ATTENTION = ("--tp", "2", "--dp", "2", "--enable-dp-attention")
# The DP-attention EdgeAcc server carries the idle-sync fault, switched off until this file exists:
# the deadlock test below then reuses it instead of starting one of its own.
SKIP_IDLE_SYNC_SWITCH = os.path.join(tempfile.gettempdir(), f"edgeacc-test-skip-idle-sync-{os.getpid()}")
IDLE_SYNC_FAULT = edgeacc_faults.server_env(**{edgeacc_faults.SKIP_IDLE_SYNC_ENV: SKIP_IDLE_SYNC_SWITCH})


# DP attention last: the deadlock test right after it takes its EdgeAcc server.
@pytest.mark.parametrize("launch", [("--dp", "2"), DP_ATTENTION], ids=["dp2", "dp_attention_tp2_dp2"])
def test_edge_acc_with_data_parallelism_matches_upstream(cpu_servers, launch):
    edge_env = IDLE_SYNC_FAULT if launch == DP_ATTENTION else None
    cpu_servers.prepare((launch, None), ((*launch, "--enable-edge-acc"), edge_env))
    expected = _lone_then_burst(cpu_servers.get(*launch))
    edge = cpu_servers.get(*launch, "--enable-edge-acc", env=edge_env)
    got = _lone_then_burst(edge)
    assert got["lone"] == expected["lone"]
    assert got["burst"] == expected["burst"]
    # Both DP groups served: requests of one group never came back from the other.
    assert got["dp_ranks"] == [0, 1]
    # Each of the two prefill sides froze its collector after the warmup (with DP attention, in a
    # step of the group's own).
    _wait_for(lambda: len(_prefill_freezes(edge, tp_rank=None)) == 2)
    check_generate_and_chat(edge)
    # The inter-token target reaches every DP rank (and every TP rank of a group: they step together).
    assert _set_internal_state(edge, edge_acc_itl_slo_ms=80) == [True, True]
    states = requests.get(f"{edge.url}/get_server_info", timeout=30).json()["internal_states"]
    assert [state["edge_acc"]["decode_pacing"]["itl_slo_ms"] for state in states] == [80.0, 80.0]
    assert edge.generate("Hello world", max_new_tokens=4)["output_ids"]
    assert _set_internal_state(edge, edge_acc_itl_slo_ms=50) == [True, True]
    if launch != DP_ATTENTION:  # that one is kept for the deadlock test
        cpu_servers.release(*launch, "--enable-edge-acc", env=edge_env)
    check_generate_and_chat(cpu_servers.get(*launch))
    cpu_servers.release(*launch)


@pytest.mark.reuses_kept_server
def test_idle_dp_group_deadlocks_without_the_idle_batch_fix(cpu_servers):
    """The regression test bites: with the idle-group sync switched off, a lone request hangs."""
    server = cpu_servers.get(*DP_ATTENTION, "--enable-edge-acc", env=IDLE_SYNC_FAULT)
    try:
        _switch_idle_sync_off_on_both_prefill_sides(server)
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"{server.url}/generate",
                          json={"text": "lone", "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                          timeout=20)  # served within seconds with the fix
    finally:
        if os.path.exists(SKIP_IDLE_SYNC_SWITCH):
            os.remove(SKIP_IDLE_SYNC_SWITCH)
        cpu_servers.release(*DP_ATTENTION, "--enable-edge-acc", env=IDLE_SYNC_FAULT)  # hung: stopped


def _error_lines(log: str) -> str:
    """The lines of a server log that say what failed, for an assertion's message."""
    return "\n".join(line[:300] for line in log.splitlines()
                     if any(word in line for word in ("Error", "error", "Exception", "exited", "edgeacc]")))[-6000:]


def _switch_idle_sync_off_on_both_prefill_sides(server, attempts: int = 5) -> None:
    """Create the switch, and return once both prefill sides skip the idle sync.

    A side may be inside an idle round's gather when the switch appears; the other then skips
    that round and the first waits in it, and a request to the skipping side's group would
    complete that round and be served. Every side saying it skips means none is in a gather.
    Otherwise the switch goes off (the waiting round completes) and on again.
    """
    for _ in range(attempts):
        seen = len(server.log_tail(10**8))
        open(SKIP_IDLE_SYNC_SWITCH, "w").close()
        # Generous: on a loaded CI machine each side's idle round may come seconds apart.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines = server.log_tail(10**8)[seen:].splitlines()
            if len({line.split()[-1] for line in lines if edgeacc_faults.SKIPPING_LINE in line}) >= 2:
                return
            time.sleep(0.1)
        os.remove(SKIP_IDLE_SYNC_SWITCH)
        time.sleep(2.0)  # both sides back in a round of the sync, so each says it skips again
    raise AssertionError("the prefill sides never both skipped the idle sync:\n"
                         + "\n".join(line for line in server.log_tail(10**8)[-20000:].splitlines()
                                      if edgeacc_faults.SKIPPING_LINE in line or "Error" in line))


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


@pytest.fixture(scope="module")
def servers_to_kill():
    """One server for each side to kill, both launched at once (a start leaves a core idle for a while)
    and healthy before either test times its kill."""
    with harness.started_together({role: CpuServer(args=("--enable-edge-acc", "--skip-server-warmup"))
                                   for role in ("prefill", "decode")}) as servers:
        yield servers


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_killing_either_side_takes_the_server_down(servers_to_kill, role):
    server = servers_to_kill[role]
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


def test_a_prefill_side_failing_at_start_takes_a_dp_server_down(monkeypatch):
    """One DP rank's prefill side fails at start (as when its port is taken). Upstream's error path
    signals its parent, the decode side; that used to kill the decode side outright and the
    data-parallel controller then waited forever for its "ready". Now the server exits."""
    monkeypatch.setattr(harness, "STARTUP_TIMEOUT_S", 300.0)
    server = CpuServer(args=("--dp", "2", "--enable-edge-acc", "--skip-server-warmup"))
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="server exited with"):
            server.start(env=edgeacc_faults.server_env(**{edgeacc_faults.FAIL_START_DP_RANK_ENV: "1"}))
        log = server.log_tail(200_000)
        assert "test fault" in log, _error_lines(log)  # the prefill side of DP rank 1 failed ...
        # ... and its decode side went down through its error path (a signal that came while it waited for
        # the handover once showed there as a child that "exited with code None" instead)
        assert "PrefillSideFailed" in log, _error_lines(log)
        # The other rank's prefill side may still be importing sglang when its decode side is killed;
        # it notices at its first own line of code, once its imports are done.
        assert_nothing_left(server, within_s=60)
        assert time.monotonic() - started < 300
    finally:
        server.stop()


def test_a_prefill_side_that_exits_before_connecting_fails_the_start_with_its_exit_code():
    """The shared state goes out from a thread while the decode side goes on with its start;
    a child that never connects must still end the start, with the reason, and leave nothing."""
    server = CpuServer(args=("--enable-edge-acc", "--skip-server-warmup"))
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="server exited with"):
            server.start(env=edgeacc_faults.server_env(**{edgeacc_faults.EXIT_BEFORE_CONNECT_ENV: "7"}))
        log = server.log_tail(200_000)
        assert "the prefill side exited with code 7 during start" in log, log[-3000:]
        assert_nothing_left(server, within_s=30)
        assert time.monotonic() - started < 240
    finally:
        server.stop()


def test_edge_acc_metrics_on_upstream_endpoint(cpu_servers):
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    server.generate("metrics please", max_new_tokens=4)
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    for series in ("sglang_edgeacc_prefill_handoff_seconds", "sglang_edgeacc_prefill_batches",
                   "sglang_edgeacc_decode_running_requests", "sglang_edgeacc_sm_percent"):
        assert series in text, series


def test_server_info_says_edge_acc_is_on_with_its_split_and_both_sides_pids(cpu_servers):
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    info = requests.get(f"{server.url}/get_server_info", timeout=30).json()
    (state,) = info["internal_states"]  # one scheduler, one DP rank
    entry = state["edge_acc"]
    assert entry["enabled"] is True
    assert entry["sm_partition"] == "mps"  # the default, as asked
    cpu = "none (cpu platform has no SMs to split)"
    assert entry["sm_split"] == {"mode": "none", "prefill": cpu, "decode": cpu,
                                 "prefill_sm_percent": None, "decode_sm_percent": None}
    decode_pid, prefill_pid = _side_pid(server, "decode"), _side_pid(server, "prefill")
    assert entry["sides"] == [{"tp_rank": 0, "decode_pid": decode_pid, "prefill_pid": prefill_pid}]
    # The defaults: beside a prefill, tokens aimed at 0.9 of the 50 ms target apart, prompts waiting or not.
    assert entry["decode_pacing"] == {"itl_slo_ms": 50.0, "aimed_gap_ms": _gaps(45.0, 45.0)}
    # The startup log says the same in one INFO line.
    started = [line for line in server.log_tail(10**7).splitlines() if "EdgeAcc on." in line]
    assert len(started) == 1, started
    assert started[0].endswith(
        f"[edgeacc decode tp0] EdgeAcc on. SM split: {cpu}. "
        "Beside a prefill, decode steps wait so that tokens come about 45 ms apart (--edge-acc-itl-slo-ms 50). "
        f"tp0: decode side pid {decode_pid} (the scheduler), prefill side pid {prefill_pid}"), started


def _gaps(prompts_waiting: float, none_waiting: float) -> dict:
    return {"prompts_waiting": prompts_waiting, "none_waiting": none_waiting}


def _pacing(server) -> dict:
    (state,) = requests.get(f"{server.url}/get_server_info", timeout=30).json()["internal_states"]
    return state["edge_acc"]["decode_pacing"]


def _set_internal_state(server, **server_args) -> list:
    reply = requests.post(f"{server.url}/set_internal_state", json={"server_args": server_args}, timeout=30)
    reply.raise_for_status()
    return reply.json()


def test_the_inter_token_target_moves_while_the_server_runs_and_a_refused_one_changes_nothing(cpu_servers):
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    try:
        assert _set_internal_state(server, edge_acc_itl_slo_ms=80) == [True]
        assert _pacing(server) == {"itl_slo_ms": 80.0, "aimed_gap_ms": _gaps(72.0, 45.0)}
        assert server.generate("Hello world", max_new_tokens=4)["output_ids"]  # still serving
        said = [line for line in server.log_tail(10**7).splitlines() if "inter-token target" in line]
        assert said[-1].endswith("[edgeacc decode tp0] inter-token target 50 -> 80 ms (/set_internal_state): "
                                 "Beside a prefill, decode steps wait so that tokens come about 72 ms apart "
                                 "while prompts wait for the prefill side, 45 ms while none does (target 80)"), said
        # Not a positive number, or beside a key upstream refuses: nothing changes, and the log says why.
        assert _set_internal_state(server, edge_acc_itl_slo_ms=-5) == [False]
        assert _set_internal_state(server, edge_acc_itl_slo_ms=60, no_such_knob=1) == [False]
        assert _pacing(server) == {"itl_slo_ms": 80.0, "aimed_gap_ms": _gaps(72.0, 45.0)}
        log = server.log_tail(10**6)
        assert "edge_acc_itl_slo_ms not changed: -5 is not a positive number of milliseconds" in log
        assert "Updating no_such_knob is not supported." in log
        # Upstream's own keys are still upstream's.
        assert _set_internal_state(server, pp_max_micro_batch_size=0) == [False]
    finally:
        assert _set_internal_state(server, edge_acc_itl_slo_ms=50) == [True]
    assert _pacing(server) == {"itl_slo_ms": 50.0, "aimed_gap_ms": _gaps(45.0, 45.0)}


def test_the_server_runs_every_decode_batch_size_before_it_listens(cpu_servers):
    """A server's first decode step at a new batch size can stall; the warm-up pays that before any user does."""
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    lines = server.log_tail(10**7).splitlines()
    warming = [i for i, line in enumerate(lines) if "[edgeacc] warming decode batch sizes " in line]
    done = [i for i, line in enumerate(lines) if "[edgeacc] decode warm-up done in " in line]
    listening = [i for i, line in enumerate(lines) if "The server is fired up and ready to roll" in line]
    assert len(warming) == 1 and len(done) == 1 and len(listening) == 1, (warming, done, listening)
    assert warming[0] < done[0] < listening[0]
    largest = int(re.search(r"sizes (\d+) down to 1", lines[warming[0]]).group(1))
    assert largest > 1
    # What the decode side ran, from the answers: one request finished at each step, through every size.
    assert lines[done[0]].endswith(f"{largest} answers of 2 to {largest + 1} tokens; prefix cache flushed"), \
        lines[done[0]]
    # It leaves nothing behind: its own first prompt, asked again, is computed from scratch.
    with open(os.path.join(harness.model_dir(), "config.json")) as fh:
        vocab = json.load(fh)["vocab_size"]
    prompt = warmup_input(largest, vocab).input_ids[0]
    answer = requests.post(f"{server.url}/generate", timeout=60, json={
        "input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).json()
    assert answer["meta_info"]["cached_tokens"] == 0, answer["meta_info"]


def test_the_prefill_sides_process_starts_before_the_decode_side_has_its_pools(cpu_servers):
    """Its import of sglang runs while the decode side loads; it is given its start once the pools exist.
    Started when the pools existed, as it was, it spent that import after them, on every start's path."""
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    lines = [line for line in server.log_tail(10**7).splitlines() if not PREFILL_LINE.match(line)]  # the decode side's
    started = [i for i, line in enumerate(lines) if "[edgeacc decode tp0] prefill side's process started (pid " in line]
    pools = [i for i, line in enumerate(lines) if "KV Cache is allocated" in line]
    assert len(started) == 1 and len(pools) == 1, (started, pools)
    assert started[0] < pools[0]
    # That process is the one that became the prefill side.
    assert f"(pid {_side_pid(server, 'prefill')})" in lines[started[0]]


def test_under_torch_compile_the_prefill_side_starts_once_the_decode_sides_graphs_are_captured(cpu_servers):
    """Upstream times kernel configs on the device while it captures under compile: nothing else may run then."""
    server = cpu_servers.get("--enable-edge-acc", "--enable-torch-compile")
    lines = server.log_tail(10**7).splitlines()
    later = [i for i, line in enumerate(lines) if "[edgeacc decode tp0] the prefill side starts once this side's "
             "graphs are captured: --enable-torch-compile times kernel configs" in line]
    mapped = [i for i, line in enumerate(lines) if PREFILL_LINE.match(line) and "from the decode side" in line]
    assert len(later) == 1 and len(mapped) == 1, (later, mapped)
    assert later[0] < mapped[0]
    assert server.generate("compiled", max_new_tokens=4)["meta_info"]["completion_tokens"] == 4
    cpu_servers.release("--enable-edge-acc", "--enable-torch-compile")


def test_the_prefill_side_starts_beside_the_capture_where_nothing_forbids_it():
    from sglang_edgeacc.edge_acc_server.decode_side import prefill_start_after_capture

    def why(**changed):
        return prefill_start_after_capture(**{"pool_resized_after_capture": False,
                                              "weights_load_during_capture": False, "torch_compile": False,
                                              **changed})

    assert why() is None
    assert "resizes the KV pool" in why(pool_resized_after_capture=True)
    assert "loads weights" in why(weights_load_during_capture=True)
    assert "--enable-torch-compile" in why(torch_compile=True)


# The mark a prefill side adds to upstream's log prefix: "[<time> TP0 edgeacc-prefill] ...".
PREFILL_LINE = re.compile(r"\[[^\]]* edgeacc-prefill\] ")


def _prefill_freezes(server, tp_rank: int | None = 0) -> list[int]:
    """The object counts of the prefill sides' "garbage collector frozen" lines (of one TP rank), in order."""
    marker = re.compile(r"\[edgeacc prefill tp(\d+)\] garbage collector frozen \((\d+) objects\)$")
    return [int(m.group(2)) for line in server.log_tail(10**7).splitlines()
            if PREFILL_LINE.match(line) and (m := marker.search(line))
            and (tp_rank is None or int(m.group(1)) == tp_rank)]


def _wait_for(condition, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_the_prefill_side_freezes_its_garbage_collector_with_the_rest_of_the_server(cpu_servers):
    # Upstream freezes its processes' collectors after the warmup, so that what start made is not
    # scanned again by every full collection; the prefill side is a process upstream does not know.
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    _wait_for(lambda: _prefill_freezes(server))
    assert _prefill_freezes(server)[0] > 10_000  # the model, the tokenizer, torch: start's objects
    before = len(_prefill_freezes(server))
    assert requests.post(f"{server.url}/freeze_gc", timeout=30).status_code == 200
    _wait_for(lambda: len(_prefill_freezes(server)) == before + 1)
    assert server.generate("after the freeze", max_new_tokens=4)["meta_info"]["completion_tokens"] == 4


def test_every_prefill_side_line_says_it_is_the_prefill_side(cpu_servers):
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    lines = server.log_tail(10**7).splitlines()
    prefill = {line for line in lines if PREFILL_LINE.match(line)}
    assert any(line.endswith("[edgeacc prefill tp0] ready") for line in prefill), "no prefill side line is marked"
    # Upstream's own lines too, not only EdgeAcc's: both sides load a model.
    loads = [line for line in lines if "Load weight end" in line]
    assert len(loads) == 2 and len(prefill.intersection(loads)) == 1, loads
    # A line that names a side comes from that side, the prefill side's SM split included.
    assert any("[edgeacc decode tp0] prefill side's SM split: none" in line for line in lines)
    for line in lines:
        if "[edgeacc prefill" in line:
            assert line in prefill, line
        if "[edgeacc decode" in line:
            assert line not in prefill, line


SLOW = "edgeacc-test-slow"
PAUSE_PROMPT = [5, 17, 42, 99, 123, 7, 300, 12]


def _greedy_ids(server, input_ids, max_new_tokens, rid=None) -> list[int]:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    if rid is not None:
        body["rid"] = rid
    reply = requests.post(f"{server.url}/generate", json=body, timeout=300)
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()["output_ids"]


def _post_ok(server, route, body) -> dict:
    reply = requests.post(f"{server.url}{route}", json=body, timeout=300)
    assert reply.status_code == 200, f"{route}: {reply.status_code} {reply.text[:500]}"
    return reply.json()


def _pause_update_continue(server, mode: str, checkpoint: str, new_tokens: int) -> list[int]:
    """A greedy request whose prefill is at the prefill side (slowed by a test fault) while generation
    pauses, the weights change to ``checkpoint``, and generation continues; its output ids."""
    with cf.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_greedy_ids, server, PAUSE_PROMPT, new_tokens, f"{SLOW}-{mode}")
        time.sleep(0.4 * edgeacc_faults.SLOW_PREFILL_S)
        assert not pending.done()
        _post_ok(server, "/pause_generation", {"mode": mode})
        try:
            # Kept requests keep their KV in place, so the cache stays (upstream refuses to flush it under them).
            update = {"model_path": checkpoint, "flush_cache": mode == "retract"}
            assert _post_ok(server, "/update_weights_from_disk", update)["success"]
        finally:
            _post_ok(server, "/continue_generation", {})
        return pending.result()


def _check_pause_with_a_prefill_in_flight(server, old: str, new: str) -> None:
    """Upstream's ``/pause_generation`` with ``mode: retract`` frees the KV of every request it finds and
    recomputes it after ``/continue_generation``, so that a weight update in between (applied at once while
    paused: the RL loop of pause, update, continue) reaches every request. The batch at the prefill side is
    in none of the places upstream looks: the pause waits for it, merges it and retracts it with the rest,
    so the request keeps the first token of the weights it was sent under and continues on the new ones,
    as upstream's does. Without that, its first token came from a forward run after the update and the
    update's cache flush failed ("requests are still running"). ``mode: in_place`` retracts nothing; the
    update itself then waits for the batch, so that no forward reads weights being written."""
    first_token = _greedy_ids(server, PAUSE_PROMPT, 1)
    output = _pause_update_continue(server, "retract", new, new_tokens=8)
    assert output[:1] == first_token, (output, first_token)
    assert output[1:] == _greedy_ids(server, PAUSE_PROMPT + first_token, 7), output
    assert first_token != _greedy_ids(server, PAUSE_PROMPT, 1), "the two checkpoints must answer differently"

    first_token = _greedy_ids(server, PAUSE_PROMPT, 1)
    output = _pause_update_continue(server, "in_place", old, new_tokens=8)
    assert output[:1] == first_token and len(output) == 8, (output, first_token)

    log = server.log_tail(10**7)
    assert log.count("pause_generation: waiting for the prefill batch in flight") == 1
    assert log.count("update_weights_from_disk: waiting for the prefill batch in flight") == 1
    # Nothing left running or holding KV: the cache flushes.
    flush = requests.post(f"{server.url}/flush_cache", timeout=60)
    assert flush.status_code == 200 and "Cache flushed" in flush.text, flush.text


def _prefill_path_seconds(server, part: str) -> float:
    from benchmarks import gpu_share

    return gpu_share.scrape(server.url).get(f"prefill_path.{part}", 0.0)


def _check_the_next_batch_is_handed_over_while_one_is_in_flight(server) -> None:
    """A prompt that arrives while a batch is at the prefill side is scheduled and handed over at once
    (``--edge-acc-prefill-batches-in-flight``, 2 by default), as upstream's overlap schedule launches its
    next prefill before the current one's result is back: it waits at the prefill side, not in the
    decode side's queue until the reply. Its answer is the one it gets alone."""
    alone = _greedy_ids(server, PAUSE_PROMPT[:5], 6)
    waited = _prefill_path_seconds(server, "to_prefill_side")
    with cf.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(_greedy_ids, server, PAUSE_PROMPT, 6, f"{SLOW}-pipelined")
        time.sleep(0.3 * edgeacc_faults.SLOW_PREFILL_S)
        behind = pool.submit(_greedy_ids, server, PAUSE_PROMPT[:5], 6)
        assert behind.result() == alone
        slow.result()
    # The second batch was at the prefill side's door for the rest of the slow one's time.
    assert _prefill_path_seconds(server, "to_prefill_side") - waited > 0.4 * edgeacc_faults.SLOW_PREFILL_S


def test_weight_updates_reach_the_prefill_side_also_while_paused(tmp_path):
    """Upstream updates weights in place on the decode side; the prefill side maps that memory.

    The first token of every request is sampled by the prefill side, so outputs after
    the update equal upstream's only if the prefill side computes with the new weights.
    The EdgeAcc server then pauses and updates with a batch at its prefill side
    (``_check_pause_with_a_prefill_in_flight``), and hands a batch over while another is in flight
    (``_check_the_next_batch_is_handed_over_while_one_is_in_flight``).
    """
    first = random_checkpoint(tmp_path / "first", seed=1)
    second = random_checkpoint(tmp_path / "second", seed=2)
    seen = {}
    slow = edgeacc_faults.server_env(**{edgeacc_faults.SLOW_PREFILL_RID_ENV: SLOW})
    # Both start at once (each start leaves a core idle for a while), then serve one after the other.
    servers = {name: CpuServer(args=("--model-path", first, "--load-format", "auto", "--enable-metrics",
                                     *extra)).launch(env=env)
               for name, extra, env in (("upstream", (), None), ("edge", ("--enable-edge-acc",), slow))}
    try:
        for name, server in servers.items():
            server.wait_healthy()
            before = server.generate("The quick brown fox", max_new_tokens=8)["output_ids"]
            reply = requests.post(f"{server.url}/update_weights_from_disk", json={"model_path": second}, timeout=300)
            after = server.generate("The quick brown fox", max_new_tokens=8)["output_ids"]
            seen[name] = (before, reply.json()["success"], after)
            if name == "edge":  # the decode side checked that the prefill side's mapping still holds the weights
                assert "update_weights_from_disk: weights updated in place" in server.log_tail(10**7)
                assert seen["edge"] == seen["upstream"]
                before, success, after = seen["edge"]
                assert success and before != after
                _check_pause_with_a_prefill_in_flight(server, old=second, new=first)
                _check_the_next_batch_is_handed_over_while_one_is_in_flight(server)
            server.stop()
    finally:
        for server in servers.values():
            server.stop()
