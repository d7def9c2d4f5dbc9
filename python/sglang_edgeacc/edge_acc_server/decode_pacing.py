"""When decode steps wait, so that queued prompts get the GPU: the SM-split policy of the decode side.

The prefill side runs at below-normal MPS priority, so a decode step always gets
the SMs first; beside a prefill both run slower, and the prefill side keeps only
about 0.8 of the rate it has alone. That rate sets the time to first token, for a
lone prompt as much as for a queue. Decode has slack whenever its steps end well
inside the inter-token target (``--edge-acc-itl-slo-ms``): then the next step need
not start at once. While the prefill side has a batch, the pacer starts each decode
step at the latest time at which its tokens still come the aimed gap after the last
ones of every request it serves, given how long steps beside a prefill took lately;
the prefill side has the whole GPU until then. With the prefill side idle, decode
steps run back to back.

The aimed gap follows the load. While prompts wait behind the batch at the prefill
side (queued, or a second batch in flight, or the rest of a chunked prompt), the
first token of each of them waits for the whole queue, and every share of the GPU
given to the prefill side shortens all of those waits: the gap aims at 0.9 of the
target. While none waits, a wider gap speeds only the batch in flight, and every
running request pays it in full: the gap aims at 0.9 of the calm target
(``CALM_TARGET_MS``) or of the target where that is smaller.

The gap a client sees is between two of its tokens: two decode results, or a
prefill reply's first token and the decode step after it. Spacing the launches
instead would let a gap grow by however much longer a step beside a prefill takes
than the one before it, so the target would need a margin that the prefill side
never gets to use.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

# The gap aimed at, as a share of the target: what a step beside a prefill may take longer than the
# longest of the recent ones stays inside the target.
TARGET_SHARE = 0.9
# The target the gap follows while no prompt waits behind the prefill batch in flight (20 tokens a
# second): a wider one would speed only that batch, and every running request would pay it.
CALM_TARGET_MS = 50.0
# How many steps beside a prefill the prediction of the next one's time looks back on.
RECENT_STEPS = 8
# Steps launched and not yet processed: at most two under the overlap schedule. A result dropped
# unprocessed (a retracting pause) would pair the next result with its launch; the pause idles the pacer.
MAX_UNPROCESSED = 2


def _aimed_gap_s(itl_slo_ms: float) -> float:
    return max(0.0, itl_slo_ms) * TARGET_SHARE / 1000.0


@dataclass(frozen=True)
class PacingDecision:
    wait_s: float  # how long to wait before the next decode step; 0: now


class DecodePacer:
    """Owns the times of the decode steps' launches and results; says how long the next launch waits."""

    def __init__(self, itl_slo_ms: float, clock: Callable[[], float] = time.monotonic):
        self.aimed_gap_s = self.calm_gap_s = 0.0
        self.retarget(itl_slo_ms)
        self._clock = clock
        self._launched: deque[float] = deque(maxlen=MAX_UNPROCESSED)
        self._last_result: Optional[float] = None
        self._beside: deque[float] = deque(maxlen=RECENT_STEPS)  # launch to result, beside a prefill
        self._last_step: Optional[float] = None  # launch to result, of the last step whatever ran beside it
        # When the first of the prefill results processed since the last launch sent out its first tokens:
        # the next step gives those requests their second.
        self._first_tokens_at: Optional[float] = None

    @property
    def enabled(self) -> bool:
        return self.aimed_gap_s > 0

    def retarget(self, itl_slo_ms: float) -> None:
        """Aim at a new target from the next step on; what recent steps took stays (it is the GPU's, not the aim's).

        ``aimed_gap_s``: the gap aimed at while prompts wait behind the prefill batch in flight;
        ``calm_gap_s``: while none waits.
        """
        self.aimed_gap_s = _aimed_gap_s(itl_slo_ms)
        self.calm_gap_s = _aimed_gap_s(min(itl_slo_ms, CALM_TARGET_MS))

    def aim_s(self, prompts_waiting: bool) -> float:
        return self.aimed_gap_s if prompts_waiting else self.calm_gap_s

    def paces(self, prefill_busy: bool, prompts_waiting: bool) -> bool:
        """Whether the next step may wait: while the prefill side has a batch, if steps leave slack.

        Where steps beside a prefill take the whole aimed gap, none waits, and the loop keeps
        the next step's launch ahead of the last one's result (the overlap schedule).
        """
        return self.enabled and prefill_busy and self.predicted_step_s() < self.aim_s(prompts_waiting)

    def predicted_step_s(self) -> float:
        """How long the next step beside a prefill should take: the longest of the recent ones."""
        if self._beside:
            return max(self._beside)
        return self._last_step or 0.0

    def next_step(self, prefill_busy: bool, prompts_waiting: bool) -> PacingDecision:
        """How long the next decode step waits, counted from the oldest last token of the requests it serves.

        That is the last decode result, or the first tokens of a prefill result processed since the
        last launch where they went out earlier (while the step before was still on the device).
        """
        since = [t for t in (self._last_result, self._first_tokens_at) if t is not None]
        if not self.paces(prefill_busy, prompts_waiting) or not since:
            return PacingDecision(0.0)
        latest = min(since) + self.aim_s(prompts_waiting) - self.predicted_step_s()
        return PacingDecision(max(0.0, latest - self._clock()))

    def launched(self) -> None:
        self._launched.append(self._clock())
        self._first_tokens_at = None  # their requests are in this step

    def first_tokens(self) -> None:
        """A prefill result's first tokens went out; their requests decode from the next launch."""
        if self._first_tokens_at is None:
            self._first_tokens_at = self._clock()

    def result(self, decode_step: bool, beside_prefill: bool) -> None:
        """A launched batch's result was processed (in launch order); a decode step's tokens went out."""
        now = self._clock()
        launched_at = self._launched.popleft() if self._launched else None
        if not decode_step:
            return
        self._last_result = now
        if launched_at is None:
            return
        self._last_step = now - launched_at
        if beside_prefill:
            self._beside.append(self._last_step)

    def idle(self) -> None:
        """No decode step ran: the next one has nothing to be spaced from."""
        self._last_result = self._first_tokens_at = None
        self._launched.clear()
