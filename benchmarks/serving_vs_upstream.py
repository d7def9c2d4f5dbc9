"""EdgeAcc against upstream sglang in the real server, with upstream's own ``bench_serving``.

Each arm is one server launch (plain sglang, plain sglang at another chunk size,
EdgeAcc with its defaults, EdgeAcc at another split), started alone on the GPU
and measured on the same workloads with ``python -m sglang.bench_serving``
(``random-ids`` prompts of exact lengths, streaming, ``ignore_eos``): total
throughput, TTFT and ITL percentiles and the worst inter-token gap. Before the
workloads, each arm runs the GPU server suite's fingerprint (greedy outputs)
so the comparison also says whether EdgeAcc answered as upstream did. Then each arm
is warmed (:func:`warm_batch_sizes`): one batch of short requests whose decode runs
through every batch size the decode graphs cover, so that what a server does once
in its life at a new batch size (a kernel specialisation compiled, a graph launched
for the first time) is not counted in the first workload that reaches it, on either
arm. ``--cold`` leaves the warm-up out.

    # GPU host, from the repository root, MPS daemon up (EDGEACC_SUITE_MPS_PIPE names its pipe dir):
    source .gpu-bundle/env.sh && python3 -m benchmarks.serving_vs_upstream --out $OUT/bench.json \\
        --arms upstream,edgeacc --workloads burst,long_out

    python3 -m benchmarks.serving_vs_upstream --report a.json b.json   # merge runs, print the ratio table

An arm ``BASE+LABEL`` runs arm BASE's flags on another build of the plugin, exported by
``scripts/gpu-host/ab-source.sh REV LABEL``: a change and the build before it on one machine, in one call.
Every arm gets the same requests (one seed per workload), so the report also compares each arm with the
run's first arm request by request (``benchmarks/paired.py``: the share of requests whose first token came
earlier, the mean difference, the median's ratio with its spread over resampled request sets).

``--gpu-share`` starts every arm with ``--enable-metrics`` and reads ``/metrics`` around each
workload: on every arm upstream's first-token stages (received, queued, forward), and on EdgeAcc
arms the decode side's work counters (the prefill side's achieved TFLOP/s, the decode side's GB/s
beside a prefill and alone) and the mean time of each part of the prefill path
(``benchmarks/gpu_share.py``).

The model is Qwen3-8B-shaped with dummy weights and a production-sized
(151,936-entry) tokenizer (``tests/serving_models.py``). ``--platform cpu
--dry-run`` runs every step on the CPU platform with the tiny model and tiny
workloads, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import requests

from benchmarks import gpu_share, paired
from benchmarks.client_gc import ClientPauses
from sglang_edgeacc.server_start.decode_warmup import warmup_input
from tests import serving_models
from tests.harness import SglangServer, gpu_memory_by_pid

# This script as a module, and the folder it is imported from (the repository root).
MODULE = "benchmarks.serving_vs_upstream"
ROOT = pathlib.Path(__file__).resolve().parents[1]

COMMON_ARGS = ("--mem-fraction-static", "0.6", "--cuda-graph-max-bs-decode", "128")
# The warm-up's batch: every decode batch size the graphs of COMMON_ARGS cover; a handful on the CPU.
WARM_UP_BATCH = {"cuda": 128, "cpu": 4}

# name -> (flags, uses MPS)
ARMS: dict[str, tuple[tuple[str, ...], bool]] = {
    "upstream": ((), False),
    # Upstream's own answer to decode stalls: decode requests ride along in every prefill chunk.
    "upstream-mixed-c2048": (("--enable-mixed-chunk", "--chunked-prefill-size", "2048"), False),
    "edgeacc": (("--enable-edge-acc",), True),
    # Decode steps back to back even while the prefill side has a batch (the default paces them).
    "edgeacc-no-pace": (("--enable-edge-acc", "--edge-acc-decode-pacing", "off"), True),
    # Looser inter-token targets: beside a prefill, tokens aimed 90 and 67.5 ms apart (the default: 45),
    # so the prefill side has more of the GPU; the first at the edge of a streaming SLO's 100 ms.
    "edgeacc-itl-100": (("--enable-edge-acc", "--edge-acc-itl-slo-ms", "100"), True),
    "edgeacc-itl-75": (("--enable-edge-acc", "--edge-acc-itl-slo-ms", "75"), True),
}

# An arm may run another build of the plugin: BASE+LABEL is arm BASE with the package exported under
# .ab/LABEL/python (scripts/gpu-host/ab-source.sh REV LABEL) first on its server's PYTHONPATH, so that two builds
# meet on one machine in one device call instead of across machines.
AB_ROOT = ROOT / ".ab"


def arm_base(arm: str) -> str:
    return arm.partition("+")[0]


def arm_label(arm: str) -> str:
    """The exported build an arm runs ("": this checkout's)."""
    return arm.partition("+")[2]


def arm_source(arm: str) -> pathlib.Path | None:
    """The exported package an arm's server imports the plugin from (None: this checkout's)."""
    return AB_ROOT / arm_label(arm) / "python" if arm_label(arm) else None


def arm_problem(arm: str) -> str | None:
    """Why ``arm`` cannot run (None: it can)."""
    if arm_base(arm) not in ARMS:
        return f"{arm}: no arm {arm_base(arm)!r} (known: {', '.join(sorted(ARMS))}; BASE+LABEL runs another build)"
    source = arm_source(arm)
    if source is not None and not (source / "sglang_edgeacc" / "__init__.py").is_file():
        return (f"{arm}: no package under {source.relative_to(ROOT)}; export it first: "
                f"scripts/gpu-host/ab-source.sh REV {arm_label(arm)}")
    return None


def arm_env(arm: str) -> dict[str, str]:
    """What an arm's server adds to its environment for its build (nothing for this checkout's)."""
    source = arm_source(arm)
    if source is None:
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(source), os.environ.get("PYTHONPATH")) if p)}


