"""Issue 7 proof: an adaptive green-context SM split against chunked prefill and fixed splits.

One GPU, the Qwen3-shaped model of ``latency_physics.py`` (random weights), decode batch
``--decode-batch`` at ``--decode-ctx`` context replayed from a CUDA graph. Arms:

  decode-only        reference
  chunked-C          one stream, one C-token chunk between two decode steps (latency_physics's
  chunked-C-graphed  run_single_process, imported, not copied); -packed: every chunk full,
                     from the next prompt when one ends (--packed-chunks)
  green-N[-hp]       fixed split: prefill on a green-context stream of N SMs, decode on an
                     ordinary stream over the whole GPU, concurrently (two host threads of one
                     process); -hp: the decode stream at the greatest priority
                     (--decode-priority)
  green-all-lowprio  with --whole-gpu-top: the top "partition", all SMs on a least-priority
                     stream (no green context)
  adaptive-itlX      the same, but every prefill piece picks its partition through
                     edge_acc.adaptive_split.AdaptiveSplitPolicy, fed with the decode side's
                     measured step times and batch size, ITL SLO X ms, TTFT SLO ~0 (always grow
                     when ITL allows)
  green-L-hp-paceMS  --paced-fixed L:MS: the fixed split L with the decode thread starting a
                     step no sooner than MS after the previous one started
  co-dD[-hp]         --co-decode-sms: a co-partition, decode's graph on a D-SM green context and
                     prefill on the other SMs (benchmarks/disjoint_green.py)
  --graphed-prefill  the split arms replay their prefill pieces from CUDA graphs captured on each
                     partition's own stream, as the chunked-C-graphed arms do
  2proc-S[-hp]       --two-process-arms: EdgeAcc's form, a second process prefills on S (an SM
                     count, all-lowprio, or all) while this one decodes; start an MPS daemon
                     first (benchmarks/adaptive_split_h200.sh) so that both are unlimited MPS
                     clients and overlap

Design choice for the one-process arms: EdgeAcc's production split is two processes under
MPS; here the two sides are two threads of one process on separate streams, decode
unconfined, prefill confined to its green context, so that the policy can be driven per
piece without a transport. The 2proc arms check that the server's form behaves alike.
Prefill runs eager in pieces of ``--piece`` tokens of whole prompts, so the policy decides
per piece and a piece's kernels fit the launch queue.

Then a phased load (``--phase-seconds`` each): calm (decode batch ``--decode-batch``, prompts
at a low rate), burst (decode batch ``--burst-decode-batch``: new requests not decoding yet,
prompts at a high rate), calm again. A phase's decode batch takes effect at the next prefill
piece (``--load-change-at piece``, EdgeAcc's order) or at the boundary itself (``time``).
Per phase and arm: decode P99 against the ITL target (and the steps over it) and TTFT P90
(prompt arrival to its last piece) against the TTFT target. Targets and rates are derived
from the steady arms of the same run (``--target-split``) unless given (see --itl-slo-ms;
with --phase-ref-tok-s too, no steady arm is needed). ``--phased-policies`` names the policy
arms (drain = the module's default, ff = feed-forward without the drain, ...);
``--queue-before-choose`` reports the queue before each choice, as the server does.
``--settle-seconds S``: the steady adaptive arms first run S seconds from the cold start
(reported in the note), then ``--seconds`` measured on the split the policy settled on.

    OUT=... ONE_ARGS="..." bash benchmarks/adaptive_split_h200.sh              # H200 (docs/benchmarks.md)
    PYTHONPATH=python python3 benchmarks/adaptive_split.py --out $OUT          # one-process arms only
    PYTHONPATH=python python3 benchmarks/adaptive_split.py --dry-run           # CPU, tiny
    # the phased load only, as in benchmarks/results/adaptive_h200_run4_phased.json:
    ... --skip-chunked --skip-adaptive-steady --steady-fixed none --queue-before-choose \
        --phased-policies drain,ff --itl-slo-ms 21.87 --ttft-slo-ms 2400 --phase-ref-tok-s 10240
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing as mp
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

from latency_physics import (  # noqa: E402
    SHAPES,
    ArmResult,
    DecodeRunner,
    percentile,
    run_decode_only,
    run_single_process,
    summarize,
    timed_decode_steps,
)
from qwen3_shaped import Qwen3Forward, random_weights  # noqa: E402

from sglang_edgeacc.edge_acc.adaptive_partitions import (  # noqa: E402
    HIGHEST_STREAM_PRIORITY,
    LOWEST_STREAM_PRIORITY,
    GreenContextPartitions,
    default_sm_counts,
    whole_gpu_low_priority_stream,
)
from sglang_edgeacc.edge_acc.adaptive_split import AdaptiveSplitConfig, AdaptiveSplitPolicy  # noqa: E402
from disjoint_green import disjoint_green_streams  # noqa: E402  (benchmarks/)
from sglang_edgeacc.edge_acc.sm_partition import green_context_stream, visible_sm_count  # noqa: E402

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
    decode_max_ms: float = float("nan")
    steps_over_itl_target: Optional[int] = None  # phased runs: decode steps above the ITL target


class Partitions:
    """Green-context streams, or plain contexts on the CPU dry run (no confinement there).

    ``co_decode_sms``: co-partitions after the others (label ``co-dD``): decode confined to
    a green context of D SMs, prefill to one on the other SMs, cut from one split
    (``edge_acc.disjoint_green``). Their decode steps replay a graph captured on the
    decode group's stream (:meth:`add_decode_runners`).
    """

    def __init__(self, device: torch.device, sm_counts: list[int], whole_gpu_top: bool = False, total_sms: int = 132,
                 co_decode_sms: tuple[int, ...] = (), decode_priority: int = 0):
        self.device = device
        self.whole_gpu_top = whole_gpu_top
        self.co: dict[int, object] = {}  # partition index -> DisjointGreenStreams
        self.co_runners: dict[tuple[int, int], DecodeRunner] = {}  # (partition index, batch) -> runner
        self.prefill_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (partition, past) -> graph
        if device.type == "cuda":
            self.green = GreenContextPartitions(sm_counts, device.index or 0, whole_gpu_top=whole_gpu_top)
            self.sm_counts = self.green.sm_counts
            self.labels = self.green.labels
            for d in co_decode_sms:
                pair = disjoint_green_streams(d, device.index or 0, group_priority=decode_priority, role="decode")
                self.co[len(self.sm_counts)] = pair
                self.sm_counts = [*self.sm_counts, pair.remainder.num_sms]
                self.labels = [*self.labels, f"co-d{pair.group.num_sms}"]
        else:
            self.green = None
            self.sm_counts = sm_counts + ([total_sms] if whole_gpu_top else [])
            self.labels = [str(n) for n in sm_counts] + (["all-lowprio"] if whole_gpu_top else [])

    def __len__(self) -> int:
        return len(self.sm_counts)

    def prefill_stream(self, index: int) -> Optional[torch.cuda.Stream]:
        if index in self.co:
            return self.co[index].remainder.stream
        return None if self.green is None else self.green.stream(index)

    def decode_stream(self, index: int) -> Optional[torch.cuda.Stream]:
        """The co-partition's decode group, or None: decode runs on its own whole-GPU stream."""
        return self.co[index].group.stream if index in self.co else None

    def add_decode_runners(self, fwd, kc, vc, batches: list[int], ctx_len: int) -> None:
        for i, pair in self.co.items():
            for bsz in batches:
                self.co_runners[(i, bsz)] = DecodeRunner(fwd, [k[:bsz] for k in kc], [v[:bsz] for v in vc], bsz,
                                                         ctx_len, self.device, capture_stream=pair.group.stream)

    def add_prefill_graphs(self, fwd, pk, pv, prompt: torch.Tensor, piece: int) -> None:
        """``--graphed-prefill``: every piece position captured on every partition's own stream (a graph
        keeps the SMs of the stream it was captured on), one memory pool for all."""
        pool = None
        for i in range(len(self)):
            stream = self.prefill_stream(i)
            with torch.inference_mode():
                with torch.cuda.stream(stream):
                    for past in range(0, prompt.shape[0], piece):
                        fwd.prefill(prompt[past : past + piece], pk, pv, slot0=0, past_len=past)
                stream.synchronize()
                for past in range(0, prompt.shape[0], piece):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=stream):
                        fwd.prefill(prompt[past : past + piece], pk, pv, slot0=0, past_len=past)
                    pool = g.pool()
                    self.prefill_graphs[(i, past)] = g

    def run_piece(self, index: int, fwd, pk, pv, prompt: torch.Tensor, past: int, n: int) -> None:
        graph = self.prefill_graphs.get((index, past))
        with self.stream_ctx(index):
            if graph is not None:
                graph.replay()
            else:
                fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)

    def stream_ctx(self, index: int):
        stream = self.prefill_stream(index)
        return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)

    def wait(self, index: int) -> None:
        stream = self.prefill_stream(index)
        if stream is not None:
            ev = torch.cuda.Event()
            ev.record(stream)
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
    decode_priority: int = 0,
    load_change_at: str = "time",
    itl_target_ms: Optional[float] = None,
    queue_before_choose: bool = False,
    decode_pace_ms: Callable[[], float] = lambda: 0.0,
    pace_from: str = "start",
    initial_index: int = 0,
) -> tuple[list[PhaseResult], list[tuple[float, int]]]:
    """Decode in a thread, prefill pieces here; returns per-phase results and the (t, partition) trace.

    ``load_change_at``: when a phase's decode batch takes effect. ``time``: at the phase
    boundary, whatever the prefill side is doing (an exogenous jump). ``piece``: at
    the first prefill piece (or idle check) after the boundary, as in EdgeAcc, where the
    decode batch grows when the decode side collects a prefill result and it dispatches
    the next prefill batch, with its new load, in the same loop iteration.

    ``decode_pace_ms``: read before each decode step; when positive, the step starts no
    sooner than that many ms after the previous one started (the decode side pacing its
    steps so the prefill side gets the GPU in between). The policy is sent step
    durations; the ITL logged is the time between step completions, the wait included.
    ``pace_from="end"``: the step starts so that, if it lasts as long as the recent
    steps did (the median of the last eight), it ends the pace after the previous one
    ended. A start-paced ITL is pace + d_k - d_{k-1}; this one is pace + d_k - median(d),
    half the variance of the step-to-step difference. The median, not a mean, so that one
    stalled step does not pull the next several intervals below the pace.
    """
    if pace_from not in ("start", "end"):
        raise ValueError(f"pace_from must be 'start' or 'end', got {pace_from!r}")
    if load_change_at not in ("time", "piece"):
        raise ValueError(f"load_change_at must be 'time' or 'piece', got {load_change_at!r}")
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
    decode_stream = torch.cuda.Stream(device, priority=decode_priority) if device.type == "cuda" else None
    stop = threading.Event()
    decode_log: list[tuple[float, float]] = []  # (t completion, itl ms)
    mailbox: deque = deque()  # the decode side's step times, as it would send them to the prefill side
    t0_box: list[float] = []
    ready = threading.Event()
    batch_box = [phases[0].decode_batch]  # the decode batch now, when load_change_at == "piece"
    part_box = [initial_index]  # the partition of the prefill piece in flight (co-partitions move decode too)

    def admit_load(t: float) -> int:
        """The prefill side's view at a piece start: the decode batch from now on."""
        batch_box[0] = bounds[phase_at(t)][2].decode_batch
        return batch_box[0]

    def decode_step(batch: int) -> None:
        """One step where the piece in flight leaves decode: its co-partition group, else the decode stream."""
        idx = part_box[0]
        group = parts.decode_stream(idx)
        if group is None:
            runners[batch].step()
        else:
            with torch.cuda.stream(group):
                parts.co_runners[(idx, batch)].step()

    def decode_loop() -> None:
        ctx = torch.cuda.stream(decode_stream) if decode_stream is not None else contextlib.nullcontext()
        with ctx:
            for r in runners.values():
                for _ in range(3):
                    r.step()
            for (i, _), r in parts.co_runners.items():
                with torch.cuda.stream(parts.decode_stream(i)):
                    for _ in range(3):
                        r.step()
            ready.set()
            while not t0_box:
                time.sleep(0.0005)
            t0 = t0_box[0]
            last = last_start = time.perf_counter()
            recent_steps: deque = deque(maxlen=8)  # seconds, the last step durations
            while not stop.is_set():
                pace = decode_pace_ms()
                if pace > 0:
                    if pace_from == "end" and recent_steps:
                        due = last + pace / 1e3 - sorted(recent_steps)[len(recent_steps) // 2]
                    else:
                        due = last_start + pace / 1e3
                    delay = due - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                batch = bounds[phase_at(last - t0)][2].decode_batch if load_change_at == "time" else batch_box[0]
                start = time.perf_counter()
                decode_step(batch)
                now = time.perf_counter()
                decode_log.append((now - t0, (now - last) * 1e3))
                recent_steps.append(now - start)
                mailbox.append(((now - start) * 1e3, batch))
                last, last_start = now, start

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
            admit_load(now)
            if not queue:
                if bounds[phase_at(now)][2].prompts_per_s is None:
                    queue.append(now)
                else:
                    if policy is not None:
                        policy.observe_queue(0)
                    nxt = arrivals[0] if arrivals else total
                    time.sleep(min(0.05, max(0.0, min(nxt, total) - now)))  # re-check the load at least every 50 ms
                    continue
            arrived = queue.popleft()
            for past in range(0, length, piece):
                n = min(piece, length - past)
                if policy is not None:
                    while mailbox:
                        ms, batch = mailbox.popleft()
                        policy.observe_decode_load(batch)  # the load each step ran under
                        policy.observe_decode_step(ms)
                    # What the decode side would send with the batch: its running batch now.
                    policy.observe_decode_load(admit_load(time.perf_counter() - t0) if load_change_at == "piece"
                                               else bounds[phase_at(time.perf_counter() - t0)][2].decode_batch)
                    if queue_before_choose:
                        # The server's order (edge_acc_server.adaptive.stream_for): the queue
                        # as the batch is sent, this prompt's rest included, then the choice.
                        t_now = time.perf_counter() - t0
                        while arrivals and arrivals[0] <= t_now:
                            queue.append(arrivals.popleft())
                        policy.observe_queue(len(queue) * length + (length - past))
                elif load_change_at == "piece":
                    admit_load(time.perf_counter() - t0)
                idx = pick()
                part_box[0] = idx
                start = time.perf_counter()
                parts.run_piece(idx, fwd, pk, pv, prompt, past, n)
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
        ends = [(t, n) for t, _, n, _ in pieces if a <= t < b]
        if ph.prompts_per_s is None and len(ends) >= 2:
            # Pieces back to back: the rate over whole pieces, from the first one's end to the
            # last one's, as the chunked arms count whole cycles. Counting the pieces that end
            # inside the window instead is off by up to one piece either way (2048 tokens in
            # 5 s is 2 %), enough to move a point across chunked prefill's steep top.
            rate = sum(n for _, n in ends[1:]) / (ends[-1][0] - ends[0][0])
        else:
            rate = toks / ph.seconds
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
                prefill_tok_s=round(rate, 1),
                prompts_done=len(tt),
                ttft_p90_ms=round(percentile(tt, 90), 1) if tt else None,
                prompts_waiting_at_end=sum(1 for arr in list(queue) + list(arrivals) if arr < b)
                if i == len(bounds) - 1
                else 0,
                mean_prefill_sms=round(sum(sms) / busy, 1) if busy else None,
                decode_max_ms=round(max(itl), 3) if itl else float("nan"),
                steps_over_itl_target=None if itl_target_ms is None else sum(1 for x in itl if x > itl_target_ms),
            )
        )
    return results, trace


