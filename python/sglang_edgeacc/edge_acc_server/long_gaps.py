"""Where the decode loop's time went when two decode results came far apart.

A gap between two decode results is a gap in every running request's stream, and
EdgeAcc's promise is that such gaps stay short. When one does not, the log says how
long it was and which part of the decode loop took the time, so a stall can be told
apart from slow decode steps. The parts come with each timed step
(:class:`~sglang_edgeacc.edge_acc_server.decode_step_times.DecodeStep`). A part names
the loop's code, not the call inside it that blocked: for that, every gap is watched
while it lasts, and one that reaches the threshold has Python's stack of every thread
written to the process's stderr at that moment (:class:`StackTimer`).
"""

from __future__ import annotations

import datetime
import faulthandler
import io
import logging
import sys
import time
from typing import Callable, Optional, TextIO

from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStep

logger = logging.getLogger(__name__)

# A gap is reported from this many inter-token targets on (a paced step beside a prefill takes one),
# and never below FLOOR_MS: the streaming SLO the benchmarks hold a server to allows no gap over 100 ms,
# so every gap that breaks it is named.
TARGETS_PER_REPORT = 2
FLOOR_MS = 100.0
# At most one line per interval; the ones held back are counted in the next.
MIN_INTERVAL_S = 1.0


class StackTimer:
    """Writes Python's stack of every thread to ``file`` once ``seconds`` pass without a ``stop``.

    faulthandler's watchdog, a C thread: it writes even while the loop's thread is in a C call
    that holds the interpreter lock (a CUDA call, a kernel compile), which a Python thread
    sampling stacks could not. One per process; starting it again replaces the one running.
    Each start and stop costs tens of microseconds (a thread started and joined).
    """

    def __init__(self, seconds: float, file: Optional[TextIO] = None):
        self.seconds = seconds
        self._file = file if file is not None else sys.stderr
        # What opens the block in the log: faulthandler's own header.
        self.header = f"Timeout ({datetime.timedelta(seconds=seconds)})!"

    def start(self) -> None:
        faulthandler.dump_traceback_later(self.seconds, repeat=False, file=self._file)

    def stop(self) -> None:
        faulthandler.cancel_dump_traceback_later()


class LongGapLog:
    def __init__(self, itl_slo_ms: float, log_prefix: Callable[[], str],
                 clock: Callable[[], float] = time.monotonic, stacks: bool = False,
                 stack_file: Optional[TextIO] = None):
        self.threshold_s = max(TARGETS_PER_REPORT * itl_slo_ms, FLOOR_MS) / 1000.0
        self._log_prefix = log_prefix
        self._clock = clock
        self._last_line: Optional[float] = None
        self._held_back = 0
        # The gap being watched started at _watched_since; after stacks were written, none are for a while.
        self._stacks = StackTimer(self.threshold_s, stack_file) if stacks else None
        self._watched_since: Optional[float] = None
        self._stacks_written_at: Optional[float] = None
        # Every running-batch size a decode result has come from: a stall at the first step of a size is
        # something done once per size (a graph's first replay, a kernel specialised on first use).
        self._sizes: set[int] = set()

    def gap(self, step: Optional[DecodeStep], requests: Optional[int] = None) -> Optional[str]:
        """One decode result (of ``requests`` running requests, where known); returns the line logged, if any.

        ``step`` is None for a result the clock does not time (the first after an idle pass): its batch
        size is still one seen.
        """
        first_of_size = requests is not None and requests not in self._sizes
        if requests is not None:
            self._sizes.add(requests)
        stacks_written = self._stop_watching()
        try:
            return self._report(step, requests, first_of_size, stacks_written)
        finally:
            self._watch()

    def idle(self) -> None:
        """No decode result is due (the loop idles, or runs a batch that is not a decode step): nothing to watch."""
        self._stop_watching()

    def _watch(self) -> None:
        if self._stacks is None:
            return
        now = self._clock()
        if self._stacks_written_at is not None and now - self._stacks_written_at < MIN_INTERVAL_S:
            return
        try:
            self._stacks.start()
        except (AttributeError, ValueError, io.UnsupportedOperation) as exc:  # a stderr without a descriptor
            logger.warning("%s long gaps are reported without Python's stacks: %s", self._log_prefix(), exc)
            self._stacks = None
            return
        self._watched_since = now

    def _stop_watching(self) -> bool:
        """Stops the gap's watch; whether its stacks were written (the gap reached the threshold)."""
        if self._watched_since is None:
            return False
        self._stacks.stop()
        now = self._clock()
        written = now - self._watched_since >= self.threshold_s
        self._watched_since = None
        if written:
            self._stacks_written_at = now
        return written

    def _report(self, step: Optional[DecodeStep], requests: Optional[int], first_of_size: bool,
                stacks_written: bool) -> Optional[str]:
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
        if stacks_written:
            line += (f"; every thread's Python stack {self.threshold_s * 1000:.0f} ms into it is above in this "
                     f"log, after \"{self._stacks.header}\" (the decode loop's is the one through "
                     "event_loop_edge_acc_decode)")
        logger.warning(line)
        return line
