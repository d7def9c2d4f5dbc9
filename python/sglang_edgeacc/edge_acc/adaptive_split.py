"""Adaptive SM split (``--edge-acc-sm-partition adaptive``): the prefill side's SM share follows load.

An MPS thread percentage is fixed for a process's life, but the right prefill/decode
split moves with the decode batch, its context and the prompt arrival rate. Here the
prefill side keeps a few green-context streams of different SM counts, built once
(:class:`~sglang_edgeacc.edge_acc.adaptive_partitions.GreenContextPartitions`; optionally topped by the whole GPU on a
least-priority stream), and launches each prefill batch on the one that
:class:`AdaptiveSplitPolicy` picks from measured step times, the decode load and the
two SLOs. Green contexts can be made in a process that is an MPS client *without* a
thread percentage (measured on an H200), which is how the server runs this mode.

Upstream SGLang's PD-multiplexing (``sglang/srt/multiplex``) also switches between
pre-built green-context stream groups per iteration, but picks the group from the
decode batch size alone (a linear rule or hand-written thresholds). This policy
keys on the decode load too, but with step times it measured per (load, split)
rather than thresholds, and closes the loop on the SLOs: the decode side's measured
step times (ITL) and the prefill side's predicted time to first token.

The rule, evaluated once per prefill batch in :meth:`AdaptiveSplitPolicy.choose`:

0. Feed-forward (``feed_forward``, default on): when the decode load the batch will
   run next to (:meth:`~AdaptiveSplitPolicy.observe_decode_load`: batch size and total
   context, bucketed by doubling) differs from the previous decision's, pick before any
   step at the new load. The buckets have hysteresis (``load_bucket_hysteresis``, a quarter
   doubling by default), a dead band above each power of two ``p``: a load in bucket ``p``
   moves up only once it is above ``p x 2**0.25``, and one in a heavier bucket moves down
   once it is at or below ``p``; inside the band (``p``, ``p x 2**0.25``] it keeps the bucket
   it came from, whichever side that was. (Above ``p`` rather than around it: decode
   batches sit exactly on powers of two, and 64 stays bucket 64 from either side.) The
   decode side's total context grows and shrinks with every request: without the band a
   context hovering at a power of two crossed a bucket edge on every other batch, and each
   crossing to the heavier side moved the split down and cleared the decode window (a
   review's run: 114 changes in 200 decisions at about 2**19 tokens; 2 without the
   context). If the current split is predicted to break the ITL SLO at the new load,
   move down to the largest split predicted within it (the smallest split if nothing is
   known about a heavier load); if TTFT is over its SLO, move up to the
   largest split predicted within the SLO's hysteresis band. Predictions are the decode
   P``itl_percentile`` measured in that (load bucket, split) cell; an unmeasured cell is
   carried over from a load where the split was measured, scaled by a split measured at
   both (towards a heavier load the slowdown ratio is raised to ``1 +
   heavier_load_exponent`` per doubling: plain ratios under-predicted on the H200).
0b. Drain (``drain_backlog``, on by default): under backlog pressure (predicted
   TTFT over ``drain_fraction`` x its SLO, or prompts arriving faster than
   ``arrival_growth_fraction`` x this split prefills them), and unless the decode steps
   seen at this split already breach the ITL SLO, move at once to the largest split whose
   ITL is *predicted* within the SLO at the load now (:meth:`~AdaptiveSplitPolicy.guarded_itl_ms`):
   measured at this load; else bounded by a measurement at a heavier load; else, for the
   first split above those only, a guess (a secant over the splits measured at this load in
   ``1 / (total SMs + extrapolation_sm_offset - split SMs)``, or a carried-over estimate,
   whichever is larger; for the whole-GPU top, ``unconfined_top``, the split below it times
   ``unconfined_top_factor`` instead of the secant) or, with only the split below measured
   here, one exploring step from it when it has ``hysteresis`` headroom. Splits in back-off
   are skipped. It does not wait out the cooldown (it acts on predictions, not on the
   window), and the TTFT grow rule (3) then grows only to the same target, never blindly
   one step up. On a heavier load
   the feed-forward rule falls back only to splits measured (or bounded) at the new load.
   Without a decode load in the messages the run-3 rules below act alone.
1. Cooldown: for ``cooldown_batches`` decisions after a change, and until
   ``min_decode_samples`` decode steps have been seen at the new split (or load),
   keep it (samples from the old split say nothing about the new one).
2. Shrink if the decode P``itl_percentile`` over the last ``window`` steps exceeds
   ``itl_slo_ms``, one step, or further while the next one down is also predicted to
   breach: the ITL SLO wins over TTFT, because a decode stall hits every running
   request while a slower prefill delays only the queued ones.
3. Grow if the predicted TTFT exceeds ``ttft_slo_ms`` and the decode percentile is
   below ``itl_slo_ms * (1 - hysteresis)`` (real headroom, not a value hovering at the
   SLO): one step, none into a split predicted to breach, several at once through
   splits predicted to hold when TTFT is over ``far_ttft_factor`` x its SLO.
   Opt-in (``grow_on_arrivals``, an unguarded rule superseded by 0b): also grow while
   prompts arrive faster than this split prefills them. With either rule on, do not relax
   into a split that would not keep up with the arrivals.
4. Shrink one step if the predicted TTFT is below ``ttft_slo_ms * relax_fraction``
   and the split is not already the smallest: prefill has slack, so give decode
   its SMs back.
5. Otherwise keep. A grow or a relax-shrink needs ``patience`` consecutive
   decisions asking for it; an SLO breach shrinks at once. Growing back into a
   split that breached the ITL SLO waits its back-off in decisions (``min_backoff``,
   doubled per repeated breach up to ``max_backoff``, halved each decision that split
   holds the SLO), so an SLO lying between two partitions does not make the choice flap.
6. Nothing decoding: with no decode step since the previous decision and either no decode
   load (never observed, or ``observe_decode_load(0)`` last) or, when a load is known, no new
   one observed and no step before the previous decision either (the server sends no load
   with an empty decode batch, and one decision without a step can be a decode step still
   running), there is no ITL to protect. The decode window is dropped, the
   ``min_decode_samples`` hold does not apply (no samples would ever come), and TTFT or
   backlog pressure grows straight to the largest split; ``cooldown_batches`` and ``patience``
   still hold. A known load is then forgotten (taken as batch 0), so the decode side's return
   is a load change for rule 0, which drops to a split known safe at it.

The predicted TTFT of the newest queued prompt is (queued + this batch's tokens) x
the measured milliseconds per token at the current split, which is what a FIFO
prefill queue would make it wait.

Use on the prefill side::

    parts = build_partitions_or_warn(whole_gpu_top=True)
    if parts is None:                                        # warned: the fixed (MPS) split, or unconfined
        ...
    policy = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=30, ttft_slo_ms=2000), len(parts),
                                 sm_counts=parts.sm_counts, total_sms=parts.total_sms,
                                 unconfined_top=parts.whole_gpu_top)
    for batch in prefill_batches:
        for ms in batch.decode_step_ms:                      # sent along by the decode side
            policy.observe_decode_step(ms)                   # (measured at the previous batch's load)
        policy.observe_decode_load(batch.decode_batch_size, batch.decode_context_tokens)
        policy.observe_queue(queued_tokens_with_this_batch)  # the drain rule's backlog
        idx = policy.choose()
        start = time.perf_counter()
        with torch.cuda.stream(parts.stream(idx)):           # order it with other streams by events
            run(batch)
        wait_for(batch)                                      # e.g. an event on parts.stream(idx)
        policy.observe_prefill((time.perf_counter() - start) * 1e3, batch.tokens, queued_tokens)
    # metrics: policy.history (the last ``history_limit`` SplitDecisions: t, index, reason, decode P99,
    # predicted TTFT), policy.changes() (every change since start)

The partitions themselves live in :mod:`.adaptive_partitions` (they need torch and a
GPU); this module is the policy alone and imports only the standard library.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdaptiveSplitConfig:
    """The policy's targets and damping (``--edge-acc-itl-slo-ms``, ``--edge-acc-ttft-slo-ms``)."""

    itl_slo_ms: float
    ttft_slo_ms: float
    # Grow only below itl_slo * (1 - hysteresis). On an H200 adjacent partitions differ by
    # about 5-10 % in decode P99 (measured with benchmarks/adaptive_split.py), so a wider band
    # keeps the policy from ever growing; the back-off below does the anti-flapping.
    hysteresis: float = 0.05
    window: int = 64  # decode steps the ITL percentile is taken over
    itl_percentile: float = 99.0
    patience: int = 1  # consecutive decisions a grow / relax-shrink needs
    cooldown_batches: int = 0  # decisions to hold after any change (min_decode_samples also holds)
    min_decode_samples: int = 8  # decode steps to see at a split before judging it
    relax_fraction: float = 0.3  # TTFT below slo * this: give SMs back to decode
    min_backoff: int = 4  # decisions to wait before growing back into a split that breached the ITL SLO
    max_backoff: int = 32  # the wait doubles per breach up to this
    # Feed-forward on the decode load (decode batch size and context, sent with each batch):
    # decode-step percentiles are kept per (load bucket, partition) and a change of load
    # moves the split before the first step at the new load, instead of after a breach.
    feed_forward: bool = True
    min_cell_samples: int = 8  # decode steps a (load, partition) cell needs before it predicts
    cell_ttl_s: float = 60.0  # a cell not refreshed for this long predicts nothing (load drifted)
    far_ttft_factor: float = 2.0  # predicted TTFT over slo * this: grow several known-safe steps at once
    # Carrying a split's slowdown over to a heavier load: raise the ratio measured at the
    # lighter load to 1 + this per doubling. On an H200 a doubled decode batch
    # turned a slowdown of r at batch 32 into about r ** 1.5 at batch 64; plain ratios
    # under-predicted (and would have picked a split that breaches).
    heavier_load_exponent: float = 0.5
    # Opt-in, superseded by drain_backlog: grow while prompts arrive faster than this split prefills them (tokens/s over
    # the last rate_window_s): a queue that grows breaches any TTFT SLO later, and the
    # backlog it leaves outlives the burst. Relax only when the split
    # below would keep up with the arrivals with margin. Off by default: on an H200 it cut a
    # steady load's TTFT P90 by 16 % but grew into a split never measured at that load and
    # broke a burst's ITL target (docs/benchmarks-history.md).
    grow_on_arrivals: bool = False
    arrival_growth_fraction: float = 0.9  # grow when arrivals > this x the service rate here
    relax_arrival_fraction: float = 0.8  # relax only when arrivals < this x the service rate below
    rate_window_s: float = 3.0
    # ITL-guarded backlog drain: under backlog pressure (predicted TTFT over
    # drain_fraction x its SLO, or prompts arriving faster than arrival_growth_fraction x this
    # split prefills them) move at once to the largest split whose ITL is *predicted* within
    # the SLO at the decode load now, and grow only there (no blind one-step exploration).
    # Predicted means: measured at this load; else bounded by a measurement at a heavier
    # load (decode at a lighter load was never slower at the same split on the H200); else,
    # for the first split above the measured ones only, extrapolated (see
    # extrapolation_sm_offset), or, with one split measured here, one exploring step from a
    # split with real headroom. A split in back-off is never a target.
    drain_backlog: bool = True
    drain_fraction: float = 0.5
    # Extrapolating a split's decode percentile at a load from the splits measured there: a
    # secant in x = 1 / (total SMs + this - split SMs) (decode squeezed into the SMs prefill
    # leaves it, softened because decode also runs inside the prefill partition at a higher
    # priority), its slope the steepest of the measured neighbours'. On the H200's batch-64
    # curve it predicted 21.4 ms for 72 SMs from 32/48 (measured 20.9), 25.7 ms for 96 from
    # 48/72 (23.3) and 31+ ms for 128 from 96/112 (37.7).
    extrapolation_sm_offset: int = 16
    # The whole-GPU least-priority top (GreenContextPartitions(whole_gpu_top=True)) is no
    # green context: prefill there is not confined, it only yields at block boundaries, so
    # the secant over the confined splits says nothing about it (it under-predicts: 44 ms
    # against 52.6 measured at batch 64). Before it is measured at a load it is guessed as the
    # split just below, measured there, times this factor: the ratio measured on an H200 was
    # 1.27-1.42 at batch 64 over three measurements, and 1.39 at batch 32.
    unconfined_top_factor: float = 1.45
    # Hysteresis of the load buckets, in doublings: the width of the dead band above each power
    # of two p in which a decode batch size or context keeps the bucket it came from (up needs
    # more than p x 2**this, down p or less; 0: plain doubling buckets).
    # Requests grow and finish continuously, so the total context hovers at a power of two
    # for long stretches; a quarter doubling (19 %) is wider than that wobble and narrower
    # than the 2x the buckets stand for.
    load_bucket_hysteresis: float = 0.25
    # Decisions kept in ``history`` (a server makes several a second; about 235 bytes each).
    # changes() counts every change since start regardless.
    history_limit: int = 4096

    def __post_init__(self) -> None:
        problems = []
        if not self.itl_slo_ms > 0:
            problems.append(f"--edge-acc-itl-slo-ms must be > 0, got {self.itl_slo_ms}")
        if not self.ttft_slo_ms > 0:
            problems.append(f"--edge-acc-ttft-slo-ms must be > 0, got {self.ttft_slo_ms}")
        if not 0 <= self.hysteresis < 1:
            problems.append(f"hysteresis must be in [0, 1), got {self.hysteresis}")
        if self.window < 1 or self.patience < 1 or self.cooldown_batches < 0 or self.min_decode_samples < 0:
            problems.append("window and patience must be >= 1, cooldown_batches and min_decode_samples >= 0")
        if not 0 < self.itl_percentile <= 100:
            problems.append(f"itl_percentile must be in (0, 100], got {self.itl_percentile}")
        if not 0 <= self.relax_fraction < 1:
            problems.append(f"relax_fraction must be in [0, 1), got {self.relax_fraction}")
        if not 0 <= self.min_backoff <= self.max_backoff:
            problems.append(f"need 0 <= min_backoff <= max_backoff, got {self.min_backoff}, {self.max_backoff}")
        if self.min_cell_samples < 1 or not self.cell_ttl_s > 0 or not self.far_ttft_factor >= 1:
            problems.append("need min_cell_samples >= 1, cell_ttl_s > 0 and far_ttft_factor >= 1")
        if not 0 < self.arrival_growth_fraction or not 0 < self.relax_arrival_fraction or not self.rate_window_s > 0:
            problems.append("arrival_growth_fraction, relax_arrival_fraction and rate_window_s must be > 0")
        if self.heavier_load_exponent < 0:
            problems.append(f"heavier_load_exponent must be >= 0, got {self.heavier_load_exponent}")
        if not 0 < self.drain_fraction <= 1 or self.drain_fraction <= self.relax_fraction:
            problems.append(f"drain_fraction must be in (relax_fraction, 1], got {self.drain_fraction}")
        if self.extrapolation_sm_offset < 1:
            problems.append(f"extrapolation_sm_offset must be >= 1, got {self.extrapolation_sm_offset}")
        if not self.unconfined_top_factor >= 1:
            problems.append(f"unconfined_top_factor must be >= 1, got {self.unconfined_top_factor}")
        if not 0 <= self.load_bucket_hysteresis < 1:
            problems.append(f"load_bucket_hysteresis must be in [0, 1) doublings, got {self.load_bucket_hysteresis}")
        if self.history_limit < 1:
            problems.append(f"history_limit must be >= 1, got {self.history_limit}")
        if problems:
            raise ValueError("adaptive SM split: " + "; ".join(problems))


