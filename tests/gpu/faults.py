"""EdgeAcc under load, faults and bad input in the real server, side by side with plain sglang.

Cases (each writes its figures into the JSON; ``--cases`` picks some):

* ``kill``: while the burst workload runs (streaming, 2048-token prompts, 64 at a time),
  SIGKILL the prefill side of one EdgeAcc server, the decode side of another, and the
  scheduler of a plain server. Figures: seconds until the server's launcher exits,
  requests open at the kill that never ended (hung), processes left (orphans), and whether
  a new EdgeAcc server then starts under the same MPS daemon.
* ``aborts``: 200 streaming requests, the client drops half at random moments (some
  before their first token, while they are in prefill). Figures: KV tokens in use once
  idle (upstream's ``/v1/loads``; upstream's idle check also fails the scheduler on a
  leak), the kept requests' tokens against plain's, and solo requests after the storm.
* ``pressure``: a pool of 3000 KV tokens, 520 short requests ending by EOS, stop token
  or length at different points, 48 at a time: upstream retracts, slots are freed and
  reused while decode steps run. Every request must complete with plain's tokens.
* ``bad``: the bad requests of ``tests/bad_requests.py``, ``max_new_tokens`` 0 and half a
  request: the same 4xx as plain, and the next valid request is served.
* ``empty-unpatched``: ``{"text": ""}`` to a plain and an EdgeAcc server started without the
  plugin's ``request_validation`` patch (``SGLANG_EDGEACC_TEST_WITHOUT_PATCHES``): whether
  sglang 0.5.23 itself refuses it or its scheduler dies (a finding; the patched servers of
  ``bad`` must answer 400).
* ``soak``: mixed load (long and short prompts, streaming or not, aborts) for
  ``--soak-s`` seconds: GPU memory, open descriptors and /dev/shm entries of every process
  of the server, sampled, with their drift after warm-up; errors in the log.

Concurrent requests share batches whose shape depends on timing, and batched kernels
round differently from solo ones; the sensitive tiny model (``serving_models``) turns
that rounding into other tokens. A concurrent answer is therefore judged against plain
sglang's answer in its own run and plain's solo answer for the same prompt; solo answers
must be identical.

    source .gpu-bundle/env.sh && OUT=$OUT bash tests/gpu/on_device.sh faults
    python3 -m tests.gpu.faults --platform cpu --scale 0.1 --soak-s 30 --out /tmp/faults.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import random
import re
import signal
import sys
import tempfile
import threading
import time
import traceback

import psutil
import requests

from tests.bad_requests import BAD_INPUTS, empty_prompt_outcome, send_half_a_request
from tests.fault_injection import edgeacc_faults
from tests.gpu.server_suite import _arm_env, model_path
from tests.harness import SglangServer, gpu_memory_by_pid, shm_in_use

VOCAB = 537
BASE = ("--chunked-prefill-size", "128", "--mem-fraction-static", "0.3")
POOL = ("--max-total-tokens", "60000", "--max-running-requests", "64")
PRESSURE_POOL = ("--max-total-tokens", "3000", "--max-running-requests", "48")
EDGE = ("--enable-edge-acc",)
ERROR_LINE = re.compile(r"Traceback|leak detected|CUDA error|Exception in|\bERROR\b")

# server name -> (edge?, extra flags); the cases that use them.
SERVERS = {
    "main-plain": (False, POOL), "main-edge": (True, POOL),
    "pressure-plain": (False, PRESSURE_POOL), "pressure-edge": (True, PRESSURE_POOL),
    "kill-plain": (False, POOL), "kill-edge-prefill": (True, POOL), "kill-edge-decode": (True, POOL),
    "soak-plain": (False, POOL), "soak-edge": (True, POOL),
    "unpatched-plain": (False, POOL), "unpatched-edge": (True, POOL),
}
# Servers without the plugin's request validation: what unpatched sglang does with an empty prompt.
UNPATCHED = {edgeacc_faults.WITHOUT_PATCHES_ENV: "request_validation"}
CASE_SERVERS = {
    "kill": ("kill-plain", "kill-edge-prefill", "kill-edge-decode"),
    "aborts": ("main-plain", "main-edge"), "bad": ("main-plain", "main-edge"),
    "pressure": ("pressure-plain", "pressure-edge"), "soak": ("soak-plain", "soak-edge"),
    "empty-unpatched": ("unpatched-plain", "unpatched-edge"),
}


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def greedy(server, prompt, n, timeout=300, **params) -> dict:
    payload = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0, **params}}
    response = requests.post(f"{server.url}/generate", json=payload, timeout=timeout)
    response.raise_for_status()
    return response.json()


def stream(server, prompt, n, drop_after: int | None = None, drop_in_s: float | None = None,
           timeout=(10, 120), **params) -> dict:
    """A streamed greedy request; ``drop_after`` chunks or ``drop_in_s`` seconds in, the client hangs up."""
    payload = {"input_ids": prompt, "stream": True,
               "sampling_params": {"max_new_tokens": n, "temperature": 0, **params}}
    started = time.monotonic()
    chunks, last = 0, None
    with requests.post(f"{server.url}/generate", json=payload, stream=True, timeout=timeout) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "chunks": 0}
        if drop_in_s is not None:
            time.sleep(drop_in_s)
            return {"dropped": True, "chunks": 0}
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            body = json.loads(line[5:])
            if "error" in body:
                return {"error": str(body["error"])[:200], "chunks": chunks}
            chunks, last = chunks + 1, body
            if drop_after is not None and chunks >= drop_after:
                return {"dropped": True, "chunks": chunks}
    return {"output_ids": (last or {}).get("output_ids"), "chunks": chunks, "s": time.monotonic() - started}


def loads(server) -> dict:
    """Requests and KV tokens in use, summed over the server's DP ranks (upstream's /v1/loads)."""
    body = requests.get(f"{server.url}/v1/loads", timeout=30).json()
    total = {"num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0}
    for entry in body.get("loads", []):
        flat = dict(entry)
        for section in ("core", "memory"):
            flat.update(entry.get(section) or {})
        missing = [key for key in total if key not in flat]
        if missing:
            raise KeyError(f"/v1/loads has no {missing}: {sorted(flat)}")
        for key in total:
            total[key] += int(flat[key])
    return total


def wait_idle(server, limit_s: float = 60) -> dict:
    deadline = time.monotonic() + limit_s
    state = loads(server)
    while time.monotonic() < deadline and (state["num_running_reqs"] or state["num_waiting_reqs"]):
        time.sleep(0.5)
        state = loads(server)
    time.sleep(2.0)  # the idle pass (and upstream's leak check) runs once the queues are empty
    return loads(server)


def flush_cache(server) -> None:
    """Empty the radix cache, so a repeated run prefills as the first one did."""
    requests.post(f"{server.url}/flush_cache", timeout=60).raise_for_status()


def log_errors(server) -> list[str]:
    return [line[:300] for line in server.log_tail(5_000_000).splitlines() if ERROR_LINE.search(line)]


def within_plain_noise(edge_different: int, plain_different: int) -> bool:
    """Concurrent answers that match neither plain run nor plain's solo answer, against plain's own count.

    Plain sglang run twice under the same load differs from itself where batching rounds
    differently; EdgeAcc passes when it differs no more than twice that, plus two. A KV
    cache read from the wrong slots differs on most requests, not a few.
    """
    return edge_different <= 2 * plain_different + 2


def judge_concurrent(edge_out, plain_out, plain_solo) -> str:
    if edge_out == plain_out:
        return "equal"
    if edge_out == plain_solo:
        return "equal_to_plain_solo"
    return "different"


# ----------------------------------------------------------------- cases
def case_kill(servers: dict, scale: float, relaunch) -> dict:
    """Kill one process of each kill-* server under load; the three run at once."""
    targets = {"kill-plain": "scheduler", "kill-edge-prefill": "prefill", "kill-edge-decode": "decode"}

    def victim(server, which):
        for proc in server.descendants():
            try:
                title = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            is_prefill = "edgeacc_prefill" in title
            if title.startswith("sglang::scheduler") and (is_prefill == (which == "prefill")):
                return proc
        return None

    def one(name):
        server = servers[name]
        rng = random.Random(7)
        n = max(8, int(128 * scale))
        prompts = [ids(rng, 2048) for _ in range(n)]
        open_at_kill, results = [], {}
        lock = threading.Lock()

        def client(i):
            with lock:
                results[i] = "open"
            try:
                out = stream(server, prompts[i], 128, ignore_eos=True, timeout=(5, 90))
                status = "ok" if out.get("output_ids") else f"error {out}"
            except requests.RequestException as exc:
                status = f"error {type(exc).__name__}"
            with lock:
                results[i] = status

        pool = cf.ThreadPoolExecutor(64)
        futures = [pool.submit(client, i) for i in range(n)]
        time.sleep(4.0)
        server.observe()
        proc = victim(server, targets[name])
        entry: dict = {"killed": targets[name], "pid": proc.pid if proc else None}
        if proc is None:
            entry["error"] = "no such process among " + str([" ".join(p.cmdline()) for p in server.descendants()])
            pool.shutdown(wait=False, cancel_futures=True)
            return name, entry
        with lock:
            open_at_kill = [i for i, status in results.items() if status == "open"]
        killed_at = time.monotonic()
        proc.send_signal(signal.SIGKILL)
        exited = None
        while time.monotonic() - killed_at < 30:
            if server.proc.poll() is not None:
                exited = time.monotonic() - killed_at
                break
            time.sleep(0.1)
        cf.wait(futures, timeout=max(1.0, 20 - (time.monotonic() - killed_at)))
        with lock:
            hung = [i for i in open_at_kill if results[i] == "open"]
            entry["open_at_kill"] = len(open_at_kill)
            entry["ended_with_error"] = sum(1 for i in open_at_kill if results[i].startswith("error"))
            entry["completed_after_kill"] = sum(1 for i in open_at_kill if results[i] == "ok")
        entry["hung"] = len(hung)
        entry["exit_s"] = round(exited, 2) if exited is not None else None
        entry["exit_code"] = server.proc.returncode
        time.sleep(5.0)
        orphans = []
        for pid in server.seen_pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    orphans.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:80]}")
            except psutil.NoSuchProcess:
                pass
        entry["orphans"] = orphans
        pool.shutdown(wait=False, cancel_futures=True)
        entry["passed"] = exited is not None and exited <= 10 and not hung and not orphans
        return name, entry

    with cf.ThreadPoolExecutor(len(targets)) as pool:
        out: dict = dict(pool.map(one, targets))
    # The MPS daemon must accept the next EdgeAcc server after its clients were killed.
    try:
        fresh = relaunch()
        probe = greedy(fresh, ids(random.Random(3), 300), 16)
        out["next_edge_server"] = {"started_s": round(fresh.started_s, 1), "served": bool(probe["output_ids"]),
                                   "passed": True}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        out["next_edge_server"] = {"error": repr(exc)[:2000], "passed": False}
    out["passed"] = all(entry.get("passed") for entry in out.values())
    return out


def case_aborts(plain, edge, scale: float) -> dict:
    rng = random.Random(11)
    n = max(20, int(200 * scale))
    plan = []
    for i in range(n):
        prompt = ids(rng, rng.randrange(50, 1500))
        drop = None
        if rng.random() < 0.5:
            drop = ("in_prefill", rng.uniform(0.0, 0.15)) if rng.random() < 0.4 else ("after", rng.randrange(1, 12))
        plan.append((prompt, drop))

    def storm(server):
        def one(item):
            prompt, drop = item
            try:
                if drop is None:
                    return stream(server, prompt, 48)
                if drop[0] == "in_prefill":
                    return stream(server, prompt, 48, drop_in_s=drop[1])
                return stream(server, prompt, 48, drop_after=drop[1])
            except requests.RequestException as exc:
                return {"error": repr(exc)[:200]}
        with cf.ThreadPoolExecutor(32) as pool:
            return list(pool.map(one, plan))

    out: dict = {"requests": n, "dropped": sum(1 for _, d in plan if d),
                 "dropped_before_first_token": sum(1 for _, d in plan if d and d[0] == "in_prefill")}
    runs = {}
    for label, server in (("plain", plain), ("plain_again", plain), ("edge", edge)):
        flush_cache(server)
        before = loads(server)
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(1) as pool:
            running = pool.submit(storm, server)
            peak = 0  # shows that the idle reading below counts what it should
            while not running.done():
                peak = max(peak, loads(server)["num_used_tokens"])
                time.sleep(0.5)
            runs[label] = running.result()
        entry = {"storm_s": round(time.monotonic() - t0, 1), "used_tokens_before": before["num_used_tokens"],
                 "used_tokens_peak": peak}
        entry["idle"] = wait_idle(server)
        entry["errors"] = sum(1 for r in runs[label] if "error" in r or "status" in r)
        entry["kept_completed"] = sum(1 for (p, d), r in zip(plan, runs[label]) if d is None and r.get("output_ids"))
        entry["alive"] = server.proc.poll() is None
        out[label] = entry
    kept = [i for i, (_, d) in enumerate(plan) if d is None]
    solo = {label: [greedy(server, plan[i][0], 48)["output_ids"] for i in kept]
            for label, server in (("plain", plain), ("edge", edge))}
    verdicts = [judge_concurrent(runs["edge"][i].get("output_ids"), runs["plain"][i].get("output_ids"), solo["plain"][k])
                for k, i in enumerate(kept)]
    out["kept_vs_plain"] = {v: verdicts.count(v) for v in sorted(set(verdicts))}
    baseline = [judge_concurrent(runs["plain_again"][i].get("output_ids"), runs["plain"][i].get("output_ids"),
                                 solo["plain"][k]) for k, i in enumerate(kept)]
    out["plain_again_vs_plain"] = {v: baseline.count(v) for v in sorted(set(baseline))}
    out["plain_storm_equal_to_its_solo"] = sum(
        1 for k, i in enumerate(kept) if runs["plain"][i].get("output_ids") == solo["plain"][k])
    out["solo_after_storm_equal"] = sum(1 for a, b in zip(solo["plain"], solo["edge"]) if a == b)
    out["solo_after_storm_total"] = len(kept)
    out["log_errors"] = {"plain": log_errors(plain)[-5:], "edge": log_errors(edge)[-5:]}
    out["passed"] = (
        out["edge"]["idle"]["num_used_tokens"] == 0 and out["edge"]["idle"]["num_running_reqs"] == 0
        and out["edge"]["alive"] and out["edge"]["errors"] == 0 and out["edge"]["kept_completed"] == len(kept)
        and out["solo_after_storm_equal"] == len(kept)
        and within_plain_noise(verdicts.count("different"), baseline.count("different"))
        and not out["log_errors"]["edge"]
    )
    return out


def case_pressure(plain, edge, scale: float) -> dict:
    rng = random.Random(5)
    n = max(40, int(520 * scale))
    work = []
    for i in range(n):
        prompt = ids(rng, rng.randrange(40, 300))
        ending = i % 3
        params = {"stop_token_ids": [rng.randrange(3, VOCAB) for _ in range(4)]} if ending == 0 else {}
        if ending == 1:
            params["ignore_eos"] = True
        work.append((prompt, rng.randrange(20, 250), params))

    def run(server):
        def one(item):
            prompt, n_new, params = item
            try:
                reply = greedy(server, prompt, n_new, **params)
                return {"output_ids": reply["output_ids"], "finish": str(reply["meta_info"]["finish_reason"])[:60]}
            except requests.RequestException as exc:
                return {"error": repr(exc)[:200]}
        with cf.ThreadPoolExecutor(48) as pool:
            return list(pool.map(one, work))

    out: dict = {"requests": n}
    runs = {}
    for label, server in (("plain", plain), ("plain_again", plain), ("edge", edge)):
        flush_cache(server)
        t0 = time.monotonic()
        runs[label] = run(server)
        finishes: dict = {}
        for r in runs[label]:
            kind = r.get("finish", "error").split("'type': '")[-1].split("'")[0]
            finishes[kind] = finishes.get(kind, 0) + 1
        out[label] = {"s": round(time.monotonic() - t0, 1),
                      "errors": sum(1 for r in runs[label] if "error" in r),
                      "finish_reasons": finishes,
                      "retractions_logged": len(re.findall(r"[Rr]etract", server.log_tail(5_000_000))),
                      "idle": wait_idle(server), "alive": server.proc.poll() is None}
    solo_cache: dict[int, list] = {}

    def against_plain(label):
        verdicts = {"equal": 0}
        for i in range(n):
            got, ref = runs[label][i].get("output_ids"), runs["plain"][i].get("output_ids")
            if got == ref:
                verdicts["equal"] += 1
                continue
            if i not in solo_cache:
                prompt, n_new, params = work[i]
                solo_cache[i] = greedy(plain, prompt, n_new, **params)["output_ids"]
            v = judge_concurrent(got, ref, solo_cache[i])
            verdicts[v] = verdicts.get(v, 0) + 1
        return verdicts
    verdicts = out["edge_vs_plain"] = against_plain("edge")
    baseline = out["plain_again_vs_plain"] = against_plain("plain_again")
    out["log_errors"] = {"plain": log_errors(plain)[-5:], "edge": log_errors(edge)[-5:]}
    out["passed"] = (out["edge"]["errors"] == 0 and out["edge"]["alive"]
                     and within_plain_noise(verdicts.get("different", 0), baseline.get("different", 0))
                     and out["edge"]["idle"]["num_used_tokens"] == 0 and not out["log_errors"]["edge"])
    return out


def case_bad(plain, edge) -> dict:
    probe = ids(random.Random(9), 64)
    out: dict = {}
    cases = {name: body for name, (body, _) in BAD_INPUTS.items()}
    cases["max_new_tokens_0"] = {"input_ids": probe, "sampling_params": {"max_new_tokens": 0}}
    for name, body in [*cases.items(), ("half_a_request", None)]:
        entry = {}
        for label, server in (("plain", plain), ("edge", edge)):
            before = greedy(server, probe, 8)["output_ids"]
            if body is None:
                send_half_a_request(server.port)
                status, message = None, ""
            else:
                response = requests.post(f"{server.url}/generate", json=body, timeout=120)
                status = response.status_code
                try:
                    message = str(response.json().get("error", {}).get("message", ""))[:160]
                except ValueError:
                    message = response.text[:160]
            after = greedy(server, probe, 8)["output_ids"]
            entry[label] = {"status": status, "message": message, "next_request_served": after == before,
                            "alive": server.proc.poll() is None}
        expected = BAD_INPUTS.get(name, (None, ""))[1].lower()
        entry["passed"] = (entry["edge"]["status"] == entry["plain"]["status"]
                           and entry["edge"]["next_request_served"] and entry["edge"]["alive"]
                           and (status_ok(entry["edge"]["status"], name))
                           and expected in entry["edge"]["message"].lower())
        out[name] = entry
    out["passed"] = all(v["passed"] for v in out.values() if isinstance(v, dict))
    return out


def case_empty_unpatched(plain, edge) -> dict:
    """A finding, not a check of ours: what sglang without ``request_validation`` does with ``{"text": ""}``.

    Passes once both servers served before the empty prompt, so that what follows is the prompt's doing.
    """
    probe = ids(random.Random(9), 64)
    out: dict = {label: empty_prompt_outcome(server, probe) for label, server in (("plain", plain), ("edge", edge))}
    out["passed"] = out["plain"]["served_before"] and out["edge"]["served_before"]
    return out


def status_ok(status, name: str) -> bool:
    if name == "max_new_tokens_0":
        return status == 200
    if name == "half_a_request":
        return status is None
    return status is not None and 400 <= status < 500


def sample(server) -> dict:
    server.observe()
    pids = sorted({server.proc.pid, *(p.pid for p in server.descendants())})
    memory = gpu_memory_by_pid()
    per = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            title = " ".join(proc.cmdline())[:60]
            per[pid] = {"title": title, "fds": proc.num_fds(), "gpu_mib": memory.get(pid),
                        "rss_mib": proc.memory_info().rss >> 20}
        except psutil.Error:
            continue
    return {"t": time.monotonic(), "procs": per, "shm": len(shm_in_use(pids)), "shm_dir": len(os.listdir("/dev/shm"))}


def case_soak(plain, edge, seconds: float, warmup_s: float) -> dict:
    def load(server, stop_at, counters):
        rng = random.Random(hash(server.url) & 0xFFFF)
        while time.monotonic() < stop_at:
            kind = rng.random()
            prompt = ids(rng, rng.randrange(1500, 3000) if kind < 0.2 else rng.randrange(20, 300))
            try:
                if rng.random() < 0.5:
                    drop = rng.randrange(1, 6) if rng.random() < 0.15 else None
                    result = stream(server, prompt, rng.randrange(8, 96), drop_after=drop)
                    counters["aborted" if result.get("dropped") else "streamed"] += 1
                else:
                    greedy(server, prompt, rng.randrange(8, 96))
                    counters["plain"] += 1
            except requests.RequestException as exc:
                counters["errors"] += 1
                counters["last_error"] = repr(exc)[:200]

    def soak(server):
        stop_at = time.monotonic() + seconds
        counters = {"streamed": 0, "plain": 0, "aborted": 0, "errors": 0}
        threads = [threading.Thread(target=load, args=(server, stop_at, counters), daemon=True) for _ in range(12)]
        for t in threads:
            t.start()
        samples = []
        while time.monotonic() < stop_at:
            samples.append(sample(server))
            time.sleep(min(15.0, max(0.5, stop_at - time.monotonic())))
        for t in threads:
            t.join(timeout=150)
        idle = wait_idle(server)
        samples.append(sample(server))
        t0 = samples[0]["t"]
        warm = next((s for s in samples if s["t"] - t0 >= warmup_s), samples[0])
        last = samples[-1]
        drift = {}
        for pid, now in last["procs"].items():
            then = warm["procs"].get(pid)
            if then is None:
                continue
            drift[now["title"] or str(pid)] = {
                "gpu_mib": (now["gpu_mib"] - then["gpu_mib"]) if None not in (now["gpu_mib"], then["gpu_mib"]) else None,
                "gpu_mib_now": now["gpu_mib"], "fds": now["fds"] - then["fds"], "rss_mib": now["rss_mib"] - then["rss_mib"],
            }
        return {"requests": counters, "idle": idle, "drift_after_warmup": drift,
                "shm_entries": [s["shm"] for s in samples], "dev_shm_total": [s["shm_dir"] for s in samples],
                "log_errors": log_errors(server)[-10:], "alive": server.proc.poll() is None,
                "samples": len(samples)}

    with cf.ThreadPoolExecutor(2) as pool:
        plain_f, edge_f = pool.submit(soak, plain), pool.submit(soak, edge)
        out = {"seconds": seconds, "warmup_s": warmup_s, "plain": plain_f.result(), "edge": edge_f.result()}
    e = out["edge"]
    flat_gpu = all((d["gpu_mib"] or 0) <= 64 for d in e["drift_after_warmup"].values())
    flat_fds = all(d["fds"] <= 4 for d in e["drift_after_warmup"].values())
    out["passed"] = (e["alive"] and e["requests"]["errors"] == 0 and not e["log_errors"] and flat_gpu and flat_fds
                     and len(set(e["shm_entries"][1:])) <= 1 and e["idle"]["num_used_tokens"] == 0)
    return out


# ----------------------------------------------------------------- driver
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", default="kill,aborts,pressure,bad,soak")
    parser.add_argument("--scale", type=float, default=1.0, help="request counts times this (CPU runs: 0.1)")
    parser.add_argument("--soak-s", type=float, default=300.0)
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--out", default="")
    parser.add_argument("--workdir", default="")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASE_SERVERS]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {sorted(CASE_SERVERS)}")
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="edgeacc-faults-"))
    out_path = pathlib.Path(args.out) if args.out else workdir / "faults.json"
    log_dir = out_path.parent / "faults_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.platform == "cpu":
        os.environ.setdefault("SGLANG_PLATFORM", "edgeacc_cpu")
    path, dummy, _, _ = model_path("tiny", workdir)

    def make(name):
        edge, extra = SERVERS[name]
        env = _arm_env("edge" if edge else "plain", args.platform)
        if name.startswith("unpatched-"):
            env = {**env, **edgeacc_faults.server_env(**UNPATCHED)}
        return SglangServer(args=(*BASE, *extra, *(EDGE if edge else ())), model_path=path, platform=args.platform,
                            dummy_weights=dummy, env=env, startup_timeout_s=420)

    names = sorted({s for c in cases for s in CASE_SERVERS[c]})
    servers = {}
    for name in names:
        servers[name] = make(name).launch()
        time.sleep(1.0)
    print(f"[faults] launched {len(servers)} servers", flush=True)
    results: dict = {"platform": args.platform, "scale": args.scale}
    lock = threading.Lock()

    def record(case, value):
        with lock:
            results[case] = value
            out_path.write_text(json.dumps(results, indent=1))
        print(f"[faults] {case}: {'PASS' if value.get('passed') else 'FAIL'}", flush=True)

    def guarded(case, fn):
        try:
            for name in CASE_SERVERS[case]:
                servers[name].wait_healthy()
                results.setdefault("started_s", {})[name] = round(servers[name].started_s, 1)
            record(case, fn())
        except Exception:  # noqa: BLE001 - the JSON says what failed
            record(case, {"error": traceback.format_exc()[-3000:], "passed": False})

    extra_servers = []

    def relaunch():
        server = make("kill-edge-decode")
        extra_servers.append(server)
        return server.launch().wait_healthy()

    try:
        soak_thread = None
        if "soak" in cases:
            soak_thread = threading.Thread(target=guarded, args=("soak", lambda: case_soak(
                servers["soak-plain"], servers["soak-edge"], args.soak_s, args.warmup_s)), daemon=True)
            soak_thread.start()
        plans = {
            "kill": lambda: case_kill(servers, args.scale, relaunch),
            "aborts": lambda: case_aborts(servers["main-plain"], servers["main-edge"], args.scale),
            "pressure": lambda: case_pressure(servers["pressure-plain"], servers["pressure-edge"], args.scale),
            "bad": lambda: case_bad(servers["main-plain"], servers["main-edge"]),
            "empty-unpatched": lambda: case_empty_unpatched(servers["unpatched-plain"], servers["unpatched-edge"]),
        }
        # The kills and the KV-pressure run use servers of their own: they run beside the others.
        side = [threading.Thread(target=guarded, args=(c, plans[c]), daemon=True) for c in ("kill", "pressure")
                if c in cases]
        for t in side:
            t.start()
        for case in ("aborts", "bad", "empty-unpatched"):
            if case in cases:
                guarded(case, plans[case])
        for t in side:
            t.join()
        if soak_thread is not None:
            soak_thread.join()
    finally:
        everything = [*servers.items(), *((f"next-edge-{i}", s) for i, s in enumerate(extra_servers))]

        def stop(item):
            name, server = item
            server.stop()
            (log_dir / f"{name}.log").write_text(server.log_tail(2_000_000))
        with cf.ThreadPoolExecutor(max(1, len(everything))) as pool:
            list(pool.map(stop, everything))
    out_path.write_text(json.dumps(results, indent=1))
    for case in cases:
        print(f"{'PASS' if results.get(case, {}).get('passed') else 'FAIL'} {case}")
    return 0 if all(results.get(c, {}).get("passed") for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
