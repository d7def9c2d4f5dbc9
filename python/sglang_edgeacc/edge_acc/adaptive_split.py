"""Adaptive SM split (``--edge-acc-sm-partition adaptive``): the prefill side's SM share follows load.

An MPS thread percentage is fixed for a process's life, but the right prefill/decode
split moves with the decode batch, its context and the prompt arrival rate. Here the
prefill side keeps a few green-context streams of different SM counts, built once
(:class:`GreenContextPartitions`), and launches each prefill batch on the one that
:class:`AdaptiveSplitPolicy` picks from measured step times and the two SLOs.

Upstream SGLang's PD-multiplexing (``sglang/srt/multiplex``) also switches between
pre-built green-context stream groups per iteration, but picks the group from the
decode batch size alone (a linear rule or hand-written thresholds). This policy
instead closes the loop on what the SLOs are about: the decode side's measured step
times (ITL) and the prefill side's predicted time to first token.

The rule, evaluated once per prefill batch in :meth:`AdaptiveSplitPolicy.choose`:

1. Cooldown: for ``cooldown_batches`` decisions after a change, and until
   ``min_decode_samples`` decode steps have been seen at the new split, keep it
   (samples from the old split say nothing about the new one).
2. Shrink one step if the decode P``itl_percentile`` over the last ``window`` steps
   exceeds ``itl_slo_ms``: the ITL SLO wins over TTFT, because a decode stall hits
   every running request while a slower prefill delays only the queued ones.
3. Grow one step if the predicted TTFT exceeds ``ttft_slo_ms`` and the decode
   percentile is below ``itl_slo_ms * (1 - hysteresis)`` (real headroom, not a value
   hovering at the SLO).
4. Shrink one step if the predicted TTFT is below ``ttft_slo_ms * relax_fraction``
   and the split is not already the smallest: prefill has slack, so give decode
   its SMs back.
5. Otherwise keep. A grow or a relax-shrink needs ``patience`` consecutive
   decisions asking for it; an SLO breach shrinks at once. Growing back into a
   split that breached the ITL SLO waits its back-off in decisions (``min_backoff``,
   doubled per repeated breach up to ``max_backoff``, halved each decision that split
   holds the SLO), so an SLO lying between two partitions does not make the choice flap.

The predicted TTFT of the newest queued prompt is (queued + this batch's tokens) x
the measured milliseconds per token at the current split, which is what a FIFO
prefill queue would make it wait.

Use on the prefill side::

    parts = build_partitions_or_warn(fixed_percent=flags.edge_acc_prefill_sm_percent)
    if parts is None:                                        # warned: run the fixed (MPS) split
        ...
    policy = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=30, ttft_slo_ms=2000), len(parts))
    for batch in prefill_batches:
        for ms in batch.decode_step_ms:                      # sent along by the decode side
            policy.observe_decode_step(ms)
        idx = policy.choose()
        start = time.perf_counter()
        with torch.cuda.stream(parts.stream(idx)):           # order it with other streams by events
            run(batch)
        wait_for(batch)                                      # e.g. an event on parts.stream(idx)
        policy.observe_prefill((time.perf_counter() - start) * 1e3, batch.tokens, queued_tokens)
    # metrics: policy.history (SplitDecision: t, index, reason, decode P99, predicted TTFT), policy.changes()

Only torch and the standard library are imported, and torch only for the partitions.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from .sm_partition import (
    MPS_PERCENT_VAR,
    GreenContextStream,
    SmPartitionError,
    green_context_stream,
    green_contexts_available,
    sm_granularity,
)

logger = logging.getLogger(__name__)

ADAPTIVE_MODE = "adaptive"


@dataclass(frozen=True)
class AdaptiveSplitConfig:
    """The policy's targets and damping (``--edge-acc-itl-slo-ms``, ``--edge-acc-ttft-slo-ms``)."""

    itl_slo_ms: float
    ttft_slo_ms: float
    # Grow only below itl_slo * (1 - hysteresis). On an H200 adjacent partitions differ by
    # about 5-10 % in decode P99 (run 1 of benchmarks/adaptive_split.py), so a wider band
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


