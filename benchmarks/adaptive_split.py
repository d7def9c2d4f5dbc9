"""Issue 7 proof: an adaptive green-context SM split against chunked prefill and fixed splits.

One GPU, the Qwen3-shaped model of ``latency_physics.py`` (random weights), decode batch
``--decode-batch`` at ``--decode-ctx`` context replayed from a CUDA graph. Arms:

  decode-only        reference
  chunked-C          one stream, one C-token chunk between two decode steps (latency_physics's
  chunked-C-graphed  run_single_process, imported, not copied)
  green-N            fixed split: prefill on a green-context stream of N SMs, decode on an
                     ordinary stream over the whole GPU, concurrently (two host threads of one
                     process)
  adaptive-itlX      the same, but every prefill piece picks its green context through
                     edge_acc.adaptive_split.AdaptiveSplitPolicy, fed with the decode side's
                     measured step times, ITL SLO X ms, TTFT SLO ~0 (always grow when ITL allows)

Design choice: EdgeAcc's production split is two processes under MPS with the decode side
at 100 % and the prefill side capped. Green contexts cannot be created in an MPS client with
a percentage, and two processes without MPS time-slice instead of running concurrently, so
here the two sides are two threads of one process on separate streams: decode uncapped on an
ordinary stream (as EdgeAcc's decode at 100 %), prefill confined to its green context (as
EdgeAcc's capped prefill side). Prefill runs eager in pieces of ``--piece`` tokens of whole
prompts, so the policy decides per piece and a piece's kernels fit the launch queue.

Then a phased load (``--phase-seconds`` each): calm (decode batch ``--decode-batch``, prompts
at a low rate), burst (decode batch ``--burst-decode-batch``: new requests not decoding yet,
prompts at a high rate), calm again. Per phase and arm: decode P99 against the ITL target and
TTFT P90 (prompt arrival to its last piece) against the TTFT target. Targets and rates are
derived from the steady arms of the same run unless given (see --itl-slo-ms).

    PYTHONPATH=python python3 benchmarks/adaptive_split.py --out $OUT                # H200
    PYTHONPATH=python python3 benchmarks/adaptive_split.py --dry-run                 # CPU, tiny
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from latency_physics import SHAPES, ArmResult, DecodeRunner, percentile, run_decode_only, run_single_process  # noqa: E402
from qwen3_shaped import Qwen3Forward, random_weights  # noqa: E402

from sglang_edgeacc.edge_acc.adaptive_split import (  # noqa: E402
    AdaptiveSplitConfig,
    AdaptiveSplitPolicy,
    GreenContextPartitions,
    default_sm_counts,
)

logger = logging.getLogger("adaptive_split_bench")


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    prompts_per_s: Optional[float]  # None: a prompt is always waiting
    decode_batch: int


@dataclass(frozen=True)
class PhaseResult:
    arm: str
    phase: str
    decode_batch: int
    prompts_per_s: Optional[float]
    decode_steps: int
    decode_p50_ms: float
    decode_p99_ms: float
    prefill_tok_s: float
    prompts_done: int
    ttft_p90_ms: Optional[float]
    prompts_waiting_at_end: int
    mean_prefill_sms: Optional[float]


class Partitions:
    """Green-context streams, or plain contexts on the CPU dry run (no confinement there)."""

    def __init__(self, device: torch.device, sm_counts: list[int]):
        self.device = device
        if device.type == "cuda":
            self.green = GreenContextPartitions(sm_counts, device.index or 0)
            self.sm_counts = self.green.sm_counts
        else:
            self.green = None
            self.sm_counts = sm_counts

    def __len__(self) -> int:
        return len(self.sm_counts)

    def stream_ctx(self, index: int):
        if self.green is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.green.stream(index))

    def wait(self, index: int) -> None:
        if self.green is not None:
            ev = torch.cuda.Event()
            ev.record(self.green.stream(index))
            ev.synchronize()  # releases the GIL while the piece runs: the decode thread keeps going


def run_concurrent(
    arm: str,
    fwd: Qwen3Forward,
    runners: dict[int, DecodeRunner],
    pk,
    pv,
    prompt: torch.Tensor,
    parts: Partitions,
    phases: list[Phase],
    piece: int,
    pick: Callable[[], int],
    policy: Optional[AdaptiveSplitPolicy] = None,
) -> tuple[list[PhaseResult], list[tuple[float, int]]]:
    """Decode in a thread, prefill pieces here; returns per-phase results and the (t, partition) trace."""
    device = prompt.device
    length = prompt.shape[0]
    bounds, acc = [], 0.0
    for ph in phases:
        bounds.append((acc, acc + ph.seconds, ph))
        acc += ph.seconds
    total = acc

    def phase_at(t: float) -> int:
        for i, (a, b, _) in enumerate(bounds):
            if t < b:
                return i
        return len(bounds) - 1

    arrivals: deque = deque()
    for a, b, ph in bounds:
        if ph.prompts_per_s:
            k = 0
            while a + k / ph.prompts_per_s < b:
                arrivals.append(a + k / ph.prompts_per_s)
                k += 1
    decode_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    stop = threading.Event()
    decode_log: list[tuple[float, float]] = []  # (t completion, itl ms)
    mailbox: deque = deque()  # the decode side's step times, as it would send them to the prefill side
    t0_box: list[float] = []
    ready = threading.Event()

    def decode_loop() -> None:
        ctx = torch.cuda.stream(decode_stream) if decode_stream is not None else contextlib.nullcontext()
        with ctx:
            for r in runners.values():
                for _ in range(3):
                    r.step()
            ready.set()
            while not t0_box:
                time.sleep(0.0005)
            t0 = t0_box[0]
            last = time.perf_counter()
            while not stop.is_set():
                runner = runners[bounds[phase_at(last - t0)][2].decode_batch]
                runner.step()
                now = time.perf_counter()
                ms = (now - last) * 1e3
                decode_log.append((now - t0, ms))
                mailbox.append(ms)
                last = now

    th = threading.Thread(target=decode_loop, name="decode", daemon=True)
    th.start()
    if not ready.wait(300):
        raise TimeoutError("decode thread did not warm up in 300 s")
    # Warm up every partition once with one piece so first-use costs are not in the timed part.
    for i in range(len(parts)):
        with parts.stream_ctx(i):
            fwd.prefill(prompt[:piece], pk, pv, slot0=0, past_len=0)
        parts.wait(i)
    t0 = time.perf_counter()
    t0_box.append(t0)
    queue: deque = deque()  # arrival times of waiting prompts
    ttfts: list[tuple[float, float]] = []  # (arrival t, ttft ms)
    pieces: list[tuple[float, float, int, int]] = []  # (t end, ms, tokens, partition)
    trace: list[tuple[float, int]] = []
    try:
        while True:
            now = time.perf_counter() - t0
            if now >= total:
                break
            while arrivals and arrivals[0] <= now:
                queue.append(arrivals.popleft())
            if not queue:
                if bounds[phase_at(now)][2].prompts_per_s is None:
                    queue.append(now)
                else:
                    if policy is not None:
                        policy.observe_queue(0)
                    nxt = arrivals[0] if arrivals else total
                    time.sleep(max(0.0, min(nxt, total) - now))
                    continue
            arrived = queue.popleft()
            for past in range(0, length, piece):
                n = min(piece, length - past)
                if policy is not None:
                    while mailbox:
                        policy.observe_decode_step(mailbox.popleft())
                idx = pick()
                start = time.perf_counter()
                with parts.stream_ctx(idx):
                    fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)
                parts.wait(idx)
                end = time.perf_counter()
                ms = (end - start) * 1e3
                pieces.append((end - t0, ms, n, idx))
                trace.append((round(start - t0, 3), parts.sm_counts[idx]))
                if policy is not None:
                    t_now = end - t0
                    while arrivals and arrivals[0] <= t_now:
                        queue.append(arrivals.popleft())
                    waiting = len(queue) * length + (length - past - n)
                    if bounds[phase_at(t_now)][2].prompts_per_s is None:
                        waiting += length  # saturating: another prompt is always waiting
                    policy.observe_prefill(ms, n, waiting)
                if end - t0 >= total + 2.0:
                    break  # do not run far past the end on a slow partition
            ttfts.append((arrived, (time.perf_counter() - t0 - arrived) * 1e3))
    finally:
        stop.set()
        th.join(60)
        if th.is_alive():
            raise TimeoutError("decode thread did not stop in 60 s")

    results = []
    for i, (a, b, ph) in enumerate(bounds):
        itl = [ms for t, ms in decode_log if a <= t < b]
        toks = sum(n for t, _, n, _ in pieces if a <= t < b)
        sms = [parts.sm_counts[p] * ms for t, ms, _, p in pieces if a <= t < b]
        busy = sum(ms for t, ms, _, _ in pieces if a <= t < b)
        tt = [ms for arr, ms in ttfts if a <= arr < b]
        results.append(
            PhaseResult(
                arm=arm,
                phase=ph.name,
                decode_batch=ph.decode_batch,
                prompts_per_s=ph.prompts_per_s,
                decode_steps=len(itl),
                decode_p50_ms=round(percentile(itl, 50), 3) if itl else float("nan"),
                decode_p99_ms=round(percentile(itl, 99), 3) if itl else float("nan"),
                prefill_tok_s=round(toks / ph.seconds, 1),
                prompts_done=len(tt),
                ttft_p90_ms=round(percentile(tt, 90), 1) if tt else None,
                prompts_waiting_at_end=sum(1 for arr in list(queue) + list(arrivals) if arr < b)
                if i == len(bounds) - 1
                else 0,
                mean_prefill_sms=round(sum(sms) / busy, 1) if busy else None,
            )
        )
    return results, trace


def interp_p99(curve: list[tuple[float, float]], tok_s: float) -> Optional[float]:
    """Chunked prefill's P99 at ``tok_s`` by linear interpolation over its (tok/s, P99) points."""
    pts = sorted(curve)
    if not pts or tok_s < pts[0][0] or tok_s > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= tok_s <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (tok_s - x0) / (x1 - x0)
    return pts[-1][1]


