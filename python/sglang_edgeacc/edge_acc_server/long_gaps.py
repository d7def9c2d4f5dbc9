"""Where the decode loop's time went when two decode results came far apart.

A gap between two decode results is a gap in every running request's stream, and
EdgeAcc's promise is that such gaps stay short. When one does not, the log says how
long it was and which part of the decode loop took the time, so a stall can be told
apart from slow decode steps: the loop marks its parts as it passes them
(:meth:`LoopParts.mark`), and the decode side hands each timed gap with the parts
since the previous result to :class:`LongGapLog`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# A gap is reported from this many inter-token targets on (a paced step beside a prefill takes one),
# and never below FLOOR_MS.
TARGETS_PER_REPORT = 4
FLOOR_MS = 200.0
# At most one line per interval; the ones held back are counted in the next.
MIN_INTERVAL_S = 1.0


class LoopParts:
    """Owns the time each part of the decode loop took since the last decode result."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._last = clock()
        self._spent: dict[str, float] = {}

    def mark(self, part: str) -> None:
        """The loop has just finished ``part``: the time since the previous mark is its."""
        now = self._clock()
        self._spent[part] = self._spent.get(part, 0.0) + now - self._last
        self._last = now

    def take(self) -> dict[str, float]:
        """The parts since the last take, in the order first marked; counting starts over."""
        spent, self._spent = self._spent, {}
        return spent


class LongGapLog:
    def __init__(self, itl_slo_ms: float, log_prefix: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic):
        self.threshold_s = max(TARGETS_PER_REPORT * itl_slo_ms, FLOOR_MS) / 1000.0
        self._log_prefix = log_prefix
        self._clock = clock
        self._last_line: Optional[float] = None
        self._held_back = 0

    def gap(self, seconds: float, parts: dict[str, float]) -> Optional[str]:
        """One timed gap and the loop's parts within it; returns the line logged, if any."""
        if seconds < self.threshold_s:
            return None
        now = self._clock()
        if self._last_line is not None and now - self._last_line < MIN_INTERVAL_S:
            self._held_back += 1
            return None
        self._last_line = now
        where = ", ".join(f"{part} {spent * 1000:.0f}" for part, spent in
                          sorted(parts.items(), key=lambda item: item[1], reverse=True))
        line = (f"{self._log_prefix()} {seconds * 1000:.0f} ms between two decode results "
                f"(reported from {self.threshold_s * 1000:.0f} ms); the loop's parts in ms: {where}")
        if self._held_back:
            line += f"; {self._held_back} more such gaps since the last report"
            self._held_back = 0
        logger.warning(line)
        return line