@dataclass
class AdaptiveSplitPolicy:
    """Picks the prefill partition index (0 = fewest SMs) per prefill batch; deterministic.

    Not thread-safe: feed it from the thread that calls :meth:`choose` (the decode
    side's step times arrive as messages, so that is natural).
    """

    config: AdaptiveSplitConfig
    num_partitions: int
    initial_index: Optional[int] = None
    clock: object = time.monotonic
    index: int = field(init=False)
    history: list = field(init=False, default_factory=list)
    _decode: deque = field(init=False)
    _ms_per_token: Optional[float] = field(init=False, default=None)
    _predicted_ttft_ms: Optional[float] = field(init=False, default=None)
    _pending: str = field(init=False, default="")
    _pending_count: int = field(init=False, default=0)
    _cooldown: int = field(init=False, default=0)
    _samples_since_change: int = field(init=False, default=0)
    _backoff_level: dict = field(init=False, default_factory=dict)  # split -> wait after its next breach
    _backoff_left: dict = field(init=False, default_factory=dict)  # split -> decisions still to wait

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError(f"adaptive SM split needs at least one partition, got {self.num_partitions}")
        start = self.num_partitions // 2 if self.initial_index is None else self.initial_index
        if not 0 <= start < self.num_partitions:
            raise ValueError(f"initial_index {start} is outside 0..{self.num_partitions - 1}")
        self.index = start
        self._decode = deque(maxlen=self.config.window)
        self._samples_since_change = self.config.min_decode_samples  # the start split is judged at once

    # --- inputs
    def observe_decode_step(self, ms: float) -> None:
        """One decode step's inter-token time, as the decode side measured it."""
        self._decode.append(float(ms))
        self._samples_since_change += 1

    def observe_prefill(self, ms: float, tokens: int, queued_tokens: int) -> None:
        """A prefill batch of ``tokens`` took ``ms`` at the current split; ``queued_tokens`` still wait."""
        if tokens <= 0 or ms <= 0:
            return
        self._ms_per_token = ms / tokens
        self._predicted_ttft_ms = (queued_tokens + tokens) * self._ms_per_token

    def observe_queue(self, queued_tokens: int) -> None:
        """The queue changed without a batch finishing (new arrivals, or it emptied)."""
        if self._ms_per_token is not None:
            self._predicted_ttft_ms = queued_tokens * self._ms_per_token

    # --- state
    def decode_percentile_ms(self) -> Optional[float]:
        return _percentile(self._decode, self.config.itl_percentile) if self._decode else None

    @property
    def predicted_ttft_ms(self) -> Optional[float]:
        return self._predicted_ttft_ms

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
        if ttft is not None and ttft < c.ttft_slo_ms * c.relax_fraction:
            return "relax", f"predicted TTFT {ttft:.0f} ms < {c.relax_fraction:g} x SLO"
        return "", "within band"

    def choose(self) -> int:
        """The partition index for the next prefill batch (see the module docstring for the rule)."""
        c = self.config
        if self._cooldown > 0 or self._samples_since_change < c.min_decode_samples:
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
            target = self.index - 1  # an SLO breach acts at once
        elif direction in ("grow", "relax"):
            if direction == self._pending:
                self._pending_count += 1
            else:
                self._pending, self._pending_count = direction, 1
            blocked = direction == "grow" and self._backoff_left.get(self.index + 1, 0) > 0
            if self._pending_count >= c.patience and not blocked:
                target = self.index + (1 if direction == "grow" else -1)
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
            self.index = target
            self._pending, self._pending_count = "", 0
            self._cooldown = c.cooldown_batches
            self._samples_since_change = 0
            self._decode.clear()
            return self._record(target, direction + ": " + reason)
        return self._record(self.index, ("hold: " + reason) if direction else reason)

    def _record(self, index: int, reason: str) -> int:
        self.history.append(
            SplitDecision(
                t=self.clock(),  # type: ignore[operator]
                index=index,
                reason=reason,
                decode_pct_ms=self.decode_percentile_ms(),
                predicted_ttft_ms=self._predicted_ttft_ms,
            )
        )
        if len(self.history) > 1 and self.history[-2].index != index:
            logger.info("[edgeacc prefill] adaptive SM split -> partition %d (%s)", index, reason)
        return index

    def changes(self) -> int:
        """How many times the chosen partition changed (the flapping metric)."""
        return sum(1 for a, b in zip(self.history, self.history[1:]) if a.index != b.index)


