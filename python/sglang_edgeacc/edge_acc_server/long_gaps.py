"""Where the decode loop's time went when two decode results came far apart.

A gap between two decode results is a gap in every running request's stream, and
EdgeAcc's promise is that such gaps stay short. When one does not, the log says how
long it was and which part of the decode loop took the time, so a stall can be told
apart from slow decode steps. The parts come with each timed step
(:class:`~sglang_edgeacc.edge_acc_server.decode_step_times.DecodeStep`). A part names
the loop's code, not the call inside it that blocked: for that, every gap is watched
while it lasts, and the loop's stack is logged once a gap reaches the threshold
(:class:`~sglang_edgeacc.edge_acc_server.stall_stack.StallStack`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStep
from sglang_edgeacc.edge_acc_server.stall_stack import StallStack

logger = logging.getLogger(__name__)

# A gap is reported from this many inter-token targets on (a paced step beside a prefill takes one),
# and never below FLOOR_MS: the streaming SLO the benchmarks hold a server to allows no gap over 100 ms,
# so every gap that breaks it is named.
TARGETS_PER_REPORT = 2
FLOOR_MS = 100.0
# At most one line (and one stack) per interval; the lines held back are counted in the next.
MIN_INTERVAL_S = 1.0


def _threshold_s(itl_slo_ms: float) -> float:
    return max(TARGETS_PER_REPORT * itl_slo_ms, FLOOR_MS) / 1000.0


class LongGapLog:
    def __init__(self, itl_slo_ms: float, log_prefix: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic, stacks: bool = False):
        self.threshold_s = _threshold_s(itl_slo_ms)
        self._log_prefix = log_prefix
        self._clock = clock
        self._last_line: Optional[float] = None
        self._held_back = 0
        # Built in the loop's thread: the stacks it takes are that thread's.
        self._stacks = StallStack(self.threshold_s, log_prefix, MIN_INTERVAL_S) if stacks else None
        # Every running-batch size a decode result has come from: a stall at the first step of a size is
        # something done once per size (a graph's first replay, a kernel specialised on first use).
        self._sizes: set[int] = set()

    def retarget(self, itl_slo_ms: float) -> None:
        """Report from the threshold of a new inter-token target on, the gap being watched included."""
        self.threshold_s = _threshold_s(itl_slo_ms)
        if self._stacks is not None:
            self._stacks.retime(self.threshold_s)

    def gap(self, step: Optional[DecodeStep], requests: Optional[int] = None) -> Optional[str]:
        """One decode result (of ``requests`` running requests, where known); returns the line logged, if any.

        ``step`` is None for a result the clock does not time (the first after an idle pass): its batch
        size is still one seen.
        """
        first_of_size = requests is not None and requests not in self._sizes
        if requests is not None:
            self._sizes.add(requests)
        stack_taken = self._stop_watching()
        try:
            return self._report(step, requests, first_of_size, stack_taken)
        finally:
            self._watch()

    def idle(self) -> None:
        """No decode result is due (the loop idles, or runs a batch that is not a decode step): nothing to watch."""
        self._stop_watching()

    def _watch(self) -> None:
        if self._stacks is not None:
            self._stacks.watch()

    def _stop_watching(self) -> bool:
        """Stops the gap's watch; whether the loop's stack was taken during it."""
        return self._stacks is not None and self._stacks.stop()

    def _report(self, step: Optional[DecodeStep], requests: Optional[int], first_of_size: bool,
                stack_taken: bool) -> Optional[str]:
        if step is None:
            return None
        seconds = step.seconds
        if seconds < self.threshold_s:
            return None
        now = self._clock()
        if self._last_line is not None and now - self._last_line < MIN_INTERVAL_S:
            self._held_back += 1
            return None
        self._last_line = now
        where = ", ".join(f"{part} {spent * 1000:.0f}" for part, spent in
                          sorted(step.parts.items(), key=lambda item: item[1], reverse=True))
        of_batch = f" of {requests} running requests" if requests is not None else ""
        if first_of_size:
            of_batch += ", the first step of that many"
        line = (f"{self._log_prefix()} {seconds * 1000:.0f} ms between two decode results{of_batch} "
                f"(reported from {self.threshold_s * 1000:.0f} ms); the loop's parts in ms: {where}")
        if self._held_back:
            line += f"; {self._held_back} more such gaps since the last report"
            self._held_back = 0
        if stack_taken:
            line += (f"; the decode loop's stack {self.threshold_s * 1000:.0f} ms into it is logged above "
                     "(\"no decode result for ...\")")
        logger.warning(line)
        return line