def to_arm(r: PhaseResult, note: str = "") -> ArmResult:
    return ArmResult(r.arm, r.decode_steps, r.decode_p50_ms, r.decode_p99_ms, float("nan"), 0, r.prefill_tok_s, r.prompts_done, note)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--burst-decode-batch", type=int, default=32)
    ap.add_argument("--decode-ctx", type=int, default=2048)
    ap.add_argument("--piece", type=int, default=2048, help="prefill piece the split is chosen for")
    ap.add_argument("--chunks", default="256,512,1024,2048")
    ap.add_argument("--graphed-chunks", action="store_true", help="also chunked arms replayed from CUDA graphs")
    ap.add_argument("--sm-counts", default="", help="prefill partitions (default: 5 from 1/4 to 7/8 of the SMs)")
    ap.add_argument("--adaptive-itl-factors", default="1.25,1.45,1.7,2.0", help="steady adaptive ITL SLOs, x decode-only P99")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--phase-seconds", type=float, default=5.0)
    ap.add_argument("--itl-slo-ms", type=float, default=0.0, help="phased ITL target (0: 1.05 x the middle fixed split's steady P99)")
    ap.add_argument("--ttft-slo-ms", type=float, default=0.0, help="phased TTFT target (0: 3x one prompt at the middle split)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, short arms: checks the script, measures nothing")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.dry_run:
        args.device, args.shape, args.prompt_len, args.piece = "cpu", "tiny", 256, 64
        args.decode_batch, args.burst_decode_batch, args.decode_ctx = 8, 4, 64
        args.chunks, args.seconds, args.phase_seconds = "32,64", 0.4, 0.5
    sys.setswitchinterval(0.0005)  # the decode thread must get the GIL back fast after each step

    device = torch.device(args.device)
    shape = SHAPES[args.shape]
    if device.type == "cuda":
        torch.cuda.set_device(device)
        total_sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        total_sms = 132
    sm_counts = [int(x) for x in args.sm_counts.split(",") if x] or default_sm_counts(total_sms, 8, 8)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    t_start = time.perf_counter()
    weights = random_weights(shape, device, dtype)
    b, ctx_len = args.decode_batch, args.decode_ctx
    kc = [torch.randn(b, shape.kv_heads, ctx_len, shape.head_dim, device=device, dtype=dtype) for _ in range(shape.layers)]
    vc = [torch.randn_like(k) for k in kc]
    pk = [torch.zeros(args.prompt_len, shape.kv_heads, shape.head_dim, device=device, dtype=dtype) for _ in range(shape.layers)]
    pv = [torch.zeros_like(k) for k in pk]
    fwd = Qwen3Forward(shape, weights, max_positions=max(args.prompt_len, ctx_len) + 16)
    runners = {b: DecodeRunner(fwd, kc, vc, b, ctx_len, device)}
    bb = args.burst_decode_batch
    if bb != b:
        runners[bb] = DecodeRunner(fwd, [k[:bb] for k in kc], [v[:bb] for v in vc], bb, ctx_len, device)
    prompt = torch.randint(0, shape.vocab, (args.prompt_len,), device=device)
    parts = Partitions(device, sm_counts)
    logger.info("setup %.1fs; partitions %s of %d SMs", time.perf_counter() - t_start, parts.sm_counts, total_sms)

    steady: list[ArmResult] = []
    base = run_decode_only(runners[b], args.seconds)
    steady.append(base)
    base_small = run_decode_only(runners[bb], args.seconds) if bb != b else base
    logger.info("%s | burst batch: %s", base, base_small)
    chunked = []
    for graphed in (False, True) if (args.graphed_chunks and device.type == "cuda") else (False,):
        for c in [int(x) for x in args.chunks.split(",") if x]:
            r = run_single_process(fwd, runners[b], pk, pv, prompt, c, args.seconds, graphed=graphed)
            steady.append(r)
            chunked.append(r)
            logger.info("%s", r)
    sat = [Phase("saturating", args.seconds, None, b)]
    fixed_steady: list[PhaseResult] = []
    for i, n in enumerate(parts.sm_counts):
        res, _ = run_concurrent(f"green-{n}", fwd, runners, pk, pv, prompt, parts, sat, args.piece, lambda i=i: i)
        fixed_steady.append(res[0])
        steady.append(to_arm(res[0]))
        logger.info("%s", res[0])
    adaptive_steady = []
    traces = {}
    for f in [float(x) for x in args.adaptive_itl_factors.split(",") if x]:
        slo = round(base.decode_p99_ms * f, 2)
        pol = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=slo, ttft_slo_ms=1.0), len(parts), initial_index=0)
        res, trace = run_concurrent(f"adaptive-itl{slo:g}", fwd, runners, pk, pv, prompt, parts, sat, args.piece, pol.choose, pol)
        adaptive_steady.append(res[0])
        steady.append(to_arm(res[0], f"mean prefill SMs {res[0].mean_prefill_sms}; {pol.changes()} changes"))
        traces[res[0].arm] = trace
        logger.info("%s (changes %d)", res[0], pol.changes())

    # Phased load: targets and rates from the steady arms above.
    mid = len(parts) // 2
    mid_tok_s = max(fixed_steady[mid].prefill_tok_s, 1.0)
    itl_slo = args.itl_slo_ms or round(1.05 * fixed_steady[mid].decode_p99_ms, 2)
    ttft_slo = args.ttft_slo_ms or round(3 * args.prompt_len / mid_tok_s * 1e3, 1)
    low_rate = round(0.35 * mid_tok_s / args.prompt_len, 3)
    high_rate = round(1.3 * mid_tok_s / args.prompt_len, 3)
    phases = [
        Phase("calm-1", args.phase_seconds, low_rate, b),
        Phase("burst", args.phase_seconds, high_rate, bb),
        Phase("calm-2", args.phase_seconds, low_rate, b),
    ]
    logger.info("phased: ITL target %.2f ms, TTFT target %.0f ms, rates %s / %s prompts/s", itl_slo, ttft_slo, low_rate, high_rate)
    phased: list[PhaseResult] = []
    for i, n in enumerate(parts.sm_counts):
        res, _ = run_concurrent(f"green-{n}", fwd, runners, pk, pv, prompt, parts, phases, args.piece, lambda i=i: i)
        phased.extend(res)
        for r in res:
            logger.info("%s", r)
    pol = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=itl_slo, ttft_slo_ms=ttft_slo), len(parts), initial_index=0)
    res, trace = run_concurrent("adaptive", fwd, runners, pk, pv, prompt, parts, phases, args.piece, pol.choose, pol)
    phased.extend(res)
    traces["adaptive-phased"] = trace
    for r in res:
        logger.info("%s", r)
    logger.info("adaptive phased: %d changes", pol.changes())

    # Summaries.
    curve = [(c.prefill_tok_s, c.decode_p99_ms) for c in chunked if not c.arm.endswith("-graphed")]
    curve_g = [(c.prefill_tok_s, c.decode_p99_ms) for c in chunked if c.arm.endswith("-graphed")]
    vs = []
    for r in fixed_steady + adaptive_steady:
        row = {"arm": r.arm, "tok_s": r.prefill_tok_s, "p99": r.decode_p99_ms}
        for name, cv in (("eager", curve), ("graphed", curve_g)):
            ref = interp_p99(cv, r.prefill_tok_s)
            row[f"chunked_{name}_p99_at_equal_tok_s"] = None if ref is None else round(ref, 2)
            row[f"ratio_{name}"] = None if ref is None else round(ref / r.decode_p99_ms, 2)
        vs.append(row)
    verdict = []
    for arm in sorted({p.arm for p in phased}, key=lambda a: (a != "adaptive", a)):
        rows = [p for p in phased if p.arm == arm]
        miss = [
            p.phase
            for p in rows
            if p.decode_p99_ms > itl_slo or (p.ttft_p90_ms is not None and p.ttft_p90_ms > ttft_slo) or p.prompts_waiting_at_end
        ]
        verdict.append({"arm": arm, "misses": miss})
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    meta = {
        "card": card,
        "sms": total_sms,
        "torch": torch.__version__,
        "shape_name": args.shape,
        "prompt_len": args.prompt_len,
        "decode_batch": b,
        "burst_decode_batch": bb,
        "decode_ctx": ctx_len,
        "piece": args.piece,
        "partitions": parts.sm_counts,
        "seconds_per_arm": args.seconds,
        "phase_seconds": args.phase_seconds,
        "phased_itl_target_ms": itl_slo,
        "phased_ttft_target_ms": ttft_slo,
        "rates_prompts_per_s": [low_rate, high_rate, low_rate],
        "decode_only_burst_batch": asdict(base_small),
        "command": " ".join([sys.executable, *sys.argv]),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    lines = ["| arm | decode P50 ms | decode P99 ms | prefill tok/s | prompts | note |", "|---|---:|---:|---:|---:|---|"]
    for r in steady:
        lines.append(f"| {r.arm} | {r.decode_p50_ms:.2f} | {r.decode_p99_ms:.2f} | {r.prefill_tok_s:.0f} | {r.prompts_done} | {r.note} |")
    lines += ["", "| arm | tok/s | P99 ms | chunked eager P99 at equal tok/s | ratio | chunked graphed P99 | ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for v in vs:
        lines.append(
            f"| {v['arm']} | {v['tok_s']:.0f} | {v['p99']:.2f} | {v['chunked_eager_p99_at_equal_tok_s']} | {v['ratio_eager']} | "
            f"{v['chunked_graphed_p99_at_equal_tok_s']} | {v['ratio_graphed']} |"
        )
    lines += [
        "",
        f"Phased load: ITL target {itl_slo:.2f} ms (decode P99), TTFT target {ttft_slo:.0f} ms (P90)",
        "",
        "| arm | phase | decode batch | prompts/s | decode P50 | decode P99 | TTFT P90 ms | prefill tok/s | mean prefill SMs | waiting at end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phased:
        lines.append(
            f"| {p.arm} | {p.phase} | {p.decode_batch} | {p.prompts_per_s} | {p.decode_p50_ms:.2f} | {p.decode_p99_ms:.2f} | "
            f"{p.ttft_p90_ms} | {p.prefill_tok_s:.0f} | {p.mean_prefill_sms} | {p.prompts_waiting_at_end} |"
        )
    lines += ["", "Phases missing a target (ITL P99, TTFT P90, or prompts left waiting):", ""]
    lines += [f"- {v['arm']}: {', '.join(v['misses']) or 'none'}" for v in verdict]
    table = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "steady": [asdict(r) for r in steady],
        "fixed_steady": [asdict(r) for r in fixed_steady],
        "adaptive_steady": [asdict(r) for r in adaptive_steady],
        "vs_chunked": vs,
        "phased": [asdict(p) for p in phased],
        "phased_verdict": verdict,
        "partition_traces": traces,
    }
    (out / "adaptive_split.json").write_text(json.dumps(payload, indent=1))
    (out / "adaptive_split.md").write_text(f"# adaptive SM split ({card})\n\n```\n{json.dumps(meta, indent=2)}\n```\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
