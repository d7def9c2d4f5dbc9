"""Adaptive SM split (``--edge-acc-sm-partition adaptive``): which partition each prefill batch runs on.

An MPS thread percentage is fixed for a process's life, but the split that serves best moves
with the decode batch, its context and the prompt arrival rate. So the prefill side keeps a
few pre-built partitions (:mod:`.adaptive_partitions`) and, per prefill batch,
:class:`AdaptiveSplitPolicy` picks one from what the decode side sends with it: its step
times since the previous batch, its load (running requests and their total context) and the
prefill queue. The ITL SLO comes first, because a slow decode step stalls every running
request while a slow prefill delays only the queued ones; within it, prefill gets the SMs
the TTFT SLO needs. What a split will cost decode is looked up in
:class:`~.adaptive_table.DecodeStepTable` (measured per load and split, or predicted).

The rule, once per batch in :meth:`AdaptiveSplitPolicy.choose`, the first that applies:

1. **Load change.** The decode load moved to another bucket: if the current split is
   predicted over the ITL SLO there, or is unknown there and the load is heavier, drop to
   the largest split known to hold the SLO at the new load (the smallest if none), before
   a step at the new load breaches.
2. **Drain.** Under backlog pressure (predicted TTFT over DRAIN_FRACTION x its SLO, or prompts
   arriving faster than ARRIVAL_GROWTH_FRACTION x this split prefills them), and unless the
   steps seen here already breach, move at once to the largest split predicted to hold the
   ITL SLO at the load now, at most one split beyond what is known: a growing queue breaks
   any TTFT SLO later, and the backlog outlives the burst that made it.
3. **Settle.** Hold until MIN_DECODE_SAMPLES decode steps were seen at the split (and load):
   steps from the old split say nothing about the new one.
4. **Shrink** when the decode percentile over the window breaches the ITL SLO: at once, past
   every split below also predicted to breach. The split left then waits a back-off before
   it is grown into again (MIN_BACKOFF decisions, doubled per repeated breach up to
   MAX_BACKOFF, halved for each decision a split holds), so an SLO lying between two
   partitions does not make the choice flap.
5. **Grow** when the predicted TTFT breaks its SLO and decode has real headroom (below the
   ITL SLO by ITL_HYSTERESIS): to the drain's target once a load is known, else one step.
6. **Relax** one step when the predicted TTFT is below RELAX_FRACTION x its SLO, unless the
   split below would not keep up with the arrivals: prefill's spare SMs go back to decode.
7. Otherwise hold.

Nothing decoding (no step since the previous decision, and no load, or a known load not
refreshed for two decisions, since the server sends none with an empty decode batch): there
is no ITL to protect, so pressure moves straight to the largest split and no samples are
waited for. The load is then forgotten, so decode's return is a load change (rule 1).

The predicted TTFT is (queued + this batch's tokens) x the milliseconds per token measured
at the current split: the newest prompt's wait in a FIFO queue.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .adaptive_table import (
    ITL_PERCENTILE,
    ITL_WINDOW_STEPS,
    DecodeStepTable,
    LoadKey,
    heavier,
    load_key,
    next_load_key,
    percentile,
)

logger = logging.getLogger(__name__)

# Grow only below ITL SLO x (1 - this). Adjacent partitions differ by about 5-10 % in decode
# P99 on an H200, so a wider band would never let the policy grow; the back-off, not this
# band, keeps it from flapping.
ITL_HYSTERESIS = 0.05
MIN_DECODE_SAMPLES = 8  # decode steps to see at a split before judging it
RELAX_FRACTION = 0.3  # predicted TTFT below SLO x this: prefill has slack
DRAIN_FRACTION = 0.5  # predicted TTFT over SLO x this: drain before the SLO breaks
ARRIVAL_GROWTH_FRACTION = 0.9  # drain when arrivals exceed this x the service rate at this split
RELAX_ARRIVAL_FRACTION = 0.8  # relax only when arrivals stay below this x the service rate below
RATE_WINDOW_S = 3.0  # the arrival rate is measured over this window
MIN_BACKOFF = 4  # decisions before growing back into a split that breached the ITL SLO
MAX_BACKOFF = 32  # the wait doubles per repeated breach up to this
HISTORY_LIMIT = 4096  # decisions kept in ``history`` (a server makes several a second)


@dataclass(frozen=True)
class AdaptiveSplitConfig:
    """The policy's two targets (``--edge-acc-itl-slo-ms``, ``--edge-acc-ttft-slo-ms``)."""

    itl_slo_ms: float
    ttft_slo_ms: float

    def __post_init__(self) -> None:
        problems = []
        if not self.itl_slo_ms > 0:
            problems.append(f"--edge-acc-itl-slo-ms must be > 0, got {self.itl_slo_ms}")
        if not self.ttft_slo_ms > 0:
            problems.append(f"--edge-acc-ttft-slo-ms must be > 0, got {self.ttft_slo_ms}")
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