# --- two processes: the form the server runs (prefill side an MPS client without a percentage)

TWO_PROCESS_TIMEOUT_S = 240


def two_process_prefill_main(conn, shape_name: str, prompt_len: int, piece: int, device_str: str, spec: str) -> None:
    """The prefill process: its own random weights (same shapes), pieces back to back on ``spec``.

    ``spec``: an SM count (a green context), ``all-lowprio`` (all SMs, least priority) or
    ``all`` (all SMs, default stream priority, i.e. no split at all).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s prefill-child %(message)s")
    keep = None  # the green context must outlive its stream's use
    try:
        device = torch.device(device_str)
        shape = SHAPES[shape_name]
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if device.type == "cuda":
            torch.cuda.set_device(device)
        weights = random_weights(shape, device, dtype)
        pk = [torch.zeros(prompt_len, shape.kv_heads, shape.head_dim, device=device, dtype=dtype) for _ in range(shape.layers)]
        pv = [torch.zeros_like(k) for k in pk]
        fwd = Qwen3Forward(shape, weights, max_positions=prompt_len + 16)
        prompt = torch.randint(0, shape.vocab, (prompt_len,), device=device)
        if device.type != "cuda":
            stream_ctx = contextlib.nullcontext
            wait = lambda: None  # noqa: E731
            sms = 0
        else:
            idx = device.index or 0
            if spec == "all":
                stream = torch.cuda.Stream(device, priority=LOWEST_STREAM_PRIORITY)
            elif spec == "all-lowprio":
                keep = whole_gpu_low_priority_stream(idx)
                stream = keep.stream
            else:
                keep = green_context_stream(int(spec), idx, role="prefill")
                stream = keep.stream
            stream_ctx = lambda: torch.cuda.stream(stream)  # noqa: E731

            def wait() -> None:
                ev = torch.cuda.Event()
                ev.record(stream)
                ev.synchronize()

            sms = visible_sm_count(idx)
        with torch.inference_mode():
            for past in range(0, prompt_len, piece):  # warm-up: one whole prompt
                with stream_ctx():
                    fwd.prefill(prompt[past : past + piece], pk, pv, slot0=0, past_len=past)
                wait()
            conn.send(("ready", sms, os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")))
            if conn.recv() != "go":
                return
            tokens, pieces, past = 0, 0, 0
            start = time.perf_counter()
            while not conn.poll(0):
                n = min(piece, prompt_len - past)
                with stream_ctx():
                    fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past)
                wait()
                tokens, pieces = tokens + n, pieces + 1
                past = (past + n) % prompt_len
            elapsed = time.perf_counter() - start
        conn.recv()
        conn.send(("done", tokens, elapsed, pieces))
    except Exception as exc:  # the parent records the arm as failed with this message
        logging.exception("prefill child failed")
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"[:400]))
    finally:
        del keep


def run_two_process(
    spec: str, runner: DecodeRunner, args, device: torch.device, decode_priority: int, seconds: float
) -> ArmResult:
    """Decode here on a stream of ``decode_priority``; prefill in a spawned process on ``spec``."""
    arm = f"2proc-{spec}" + ("-hp" if decode_priority else "")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=two_process_prefill_main,
        args=(child, args.shape, args.prompt_len, args.piece, str(device), spec),
        daemon=True,
    )
    proc.start()
    try:
        if not parent.poll(TWO_PROCESS_TIMEOUT_S):
            raise TimeoutError(f"{arm}: the prefill process did not get ready in {TWO_PROCESS_TIMEOUT_S} s")
        msg = parent.recv()
        if msg[0] == "error":
            logger.warning("%s failed: %s", arm, msg[1])
            return ArmResult(arm, 0, float("nan"), float("nan"), float("nan"), 0, 0.0, 0, f"failed: {msg[1]}")
        _, child_sms, pipe_dir = msg
        stream = torch.cuda.Stream(device, priority=decode_priority) if device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for _ in range(5):
                runner.step()
            parent.send("go")
            itl = timed_decode_steps(runner, seconds)
        parent.send("stop")
        if not parent.poll(TWO_PROCESS_TIMEOUT_S):
            raise TimeoutError(f"{arm}: the prefill process did not report")
        msg = parent.recv()
        if msg[0] == "error":
            return ArmResult(arm, 0, float("nan"), float("nan"), float("nan"), 0, 0.0, 0, f"failed: {msg[1]}")
        _, tokens, elapsed, pieces = msg
    finally:
        proc.join(TWO_PROCESS_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    note = f"prefill process saw {child_sms} SMs; MPS pipe dir {pipe_dir or '(none: no MPS)'}; {pieces} pieces"
    return summarize(arm, itl, tokens, elapsed, tokens // args.prompt_len, note)


def tuned_frontier(curve: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (tok/s, P99) points no other chunk size beats on both (a tuned deployment picks among these)."""
    return sorted(p for p in curve if not any(q != p and q[0] >= p[0] and q[1] <= p[1] for q in curve))