def plugin_imported_from(arm: str) -> pathlib.Path:
    """Where a Python started with the arm's server environment imports the plugin from."""
    probe = subprocess.run([sys.executable, "-c", "import sglang_edgeacc; print(sglang_edgeacc.__file__)"],
                           env={**os.environ, **arm_env(arm)}, capture_output=True, text=True, timeout=120,
                           cwd=tempfile.gettempdir())
    if probe.returncode != 0:
        raise RuntimeError(f"{arm}: the plugin does not import in its server's environment:\n{probe.stderr[-2000:]}")
    return pathlib.Path(probe.stdout.strip()).resolve()


def arm_revision(arm: str) -> str | None:
    source = arm_source(arm)
    if source is None:
        return None
    stamp = source.parent / "REVISION"
    return stamp.read_text().strip() if stamp.is_file() else "unknown"


@dataclass(frozen=True)
class Workload:
    prompts: int
    input_len: int
    output_len: int
    concurrency: int | None = None  # None: all at once (closed loop at the rate)
    rate: float | None = None  # requests/s, Poisson; None: as fast as the concurrency allows
    # Random lengths: each prompt and output uniform in [len * range_ratio, len] (bench_serving's rule).
    range_ratio: float = 1.0


WORKLOADS: dict[str, Workload] = {
    "burst": Workload(128, 2048, 128, concurrency=64),
    "long_out": Workload(128, 2048, 512, concurrency=128),
    # The reference deployment's shape (~2860 in / ~2180 out, 128 concurrent), fewer prompts so the
    # KV pool holds them all at once.
    "reference": Workload(64, 2860, 2180, concurrency=128),
    "open_4": Workload(64, 2048, 128, rate=4.0),
    "open_8": Workload(64, 2048, 128, rate=8.0),
    "open_16": Workload(64, 2048, 128, rate=16.0),
    # Steady state: many more requests than the concurrency, so requests finish and new ones start
    # all the time; prompts 1024-3072 tokens, outputs 128-384.
    "steady": Workload(384, 3072, 384, concurrency=128, range_ratio=1 / 3),
    # Poisson arrivals with the same random lengths: the sweep the goodput search reads.
    **{f"poisson_{rate}": Workload(96, 3072, 384, rate=float(rate), range_ratio=1 / 3) for rate in (4, 8, 12, 16)},
    # The same prompts answered with one token: no decode runs, so the first token's time is the prefill
    # path alone (EdgeAcc: the hand-off, the prefill side and the reply; upstream: its own prefill).
    **{f"prefill_only_{rate}": Workload(96, 3072, 1, rate=float(rate), range_ratio=1 / 3) for rate in (8, 16)},
    # The sweep's low end, where upstream's best arms may still meet the tight SLO: 24 s of arrivals, as at
    # 4 req/s. Listed last so that the workloads above keep their seeds (and prompts) from earlier runs.
    "poisson_2": Workload(48, 3072, 384, rate=2.0, range_ratio=1 / 3),
    # Between the sweep's rates, where the tight SLO's attainment falls through 90 % on an H100.
    "poisson_3": Workload(72, 3072, 384, rate=3.0, range_ratio=1 / 3),
    "poisson_6": Workload(96, 3072, 384, rate=6.0, range_ratio=1 / 3),
    # Three times poisson_16's requests, for counts of rare events (first gaps over the SLO's 100 ms) that
    # decide between two builds; outside the goodput sweep, which reads each rate once.
    "long_poisson_16": Workload(288, 3072, 384, rate=16.0, range_ratio=1 / 3),
}
# A request meets the SLO when its first token comes within max(1 s, 1 ms per prompt token) and no
# gap between its tokens exceeds 100 ms; the tight SLO asks for the first token within 300 ms.
SLO_GAP_MS = 100.0
TIGHT_TTFT_MS = 300.0
GOODPUT_ATTAINMENT = 0.9
DRY_WORKLOADS = {name: Workload(4, 64, 8, concurrency=w.concurrency and 2, rate=w.rate, range_ratio=w.range_ratio)
                 for name, w in WORKLOADS.items()}

# What an arm costs, to decide before starting it whether it can end inside the time a device call has left:
# a start with dummy weights took 100-160 s on an H100 (or the slowest start measured in the run, if longer),
# the fingerprint about 10 s, the warm-up a few seconds, a Poisson workload its arrivals and the last answers after them.
GPU_START_ESTIMATE_S = 160.0
CPU_START_ESTIMATE_S = 60.0
FINGERPRINT_S = 10.0
WARM_UP_S = 5.0
WORKLOAD_TAIL_S = 15.0
CLOSED_LOOP_ESTIMATE_S = 90.0  # its length depends on the server; the longest seen on an H200


def arm_estimate_s(workloads: dict[str, Workload], start_s: float, passes: int = 1) -> float:
    """An arm's time: its start, fingerprint and warm-up, and its workloads ``passes`` times (one per target)."""
    return start_s + FINGERPRINT_S + WARM_UP_S + passes * sum(
        w.prompts / w.rate + WORKLOAD_TAIL_S if w.rate else CLOSED_LOOP_ESTIMATE_S for w in workloads.values())