class AdaptiveSplitPolicy:
    """Picks the prefill partition index (0 = fewest SMs) per prefill batch; deterministic.

    ``sm_counts``, ``total_sms`` and ``unconfined_top`` describe the partitions
    (:class:`~.adaptive_table.DecodeStepTable`). Not thread-safe: feed it from the thread that
    calls :meth:`choose` (the decode side's step times arrive as messages, so that is natural).
    """

    def __init__(self, config: AdaptiveSplitConfig, num_partitions: int, initial_index: Optional[int] = None,
                 clock: Callable[[], float] = time.monotonic, sm_counts: Optional[Sequence[int]] = None,
                 total_sms: Optional[int] = None, unconfined_top: bool = False) -> None:
        if num_partitions < 1:
            raise ValueError(f"adaptive SM split needs at least one partition, got {num_partitions}")
        start = num_partitions // 2 if initial_index is None else initial_index
        if not 0 <= start < num_partitions:
            raise ValueError(f"initial_index {start} is outside 0..{num_partitions - 1}")
        self.config, self.num_partitions, self.clock = config, num_partitions, clock
        self.table = DecodeStepTable(num_partitions, sm_counts, total_sms, unconfined_top, clock)
        self.index = start
        self.history: deque[SplitDecision] = deque(maxlen=HISTORY_LIMIT)  # oldest first
        self._decode: deque[float] = deque(maxlen=ITL_WINDOW_STEPS)  # steps at this split and load
        self._samples_since_change = MIN_DECODE_SAMPLES  # the start split is judged at once
        self._ms_per_token: Optional[float] = None
        self._predicted_ttft_ms: Optional[float] = None
        self._backoff_level: dict[int, int] = {}  # split -> wait after its next breach
        self._backoff_left: dict[int, int] = {}  # split -> decisions still to wait
        self._load: Optional[LoadKey] = None  # the decode load now
        self._decided_load: Optional[LoadKey] = None  # the load at the previous decision
        self._processed_tokens = 0
        self._arrived: deque[tuple[float, int]] = deque()  # (t, tokens queued + processed so far)
        self._service_tok_s: dict[int, float] = {}  # split -> prefill tokens/s measured there
        self._changes = 0  # every change of the recorded split since start
        self._last_recorded: Optional[int] = None
        self._steps_since_decision = 0
        self._load_since_decision = False  # a nonzero decode load was observed
        self._stepless_decisions = 0  # consecutive decisions with no step before them

    # --- inputs
    def observe_decode_step(self, ms: float) -> None:
        """One decode step's inter-token time, as the decode side measured it (at the load last observed)."""
        self._decode.append(float(ms))
        self._samples_since_change += 1
        self._steps_since_decision += 1
        if self._load is not None:
            self.table.record(self._load, self.index, ms)

    def observe_decode_load(self, batch_size: int, context_tokens: int = 0) -> None:
        """The decode side's running batch (requests, and their total context when known).

        Call it before the decode steps measured at that load and once more, with the load
        the next prefill batch will run next to, before :meth:`choose`.
        """
        if batch_size < 0 or context_tokens < 0:
            raise ValueError(f"decode load must be >= 0, got batch {batch_size}, context {context_tokens}")
        key = next_load_key(batch_size, context_tokens, self._load)
        if batch_size > 0:
            self._load_since_decision = True
        if self._load is not None and key != self._load:
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
        while self._arrived and now - self._arrived[0][0] > RATE_WINDOW_S:
            self._arrived.popleft()

    def observe_queue(self, queued_tokens: int) -> None:
        """The queue changed without a batch finishing (new arrivals, or it emptied)."""
        if self._ms_per_token is not None:
            self._predicted_ttft_ms = queued_tokens * self._ms_per_token

    # --- state
    def decode_percentile_ms(self) -> Optional[float]:
        return percentile(self._decode) if self._decode else None

    @property
    def decode_load(self) -> Optional[LoadKey]:
        """The (batch, context) load bucket in use, or None before any load was observed."""
        return self._load

    @property
    def predicted_ttft_ms(self) -> Optional[float]:
        return self._predicted_ttft_ms

    def arrival_tok_s(self) -> Optional[float]:
        """Prompt tokens arriving per second over the last RATE_WINDOW_S (None before a quarter of it)."""
        if len(self._arrived) < 2:
            return None
        (t0, a0), (t1, a1) = self._arrived[0], self._arrived[-1]
        if t1 - t0 < RATE_WINDOW_S / 4:
            return None
        return max(0.0, (a1 - a0) / (t1 - t0))

    # --- the decision
    def _wanted(self) -> tuple[str, str]:
        """(direction, reason) from the window and the queue: direction in {'shrink', 'grow', 'relax', ''}."""
        c = self.config
        itl = self.decode_percentile_ms()
        ttft = self._predicted_ttft_ms
        if itl is not None and itl > c.itl_slo_ms:
            return "shrink", f"decode P{ITL_PERCENTILE:g} {itl:.2f} ms > ITL SLO {c.itl_slo_ms:g}"
        if ttft is not None and ttft > c.ttft_slo_ms:
            if itl is None or itl < c.itl_slo_ms * (1 - ITL_HYSTERESIS):
                return "grow", f"predicted TTFT {ttft:.0f} ms > SLO {c.ttft_slo_ms:g} with ITL headroom"
            return "", "TTFT over SLO but no ITL headroom"
        if ttft is not None and ttft < c.ttft_slo_ms * RELAX_FRACTION:
            arrivals, below = self.arrival_tok_s(), self._service_tok_s.get(self.index - 1)
            if arrivals is not None and below and arrivals >= RELAX_ARRIVAL_FRACTION * below:
                return "", f"TTFT low but the split below would not keep up ({arrivals:.0f} tok/s arriving)"
            return "relax", f"predicted TTFT {ttft:.0f} ms < {RELAX_FRACTION:g} x SLO"
        return "", "within band"

    def _guarded(self, index: int) -> tuple[str, Optional[float]]:
        return self.table.guarded(self._load, index)

    def _load_change(self) -> Optional[tuple[int, str]]:
        """Rule 1: (target, reason) when the decode load changed since the previous decision."""
        before, now = self._decided_load, self._load
        self._decided_load = now
        if before is None or now is None or before == now:
            return None
        slo = self.config.itl_slo_ms
        kind, ms = self._guarded(self.index)
        if kind == "known" and ms <= slo:
            return None
        if kind != "known" and not heavier(now, before):
            return None  # lighter load: what held before still holds
        # Only splits measured (or bounded) at the new load: guesses carried over from another
        # load are too noisy to drop to; the drain climbs from there under pressure.
        safe = self.table.largest_known_within(now, self.index, slo)
        why = "not known to hold the ITL SLO" if kind != "known" else f"predicted ITL {ms:.2f} ms > SLO"
        return (0 if safe is None else safe), f"decode load {before} -> {now}, {why}: back to a known-safe split"

    def _drain_target(self) -> int:
        """The largest split above this one predicted within the ITL SLO; one guessed step at most."""
        slo = self.config.itl_slo_ms
        best = self.index
        for j in range(self.index + 1, self.num_partitions):
            if self._backoff_left.get(j, 0) > 0:
                break
            kind, ms = self._guarded(j)
            if kind == "known" and ms <= slo:
                best = j
                continue
            guessed = kind == "guess" and ms <= slo
            explored = kind == "explore" and ms <= slo * (1 - ITL_HYSTERESIS) and j == self.index + 1
            if guessed or explored:
                best = j
            break
        return best

    def _backlog_pressure(self) -> Optional[str]:
        """Why the queue needs the largest safe split now, or None."""
        ttft = self._predicted_ttft_ms
        if ttft is not None and ttft > self.config.ttft_slo_ms * DRAIN_FRACTION:
            return f"predicted TTFT {ttft:.0f} ms > {DRAIN_FRACTION:g} x SLO"
        arrivals, service = self.arrival_tok_s(), self._service_tok_s.get(self.index)
        if arrivals is not None and service and arrivals > ARRIVAL_GROWTH_FRACTION * service:
            return f"arrivals {arrivals:.0f} tok/s > {ARRIVAL_GROWTH_FRACTION:g} x {service:.0f} prefilled here"
        return None

    def _shrink_target(self) -> int:
        """One step down, further while the next lower split is also predicted to breach."""
        target = self.index - 1
        while target > 0:
            ms = self.table.predicted(self._load, target)
            if ms is None or ms <= self.config.itl_slo_ms:
                break
            target -= 1
        return target

    def _decode_idle(self) -> bool:
        """Nothing is decoding next to this decision; consumes the since-last-decision counters.

        No load, or an explicit ``observe_decode_load(0)``: one decision without a step is
        enough. A known load that the caller stopped refreshing (the server sends none with an
        empty decode batch): two decisions in a row without a step, as one can fall between
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
            self._load = (0, 0)  # the decode side's return is then a load change for rule 1
        return True

    def choose(self) -> int:
        """The partition index for the next prefill batch (the module docstring states the rule)."""
        slo = self.config.itl_slo_ms
        idle = self._decode_idle()
        change = self._load_change()
        if idle:
            self._decided_load = (0, 0)  # even without a load ever observed: the next one is a change
        if change is not None and change[0] != self.index:
            self._backoff_left.clear()  # a new load is a new situation: breaches at the old one do not block
            return self._move(change[0], "feed-forward", change[1])
        top = self.num_partitions - 1
        if self._load is not None or idle:
            # Acts on predictions, not on the window, so it need not wait for samples here.
            why = self._backlog_pressure()
            itl = self.decode_percentile_ms()
            if why is not None and (itl is None or itl <= slo):
                if idle:
                    if top > self.index:
                        return self._move(top, "drain", f"{why}; nothing decoding: no ITL to protect")
                else:
                    target = self._drain_target()
                    if target > self.index:
                        kind, ms = self._guarded(target)
                        return self._move(target, "drain", f"{why}; split {target} {kind} at {ms:.2f} ms ITL")
        # Nothing decoding: no samples would ever end the hold.
        if not idle and self._samples_since_change < MIN_DECODE_SAMPLES:
            return self._record(self.index, "cooldown")
        for j in list(self._backoff_left):
            self._backoff_left[j] = max(0, self._backoff_left[j] - 1)
        direction, reason = self._wanted()
        if direction != "shrink" and self.index in self._backoff_level and len(self._decode) >= MIN_DECODE_SAMPLES:
            # The current split meets the ITL SLO on enough samples: forgive its breaches gradually.
            self._backoff_level[self.index] //= 2
        target = self.index
        if direction == "shrink":
            target = self._shrink_target()
        elif direction == "relax":
            target = self.index - 1
        elif direction == "grow" and (idle or self._backoff_left.get(self.index + 1, 0) == 0):
            if idle:
                target, reason = top, reason + "; nothing decoding"
            else:
                # Never into a split without a guarded prediction once the load is known.
                target = self._drain_target() if self._load is not None else self.index + 1
        target = min(max(target, 0), top)
        if target == self.index:
            return self._record(self.index, ("hold: " + reason) if direction else reason)
        if direction == "shrink":
            # The split left broke the ITL SLO: wait longer before trying it again.
            level = min(MAX_BACKOFF, max(MIN_BACKOFF, 2 * self._backoff_level.get(self.index, 0)))
            self._backoff_level[self.index] = self._backoff_left[self.index] = level
        return self._move(target, direction, reason)

    def _move(self, target: int, direction: str, reason: str) -> int:
        self.index = target
        self._samples_since_change = 0
        self._decode.clear()
        return self._record(target, direction + ": " + reason)

    def _record(self, index: int, reason: str) -> int:
        self.history.append(SplitDecision(t=self.clock(), index=index, reason=reason,
                                          decode_pct_ms=self.decode_percentile_ms(),
                                          predicted_ttft_ms=self._predicted_ttft_ms))
        # Counted here, not from the history: the history keeps only the last HISTORY_LIMIT.
        if self._last_recorded is not None and self._last_recorded != index:
            self._changes += 1
            logger.info("[edgeacc prefill] adaptive SM split -> partition %d (%s)", index, reason)
        self._last_recorded = index
        return index

    def changes(self) -> int:
        """How many times the chosen partition changed between recorded decisions since start (the flapping metric)."""
        return self._changes


__all__ = ["AdaptiveSplitConfig", "AdaptiveSplitPolicy", "SplitDecision", "load_key"]
