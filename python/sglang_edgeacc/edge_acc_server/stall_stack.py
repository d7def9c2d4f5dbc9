"""Where the decode loop is while a gap between decode results lasts: its Python stack, taken during the gap.

The long-gap line names the part of the loop that took the time; the call inside it
that blocked (a synchronisation, a kernel compile, a lock) shows only in the loop's
stack while it blocks. A daemon thread takes that stack once an interval the loop
watches reaches the threshold and logs it at once. The loop only writes a time per
decode result; the thread sleeps until the interval's deadline.

The stack is taken with the interpreter lock held (``sys._current_frames``), which is
what makes reading another thread's frames safe. A call that keeps the lock for the
whole stall (a C call that does not release it) lets the thread in only when it
returns: the line then says how late the stack was taken.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Callable, Optional

logger = logging.getLogger(__name__)

# A stack taken this long after the threshold was held back by the loop itself.
LATE_S = 0.05


class StallStack:
    def __init__(self, seconds: float, log_prefix: Callable[[], str], min_interval_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self._log_prefix = log_prefix
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._thread_id = threading.get_ident()  # the loop's: the one that builds this
        # The watched interval's start (None: nothing is watched) and the last one whose stack was taken.
        self._since: Optional[float] = None
        self._taken_for: Optional[float] = None
        self._taken_at: Optional[float] = None
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="edgeacc-stall-stack", daemon=True).start()

    def watch(self) -> None:
        """A new interval starts now (a decode result was just processed)."""
        was_idle = self._since is None
        self._since = self._clock()
        if was_idle:
            self._wake.set()

    def retime(self, seconds: float) -> None:
        """Take stacks from ``seconds`` into an interval on, the one being watched included."""
        self.seconds = seconds
        self._wake.set()  # the thread may be asleep until the old deadline

    def stop(self) -> bool:
        """The interval ends; whether its stack was taken."""
        since, self._since = self._since, None
        return since is not None and self._taken_for == since

    def _run(self) -> None:
        while True:
            since = self._since
            if since is None:
                self._wake.wait()
                self._wake.clear()
                continue
            if self._taken_for == since:  # this interval's stack is out: wait for the next interval
                self._wake.wait(self.seconds)
                self._wake.clear()
                continue
            now = self._clock()
            due = since + self.seconds
            if self._taken_at is not None:
                due = max(due, self._taken_at + self._min_interval_s)
            if now < due:
                self._wake.wait(due - now)
                self._wake.clear()
                continue
            self._take(since, now)

    def _take(self, since: float, now: float) -> None:
        frame = sys._current_frames().get(self._thread_id)
        if frame is None or self._since != since:
            return  # the interval ended meanwhile
        stack = "".join(traceback.format_stack(frame))
        self._taken_for, self._taken_at = since, now
        late = now - since - self.seconds
        held = (f" (taken {late * 1000:.0f} ms after that: until then the loop kept the interpreter, in a call "
                "that does not release it)") if late > LATE_S else ""
        logger.warning("%s no decode result for %.0f ms%s; the decode loop is in:\n%s", self._log_prefix(),
                       (now - since) * 1000, held, stack.rstrip("\n"))
