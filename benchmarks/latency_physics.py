"""Issue proof 3: does a prefill side under MPS keep decode steps short while long prompts keep arriving?

One GPU, one Qwen3-shaped model with random weights (``qwen3_shaped.py``; its math is
checked against transformers' Qwen3 first). Prompts of ``--prompt-len`` tokens are always
waiting (saturating arrivals), and a decode batch of ``--decode-batch`` requests at
``--decode-ctx`` context steps with a CUDA graph, as SGLang's decode does. Arms:

  decode-only      reference: decode steps and nothing else
  whole            one process; each whole prompt is prefilled between two decode steps
                   (SGLang without chunked prefill)
  chunked-C        one process; one C-token chunk of the current prompt between two decode
                   steps (SGLang's chunked prefill: prefill and decode batches alternate)
  chunked-C-graphed  the same, each chunk replayed from a CUDA graph: chunked prefill without
                   any kernel-launch overhead, a best case SGLang's eager prefill does not reach
  edgeacc-mps-P[-bn]  two processes: this one decodes at 100%; a spawned prefill side under
                   CUDA MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P imports the weights and
                   KV pool through edge_acc.tensor_share (zero copies), prefills whole
                   prompts into the shared pool back to back and hands each first token
                   over with an edge_acc.ordering fence; -bn: the prefill side is an MPS
                   client of below-normal priority (--prefill-priorities); -dhi: this process
                   replays its decode steps on a stream of the highest priority the device
                   has (--decode-stream-priorities): whether a stream priority, which a
                   process can change from one step to the next, protects decode across
                   MPS clients as the prefill side's fixed client priority does

Prefill runs eager in the whole, chunked-C and EdgeAcc arms, with unfused kernels (K/V
expanded per query head, masked attention over the prefix), so small eager chunks pay
launch overhead a fused SGLang prefill would not: the graphed arms bound that effect.

Per arm: decode inter-token latency (time between consecutive decode-step completions)
P50/P99, and prefill tokens/s. Results go to ``--out`` as latency_physics.json and .md.
``--kernel-profile-steps N`` also records N decode steps of the decode-only and EdgeAcc arms
with torch's profiler and splits each step into kernel time and gaps between kernels
(``kernel_timeline.py``): whether decode beside a prefill runs slower kernels or waits for SMs.

    PYTHONPATH=python python3 -m benchmarks.latency_physics --out /tmp/lp       # H200 defaults
    PYTHONPATH=python python3 -m benchmarks.latency_physics --device cpu --shape tiny --seconds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from benchmarks.kernel_timeline import comparison_lines, profile_steps
from benchmarks.qwen3_shaped import Qwen3Forward, Qwen3Shape, compare_with_transformers, random_weights
from sglang_edgeacc.edge_acc.ordering import ReadFence, WriteFence
from sglang_edgeacc.edge_acc.sm_partition import (
    child_env,
    environment_for_child,
    mps_priority_env,
    visible_sm_count,
)
from sglang_edgeacc.edge_acc.tensor_export import export_tensors
from sglang_edgeacc.edge_acc.tensor_import import import_tensors
from tests.segment_pool import allocate_single_segment, layer_views

logger = logging.getLogger("latency_physics")

SHAPES = {
    "qwen3-8b": Qwen3Shape(),
    "qwen3-4b": Qwen3Shape(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=9728),
    "tiny": Qwen3Shape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=512),
}
CHILD_TIMEOUT_S = 180
# Stream priorities of the decode steps in the EdgeAcc arms; torch maps a priority beyond the
# device's range to its nearest end, so -100 is the highest the device has.
DECODE_STREAM_PRIORITIES = {"default": None, "high": -100}


@dataclass(frozen=True)
class ArmResult:
    arm: str
    decode_steps: int
    decode_p50_ms: float
    decode_p99_ms: float
    decode_mean_ms: float
    prefill_tokens: int
    prefill_tok_s: float
    prompts_done: int
    note: str = ""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def summarize(arm: str, itl_s: list[float], tokens: int, elapsed_s: float, prompts: int, note: str = "") -> ArmResult:
    ms = [x * 1e3 for x in itl_s] or [float("nan")]
    return ArmResult(
        arm=arm,
        decode_steps=len(itl_s),
        decode_p50_ms=round(percentile(ms, 50), 3),
        decode_p99_ms=round(percentile(ms, 99), 3),
        decode_mean_ms=round(statistics.fmean(ms), 3),
        prefill_tokens=tokens,
        prefill_tok_s=round(tokens / elapsed_s, 1) if elapsed_s > 0 else 0.0,
        prompts_done=prompts,
        note=note,
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class DecodeRunner:
    """A fixed decode batch at steady state, replayed from a CUDA graph on GPUs."""

    def __init__(self, fwd: Qwen3Forward, k_cache, v_cache, batch: int, ctx: int, device: torch.device,
                 capture_stream: Optional[torch.cuda.Stream] = None):
        """``capture_stream``: warm up and capture there (a green-context stream: the graph's kernels
        are then confined to its SMs); default, a fresh side stream."""
        self.device = device
        self.position = ctx - 1
        self.ids = torch.randint(0, fwd.s.vocab, (batch,), device=device)
        self.fwd, self.k, self.v = fwd, k_cache, v_cache
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        with torch.inference_mode():
            if device.type == "cuda":
                side = capture_stream if capture_stream is not None else torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(3):
                        self.out = fwd.decode_step(self.ids, self.position, k_cache, v_cache)
                torch.cuda.current_stream(device).wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph, stream=capture_stream):
                    self.out = fwd.decode_step(self.ids, self.position, k_cache, v_cache)
            else:
                self.out = fwd.decode_step(self.ids, self.position, k_cache, v_cache)

    def step(self) -> None:
        with torch.inference_mode():
            if self.graph is not None:
                self.graph.replay()
            else:
                self.out = self.fwd.decode_step(self.ids, self.position, self.k, self.v)
            self.ids.copy_(self.out)
        sync(self.device)


def timed_decode_steps(decode: DecodeRunner, seconds: float) -> list[float]:
    """Back-to-back decode steps for ``seconds``; their inter-token times in seconds."""
    itl, last = [], time.perf_counter()
    end = last + seconds
    while last < end:
        decode.step()
        now = time.perf_counter()
        itl.append(now - last)
        last = now
    return itl


def run_decode_only(decode: DecodeRunner, seconds: float, timelines: Optional[dict] = None,
                    profile_steps_n: int = 0) -> ArmResult:
    for _ in range(5):
        decode.step()
    result = summarize("decode-only", timed_decode_steps(decode, seconds), 0, seconds, 0)
    if timelines is not None and profile_steps_n:
        timelines[result.arm] = profile_steps(decode.step, profile_steps_n, decode.device.type == "cuda")
    return result


def chunk_cycles(length: int, chunk: Optional[int], packed: bool = False) -> list[list[tuple[int, int]]]:
    """The prefill pieces ``(past, n)`` run between two decode steps, cycle by cycle, until they repeat.

    Unpacked: one prompt cut into ``chunk``-token chunks, the last one short when ``chunk``
    does not divide the prompt. Packed: prompts back to back and every chunk full, the
    rest of a chunk taken from the next prompt, as SGLang's chunked prefill fills its
    token budget from the waiting requests when prompts keep arriving.
    """
    step = length if chunk is None else chunk
    if not packed or length % step == 0:
        return [[(past, min(step, length - past))] for past in range(0, length, step)]
    cycles, past = [], 0
    for _ in range(math.lcm(length, step) // step):
        cycle, want = [], step
        while want:
            n = min(want, length - past)
            cycle.append((past, n))
            want -= n
            past = (past + n) % length
        cycles.append(cycle)
    return cycles


def capture_prefill_graphs(fwd: Qwen3Forward, pk, pv, prompt: torch.Tensor, pieces, device) -> dict:
    """One CUDA graph per distinct piece ``(past, n)`` (one memory pool: they never run at once)."""
    pieces = sorted(set(pieces))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for past, n in pieces:
            fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)
    torch.cuda.current_stream(device).wait_stream(side)
    graphs, pool = {}, None
    for past, n in pieces:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool):
            fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)
        pool = g.pool()
        graphs[(past, n)] = g
    return graphs


def run_single_process(
    fwd: Qwen3Forward,
    decode: DecodeRunner,
    pk,
    pv,
    prompt: torch.Tensor,
    chunk: Optional[int],
    seconds: float,
    graphed: bool = False,
    packed: bool = False,
) -> ArmResult:
    """Prefill and decode in turn on one stream: a cycle's pieces (:func:`chunk_cycles`), then a decode step."""
    length = prompt.shape[0]
    cycles = chunk_cycles(length, chunk, packed)
    graphs = capture_prefill_graphs(fwd, pk, pv, prompt, [p for c in cycles for p in c], decode.device) if graphed else {}

    def one_cycle_of_prefill(k: int) -> tuple[int, int]:
        """Runs cycle ``k``; returns its tokens and the prompts it finished."""
        tokens = finished = 0
        for past, n in cycles[k % len(cycles)]:
            if graphed:
                graphs[(past, n)].replay()
            else:
                fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)
            tokens += n
            finished += past + n == length
        return tokens, finished

    # Warm up: every cycle once, with decode steps between.
    for k in range(len(cycles)):
        one_cycle_of_prefill(k)
        decode.step()
    itl, tokens, prompts, k = [], 0, 0, 0
    start = last = time.perf_counter()
    end = start + seconds
    while last < end:
        n, done = one_cycle_of_prefill(k)
        tokens, prompts, k = tokens + n, prompts + done, k + 1
        decode.step()
        now = time.perf_counter()
        itl.append(now - last)
        last = now
    spans_prompts = any(len(c) > 1 for c in cycles)  # only then does packing change anything
    arm = ("whole" if chunk is None else f"chunked-{chunk}") + ("-packed" if spans_prompts else "")
    arm += "-graphed" if graphed else ""
    note = "prefill chunks replayed from CUDA graphs (no launch overhead)" if graphed else ""
    graphs.clear()  # free the graphs (and their pool) before the next arm
    return summarize(arm, itl, tokens, last - start, prompts, note)