def interp_p99(curve: list[tuple[float, float]], tok_s: float) -> Optional[float]:
    """Tuned chunked prefill's P99 at ``tok_s``: linear interpolation along :func:`tuned_frontier`
    (as if every chunk size between two measured ones were available)."""
    pts = tuned_frontier(curve)
    if not pts or tok_s < pts[0][0] or tok_s > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= tok_s <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (tok_s - x0) / (x1 - x0)
    return pts[-1][1]


def prefill_alone_tok_s(run_piece: Callable[[int, int], None], wait: Callable[[], None], length: int, piece: int,
                        seconds: float = 1.5) -> float:
    """Prefill pieces back to back, nothing else running; ``run_piece(past, n)`` launches one."""
    tokens, past = 0, 0
    with torch.inference_mode():
        run_piece(0, min(piece, length))  # warm-up
        wait()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            n = min(piece, length - past)
            run_piece(past, n)
            wait()
            tokens, past = tokens + n, (past + n) % length
    return round(tokens / (time.perf_counter() - start), 1)


def partition_prefill_alone_tok_s(parts: Partitions, index: int, fwd, pk, pv, prompt: torch.Tensor, piece: int,
                                  seconds: float = 1.5) -> float:
    """On one partition, as the split arms run their pieces (graphed when captured)."""
    return prefill_alone_tok_s(lambda past, n: parts.run_piece(index, fwd, pk, pv, prompt, past, n),
                               lambda: parts.wait(index), prompt.shape[0], piece, seconds)