def skip_reason(arm: str, workloads: dict[str, Workload], left_s: float | None, start_s: float,
                passes: int = 1) -> str | None:
    """Why an arm is not started: it would not end in the time left (None: start it, or no limit was given)."""
    if left_s is None:
        return None
    need = arm_estimate_s(workloads, start_s, passes)
    if need <= left_s:
        return None
    return (f"{arm}: not started: {max(left_s, 0):.0f} s left of the time limit, and this arm needs about "
            f"{need:.0f} s (a start of {start_s:.0f} s, the fingerprint, the workloads); give it a call of its own")


def workload_seed(name: str) -> int:
    """The same prompts for a workload on every arm, different prompts for different workloads."""
    return 1 + (list(WORKLOADS).index(name) if name in WORKLOADS else len(WORKLOADS))


METRICS = ("total_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "max_itl_ms")


def bench_argv(url: str, model: str, w: Workload, out_file: str, seed: int) -> list[str]:
    """``python -m sglang.bench_serving`` arguments for one workload.

    Each workload gets its own seed: ``random-ids`` prompts depend only on it, so two
    workloads with one seed would send the same prompts and the second would measure
    radix-cache hits instead of prefill.
    """
    argv = [
        "--backend", "sglang", "--base-url", url,
        "--model", model, "--tokenizer", model, "--dataset-name", "random-ids", "--tokenize-prompt",
        "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
        "--random-range-ratio", f"{w.range_ratio:.6f}", "--num-prompts", str(w.prompts), "--seed", str(seed),
        "--output-file", out_file, "--output-details", "--disable-tqdm",
    ]
    argv += ["--request-rate", str(w.rate if w.rate else "inf")]
    if w.concurrency:
        argv += ["--max-concurrency", str(w.concurrency)]
    return argv


def bench_serving_many(plan: dict) -> None:
    """Run upstream's bench_serving once per argument list, in this process (its imports cost once).

    With a ``metrics_url``, EdgeAcc's work counters are read before and after each run and
    written beside its result (``counter_files``). The client's heap is frozen before each run
    and its own collector pauses during the run are written beside the result (``gc_files``).
    """
    from sglang.benchmark.serving import cli_main

    url = plan.get("metrics_url")
    for argv, counter_file, gc_file in zip(plan["runs"], plan["counter_files"], plan["gc_files"]):
        before = gpu_share.scrape(url) if url else None
        sys.argv = ["sglang.bench_serving", *argv]
        pauses = ClientPauses().start()
        try:
            cli_main()
        except SystemExit:
            pass
        except Exception as exc:  # noqa: BLE001 - the caller sees a missing result file
            print(f"bench_serving failed: {type(exc).__name__}: {exc}", flush=True)
        finally:
            pathlib.Path(gc_file).write_text(json.dumps(pauses.stop()))
        if url:
            time.sleep(1.0)  # upstream's multiprocess collector reads what the schedulers wrote
            pathlib.Path(counter_file).write_text(json.dumps({"before": before, "after": gpu_share.scrape(url)}))


def run_workloads(server: SglangServer, model: str, workloads: dict[str, Workload], log_dir: pathlib.Path,
                  counters: bool = False, tag: str = "") -> dict:
    """Each workload through bench_serving; ``tag`` tells apart the files of passes on one server."""
    files = {name: str(log_dir / f"bench_{name}_{server.port}{tag}.jsonl") for name in workloads}
    plan = {
        "runs": [bench_argv(server.url, model, w, files[name], seed=workload_seed(name))
                 for name, w in workloads.items()],
        "metrics_url": server.url if counters else None,
        "counter_files": [files[name] + ".counters.json" for name in workloads],
        "gc_files": [files[name] + ".client_gc.json" for name in workloads],
    }
    started = time.monotonic()
    # The child finds this module through PYTHONPATH, whatever directory it starts in.
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-m", MODULE, "--bench-serving-runs", json.dumps(plan)],
                          env={**os.environ, "PYTHONPATH": python_path}, capture_output=True, text=True, timeout=900)
    (log_dir / f"bench_serving_{server.port}{tag}.log").write_text(proc.stdout[-200_000:] + proc.stderr[-200_000:])
    results = {}
    for name in workloads:
        if not os.path.exists(files[name]):
            results[name] = {"error": (proc.stdout[-1500:] + proc.stderr[-2500:])}
            continue
        with open(files[name]) as fh:
            result = json.loads(fh.read().strip().splitlines()[-1])
        picked = {k: result.get(k) for k in (*METRICS, "completed", "duration", "total_output_tokens")}
        gaps = [g for itls in result.get("itls") or [] for g in (itls or [])]
        picked["max_itl_ms"] = max(gaps) * 1000 if gaps else None
        picked.update(slo_attainment(result))
        picked.update(gap_split(result))
        picked.update(paired.request_details(result))
        picked["errors"] = sum(1 for e in result.get("errors") or [] if e)
        gc_file = pathlib.Path(files[name] + ".client_gc.json")
        if gc_file.exists():
            seen = json.loads(gc_file.read_text())
            picked["client_gc_max_ms"] = seen["max_ms"]
            picked["client_gc_listed"] = seen["listed"]
        counter_file = pathlib.Path(files[name] + ".counters.json")
        if counters and counter_file.exists() and picked.get("duration"):
            seen = json.loads(counter_file.read_text())
            picked["gpu_share"] = gpu_share.shares(seen["before"], seen["after"],
                                                   gpu_share.ModelCosts.from_model_dir(model), picked["duration"])
        results[name] = picked
    print(f"[bench] workloads took {time.monotonic() - started:.0f} s", flush=True)
    return results