def prefill_side_main(conn, bundle_bytes: bytes, shape: Qwen3Shape, prompt_len: int, device_str: str) -> None:
    """The EdgeAcc prefill side: imports weights and pool, prefills whole prompts until told to stop."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    device = torch.device(device_str)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    imported = import_tensors(pickle.loads(bundle_bytes))
    weights = {k[2:]: v for k, v in imported.tensors.items() if k.startswith("w.")}
    pk, pv = layer_views(imported.tensors, "pk"), layer_views(imported.tensors, "pv")
    fwd = Qwen3Forward(shape, weights, max_positions=max(prompt_len, 1024) + 16)
    own_alloc = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    prompt = torch.randint(0, shape.vocab, (prompt_len,), device=device)
    fwd.prefill(prompt, pk, pv, slot0=0)
    sync(device)
    fence = WriteFence(device)
    conn.send(("ready", visible_sm_count(device.index or 0) if device.type == "cuda" else 0, own_alloc))
    assert conn.recv() == "go"
    tokens = prompts = 0
    start = time.perf_counter()
    while not conn.poll(0):
        first = int(fwd.prefill(prompt, pk, pv, slot0=0).item())  # a host sync, as SGLang's sampling does
        tokens += prompt_len
        prompts += 1
        conn.send(("first_token", first, fence.signal()))
    elapsed = time.perf_counter() - start
    assert conn.recv() == "stop"
    del fwd, weights, pk, pv
    imported.release()
    conn.send(("done", tokens, elapsed, prompts))
    conn.close()


def decode_stream(priority: str, device: torch.device) -> Optional[torch.cuda.Stream]:
    """The stream the EdgeAcc arms replay decode steps on; None: the current one."""
    value = DECODE_STREAM_PRIORITIES[priority]
    if value is None or device.type != "cuda":
        return None
    return torch.cuda.Stream(device, priority=value)


def run_edgeacc_mps(
    decode: DecodeRunner, shared: dict, shape: Qwen3Shape, prompt_len: int, share: int, seconds: float, device,
    priority: str = "normal", timelines: Optional[dict] = None, profile_steps_n: int = 0,
    decode_priority: str = "default",
) -> ArmResult:
    # One export per importing process: torch counts each CUDA export as one consumer reference.
    bundle_bytes = pickle.dumps(export_tensors(shared))
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    env = child_env("prefill", share, "mps", device_type=device.type)
    env.update(mps_priority_env("prefill", priority, "mps", device_type=device.type))
    with environment_for_child(env):
        proc = ctx.Process(
            target=prefill_side_main, args=(child, bundle_bytes, shape, prompt_len, str(device)), daemon=True
        )
        proc.start()
    try:
        if not parent.poll(CHILD_TIMEOUT_S):
            raise TimeoutError(f"prefill side at {share}% did not get ready in {CHILD_TIMEOUT_S}s")
        _, child_sms, child_alloc = parent.recv()
        reader = ReadFence(device)
        stream = decode_stream(decode_priority, device)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))
        # Every decode step, its fence waits and its host sync run on that stream.
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for _ in range(5):
                decode.step()
            parent.send("go")
            itl, handoffs, last = [], 0, time.perf_counter()
            end = last + seconds
            while last < end:
                while parent.poll(0):
                    kind, _first, token = parent.recv()
                    # The decode side would now read the new request's KV: order it after the prefill's writes.
                    reader.wait(token)
                    handoffs += 1
                decode.step()
                now = time.perf_counter()
                itl.append(now - last)
                last = now
            timeline = None
            if timelines is not None and profile_steps_n:
                # Still beside a saturating prefill: the prefill side runs until told to stop.
                timeline = profile_steps(decode.step, profile_steps_n, device.type == "cuda")
        if stream is not None:
            torch.cuda.current_stream(device).wait_stream(stream)
        parent.send("stop")
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while True:
            if not parent.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError("prefill side did not report")
            msg = parent.recv()
            if msg[0] == "done":
                break
        _, tokens, elapsed, prompts = msg
    finally:
        proc.join(CHILD_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    note = f"prefill side saw {child_sms} SMs; its own allocations {child_alloc / 2**20:.0f} MiB; {handoffs} fenced handoffs"
    if stream is not None:
        note += f"; decode steps on a stream of priority {stream.priority}"
    suffix = ("" if priority == "normal" else "-bn") + ("" if decode_priority == "default" else "-dhi")
    result = summarize(f"edgeacc-mps-{share}{suffix}", itl, tokens, elapsed, prompts, note)
    if timeline is not None:
        timelines[result.arm] = timeline
    return result


def markdown_table(rows: list[ArmResult], base: ArmResult, whole: Optional[ArmResult]) -> str:
    lines = [
        "| arm | decode P50 ms | decode P99 ms | P99 / decode-only | prefill tok/s | prefill vs whole | prompts | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        rel = r.decode_p99_ms / base.decode_p99_ms if base.decode_p99_ms else float("nan")
        pf = r.prefill_tok_s / whole.prefill_tok_s if whole and whole.prefill_tok_s else float("nan")
        lines.append(
            f"| {r.arm} | {r.decode_p50_ms:.2f} | {r.decode_p99_ms:.2f} | {rel:.2f} | {r.prefill_tok_s:.0f} | "
            f"{pf:.2f} | {r.prompts_done} | {r.note} |"
        )
    return "\n".join(lines)


def comparisons(rows: list[ArmResult]) -> list[str]:
    """Each EdgeAcc row against the chunked row (eager, and graphed) of nearest prefill throughput."""
    chunked = [r for r in rows if r.arm.startswith("chunked-")]
    # Compare against the chunked row of nearest prefill throughput, eager and graphed.
    out = []
    for e in (r for r in rows if r.arm.startswith("edgeacc-")):
        for kind in ("eager", "graphed"):
            pool = [c for c in chunked if c.arm.endswith("-graphed") == (kind == "graphed")]
            if not pool:
                continue
            c = min(pool, key=lambda r: abs(r.prefill_tok_s - e.prefill_tok_s))
            out.append(
                f"{e.arm} vs {c.arm}: decode P50 x{e.decode_p50_ms / c.decode_p50_ms:.2f}, "
                f"P99 x{e.decode_p99_ms / c.decode_p99_ms:.2f}, prefill tok/s x{e.prefill_tok_s / c.prefill_tok_s:.2f}"
            )
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--prompt-len", type=int, default=8192)
    ap.add_argument("--decode-batch", type=int, default=32)
    ap.add_argument("--decode-ctx", type=int, default=1024)
    ap.add_argument("--chunks", default="256,512,1024,2048")
    ap.add_argument("--mps-shares", default="25,50,75,100")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument(
        "--no-graphed-chunks",
        dest="graphed_chunks",
        action="store_false",
        help="skip the chunked arms whose chunks replay from CUDA graphs (chunked prefill's best case)",
    )
    ap.add_argument("--prefill-priorities", default="normal",
                    help="MPS client priorities of the prefill side to run each share at (normal,below-normal); "
                    "below-normal arms are named edgeacc-mps-P-bn")
    ap.add_argument("--decode-stream-priorities", default="default",
                    help="stream priorities of the EdgeAcc arms' decode steps, comma-separated "
                    f"({','.join(DECODE_STREAM_PRIORITIES)}); high arms are named ...-dhi")
    ap.add_argument("--kernel-profile-steps", type=int, default=0,
                    help="profile this many decode steps of the decode-only and EdgeAcc arms (kernel time and "
                    "the gaps between kernels); 0: off")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    decode_priorities = [p for p in args.decode_stream_priorities.split(",") if p]
    unknown = sorted(set(decode_priorities) - set(DECODE_STREAM_PRIORITIES))
    if unknown:
        ap.error(f"--decode-stream-priorities: unknown {unknown}; known: {sorted(DECODE_STREAM_PRIORITIES)}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    device = torch.device(args.device)
    shape = SHAPES[args.shape]
    if device.type == "cuda":
        torch.cuda.set_device(device)
    err = compare_with_transformers("cpu")
    logger.info("Qwen3-shaped forward vs transformers Qwen3 (float32, tiny): max rel logit error %.2e", err)
    if err > 1e-4:
        raise SystemExit(f"the benchmark's forward does not match transformers' Qwen3 (error {err:.2e})")

    dtype = torch.bfloat16
    t0 = time.perf_counter()
    weights = random_weights(shape, device, dtype)
    b, ctx_len, kvh, hd = args.decode_batch, args.decode_ctx, shape.kv_heads, shape.head_dim
    specs = {}
    for i in range(shape.layers):
        specs[f"dk.{i}"] = ((b, kvh, ctx_len, hd), dtype)
        specs[f"dv.{i}"] = ((b, kvh, ctx_len, hd), dtype)
    for i in range(shape.layers):
        specs[f"pk.{i}"] = ((args.prompt_len, kvh, hd), dtype)
    for i in range(shape.layers):
        specs[f"pv.{i}"] = ((args.prompt_len, kvh, hd), dtype)
    pool = allocate_single_segment(specs, device)
    for name, view in pool.items():
        if name.startswith("d"):
            view.normal_()
    weight_bytes = sum(w.numel() * w.element_size() for w in weights.values())
    pool_bytes = sum(v.numel() * v.element_size() for v in pool.values())
    logger.info(
        "Built %s: %.2f GiB weights, %.2f GiB KV pool in %.1fs", args.shape, weight_bytes / 2**30, pool_bytes / 2**30,
        time.perf_counter() - t0,
    )
    fwd = Qwen3Forward(shape, weights, max_positions=max(args.prompt_len, ctx_len) + 16)
    decode = DecodeRunner(fwd, layer_views(pool, "dk"), layer_views(pool, "dv"), b, ctx_len, device)
    pk, pv = layer_views(pool, "pk"), layer_views(pool, "pv")
    prompt = torch.randint(0, shape.vocab, (args.prompt_len,), device=device)

    timelines: dict = {}
    rows = [run_decode_only(decode, args.seconds, timelines, args.kernel_profile_steps)]
    logger.info("%s", rows[-1])
    rows.append(run_single_process(fwd, decode, pk, pv, prompt, None, args.seconds))
    logger.info("%s", rows[-1])
    for graphed in (False, True) if (args.graphed_chunks and device.type == "cuda") else (False,):
        for c in [int(x) for x in args.chunks.split(",") if x]:
            try:
                rows.append(run_single_process(fwd, decode, pk, pv, prompt, c, args.seconds, graphed=graphed))
            except RuntimeError as exc:  # a capture problem must not cost the other arms
                logger.exception("chunked-%d graphed=%s failed", c, graphed)
                torch.cuda.synchronize(device)
                rows.append(ArmResult(f"chunked-{c}-graphed", 0, 0.0, 0.0, 0.0, 0, 0.0, 0, f"failed: {exc}"[:200]))
                continue
            logger.info("%s", rows[-1])
    shared = {**{f"w.{k}": v for k, v in weights.items()}, **{k: v for k, v in pool.items() if k.startswith("p")}}
    for priority in [p for p in args.prefill_priorities.split(",") if p]:
        for decode_priority in decode_priorities:
            for share in [int(x) for x in args.mps_shares.split(",") if x]:
                rows.append(run_edgeacc_mps(decode, shared, shape, args.prompt_len, share, args.seconds, device,
                                            priority, timelines, args.kernel_profile_steps, decode_priority))
                logger.info("%s", rows[-1])

    base = rows[0]
    whole = next((r for r in rows if r.arm == "whole"), None)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {
        "card": card,
        "sms": visible_sm_count(device.index or 0) if device.type == "cuda" else 0,
        "torch": torch.__version__,
        "shape": asdict(shape),
        "shape_name": args.shape,
        "params_billion": round(shape.param_count() / 1e9, 3),
        "prompt_len": args.prompt_len,
        "decode_batch": b,
        "decode_ctx": ctx_len,
        "seconds_per_arm": args.seconds,
        "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""),
        "forward_vs_transformers_rel_err": err,
        "command": " ".join([sys.executable, "-m", "benchmarks.latency_physics", *sys.argv[1:]]),
    }
    table = markdown_table(rows, base, whole)
    comps = comparisons(rows) + comparison_lines(timelines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"meta": meta, "rows": [asdict(r) for r in rows], "kernel_timelines": timelines}
    (out / "latency_physics.json").write_text(json.dumps(result, indent=2))
    (out / "latency_physics.md").write_text(
        f"# latency physics ({card})\n\n```\n{json.dumps(meta, indent=2)}\n```\n\n{table}\n\n" + "\n".join(f"- {c}" for c in comps) + "\n"
    )
    print(table)
    print("\n".join(comps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
