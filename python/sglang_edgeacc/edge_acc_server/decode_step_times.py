"""The decode side's inter-token time: measured once, read by the metrics and the long-gap log.

Inter-token latency here is the time between two consecutive decode results,
whatever the loop did in between. :class:`DecodeStepClock` is its one owner: it
times each processed result against the previous one, and starts over when the
loop idles or processes a result that is not a decode step. The loop marks its
parts as it passes them (:meth:`DecodeStepClock.mark`), so each step also says
where its time went; the time the interpreter's garbage collector took inside a
part is its own part (:data:`GC_PART`), so a collection that stops the loop is
named as such and not blamed on the code it interrupted. Each step it returns goes
to the ``sglang_edgeacc_decode_*`` series (:meth:`~sglang_edgeacc.edge_acc_server.metrics.EdgeAccStats.record_decode_step`),
labelled by whether a prefill batch was in flight beside it, and to
:class:`~sglang_edgeacc.edge_acc_server.long_gaps.LongGapLog`.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# The part the loop is in from the last mark until a result is timed.
RESULT_PART = "decode results"
# Collections of the interpreter's garbage collector, wherever in the loop they ran.
GC_PART = "garbage collection"


class GcTimer:
    """The time the garbage collector has taken in this process since the timer was started.

    A collection stops every thread of the interpreter, the decode loop's included;
    ``gc.callbacks`` brackets each one, so its time is known to the clock's resolution.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._started: Optional[float] = None
        self.total = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = self._clock()
        elif self._started is not None:
            self.total += self._clock() - self._started
            self._started = None

    def stop(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)


@dataclass(frozen=True)
class DecodeStep:
    seconds: float  # since the previous decode result
    beside_prefill: bool  # a prefill batch was in flight when this result was processed
    # Where those seconds went: each part of the loop the decode side marked, in the order first marked.
    parts: dict[str, float] = field(default_factory=dict, compare=False)


class DecodeStepClock:
    def __init__(self, clock: Callable[[], float] = time.perf_counter, gc_timer: Optional[GcTimer] = None):
        self._clock = clock
        self._gc = gc_timer
        self._gc_seen = gc_timer.total if gc_timer is not None else 0.0
        self._last_done: Optional[float] = None
        self._last_mark = clock()
        self._parts: dict[str, float] = {}

    def mark(self, part: str) -> None:
        """The loop has just finished ``part``: the time since the previous mark is its."""
        self._add(part, self._clock())

    def result(self, is_decode: bool, beside_prefill: bool) -> Optional[DecodeStep]:
        """One result processed: the decode step it ends, or None when there is no interval to time
        (the first decode result after a reset, or a result that is not a decode step)."""
        now = self._clock()
        self._add(RESULT_PART, now)
        parts, self._parts = self._parts, {}
        if not is_decode:
            self._last_done = None
            return None
        last, self._last_done = self._last_done, now
        if last is None:
            return None
        return DecodeStep(seconds=now - last, beside_prefill=beside_prefill, parts=parts)

    def idle(self) -> None:
        """No decode step this iteration: the next one starts a new interval."""
        self._last_done = None
        self._parts = {}

    def _add(self, part: str, now: float) -> None:
        spent = now - self._last_mark
        if self._gc is not None:
            collected, self._gc_seen = self._gc.total - self._gc_seen, self._gc.total
            collected = min(collected, spent)
            if collected > 0:
                self._parts[GC_PART] = self._parts.get(GC_PART, 0.0) + collected
                spent -= collected
        self._parts[part] = self._parts.get(part, 0.0) + spent
        self._last_mark = now
