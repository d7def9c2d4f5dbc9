"""Admission under KV pressure: how upstream and EdgeAcc admit, retract and answer one burst.

Both servers get a KV pool far smaller than the burst needs, so requests wait for
slots, are admitted as slots free, and may be retracted when decode runs out. For
each server: every request's first token and end (streamed, from the moment the
burst was sent), the retractions (``sglang:num_retracted_requests_total``), and the
running and queued request counts sampled from ``/metrics`` while the burst runs.
Scheduling is the same code on every platform, so the CPU shows who admits what and
when; the times are the CPU's.

    python -m benchmarks.kv_pressure --out /tmp/kv_pressure.json                   # CPU platform
    source .gpu-bundle/env.sh && python3 -m benchmarks.kv_pressure --platform cuda --model-path DIR \
        --pool-tokens 60000 --requests 256 --out $OUT/kv_pressure.json                   # not run on a GPU yet
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import random
import re
import statistics
import sys
import threading
import time

import requests

from tests.harness import SglangServer, started_together

TINY_VOCAB = 537
ARMS = {"upstream": (), "edgeacc": ("--enable-edge-acc",)}
SAMPLE_S = 0.05
_GAUGE = re.compile(r"^(sglang:(?:num_running_reqs|num_queue_reqs|num_retracted_requests_total))\{[^}]*\} ([0-9.e+-]+)$",
                    re.M)


def server_args(pool_tokens: int) -> tuple[str, ...]:
    return ("--max-total-tokens", str(pool_tokens), "--chunked-prefill-size", "256", "--max-running-requests", "64",
            "--enable-metrics")


def burst(n: int, seed: int = 7) -> list[list[int]]:
    """``n`` distinct prompts of 200-400 tokens: no radix hits between them."""
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randint(200, 400))] for _ in range(n)]


def parse_metrics(text: str) -> dict[str, float]:
    """The running and queued request gauges and the retraction counter, each summed over its label sets."""
    seen: dict[str, float] = {}
    for name, value in _GAUGE.findall(text):
        seen[name] = seen.get(name, 0.0) + float(value)
    return seen


def scrape(url: str) -> dict[str, float]:
    return parse_metrics(requests.get(f"{url}/metrics", timeout=10).text)


def stream_one(url: str, ids: list[int], new_tokens: int, sent: float) -> dict:
    payload = {"input_ids": ids, "stream": True,
               "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}}
    first = None
    tokens = 0
    with requests.post(f"{url}/generate", json=payload, stream=True, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if first is None:
                first = time.monotonic() - sent
            tokens = chunk.get("meta_info", {}).get("completion_tokens", tokens)
    return {"first_token_s": first, "end_s": time.monotonic() - sent, "tokens": tokens}


def run_burst(server: SglangServer, prompts: list[list[int]], new_tokens: int) -> dict:
    before = scrape(server.url)
    samples: list[tuple[float, float, float]] = []
    done = threading.Event()
    sent = time.monotonic()

    def sample():
        while not done.is_set():
            seen = scrape(server.url)
            samples.append((round(time.monotonic() - sent, 3), seen.get("sglang:num_running_reqs", 0.0),
                            seen.get("sglang:num_queue_reqs", 0.0)))
            done.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with cf.ThreadPoolExecutor(len(prompts)) as pool:
            answers = list(pool.map(lambda ids: stream_one(server.url, ids, new_tokens, sent), prompts))
    finally:
        done.set()  # also when a request failed: the sampler must not poll a stopped server
        sampler.join()
    after = scrape(server.url)
    firsts = sorted(a["first_token_s"] for a in answers if a["first_token_s"] is not None)
    name = "sglang:num_retracted_requests_total"
    return {
        "requests": len(prompts),
        "finished_full": sum(1 for a in answers if a["tokens"] == new_tokens),
        "retracted": after.get(name, 0.0) - before.get(name, 0.0),
        "peak_running": max((s[1] for s in samples), default=0.0),
        "first_token_s": {"min": firsts[0], "median": statistics.median(firsts), "max": firsts[-1]} if firsts else None,
        "burst_s": max(a["end_s"] for a in answers),
        "answers": answers,
        "samples": samples,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--pool-tokens", type=int, default=4096)
    parser.add_argument("--model-path", default="", help="default: the shipped tiny model (dummy weights)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.platform == "cpu":
        os.environ.setdefault("SGLANG_PLATFORM", "edgeacc_cpu")
    servers = {arm: SglangServer(args=(*server_args(args.pool_tokens), *flags), platform=args.platform,
                                 model_path=args.model_path, startup_timeout_s=420)
               for arm, flags in ARMS.items()}
    prompts = burst(args.requests)
    out: dict = {"platform": args.platform, "pool_tokens": args.pool_tokens, "new_tokens": args.new_tokens,
                 "prompt_tokens": sum(map(len, prompts)), "arms": {}}
    with started_together(servers):
        for arm, server in servers.items():  # one at a time: the burst has the machine to itself
            out["arms"][arm] = run_burst(server, prompts, args.new_tokens)
            r = out["arms"][arm]
            print(f"[kv-pressure] {arm}: {r['finished_full']}/{r['requests']} finished, {r['retracted']:.0f} "
                  f"retracted, peak running {r['peak_running']:.0f}, first token {r['first_token_s']}, "
                  f"burst {r['burst_s']:.1f} s", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