def whole_gpu_prefill_alone_tok_s(fwd, pk, pv, prompt: torch.Tensor, piece: int, seconds: float = 1.5) -> float:
    """Eager on the current stream."""
    return prefill_alone_tok_s(lambda past, n: fwd.prefill(prompt[past : past + n], pk, pv, slot0=0, past_len=past),
                               torch.cuda.synchronize, prompt.shape[0], piece, seconds)


def overlap_cost(arm_tok_s: float, steps_per_s: float, alone_tok_s: float, decode_alone_ms: float) -> dict:
    """What one decode step costs the prefill side in a split arm, and the ratio ceiling that implies.

    Per second the split gives prefill ``arm_tok_s`` of the ``alone_tok_s`` it makes alone, so
    the decode steps cost it ``1 - arm/alone`` of the second; per step that is ``d_eff``.
    Chunked prefill pays the whole step (``decode_alone_ms``) for every decode step, so at
    equal prefill throughput near saturation a split's ITL is at best ``d_eff / decode_alone``
    of chunked prefill's, before the tails of either (docs/benchmarks-history.md).
    """
    if steps_per_s <= 0 or alone_tok_s <= 0:
        return {"decode_cost_ms": None, "ratio_ceiling": None}
    d_eff = max(0.0, 1.0 - arm_tok_s / alone_tok_s) / steps_per_s * 1e3
    return {"decode_cost_ms": round(d_eff, 2),
            "ratio_ceiling": round(decode_alone_ms / d_eff, 2) if d_eff > 0 else None}