# --- partitions


def default_sm_counts(total_sms: int, minimum: int, multiple: int, count: int = 5) -> list[int]:
    """``count`` prefill SM counts spread from about 1/4 to about 7/8 of the GPU, multiples of ``multiple``.

    The decode side keeps at least ``total / 8`` SMs to itself at the largest split:
    beyond that the split stops protecting decode (see docs/benchmarks.md).
    """
    if count < 1:
        raise ValueError(f"need at least one partition, got {count}")
    low = max(minimum, (total_sms // 4) // multiple * multiple)
    high = max(low, (total_sms * 7 // 8) // multiple * multiple)
    if count == 1:
        return [high]
    counts = []
    for i in range(count):
        raw = low + (high - low) * i / (count - 1)
        counts.append(max(minimum, int(round(raw / multiple)) * multiple))
    return sorted(set(counts))


class GreenContextPartitions:
    """Green-context streams of increasing SM counts for the prefill side, created once.

    Index 0 is the smallest. Keep the object alive while its streams are in use.
    """

    def __init__(self, sm_counts: Optional[Sequence[int]] = None, device_index: int = 0, *, tp_rank: int = 0):
        if not green_contexts_available():
            raise SmPartitionError(
                f"--edge-acc-sm-partition {ADAPTIVE_MODE} needs CUDA and torch.cuda.green_contexts "
                f"(torch {torch.__version__}); use --edge-acc-sm-partition mps"
            )
        total = torch.cuda.get_device_properties(device_index).multi_processor_count
        minimum, multiple = sm_granularity(device_index)
        counts = list(sm_counts) if sm_counts else default_sm_counts(total, minimum, multiple)
        bad = [n for n in counts if n < minimum or n > total or n % multiple]
        if bad:
            raise SmPartitionError(
                f"adaptive SM split: SM counts {bad} are not multiples of {multiple} between {minimum} and {total} "
                f"on cuda:{device_index}"
            )
        self.total_sms = total
        self.device_index = device_index
        self.parts: list[GreenContextStream] = [
            green_context_stream(n, device_index, role="prefill", tp_rank=tp_rank) for n in sorted(set(counts))
        ]
        logger.info(
            "[edgeacc prefill tp%d] adaptive SM split: partitions %s of %d SMs",
            tp_rank,
            self.sm_counts,
            total,
        )

    @property
    def sm_counts(self) -> list[int]:
        return [p.num_sms for p in self.parts]

    def __len__(self) -> int:
        return len(self.parts)

    def stream(self, index: int) -> torch.cuda.Stream:
        return self.parts[index].stream


def build_partitions_or_warn(
    sm_counts: Optional[Sequence[int]] = None,
    device_index: int = 0,
    *,
    fixed_percent: Optional[int] = None,
    tp_rank: int = 0,
) -> Optional[GreenContextPartitions]:
    """The partitions, or None with a WARNING when green contexts cannot be made here.

    On None the caller runs the fixed split (``--edge-acc-prefill-sm-percent`` through
    MPS). The policy can still be run to log what it would have chosen.
    """
    why = None
    if os.environ.get(MPS_PERCENT_VAR):
        why = f"this process is an MPS client limited by {MPS_PERCENT_VAR}={os.environ[MPS_PERCENT_VAR]}"
    else:
        try:
            return GreenContextPartitions(sm_counts, device_index, tp_rank=tp_rank)
        except SmPartitionError as exc:
            why = str(exc)
    fixed = f" at {fixed_percent}%" if fixed_percent is not None else ""
    logger.warning(
        "[edgeacc prefill tp%d] --edge-acc-sm-partition %s unavailable (%s); falling back to the fixed split%s",
        tp_rank,
        ADAPTIVE_MODE,
        why,
        fixed,
    )
    return None


__all__ = [
    "ADAPTIVE_MODE",
    "AdaptiveSplitConfig",
    "AdaptiveSplitPolicy",
    "GreenContextPartitions",
    "SplitDecision",
    "build_partitions_or_warn",
    "default_sm_counts",
]