@dataclass(frozen=True)
class SplitDecision:
    """One entry of the policy's history: what it chose and why (for metrics)."""

    t: float
    index: int
    reason: str
    decode_pct_ms: Optional[float]
    predicted_ttft_ms: Optional[float]


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def _pow2_bucket(n: int) -> int:
    """The smallest power of two >= n (0 for unknown): one bucket per doubling of the load."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


def _sticky_bucket(value: int, current: int, margin_doublings: float) -> int:
    """The doubling bucket of ``value``, but ``current`` while ``value`` is in the dead band above it.

    A Schmitt trigger on each power of two ``p``: a value in bucket ``p`` (``(p/2, p]``) moves up
    only above ``p x 2**margin``; one in a heavier bucket moves down at ``p`` (the plain,
    inclusive edge). Between the two, ``margin`` doublings wide, the bucket it came from
    holds, whichever side that was. The band lies above ``p`` rather than around it because
    loads sit exactly on powers of two (batch caps, CUDA-graph sizes): 64 must stay bucket 64
    from either side. Unknown (0) on either side moves at once.
    """
    fresh = _pow2_bucket(value)
    if not current or not fresh or fresh <= current:
        return fresh
    return fresh if value > current * 2.0 ** margin_doublings else current


LoadKey = tuple[int, int]  # (decode batch bucket, decode context tokens bucket or 0)


def load_key(batch_size: int, context_tokens: int = 0) -> LoadKey:
    return (_pow2_bucket(batch_size), _pow2_bucket(context_tokens))


def _doublings(heavy: LoadKey, light: LoadKey) -> float:
    """How many doublings of load ``heavy`` is above ``light`` (0 when it is not heavier)."""
    ratio = (heavy[0] / light[0]) if heavy[0] and light[0] else 1.0
    if heavy[1] and light[1]:
        ratio *= heavy[1] / light[1]
    return max(0.0, math.log2(ratio)) if ratio > 0 else 0.0


def _heavier(a: LoadKey, b: LoadKey) -> bool:
    """Load ``a`` is heavier than ``b`` in some dimension (an unknown context compares as equal)."""
    return a[0] > b[0] or bool(a[1] and b[1] and a[1] > b[1])


@dataclass
class _Cell:
    """Decode-step times seen at one (load bucket, partition)."""

    samples: deque
    updated: float


@dataclass
class AdaptiveSplitPolicy:
    """Picks the prefill partition index (0 = fewest SMs) per prefill batch; deterministic.

    Not thread-safe: feed it from the thread that calls :meth:`choose` (the decode
    side's step times arrive as messages, so that is natural).
    """

    config: AdaptiveSplitConfig
    num_partitions: int
    initial_index: Optional[int] = None
    clock: Callable[[], float] = time.monotonic
    # SMs of each partition and of the GPU (GreenContextPartitions.sm_counts / total_sms): the
    # drain rule's extrapolation needs the spacing. Default: evenly spaced, the top one short by one.
    sm_counts: Optional[Sequence[int]] = None
    total_sms: Optional[int] = None
    # The last partition is the whole-GPU least-priority top, not a green context
    # (GreenContextPartitions.whole_gpu_top): the drain guesses it differently.
    unconfined_top: bool = False
    index: int = field(init=False)
    history: deque = field(init=False)  # the last config.history_limit SplitDecisions, oldest first
    _decode: deque = field(init=False)
    _ms_per_token: Optional[float] = field(init=False, default=None)
    _predicted_ttft_ms: Optional[float] = field(init=False, default=None)
    _pending: str = field(init=False, default="")
    _pending_count: int = field(init=False, default=0)
    _cooldown: int = field(init=False, default=0)
    _samples_since_change: int = field(init=False, default=0)
    _backoff_level: dict = field(init=False, default_factory=dict)  # split -> wait after its next breach
    _backoff_left: dict = field(init=False, default_factory=dict)  # split -> decisions still to wait
    _load: Optional[LoadKey] = field(init=False, default=None)  # the decode load now
    _decided_load: Optional[LoadKey] = field(init=False, default=None)  # the load at the previous decision
    _cells: dict = field(init=False, default_factory=dict)  # (load, split) -> _Cell
    _processed_tokens: int = field(init=False, default=0)
    _arrived: deque = field(init=False, default_factory=deque)  # (t, tokens queued + processed so far)
    _service_tok_s: dict = field(init=False, default_factory=dict)  # split -> prefill tokens/s measured there
    _changes: int = field(init=False, default=0)  # every change of the recorded split since start
    _last_recorded: Optional[int] = field(init=False, default=None)
    _steps_since_decision: int = field(init=False, default=0)
    _load_since_decision: bool = field(init=False, default=False)  # a nonzero decode load was observed
    _stepless_decisions: int = field(init=False, default=0)  # consecutive decisions with no step before them

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError(f"adaptive SM split needs at least one partition, got {self.num_partitions}")
        start = self.num_partitions // 2 if self.initial_index is None else self.initial_index
        if not 0 <= start < self.num_partitions:
            raise ValueError(f"initial_index {start} is outside 0..{self.num_partitions - 1}")
        self.index = start
        if self.sm_counts is None:
            self.sm_counts = list(range(1, self.num_partitions + 1))
        if len(self.sm_counts) != self.num_partitions or list(self.sm_counts) != sorted(set(self.sm_counts)):
            raise ValueError(f"sm_counts {self.sm_counts} must be {self.num_partitions} increasing SM counts")
        if self.total_sms is None:
            self.total_sms = self.sm_counts[-1] + 1
        if self.total_sms < self.sm_counts[-1]:
            raise ValueError(f"total_sms {self.total_sms} is below the largest partition {self.sm_counts[-1]}")
        self._decode = deque(maxlen=self.config.window)
        self.history = deque(maxlen=self.config.history_limit)
        self._samples_since_change = self.config.min_decode_samples  # the start split is judged at once

    # --- inputs
    def observe_decode_step(self, ms: float) -> None:
        """One decode step's inter-token time, as the decode side measured it (at the load last observed)."""
        self._decode.append(float(ms))
        self._samples_since_change += 1
        self._steps_since_decision += 1
        if self.config.feed_forward and self._load is not None:
            key = (self._load, self.index)
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = _Cell(deque(maxlen=self.config.window), 0.0)
            cell.samples.append(float(ms))
            cell.updated = self.clock()

    def observe_decode_load(self, batch_size: int, context_tokens: int = 0) -> None:
        """The decode side's running batch (requests, and their total context when known).

        Call it before the decode steps measured at that load and once more, with the load
        the next prefill batch will run next to, before :meth:`choose`.
        """
        if batch_size < 0 or context_tokens < 0:
            raise ValueError(f"decode load must be >= 0, got batch {batch_size}, context {context_tokens}")
        if self._load is None:
            key = load_key(batch_size, context_tokens)
        else:
            margin = self.config.load_bucket_hysteresis
            key = (_sticky_bucket(batch_size, self._load[0], margin),
                   _sticky_bucket(context_tokens, self._load[1], margin))
        if batch_size > 0:
            self._load_since_decision = True
        if self.config.feed_forward and self._load is not None and key != self._load:
            # Steps at the old load say nothing about the new one: judge afresh.
            self._decode.clear()
            self._samples_since_change = 0
        self._load = key

    def observe_prefill(self, ms: float, tokens: int, queued_tokens: int) -> None:
        """A prefill batch of ``tokens`` took ``ms`` at the current split; ``queued_tokens`` still wait."""
        if tokens <= 0 or ms <= 0:
            return
        self._ms_per_token = ms / tokens
        self._predicted_ttft_ms = (queued_tokens + tokens) * self._ms_per_token
        self._service_tok_s[self.index] = tokens / ms * 1e3
        # Queued plus processed tokens only grow by arrivals: their slope is the arrival rate.
        self._processed_tokens += tokens
        now = self.clock()
        self._arrived.append((now, queued_tokens + self._processed_tokens))
        while self._arrived and now - self._arrived[0][0] > self.config.rate_window_s:
            self._arrived.popleft()

    def observe_queue(self, queued_tokens: int) -> None:
        """The queue changed without a batch finishing (new arrivals, or it emptied)."""
        if self._ms_per_token is not None:
            self._predicted_ttft_ms = queued_tokens * self._ms_per_token

    # --- state
    def decode_percentile_ms(self) -> Optional[float]:
        return _percentile(self._decode, self.config.itl_percentile) if self._decode else None

    @property
    def decode_load(self) -> Optional[LoadKey]:
        """The (batch, context) load bucket in use (with hysteresis), or None before any load was observed."""
        return self._load

    @property
    def predicted_ttft_ms(self) -> Optional[float]:
        return self._predicted_ttft_ms

    def arrival_tok_s(self) -> Optional[float]:
        """Prompt tokens arriving per second over the last ``rate_window_s`` (None before a quarter window)."""
        if len(self._arrived) < 2:
            return None
        (t0, a0), (t1, a1) = self._arrived[0], self._arrived[-1]
        if t1 - t0 < self.config.rate_window_s / 4:
            return None
        return max(0.0, (a1 - a0) / (t1 - t0))

    # --- the decision
    def _wanted(self) -> tuple[str, str]:
        """(direction, reason) before patience and cooldown: direction in {'shrink', 'grow', 'relax', ''}."""
        c = self.config
        itl = self.decode_percentile_ms()
        ttft = self._predicted_ttft_ms
        if itl is not None and itl > c.itl_slo_ms:
            return "shrink", f"decode P{c.itl_percentile:g} {itl:.2f} ms > ITL SLO {c.itl_slo_ms:g}"
        headroom = itl is None or itl < c.itl_slo_ms * (1 - c.hysteresis)
        if ttft is not None and ttft > c.ttft_slo_ms:
            if headroom:
                return "grow", f"predicted TTFT {ttft:.0f} ms > SLO {c.ttft_slo_ms:g} with ITL headroom"
            return "", "TTFT over SLO but no ITL headroom"
        arrivals = self.arrival_tok_s() if c.feed_forward and (c.grow_on_arrivals or c.drain_backlog) else None
        service = self._service_tok_s.get(self.index)
        outpaced = arrivals is not None and service and ttft and arrivals > c.arrival_growth_fraction * service
        if c.grow_on_arrivals and outpaced:
            if headroom:
                return "grow", (f"arrivals {arrivals:.0f} tok/s > {c.arrival_growth_fraction:g} x "
                                f"{service:.0f} prefilled here")
            return "", "arrivals outpace prefill but no ITL headroom"
        if ttft is not None and ttft < c.ttft_slo_ms * c.relax_fraction:
            below = self._service_tok_s.get(self.index - 1)
            if arrivals is not None and below and arrivals >= c.relax_arrival_fraction * below:
                return "", f"TTFT low but the split below would not keep up ({arrivals:.0f} tok/s arriving)"
            return "relax", f"predicted TTFT {ttft:.0f} ms < {c.relax_fraction:g} x SLO"
        return "", "within band"

    def _measured(self, load: LoadKey, index: int) -> Optional[float]:
        cell = self._cells.get((load, index))
        if cell is None or len(cell.samples) < self.config.min_cell_samples:
            return None
        if self.clock() - cell.updated > self.config.cell_ttl_s:
            return None
        return _percentile(cell.samples, self.config.itl_percentile)

    def predicted_itl_ms(self, index: int, load: Optional[LoadKey] = None) -> Optional[float]:
        """Decode-step percentile expected at ``index`` under ``load`` (default: the load now); None if unknown.

        Measured if the cell has enough fresh samples; otherwise carried over from another
        load measured at this split, scaled by how a split measured at both loads differs (the
        ratio raised to ``1 + heavier_load_exponent`` per doubling when this load is heavier;
        the most pessimistic such estimate). Never below a measured smaller split's value.
        """
        load = self._load if load is None else load
        if load is None:
            return None
        floor = max((m for j in range(index) if (m := self._measured(load, j)) is not None), default=None)
        own = self._measured(load, index)
        if own is not None:
            return own if floor is None else max(own, floor)
        guesses = []
        for other in {k for k, _ in self._cells if k != load}:
            there = self._measured(other, index)
            if there is None:
                continue
            power = 1.0 + self.config.heavier_load_exponent * _doublings(load, other)
            for j in range(self.num_partitions):
                here_j, there_j = self._measured(load, j), self._measured(other, j)
                if here_j is not None and there_j:
                    guesses.append(here_j * (there / there_j) ** power)
        if not guesses:
            return None
        guess = max(guesses)
        return guess if floor is None else max(guess, floor)

    def _largest_predicted_safe(self, limit_ms: float, top: int) -> Optional[int]:
        """The largest split <= ``top`` whose prediction is known and <= ``limit_ms``, walking up from 0."""
        best = None
        for j in range(top + 1):
            pred = self.predicted_itl_ms(j)
            if pred is None or pred > limit_ms:
                break  # splits only get worse for decode as they grow: stop at the first unknown or bad one
            best = j
        return best

    # --- the ITL-guarded backlog drain (drain_backlog)
    def _heavier_bound(self, load: LoadKey, index: int) -> Optional[float]:
        """The smallest percentile measured at ``index`` under a load at least as heavy in every known dimension."""
        bounds = []
        for other in {k for k, _ in self._cells}:
            if other == load or other[0] < load[0] or (other[1] and load[1] and other[1] < load[1]):
                continue
            if (m := self._measured(other, index)) is not None:
                bounds.append(m)
        return min(bounds) if bounds else None

    def _x(self, index: int) -> float:
        sms = self.sm_counts[index]  # type: ignore[index]
        return 1.0 / (self.total_sms + self.config.extrapolation_sm_offset - sms)

    def _extrapolated(self, load: LoadKey, index: int) -> Optional[float]:
        """The secant guess at ``index`` from the splits below it measured at ``load`` (None with fewer than two)."""
        below = [(j, m) for j in range(index) if (m := self._measured(load, j)) is not None]
        if len(below) < 2:
            return None
        slope = max(max(0.0, (mb - ma) / (self._x(b) - self._x(a))) for (a, ma), (b, mb) in zip(below, below[1:]))
        top, m_top = below[-1]
        return m_top + slope * (self._x(index) - self._x(top))

    def guarded_itl_ms(self, index: int) -> tuple[str, Optional[float]]:
        """(kind, ms) the drain rule trusts at ``index`` under the load now.

        kind ``known``: measured here, or bounded by a heavier load (and never below a
        measured smaller split); ``guess``: extrapolated, or carried over from another load
        (the larger of the two; for the unconfined top, the split below times
        ``unconfined_top_factor`` instead of the secant, and never an exploring step);
        ``explore``: nothing to go on but the split just below, measured here (its value
        is returned); ``unknown``.
        """
        load = self._load
        if load is None:
            return "unknown", None
        floor = max((m for j in range(index) if (m := self._measured(load, j)) is not None), default=None)
        own = self._measured(load, index)
        bound = self._heavier_bound(load, index)
        known = own if own is not None else bound
        if known is not None:
            return "known", known if floor is None else max(known, floor)
        below = self._measured(load, index - 1) if index > 0 else None
        if self.unconfined_top and index == self.num_partitions - 1:
            scaled = None if below is None else below * self.config.unconfined_top_factor
            guesses = [g for g in (scaled, self.predicted_itl_ms(index)) if g is not None]
            return ("guess", max(guesses)) if guesses else ("unknown", None)
        guesses = [g for g in (self._extrapolated(load, index), self.predicted_itl_ms(index)) if g is not None]
        if guesses:
            return "guess", max(guesses)
        return ("explore", below) if below is not None else ("unknown", None)

    def _drain_target(self) -> int:
        """The largest split above the current one the guarded predictions allow; one guessed step at most."""
        c = self.config
        band = c.itl_slo_ms * (1 - c.hysteresis)
        best = self.index
        for j in range(self.index + 1, self.num_partitions):
            if self._backoff_left.get(j, 0) > 0:
                break
            kind, pred = self.guarded_itl_ms(j)
            if kind == "known" and pred <= c.itl_slo_ms:
                best = j
                continue
            guessed = kind == "guess" and pred <= c.itl_slo_ms
            explored = kind == "explore" and pred <= band and j == self.index + 1
            if guessed or explored:
                best = j
            break
        return best

    def _largest_known_safe(self, top: int) -> Optional[int]:
        """The largest split <= ``top`` whose guarded prediction is known and within the SLO, walking up from 0."""
        best = None
        for j in range(top + 1):
            kind, pred = self.guarded_itl_ms(j)
            if kind != "known" or pred > self.config.itl_slo_ms:
                break
            best = j
        return best

    def _backlog_pressure(self) -> Optional[str]:
        """Why the queue needs the largest safe split now, or None."""
        c = self.config
        ttft = self._predicted_ttft_ms
        if ttft is not None and ttft > c.ttft_slo_ms * c.drain_fraction:
            return f"predicted TTFT {ttft:.0f} ms > {c.drain_fraction:g} x SLO"
        arrivals, service = self.arrival_tok_s(), self._service_tok_s.get(self.index)
        if arrivals is not None and service and arrivals > c.arrival_growth_fraction * service:
            return f"arrivals {arrivals:.0f} tok/s > {c.arrival_growth_fraction:g} x {service:.0f} prefilled here"
        return None

    def _feed_forward_on_load_change(self) -> Optional[tuple[int, str]]:
        """(target, reason) when the decode load changed since the last decision, else None."""
        c = self.config
        before, now = self._decided_load, self._load
        self._decided_load = now
        if not c.feed_forward or before is None or now is None or before == now:
            return None
        pred = self.predicted_itl_ms(self.index)
        pressure = self._predicted_ttft_ms is not None and self._predicted_ttft_ms > c.ttft_slo_ms
        label = f"decode load {before} -> {now}"
        if c.drain_backlog:
            # Guesses carried over from another load are too noisy to act on (the measured ratios spread):
            # fall back only to splits measured (or bounded) at the new load; the drain rule
            # then climbs from there under pressure.
            kind, guarded = self.guarded_itl_ms(self.index)
            if kind == "known" and guarded <= c.itl_slo_ms:
                return None
            if kind != "known" and not _heavier(now, before):
                return None  # lighter load: what held before still holds
            safe = self._largest_known_safe(self.index)
            why = "not known to hold the ITL SLO" if kind != "known" else f"predicted ITL {guarded:.2f} ms > SLO"
            return (0 if safe is None else safe), f"{label}, {why}: back to a known-safe split"
        if pred is None:
            if not _heavier(now, before):
                return None  # lighter load, nothing known: what held before still holds
            safe = self._largest_predicted_safe(c.itl_slo_ms, self.index)
            return (0 if safe is None else safe), f"{label}, no estimate at this split: back to a known-safe one"
        if pred > c.itl_slo_ms:
            # Down to a split predicted within the SLO itself: inside the hysteresis band the
            # feedback rule holds, so this does not invite a flap.
            safe = self._largest_predicted_safe(c.itl_slo_ms, self.index)
            return (0 if safe is None else safe), f"{label}, predicted ITL {pred:.2f} ms > SLO {c.itl_slo_ms:g}"
        if pressure:
            safe = self._largest_predicted_safe(c.itl_slo_ms * (1 - c.hysteresis), self.num_partitions - 1)
            if safe is not None and safe > self.index:
                return safe, f"{label}, TTFT over SLO and predicted ITL headroom up to split {safe}"
        return None

    def _grow_target(self) -> int:
        """One step up; several when TTFT is far over its SLO and the predictions allow it."""
        c = self.config
        step = self.index + 1
        if c.feed_forward and c.drain_backlog and self._load is not None:
            return self._drain_target()  # never into a split without a guarded prediction
        if not c.feed_forward or step >= self.num_partitions:
            return step
        limit = c.itl_slo_ms * (1 - c.hysteresis)
        pred_next = self.predicted_itl_ms(step)
        if pred_next is not None and pred_next > c.itl_slo_ms:
            return self.index  # known to breach: the back-off's job is to retry later, not this
        ttft = self._predicted_ttft_ms
        if ttft is None or ttft <= c.ttft_slo_ms * c.far_ttft_factor:
            return step
        target = step
        for j in range(step + 1, self.num_partitions):
            pred = self.predicted_itl_ms(j)
            if pred is None or pred > limit or self._backoff_left.get(j, 0) > 0:
                break
            target = j
        return target

    def _shrink_target(self) -> int:
        """One step down, further while the next lower split is also predicted to breach."""
        target = self.index - 1
        if not self.config.feed_forward:
            return target
        while target > 0:
            pred = self.predicted_itl_ms(target)
            if pred is None or pred <= self.config.itl_slo_ms:
                break
            target -= 1
        return target

    def _decode_idle(self) -> bool:
        """Nothing is decoding next to this decision (rule 6); consumes the since-last-decision counters.

        Explicit (``observe_decode_load(0)``) or no load at all: one decision without a step
        is enough. A known load that the caller stopped refreshing (the server sends none with
        an empty decode batch): two decisions in a row without a step, as one can fall between
        two decode steps. A nonzero load observed since the last decision means decode runs.
        """
        stepless = self._steps_since_decision == 0
        streak = self._stepless_decisions
        refreshed = self._load_since_decision
        self._stepless_decisions = streak + 1 if stepless else 0
        self._steps_since_decision, self._load_since_decision = 0, False
        if not stepless or refreshed:
            return False
        no_load = self._load is None or self._load[0] == 0
        if not no_load and streak < 1:
            return False
        # Whatever the window holds was measured next to a decode batch that has finished.
        self._decode.clear()
        if not no_load:
            self._load = (0, 0)  # the decode side's return is then a load change for rule 0
        return True

    def choose(self) -> int:
        """The partition index for the next prefill batch (see the module docstring for the rule)."""
        c = self.config
        idle = self._decode_idle()
        forward = self._feed_forward_on_load_change()
        if idle:
            # Even without a load ever observed: the first load after this is a change.
            self._decided_load = (0, 0)
        if forward is not None and forward[0] != self.index:
            target, reason = forward
            # A new load is a new situation: breaches seen at the old one do not block.
            self._backoff_left.clear()
            return self._move(target, "feed-forward", reason)
        top = self.num_partitions - 1
        if c.feed_forward and c.drain_backlog and (self._load is not None or idle):
            # Acts on predictions, not on the window, so it need not wait out the cooldown;
            # never while the decode steps seen at this split breach the SLO.
            why = self._backlog_pressure()
            itl = self.decode_percentile_ms()
            if why is not None and (itl is None or itl <= c.itl_slo_ms):
                if idle:
                    if top > self.index:
                        return self._move(top, "drain", f"{why}; nothing decoding: no ITL to protect")
                else:
                    target = self._drain_target()
                    if target > self.index:
                        kind, pred = self.guarded_itl_ms(target)
                        return self._move(target, "drain", f"{why}; split {target} {kind} at {pred:.2f} ms ITL")
        # Nothing decoding: no samples would ever end the min_decode_samples hold.
        if self._cooldown > 0 or (not idle and self._samples_since_change < c.min_decode_samples):
            self._cooldown = max(0, self._cooldown - 1)
            return self._record(self.index, "cooldown")
        for j in list(self._backoff_left):
            self._backoff_left[j] = max(0, self._backoff_left[j] - 1)
        direction, reason = self._wanted()
        if direction != "shrink" and self.index in self._backoff_level and len(self._decode) >= c.min_decode_samples:
            # The current split meets the ITL SLO on enough samples: forgive its breaches gradually.
            self._backoff_level[self.index] //= 2
        target = self.index
        if direction == "shrink":
            target = self._shrink_target()  # an SLO breach acts at once
        elif direction in ("grow", "relax"):
            if direction == self._pending:
                self._pending_count += 1
            else:
                self._pending, self._pending_count = direction, 1
            blocked = direction == "grow" and not idle and self._backoff_left.get(self.index + 1, 0) > 0
            if self._pending_count >= c.patience and not blocked:
                if direction == "relax":
                    target = self.index - 1
                else:
                    target = top if idle else self._grow_target()
                    reason = reason + ("; nothing decoding" if idle else "")
        if direction not in ("grow", "relax"):
            self._pending, self._pending_count = "", 0
        target = min(max(target, 0), self.num_partitions - 1)
        if target != self.index:
            if direction == "shrink":
                # The split we leave broke the ITL SLO: wait longer before trying it again, so
                # an SLO lying between two partitions does not make the policy flap between them.
                level = min(c.max_backoff, max(c.min_backoff, 2 * self._backoff_level.get(self.index, 0)))
                self._backoff_level[self.index] = level
                self._backoff_left[self.index] = level
            return self._move(target, direction, reason)
        return self._record(self.index, ("hold: " + reason) if direction else reason)

    def _move(self, target: int, direction: str, reason: str) -> int:
        self.index = target
        self._pending, self._pending_count = "", 0
        self._cooldown = self.config.cooldown_batches
        self._samples_since_change = 0
        self._decode.clear()
        return self._record(target, direction + ": " + reason)

    def _record(self, index: int, reason: str) -> int:
        self.history.append(
            SplitDecision(
                t=self.clock(),
                index=index,
                reason=reason,
                decode_pct_ms=self.decode_percentile_ms(),
                predicted_ttft_ms=self._predicted_ttft_ms,
            )
        )
        # Counted here, not from the history: the history keeps only the last history_limit.
        if self._last_recorded is not None and self._last_recorded != index:
            self._changes += 1
            logger.info("[edgeacc prefill] adaptive SM split -> partition %d (%s)", index, reason)
        self._last_recorded = index
        return index

    def changes(self) -> int:
        """How many times the chosen partition changed between recorded decisions since start (the flapping metric)."""
        return self._changes


__all__ = [
    "AdaptiveSplitConfig",
    "AdaptiveSplitPolicy",
    "SplitDecision",
    "load_key",
]