def co_partition_probes(parts: Partitions, fwd, runner: DecodeRunner, pk, pv, prompt, piece: int, batch: int) -> list[dict]:
    """Each co-partition's sides alone: is decode really confined (slower on fewer SMs, whichever stream
    the graph was captured on), and what does prefill make on the remainder?"""
    if not parts.co:
        return []
    whole = whole_gpu_prefill_alone_tok_s(fwd, pk, pv, prompt, piece)
    rows = []
    for i, pair in parts.co.items():
        with torch.cuda.stream(pair.group.stream):
            own = run_decode_only(parts.co_runners[(i, batch)], 1.5)
            foreign = run_decode_only(runner, 1.5)  # captured on an ordinary stream, replayed on the group
        rows.append({
            "label": parts.labels[i],
            "decode_sms": pair.group.num_sms,
            "prefill_sms": pair.remainder.num_sms,
            "decode_only_p50_ms": own.decode_p50_ms,
            "decode_only_p99_ms": own.decode_p99_ms,
            "decode_only_p50_ms_foreign_graph": foreign.decode_p50_ms,
            "prefill_only_tok_s": partition_prefill_alone_tok_s(parts, i, fwd, pk, pv, prompt, piece),
            "whole_gpu_prefill_tok_s": whole,
        })
        logger.info("co-partition probe %s", rows[-1])
    return rows


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
    ap.add_argument("--packed-chunks", action="store_true",
                    help="chunked arms fill every chunk, from the next prompt when one ends (SGLang's chunked prefill "
                         "under a backlog); matters only for chunks that do not divide --prompt-len")
    ap.add_argument("--graphed-only", action="store_true", help="only the graphed chunked arms (saves device time)")
    ap.add_argument("--sm-counts", default="", help="prefill partitions (default: 5 from 1/4 to 7/8 of the SMs)")
    ap.add_argument("--whole-gpu-top", action="store_true",
                    help="add a top partition: all SMs on a least-priority stream (decode should be --decode-priority high)")
    ap.add_argument("--decode-priority", choices=("normal", "high", "both"), default="normal",
                    help="decode stream priority in the split arms (both: every fixed split twice; the adaptive "
                         "and phased arms then use high)")
    ap.add_argument("--target-split", default="72", help="the fixed split (label) the phased targets and rates derive from")
    ap.add_argument("--phased-fixed", default="", help="labels of the fixed splits run in the phased load (default all)")
    ap.add_argument("--adaptive-itl-factors", default="1.25,1.45,1.7,2.0", help="steady adaptive ITL SLOs, x decode-only P99")
    ap.add_argument("--compare-feedback-policy", action="store_true",
                    help="also run the phased load with the feedback-only policy (feed_forward=False)")
    ap.add_argument("--load-change-at", choices=("piece", "time"), default="piece",
                    help="phased load: a phase's decode batch takes effect at the next prefill piece (EdgeAcc: the "
                         "decode side sends its new load with the batch) or at the boundary itself")
    ap.add_argument("--also-exogenous", action="store_true",
                    help="also run the adaptive policy with --load-change-at time (the load jumps mid-piece)")
    ap.add_argument("--grow-on-arrivals", action="store_true",
                    help="the policy's opt-in arrival-rate rule (AdaptiveSplitConfig.grow_on_arrivals) in the adaptive "
                         "arms (off by default: unguarded, it grows into splits that break the ITL SLO)")
    ap.add_argument("--steady-fixed", default="",
                    help="labels of the fixed splits run under the steady load (default all; keep --target-split)")
    ap.add_argument("--steady-policy", choices=("default", "drain", "ff"), default="default",
                    help="policy of the steady adaptive arms: the module's defaults, drain_backlog on, or off")
    ap.add_argument("--phased-policies", default="",
                    help="comma list of phased policy arms, replacing the flags above: drain, drain-rep (a "
                         "second run of it), ff (feed-forward, no drain, no arrival rule), "
                         "arrivals (feed-forward with the unguarded arrival rule), feedback (feed_forward=False), "
                         "drain-load-at-time")
    ap.add_argument("--queue-before-choose", action="store_true",
                    help="report the queue to the policy before each choice, as the server does")
    ap.add_argument("--paced-fixed", default="",
                    help="steady fixed splits with the decode side pacing its steps: comma list of LABEL:MS[:end] "
                         "(e.g. all-lowprio:75), a step starting MS after the previous one started (:end: timed so "
                         "that it ends MS after the previous one ended, by the median of the last eight step times)")
    ap.add_argument("--overlap-cost", action="store_true",
                    help="also measure each fixed split's prefill alone on its partition and report what a decode "
                         "step costs the prefill side there, and the ceiling that puts on the ratio")
    ap.add_argument("--co-decode-sms", default="",
                    help="co-partitions (label co-dD) after the others: decode confined to D SMs, prefill to the "
                         "rest, disjoint green contexts from one split; each also gets a decode-only and a "
                         "prefill-only probe")
    ap.add_argument("--graphed-prefill", action="store_true",
                    help="the split arms replay their prefill pieces from CUDA graphs captured on each partition's "
                         "stream (chunked prefill's graphed arms, on both sides); the server's prefill side runs eager")
    ap.add_argument("--skip-chunked", action="store_true")
    ap.add_argument("--skip-adaptive-steady", action="store_true")
    ap.add_argument("--skip-phased", action="store_true")
    ap.add_argument("--two-process-arms", default="",
                    help="comma list of prefill specs run as a second process (SM count, all-lowprio, all); "
                         "start the MPS daemon first for them to overlap")
    ap.add_argument("--two-process-only", action="store_true", help="decode-only plus the two-process arms")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--settle-seconds", type=float, default=0.0,
                    help="steady adaptive arms: run this long from the cold start first and report it apart")
    ap.add_argument("--phase-seconds", type=float, default=5.0)
    ap.add_argument("--itl-slo-ms", type=float, default=0.0, help="phased ITL target (0: 1.05 x the target split's steady P99)")
    ap.add_argument("--ttft-slo-ms", type=float, default=0.0, help="phased TTFT target (0: 3x one prompt at the target split)")
    ap.add_argument("--phase-ref-tok-s", type=float, default=0.0,
                    help="prefill tok/s the phased rates derive from (0: the target split's steady arm, which runs about "
                         "20%% slow when it runs first, without the chunked arms before it)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, short arms: checks the script, measures nothing")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.dry_run:
        args.device, args.shape, args.prompt_len, args.piece = "cpu", "tiny", 256, 64
        args.decode_batch, args.burst_decode_batch, args.decode_ctx = 8, 4, 64
        args.chunks, args.seconds, args.phase_seconds = "32,64", 0.4, 0.5
        args.sm_counts = args.sm_counts or "32,48,72,96,112"
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
    fwd = Qwen3Forward(shape, weights, max_positions=max(args.prompt_len, ctx_len) + 16)
    runners = {b: DecodeRunner(fwd, kc, vc, b, ctx_len, device)}
    bb = args.burst_decode_batch
    if bb != b:
        runners[bb] = DecodeRunner(fwd, [k[:bb] for k in kc], [v[:bb] for v in vc], bb, ctx_len, device)
    high = HIGHEST_STREAM_PRIORITY
    prios = {"normal": [LOWEST_STREAM_PRIORITY], "high": [high], "both": [LOWEST_STREAM_PRIORITY, high]}[args.decode_priority]
    policy_prio = prios[-1]
    suffix = {LOWEST_STREAM_PRIORITY: "", high: "-hp"}

    steady: list[ArmResult] = []
    base = run_decode_only(runners[b], args.seconds)
    steady.append(base)
    base_small = run_decode_only(runners[bb], args.seconds) if bb != b else base
    logger.info("%s | burst batch: %s", base, base_small)
    two_process: list[ArmResult] = []
    for spec in [x for x in args.two_process_arms.split(",") if x]:
        for prio in prios:
            r = run_two_process(spec, runners[b], args, device, prio, args.seconds)
            two_process.append(r)
            steady.append(r)
            logger.info("%s", r)
    probes: list[dict] = []
    if args.two_process_only:
        args.skip_chunked = args.skip_adaptive_steady = args.skip_phased = True
        parts = None
    else:
        pk = [torch.zeros(args.prompt_len, shape.kv_heads, shape.head_dim, device=device, dtype=dtype) for _ in range(shape.layers)]
        pv = [torch.zeros_like(k) for k in pk]
        prompt = torch.randint(0, shape.vocab, (args.prompt_len,), device=device)
        co = tuple(int(x) for x in args.co_decode_sms.split(",") if x) if device.type == "cuda" else ()
        parts = Partitions(device, sm_counts, whole_gpu_top=args.whole_gpu_top, total_sms=total_sms,
                           co_decode_sms=co, decode_priority=prios[-1])
        parts.add_decode_runners(fwd, kc, vc, sorted({b, bb}), ctx_len)
        if args.graphed_prefill and device.type == "cuda":
            parts.add_prefill_graphs(fwd, pk, pv, prompt, args.piece)
            logger.info("prefill pieces captured on %d partitions' streams", len(parts))
        probes = co_partition_probes(parts, fwd, runners[b], pk, pv, prompt, args.piece, b)
        logger.info("setup %.1fs; partitions %s of %d SMs", time.perf_counter() - t_start, parts.labels, total_sms)
    chunked = []
    if not args.skip_chunked:
        modes = (False, True) if (args.graphed_chunks and device.type == "cuda") else (False,)
        for graphed in (True,) if args.graphed_only and device.type == "cuda" else modes:
            for c in [int(x) for x in args.chunks.split(",") if x]:
                r = run_single_process(fwd, runners[b], pk, pv, prompt, c, args.seconds, graphed=graphed,
                                       packed=args.packed_chunks)
                steady.append(r)
                chunked.append(r)
                logger.info("%s", r)
    sat = [Phase("saturating", args.seconds, None, b)]
    fixed_steady: list[PhaseResult] = []
    arm_partition: dict[str, int] = {}  # fixed and paced arm -> the partition it ran on (--overlap-cost)
    steady_by_label: dict[str, PhaseResult] = {}
    steady_wanted = [x for x in args.steady_fixed.split(",") if x]
    for prio in prios if parts is not None else []:
        for i, label in enumerate(parts.labels):
            if steady_wanted and label not in steady_wanted:
                continue
            arm = f"green-{label}{suffix[prio]}"
            arm_partition[arm] = i
            res, _ = run_concurrent(arm, fwd, runners, pk, pv, prompt, parts, sat, args.piece, lambda i=i: i, initial_index=i,
                                    decode_priority=prio)
            fixed_steady.append(res[0])
            steady.append(to_arm(res[0]))
            if prio == policy_prio:
                steady_by_label[label] = res[0]
            logger.info("%s", res[0])
    for spec in [x for x in args.paced_fixed.split(",") if x] if parts is not None else []:
        label, pace, pace_from = (spec.split(":") + [""] * 3)[:3]
        if label not in parts.labels or not pace or pace_from not in ("", "start", "end"):
            raise SystemExit(f"--paced-fixed {spec!r}: want LABEL:MS[:end] with LABEL one of {parts.labels}")
        i = parts.labels.index(label)
        arm = f"green-{label}{suffix[policy_prio]}-pace{'end' if pace_from == 'end' else ''}{pace}"
        res, _ = run_concurrent(arm, fwd, runners, pk, pv, prompt, parts, sat, args.piece, lambda i=i: i, initial_index=i,
                                decode_priority=policy_prio, decode_pace_ms=lambda p=float(pace): p,
                                pace_from=pace_from or "start")
        arm_partition[arm] = i
        fixed_steady.append(res[0])
        steady.append(to_arm(res[0]))
        logger.info("%s", res[0])
    prefill_alone: dict[int, float] = {}
    if args.overlap_cost and parts is not None:
        for i in sorted(set(arm_partition.values())):
            prefill_alone[i] = partition_prefill_alone_tok_s(parts, i, fwd, pk, pv, prompt, args.piece, args.seconds / 2)
            logger.info("prefill alone on %s: %.0f tok/s", parts.labels[i], prefill_alone[i])
    adaptive_steady = []
    traces = {}
    for f in [float(x) for x in args.adaptive_itl_factors.split(",") if x] if not args.skip_adaptive_steady else []:
        slo = round(base.decode_p99_ms * f, 2)
        steady_kw = {"default": {}, "drain": {"drain_backlog": True}, "ff": {"drain_backlog": False}}[args.steady_policy]
        pol = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=slo, ttft_slo_ms=1.0, **steady_kw), len(parts),
                                  initial_index=0, sm_counts=parts.sm_counts, total_sms=total_sms,
                                  unconfined_top=parts.whole_gpu_top)
        # --settle-seconds: a first phase from the cold start (split 0), reported apart, so the
        # steady phase measures the split the policy settled on, not its ramp.
        arm_phases = ([Phase("settling", args.settle_seconds, None, b)] if args.settle_seconds > 0 else []) + sat
        res, trace = run_concurrent(f"adaptive-itl{slo:g}{suffix[policy_prio]}", fwd, runners, pk, pv, prompt, parts,
                                    arm_phases, args.piece, pol.choose, pol, decode_priority=policy_prio,
                                    queue_before_choose=args.queue_before_choose)
        settle_note = (f"; settling {args.settle_seconds:g} s before: P99 {res[0].decode_p99_ms:.2f} ms, "
                       f"{res[0].prefill_tok_s:.0f} tok/s" if len(res) > 1 else "")
        res = res[-1:]
        adaptive_steady.append(res[0])
        steady.append(to_arm(res[0], f"mean prefill SMs {res[0].mean_prefill_sms}; {pol.changes()} changes{settle_note}"))
        traces[res[0].arm] = trace
        logger.info("%s (changes %d)", res[0], pol.changes())

    # Phased load: targets and rates from the steady arms above.
    phased: list[PhaseResult] = []
    itl_slo = ttft_slo = low_rate = high_rate = None
    if not args.skip_phased:
        ref = steady_by_label.get(args.target_split)
        explicit = args.phase_ref_tok_s > 0 and args.itl_slo_ms > 0 and args.ttft_slo_ms > 0
        if ref is None and not explicit:
            raise SystemExit(f"--target-split {args.target_split!r} is not one of the steady partitions run "
                             f"({sorted(steady_by_label)}); or give --phase-ref-tok-s, --itl-slo-ms and --ttft-slo-ms")
        ref_tok_s = args.phase_ref_tok_s or max(ref.prefill_tok_s, 1.0)
        itl_slo = args.itl_slo_ms or round(1.05 * ref.decode_p99_ms, 2)
        ttft_slo = args.ttft_slo_ms or round(3 * args.prompt_len / ref_tok_s * 1e3, 1)
        low_rate = round(0.35 * ref_tok_s / args.prompt_len, 3)
        high_rate = round(1.3 * ref_tok_s / args.prompt_len, 3)
        phases = [
            Phase("calm-1", args.phase_seconds, low_rate, b),
            Phase("burst", args.phase_seconds, high_rate, bb),
            Phase("calm-2", args.phase_seconds, low_rate, b),
        ]
        logger.info("phased: ITL target %.2f ms, TTFT target %.0f ms, rates %s / %s prompts/s", itl_slo, ttft_slo, low_rate, high_rate)
        wanted = [x for x in args.phased_fixed.split(",") if x] or parts.labels
        for i, label in enumerate(parts.labels):
            if label not in wanted:
                continue
            res, _ = run_concurrent(f"green-{label}{suffix[policy_prio]}", fwd, runners, pk, pv, prompt, parts, phases,
                                    args.piece, lambda i=i: i, initial_index=i, decode_priority=policy_prio,
                                    load_change_at=args.load_change_at, itl_target_ms=itl_slo)
            phased.extend(res)
            for r in res:
                logger.info("%s", r)
        kinds = [("adaptive", {"grow_on_arrivals": args.grow_on_arrivals}, args.load_change_at)]
        if args.compare_feedback_policy:
            kinds.append(("adaptive-feedback-only", {"feed_forward": False}, args.load_change_at))
        if args.also_exogenous and args.load_change_at != "time":
            kinds.append(("adaptive-load-at-time", {"grow_on_arrivals": args.grow_on_arrivals}, "time"))
        named = {
            "drain": ("adaptive-drain", {"drain_backlog": True}, args.load_change_at),
            "drain-rep": ("adaptive-drain-rep", {"drain_backlog": True}, args.load_change_at),
            "ff": ("adaptive-ff-run3", {"drain_backlog": False, "grow_on_arrivals": False}, args.load_change_at),
            "arrivals": ("adaptive-arrivals-run3", {"drain_backlog": False, "grow_on_arrivals": True}, args.load_change_at),
            "feedback": ("adaptive-feedback-only", {"feed_forward": False, "drain_backlog": False}, args.load_change_at),
            "drain-load-at-time": ("adaptive-drain-load-at-time", {"drain_backlog": True}, "time"),
        }
        if args.phased_policies:
            unknown = [x for x in args.phased_policies.split(",") if x not in named]
            if unknown:
                raise SystemExit(f"--phased-policies: unknown {unknown}; choose from {sorted(named)}")
            kinds = [named[x] for x in args.phased_policies.split(",") if x]
        for name, kw, change_at in kinds:
            cfg = AdaptiveSplitConfig(itl_slo_ms=itl_slo, ttft_slo_ms=ttft_slo, **kw)
            pol = AdaptiveSplitPolicy(cfg, len(parts), initial_index=0, sm_counts=parts.sm_counts, total_sms=total_sms,
                                      unconfined_top=parts.whole_gpu_top)
            res, trace = run_concurrent(name, fwd, runners, pk, pv, prompt, parts, phases, args.piece, pol.choose, pol,
                                        decode_priority=policy_prio, load_change_at=change_at, itl_target_ms=itl_slo,
                                        queue_before_choose=args.queue_before_choose)
            phased.extend(res)
            traces[f"{name}-phased"] = trace
            traces[f"{name}-phased-decisions"] = [
                (round(h.t, 3), h.index, h.reason[:110]) for h in pol.history if h.reason != "within band"
            ][:400]
            for r in res:
                logger.info("%s", r)
            logger.info("%s phased: %d changes", name, pol.changes())

    # Summaries.
    curve = [(c.prefill_tok_s, c.decode_p99_ms) for c in chunked if not c.arm.endswith("-graphed")]
    curve_g = [(c.prefill_tok_s, c.decode_p99_ms) for c in chunked if c.arm.endswith("-graphed")]
    vs = []
    for r in [*fixed_steady, *adaptive_steady, *two_process]:
        if not r.decode_steps:
            continue  # a failed two-process arm
        row = {"arm": r.arm, "tok_s": r.prefill_tok_s, "p99": r.decode_p99_ms}
        for name, cv in (("eager", curve), ("graphed", curve_g)):
            ref = interp_p99(cv, r.prefill_tok_s)
            row[f"chunked_{name}_p99_at_equal_tok_s"] = None if ref is None else round(ref, 2)
            row[f"ratio_{name}"] = None if ref is None else round(ref / r.decode_p99_ms, 2)
        i = arm_partition.get(r.arm)
        if i in prefill_alone:
            row["prefill_alone_tok_s"] = prefill_alone[i]
            row.update(overlap_cost(r.prefill_tok_s, r.decode_steps / args.seconds, prefill_alone[i], base.decode_p50_ms))
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
        "partitions": parts.labels if parts is not None else None,
        "decode_priority": args.decode_priority,
        "whole_gpu_top": args.whole_gpu_top,
        "graphed_prefill": args.graphed_prefill,
        "overlap_cost": args.overlap_cost,
        "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""),
        "seconds_per_arm": args.seconds,
        "phase_seconds": args.phase_seconds,
        "load_change_at": args.load_change_at,
        "grow_on_arrivals": args.grow_on_arrivals,
        "phased_policies": args.phased_policies,
        "steady_policy": args.steady_policy,
        "queue_before_choose": args.queue_before_choose,
        "phased_itl_target_ms": itl_slo,
        "phased_ttft_target_ms": ttft_slo,
        "phase_ref_tok_s": args.phase_ref_tok_s,
        "rates_prompts_per_s": [low_rate, high_rate, low_rate],
        "decode_only_burst_batch": asdict(base_small),
        "command": " ".join([sys.executable, *sys.argv]),
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    lines = ["| arm | decode P50 ms | decode P99 ms | decode steps/s | prefill tok/s | prompts | note |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in steady:
        steps_s = r.decode_steps / args.seconds  # every steady arm runs --seconds
        lines.append(f"| {r.arm} | {r.decode_p50_ms:.2f} | {r.decode_p99_ms:.2f} | {steps_s:.1f} | {r.prefill_tok_s:.0f} "
                     f"| {r.prompts_done} | {r.note} |")
    lines += ["", "| arm | tok/s | P99 ms | chunked eager P99 at equal tok/s | ratio | chunked graphed P99 | ratio "
              "| prefill alone tok/s | decode step's cost to prefill ms | ratio ceiling |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v in vs:
        lines.append(
            f"| {v['arm']} | {v['tok_s']:.0f} | {v['p99']:.2f} | {v['chunked_eager_p99_at_equal_tok_s']} | {v['ratio_eager']} | "
            f"{v['chunked_graphed_p99_at_equal_tok_s']} | {v['ratio_graphed']} | {v.get('prefill_alone_tok_s', '')} "
            f"| {v.get('decode_cost_ms', '')} | {v.get('ratio_ceiling', '')} |"
        )
    lines += [
        "",
        f"Phased load: ITL target {itl_slo} ms (decode P99), TTFT target {ttft_slo} ms (P90)",
        "",
        "| arm | phase | decode batch | prompts/s | decode P50 | decode P99 | steps > ITL target / all | decode max | TTFT P90 ms "
        "| prefill tok/s | mean prefill SMs | waiting at end |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phased:
        lines.append(
            f"| {p.arm} | {p.phase} | {p.decode_batch} | {p.prompts_per_s} | {p.decode_p50_ms:.2f} | {p.decode_p99_ms:.2f} | "
            f"{p.steps_over_itl_target} / {p.decode_steps} | {p.decode_max_ms:.1f} | {p.ttft_p90_ms} | {p.prefill_tok_s:.0f} | {p.mean_prefill_sms} | {p.prompts_waiting_at_end} |"
        )
    lines += ["", "Phases missing a target (ITL P99, TTFT P90, or prompts left waiting):", ""]
    lines += [f"- {v['arm']}: {', '.join(v['misses']) or 'none'}" for v in verdict]
    if probes:
        lines += ["", "Co-partition probes (each side alone on its group):", "",
                  "| partition | decode SMs | decode-only P50 ms (graph captured on the group) | same, graph captured "
                  "off it | prefill SMs | prefill-only tok/s | whole GPU prefill-only tok/s |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {p['label']} | {p['decode_sms']} | {p['decode_only_p50_ms']} | {p['decode_only_p50_ms_foreign_graph']} "
                  f"| {p['prefill_sms']} | {p['prefill_only_tok_s']} | {p['whole_gpu_prefill_tok_s']} |" for p in probes]
    table = "\n".join(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "steady": [asdict(r) for r in steady],
        "fixed_steady": [asdict(r) for r in fixed_steady],
        "adaptive_steady": [asdict(r) for r in adaptive_steady],
        "two_process": [asdict(r) for r in two_process],
        "co_partition_probes": probes,
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