def _percentile(values: list[float], share: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else None


def slo_attainment(result: dict) -> dict:
    """TTFT p90 and the share of requests that meet the SLO and the tight SLO, from bench_serving's details.

    Also how many requests had a gap over the SLO's, and of those how many only between their first and
    second token: a request's first gap has other causes (how a new request joins the decode batch) than
    the gaps after it (the decode steps' spacing, a stall of every running request).
    """
    ttfts, itls, lens = result.get("ttfts") or [], result.get("itls") or [], result.get("input_lens") or []
    if not ttfts:
        return {}
    met = tight = over = first_only = 0
    for ttft, gaps, prompt_len in zip(ttfts, itls, lens):
        ttft_ms, worst_gap_ms = ttft * 1000, max(gaps or [0.0]) * 1000
        if worst_gap_ms > SLO_GAP_MS:
            over += 1
            first_only += max(gaps[1:] or [0.0]) * 1000 <= SLO_GAP_MS
        if ttft <= 0 or worst_gap_ms > SLO_GAP_MS:
            continue  # a failed request has no first token
        met += ttft_ms <= max(1000.0, float(prompt_len))
        tight += ttft_ms <= TIGHT_TTFT_MS
    p90 = _percentile([t * 1000 for t in ttfts if t > 0], 0.9)
    return {"p90_ttft_ms": p90, "slo_attainment": met / len(ttfts), "tight_slo_attainment": tight / len(ttfts),
            "gap_over_slo_requests": over, "gap_over_slo_first_only": first_only}


def gap_split(result: dict) -> dict:
    """Each request's first gap (its first token to its second) apart from every gap after it, in ms.

    The two have different causes: a first gap is how soon a new request joins a decode step, the later
    ones are the steps' spacing. A change to one can move the other the opposite way, which a P99 over
    every gap hides.
    """
    itls = [gaps for gaps in result.get("itls") or [] if gaps]
    if not itls:
        return {}
    first = [gaps[0] * 1000 for gaps in itls]
    later = [g * 1000 for gaps in itls for g in gaps[1:]]
    return {"first_gap_p50_ms": _percentile(first, 0.5), "first_gap_p90_ms": _percentile(first, 0.9),
            "first_gap_max_ms": max(first), "later_gap_p99_ms": _percentile(later, 0.99)}


def gap_table(arms: dict) -> str:
    """Per workload and arm: the first gaps and the later gaps apart (empty where no result has them)."""
    lines = ["| workload | arm | first gap p50 ms | first gap p90 ms | first gap max ms | later gaps p99 ms |",
             "|---|---|---:|---:|---:|---:|"]
    for w in WORKLOADS:
        for arm, entry in arms.items():
            r = entry.get("workloads", {}).get(w) or {}
            if "first_gap_p50_ms" in r:
                later = f"{r['later_gap_p99_ms']:.1f}" if r.get("later_gap_p99_ms") is not None else "-"
                lines.append(f"| {w} | {arm} | {r['first_gap_p50_ms']:.1f} | {r['first_gap_p90_ms']:.1f} "
                             f"| {r['first_gap_max_ms']:.1f} | {later} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def goodput_rate(arm: dict, key: str = "slo_attainment") -> float | None:
    """The highest Poisson rate of the sweep at which at least 90 % of requests met the SLO (None: none did)."""
    rates = [WORKLOADS[w].rate for w, r in arm.get("workloads", {}).items()
             if w.startswith("poisson_") and (r.get(key) or 0) >= GOODPUT_ATTAINMENT]
    return max(rates) if rates else None


def goodput_crossing(arm: dict, key: str = "slo_attainment") -> tuple[float, bool] | None:
    """Where the arm's attainment curve falls through 90 %, by linear interpolation between the highest rate
    that met it and the next rate of the sweep, which did not: (rate, True). A sweep met to its top rate gives
    (that rate, False): the crossing is above the sweep. None: no rate met it.

    The sweep's rates are far apart (2, 4, 8, 16 req/s), so the highest rate met alone can put two arms
    a factor of two apart or together that are not.
    """
    met = goodput_rate(arm, key)
    if met is None:
        return None
    points = [(rate, r[key]) for rate, r in poisson_sweep(arm) if r.get(key) is not None]
    above = [(rate, share) for rate, share in points if rate > met]
    if not above:
        return met, False
    next_rate, next_share = above[0]
    met_share = dict(points)[met]
    return met + (next_rate - met) * (met_share - GOODPUT_ATTAINMENT) / (met_share - next_share), True


def poisson_sweep(arm: dict) -> list[tuple[float, dict]]:
    """The arm's Poisson workloads as (rate, result), lowest rate first."""
    return sorted(((WORKLOADS[w].rate, r) for w, r in arm.get("workloads", {}).items()
                   if w.startswith("poisson_") and w in WORKLOADS), key=lambda item: item[0])


def attainment_curves(arms: dict) -> str:
    """Each arm's share of requests meeting the SLO and the tight SLO at each rate of the sweep, and the
    tight-SLO goodput of every EdgeAcc arm against upstream's best arm (the highest goodput of the
    upstream arms, whichever configuration that is)."""
    rates = sorted({rate for entry in arms.values() for rate, _ in poisson_sweep(entry)})
    if not rates:
        return ""
    lines = ["| arm (SLO met / tight SLO met) | " + " | ".join(f"{rate:g} req/s" for rate in rates) + " |",
             "|---|" + "---:|" * len(rates)]
    for arm, entry in arms.items():
        sweep = dict(poisson_sweep(entry))
        if not sweep:
            continue
        cells = [f"{sweep[rate]['slo_attainment']:.0%} / {sweep[rate]['tight_slo_attainment']:.0%}"
                 if sweep.get(rate, {}).get("slo_attainment") is not None else "-" for rate in rates]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    upstream = {a: goodput_rate(e, "tight_slo_attainment") for a, e in arms.items()
                if a.startswith("upstream") and poisson_sweep(e)}
    if upstream:
        best_arm = max(upstream, key=lambda a: upstream[a] or 0.0)
        best = upstream[best_arm]
        for arm, entry in arms.items():
            if arm.startswith("upstream") or not poisson_sweep(entry):
                continue
            mine = goodput_rate(entry, "tight_slo_attainment")
            if best:
                versus = f"{mine / best:.2f}x" if mine else "below the sweep"
            else:
                versus = f"upstream below {rates[0]:g} req/s on every arm"
            lines.append(f"\ntight-SLO goodput: {arm} {mine} req/s, best upstream ({best_arm}) {best} req/s: {versus}")
            lines.append(_crossing_line(arm, entry, arms))
    return "\n".join(lines)


def _crossing_line(arm: dict, entry: dict, arms: dict) -> str:
    """The tight-SLO goodput of one EdgeAcc arm against upstream's best, both where their curves cross 90 %."""
    key = "tight_slo_attainment"
    crossings = {a: goodput_crossing(e, key) for a, e in arms.items() if a.startswith("upstream") and poisson_sweep(e)}
    crossings = {a: c for a, c in crossings.items() if c is not None}
    mine = goodput_crossing(entry, key)
    if not crossings or mine is None:
        return f"where the curves cross 90 %: {arm} {_crossing(mine)}, upstream below the sweep"
    best_arm = max(crossings, key=lambda a: crossings[a][0])
    best = crossings[best_arm]
    ratio = f"{'at least ' if not mine[1] else ''}{mine[0] / best[0]:.2f}x"
    if not best[1]:
        ratio = "unknown (upstream met the whole sweep)"
    return f"where the curves cross 90 %: {arm} {_crossing(mine)}, best upstream ({best_arm}) {_crossing(best)}: {ratio}"


def _crossing(crossing: tuple[float, bool] | None) -> str:
    if crossing is None:
        return "below the sweep"
    rate, inside = crossing
    return f"about {rate:.1f} req/s" if inside else f"at least {rate:g} req/s (the sweep's top)"


def server_memory(server: SglangServer) -> dict[str, int]:
    """GPU MiB of each scheduler of the server, by process title."""
    usage = gpu_memory_by_pid()
    found = {}
    for proc in server.descendants():
        try:
            title = " ".join(proc.cmdline())[:80] or proc.name()
        except Exception:  # noqa: BLE001 - a process may end while listed
            continue
        if proc.pid in usage:
            found[title] = usage[proc.pid]
    return found


def warm_batch_sizes(server: SglangServer, batch: int, vocab: int) -> list[int]:
    """The request an EdgeAcc server warms itself with at start (``decode_warmup.warmup_input``), sent over HTTP.

    Upstream's servers do not warm their decode batch sizes; this puts every arm in the same state
    before it is measured. Returns each answer's length.
    """
    request = warmup_input(batch, vocab)
    response = requests.post(f"{server.url}/generate", timeout=300,
                             json={"input_ids": request.input_ids, "sampling_params": request.sampling_params})
    response.raise_for_status()
    return [len(out["output_ids"]) for out in response.json()]


def is_edge_acc(arm: str) -> bool:
    return "--enable-edge-acc" in ARMS[arm_base(arm)][0]


def launch_target_ms(arm: str) -> float:
    """The inter-token target an EdgeAcc arm starts with: its flag, or the default."""
    from sglang_edgeacc.flags import EdgeAccFlags

    flags = ARMS[arm_base(arm)][0]
    if "--edge-acc-itl-slo-ms" in flags:
        return float(flags[flags.index("--edge-acc-itl-slo-ms") + 1])
    return EdgeAccFlags.edge_acc_itl_slo_ms


def target_label(arm: str, itl_slo_ms: float) -> str:
    """The report's name for an arm's workloads at a target: the arm's own at the one it starts with."""
    return arm if itl_slo_ms == launch_target_ms(arm) else f"{arm}@itl-{itl_slo_ms:g}"


def retarget(server: SglangServer, itl_slo_ms: float) -> None:
    """Move a running EdgeAcc server to another inter-token target and start it on an empty prefix cache.

    The workloads' prompts depend only on their seeds, so a second pass would otherwise hit the
    radix cache the first one filled instead of prefilling.
    """
    reply = requests.post(f"{server.url}/set_internal_state", timeout=60,
                          json={"server_args": {"edge_acc_itl_slo_ms": itl_slo_ms}})
    reply.raise_for_status()
    if not all(reply.json()):
        raise RuntimeError(f"the server refused edge_acc_itl_slo_ms={itl_slo_ms}: {reply.json()}")
    for state in requests.get(f"{server.url}/get_server_info", timeout=60).json()["internal_states"]:
        said = state["edge_acc"]["decode_pacing"]["itl_slo_ms"]
        if said != itl_slo_ms:
            raise RuntimeError(f"asked for an inter-token target of {itl_slo_ms} ms, the server says {said}")
    deadline = time.monotonic() + 60
    while requests.post(f"{server.url}/flush_cache", timeout=60).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError("the prefix cache could not be flushed within 60 s (requests still running?)")
        time.sleep(1.0)


def run_arm(arm: str, platform: str, model: str, dummy: bool, workloads: dict[str, Workload],
            log_dir: pathlib.Path, fingerprint_vocab: int, layout: tuple[str, ...] = (),
            counters: bool = False, on_measured=None, warm_up: bool = True,
            itl_targets: tuple[float, ...] = ()) -> dict:
    """One arm: start its server, fingerprint it, run the workloads, stop it.

    With ``itl_targets`` (EdgeAcc arms) the workloads run once per inter-token target on the same
    warm server, moved between them through ``/set_internal_state``; the targets' results are in
    ``entry["targets"]``, each under its :func:`target_label`, the start's target first.
    ``on_measured(entry)`` is called once the measurements are in, before the server
    stops: stopping can take a while, and a step cut off by its time limit then still
    keeps what it measured.
    """
    from tests.gpu.server_suite import fingerprint

    flags, uses_mps = ARMS[arm_base(arm)]
    if counters:
        # On every arm, so that what metrics cost is the same on both sides of a ratio.
        flags = (*flags, "--enable-metrics")
    common = COMMON_ARGS if platform == "cuda" else ()
    env = arm_env(arm)
    if uses_mps and platform == "cuda" and os.environ.get("EDGEACC_SUITE_MPS_PIPE"):
        env.update(CUDA_MPS_PIPE_DIRECTORY=os.environ["EDGEACC_SUITE_MPS_PIPE"],
                   CUDA_MPS_LOG_DIRECTORY=os.environ.get("EDGEACC_SUITE_MPS_LOG", os.environ["EDGEACC_SUITE_MPS_PIPE"]))
    server = SglangServer(args=(*common, *layout, *flags), model_path=model, platform=platform, dummy_weights=dummy,
                          env=env, startup_timeout_s=420)
    entry: dict = {"flags": [*common, *layout, *flags]}
    try:
        if arm_source(arm) is not None:
            # Checked before the start, so that a result is never filed under a build its server did not run.
            imported = plugin_imported_from(arm)
            entry["build"] = {"source": str(arm_source(arm).relative_to(ROOT)), "revision": arm_revision(arm),
                              "imported_from": str(imported)}
            if not imported.is_relative_to(arm_source(arm).resolve()):
                raise RuntimeError(f"{arm}: its server would import the plugin from {imported}, not from "
                                   f"{arm_source(arm)} (is something put before it on PYTHONPATH?)")
        server.start()
        entry["started_s"] = round(server.started_s, 1)
        print(f"[bench] {arm}: healthy after {server.started_s:.0f} s", flush=True)
        entry["fingerprint"] = fingerprint(server, fingerprint_vocab, sensitive=False)
        if warm_up:
            t0 = time.monotonic()
            lengths = warm_batch_sizes(server, WARM_UP_BATCH[platform], fingerprint_vocab)
            entry["warm_up"] = {"batch": len(lengths), "seconds": round(time.monotonic() - t0, 1)}
        entry["gpu_mib"] = server_memory(server)
        entry["workloads"] = run_workloads(server, model, workloads, log_dir, counters=counters)
        entry["gpu_mib_after_load"] = server_memory(server)
        for name, r in entry["workloads"].items():
            print(f"[bench] {arm}/{name}: {json.dumps(r)[:300]}", flush=True)
        later = [t for t in dict.fromkeys(itl_targets) if t != launch_target_ms(arm)] if is_edge_acc(arm) else []
        if later:
            entry["targets"] = {}
            for itl_slo_ms in later:
                if on_measured is not None:
                    on_measured(entry)
                label = target_label(arm, itl_slo_ms)
                retarget(server, itl_slo_ms)
                print(f"[bench] {arm}: inter-token target now {itl_slo_ms:g} ms ({label})", flush=True)
                entry["targets"][label] = {"itl_slo_ms": itl_slo_ms,
                                           "workloads": run_workloads(server, model, workloads, log_dir, counters,
                                                                        tag=f"_itl{itl_slo_ms:g}")}
                for name, r in entry["targets"][label]["workloads"].items():
                    print(f"[bench] {label}/{name}: {json.dumps(r)[:300]}", flush=True)
        if on_measured is not None:
            on_measured(entry)
    except Exception as exc:  # noqa: BLE001 - recorded, the next arm still runs
        entry["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
    finally:
        server.stop()
        (log_dir / f"server_{arm}.log").write_text(server.log_tail(300_000))
    return entry


# ----------------------------------------------------------------- report
def report_arms(arm: str, entry: dict) -> dict:
    """What one arm's run adds to the report: the arm, and an arm per later target it ran on the same server
    (its start, fingerprint and memory are the arm's)."""
    own = {key: value for key, value in entry.items() if key != "targets"}
    arms = {arm: own}
    for label, measured in entry.get("targets", {}).items():
        arms[label] = {**own, **measured, "same_server_as": arm}
    return arms


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if metric == "total_throughput" else a < b


def best_upstream(arms: dict, workload: str) -> str | None:
    """Upstream's honest competitor on a workload: the lowest ITL p99 among the upstream arms
    whose throughput is within 5 % of the best upstream throughput there."""
    ups = {a: e["workloads"][workload] for a, e in arms.items() if a.startswith("upstream")
           and "error" not in e.get("workloads", {}).get(workload, {"error": 1})}
    if not ups:
        return None
    top = max(r["total_throughput"] for r in ups.values())
    eligible = {a: r for a, r in ups.items() if r["total_throughput"] >= 0.95 * top}
    return min(eligible, key=lambda a: eligible[a]["p99_itl_ms"])


def ratio_table(arms: dict) -> str:
    workloads = sorted({w for e in arms.values() for w in e.get("workloads", {})},
                       key=lambda w: list(WORKLOADS).index(w) if w in WORKLOADS else 99)
    lines = []
    for w in workloads:
        base = arms.get("upstream", {}).get("workloads", {}).get(w)
        best = best_upstream(arms, w)
        lines.append(f"\n### {w}: {WORKLOADS.get(w)}")
        lines.append("| arm | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | ITL max ms "
                     "| vs upstream (tok/s, TTFT p50, ITL p99, ITL max) | vs best upstream (" + str(best) + ") |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for arm, entry in arms.items():
            r = entry.get("workloads", {}).get(w)
            if not r or "error" in r:
                lines.append(f"| {arm} | error | | | | | | | |")
                continue

            def ratios(ref):
                if not ref or "error" in ref:
                    return "-"
                return ", ".join(f"{r[m] / ref[m]:.2f}x" if ref.get(m) and r.get(m) is not None else "-"
                                 for m in ("total_throughput", "median_ttft_ms", "p99_itl_ms", "max_itl_ms"))

            def ms(metric, digits):  # one-token answers have no gaps between tokens
                return "-" if r.get(metric) is None else f"{r[metric]:.{digits}f}"
            best_ref = arms[best]["workloads"][w] if best else None
            lines.append(f"| {arm} | {r['total_throughput']:.0f} | {r['median_ttft_ms']:.0f} | {r['p99_ttft_ms']:.0f} "
                         f"| {ms('median_itl_ms', 1)} | {ms('p99_itl_ms', 1)} | {ms('max_itl_ms', 1)} "
                         f"| {ratios(base)} | {ratios(best_ref)} |")
    return "\n".join(lines)


def outputs_table(arms: dict) -> str:
    from tests.gpu.server_suite import compare

    ref = arms.get("upstream", {}).get("fingerprint")
    lines = []
    for arm, entry in arms.items():
        fp = entry.get("fingerprint")
        if arm == "upstream" or ref is None or fp is None or entry.get("same_server_as"):
            continue  # a later target's pass: its server was fingerprinted once, at the target it started with
        problems = compare(ref, fp)
        lines.append(f"- {arm}: greedy outputs {'equal upstream' if not problems else 'DIFFER: ' + '; '.join(problems)[:400]}")
    later = [a for a, e in arms.items() if e.get("same_server_as")]
    if later:
        lines.append(f"- {', '.join(later)}: the same servers at other targets, not fingerprinted again")
    starts = ", ".join(f"{a} {e.get('started_s', '-')} s" for a, e in arms.items() if not e.get("same_server_as"))
    lines.append(f"- start to healthy: {starts}")
    return "\n".join(lines)


def merge_runs(runs: list[dict]) -> dict:
    """The arms of several runs, workload by workload: an arm measured on some workloads in one
    run and on others in the next keeps both; a later run's result for the same workload wins."""
    arms: dict = {}
    for run in runs:
        for arm, entry in run["arms"].items():
            merged = arms.setdefault(arm, {})
            workloads = {**merged.get("workloads", {}), **entry.get("workloads", {})}
            for key, value in entry.items():
                merged.setdefault(key, value)
            merged["workloads"] = workloads
    return arms


def slo_table(arms: dict) -> str:
    """Per workload and arm: TTFT p90 and SLO attainment; then each arm's goodput rate over the Poisson sweep."""
    lines = ["| workload | arm | TTFT p90 ms | SLO met | tight SLO met | requests with a gap over 100 ms "
             "(only their first) |", "|---|---|---:|---:|---:|---:|"]
    for w in WORKLOADS:
        for arm, entry in arms.items():
            r = entry.get("workloads", {}).get(w)
            if r and r.get("slo_attainment") is not None:
                p90 = f"{r['p90_ttft_ms']:.0f}" if r.get("p90_ttft_ms") is not None else "-"
                over = (f"{r['gap_over_slo_requests']} ({r['gap_over_slo_first_only']})"
                        if "gap_over_slo_requests" in r else "-")  # results recorded before it was counted
                lines.append(f"| {w} | {arm} | {p90} | {r['slo_attainment']:.0%} "
                             f"| {r['tight_slo_attainment']:.0%} | {over} |")
    lines += ["", "| arm | goodput rate (SLO) | goodput rate (tight SLO) |", "|---|---:|---:|"]
    for arm, entry in arms.items():
        if any(w.startswith("poisson_") for w in entry.get("workloads", {})):
            lines.append(f"| {arm} | {goodput_rate(entry)} | {goodput_rate(entry, 'tight_slo_attainment')} |")
    return "\n".join(lines)


# A client pause from this long on is named in the report beside the gaps it may explain.
CLIENT_PAUSE_NOTED_MS = 50.0


def client_pause_notes(arms: dict) -> str:
    """Every workload in which the benchmark client's own collector stopped it long enough to show as a gap."""
    notes = []
    for arm, entry in arms.items():
        for w, r in entry.get("workloads", {}).items():
            if (r.get("client_gc_max_ms") or 0) >= CLIENT_PAUSE_NOTED_MS:
                notes.append(f"- {arm}/{w}: the client itself paused {r['client_gc_max_ms']:.0f} ms (its garbage "
                             f"collector); a gap or first token that much longer there is the client's, not the server's")
    return "\n".join(notes)


def report(paths: list[str]) -> str:
    return report_from_arms(merge_runs([json.loads(pathlib.Path(path).read_text()) for path in paths]))


def report_from_arms(arms: dict) -> str:
    extra = [t for t in (gap_table(arms), gpu_share.share_table(arms), gpu_share.step_part_table(arms),
                         gpu_share.latency_table(arms), client_pause_notes(arms)) if t]
    curves = attainment_curves(arms)
    pairs = paired.paired_table(arms)
    return "\n\n".join([ratio_table(arms), slo_table(arms), *([pairs] if pairs else []), *([curves] if curves else []),
                        outputs_table(arms), *extra])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="upstream,edgeacc",
                        help=f"comma-separated, of {', '.join(ARMS)}; BASE+LABEL: arm BASE on the build that "
                             "scripts/gpu-host/ab-source.sh REV LABEL exported")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--shape", choices=sorted(serving_models.QWEN3_SHAPES), default="8b",
                        help="the Qwen3 shape served with dummy weights (32b: the reference deployment's model)")
    parser.add_argument("--platform", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="tiny model and tiny workloads (checks the script)")
    parser.add_argument("--layout", default="", help="flags added to every arm, e.g. '--tp 2' or "
                        "'--tp 2 --dp 2 --enable-dp-attention' (the same layout for upstream and EdgeAcc)")
    parser.add_argument("--out", default="")
    parser.add_argument("--workdir", default="")
    parser.add_argument("--report", nargs="*", help="print the table of earlier --out files and exit")
    parser.add_argument("--time-limit-s", type=float, default=0.0,
                        help="the time this run has (a device call's limit): an arm that would not end inside "
                             "what is left is not started, and the run says so")
    parser.add_argument("--gpu-share", action="store_true",
                        help="--enable-metrics on every arm; record each EdgeAcc side's TFLOP/s and GB/s")
    parser.add_argument("--cold", action="store_true",
                        help="no warm-up: each workload also pays what a server does once at a batch size it has "
                             "not run before (the workload first to reach a size pays it)")
    parser.add_argument("--itl-targets", default="",
                        help="comma-separated inter-token targets in ms: each EdgeAcc arm runs its workloads once "
                             "per target on the same warm server (/set_internal_state), reported as ARM@itl-T")
    parser.add_argument("--bench-serving-runs", help=argparse.SUPPRESS)  # internal: one process per arm
    args = parser.parse_args(argv)
    if args.bench_serving_runs:
        bench_serving_many(json.loads(args.bench_serving_runs))
        return 0
    if args.report:
        print(report(args.report))
        return 0
    problems = [p for p in map(arm_problem, args.arms.split(",")) if p]
    if problems:
        parser.error("; ".join(problems))
    table = DRY_WORKLOADS if args.dry_run else WORKLOADS
    workloads = {w: table[w] for w in args.workloads.split(",") if w}
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="edgeacc-bench-"))
    out = pathlib.Path(args.out) if args.out else workdir / "bench.json"
    log_dir = out.parent / "bench_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.platform == "cpu":
        os.environ.setdefault("SGLANG_PLATFORM", "edgeacc_cpu")
    if args.dry_run:
        model, dummy, vocab = str(serving_models.tiny_model_with_production_tokenizer(workdir / "tiny-prod-tok")), True, 500
    else:
        model = str(serving_models.qwen3_shaped_model(workdir / f"qwen3-{args.shape}", args.shape))
        dummy, vocab = True, 151000
    results = {"platform": args.platform, "model": model, "common_args": list(COMMON_ARGS),
               "layout": args.layout, "arms": {}}
    def save(arm: str, entry: dict) -> None:
        results["arms"].update(report_arms(arm, entry))
        out.write_text(json.dumps(results, indent=1))

    began = time.monotonic()
    start_s = GPU_START_ESTIMATE_S if args.platform == "cuda" else CPU_START_ESTIMATE_S
    itl_targets = tuple(float(t) for t in args.itl_targets.split(",") if t)
    for arm in args.arms.split(","):
        left_s = args.time_limit_s - (time.monotonic() - began) if args.time_limit_s else None
        passes = len({launch_target_ms(arm), *itl_targets}) if is_edge_acc(arm) else 1
        reason = skip_reason(arm, workloads, left_s, start_s, passes)
        if reason:
            print(f"[bench] {reason}", flush=True)
            save(arm, {"not_started": reason})
            continue
        save(arm, run_arm(arm, args.platform, model, dummy, workloads, log_dir, vocab,
                          layout=tuple(args.layout.split()), counters=args.gpu_share,
                          on_measured=lambda entry, arm=arm: save(arm, entry), warm_up=not args.cold,
                          itl_targets=itl_targets))
        start_s = max(start_s, results["arms"][arm].get("started_s") or 0.0)  # the slowest start seen is the guess
    print(report_from_arms(results["arms"]))
    return 0 if all("error" not in e and "not_started" not in e for e in results["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
