"""The decode side's inter-token time: measured once, read by the metrics and the long-gap log.

Inter-token latency here is the time between two consecutive decode results,
whatever the loop did in between. :class:`DecodeStepClock` is its one owner: it
times each processed result against the previous one, and starts over when the
loop idles or processes a result that is not a decode step. The loop marks its
parts as it passes them (:meth:`DecodeStepClock.mark`), so each step also says
where its time went. Each step it returns goes to the ``sglang_edgeacc_decode_*``
series (:meth:`~sglang_edgeacc.edge_acc_server.metrics.EdgeAccStats.record_decode_step`),
labelled by whether a prefill batch was in flight beside it, and to
:class:`~sglang_edgeacc.edge_acc_server.long_gaps.LongGapLog`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

# The part the loop is in from the last mark until a result is timed.
RESULT_PART = "decode results"


@dataclass(frozen=True)
class DecodeStep:
    seconds: float  # since the previous decode result
    beside_prefill: bool  # a prefill batch was in flight when this result was processed
    # Where those seconds went: each part of the loop the decode side marked, in the order first marked.
    parts: dict[str, float] = field(default_factory=dict, compare=False)


class DecodeStepClock:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
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
        self._parts[part] = self._parts.get(part, 0.0) + now - self._last_mark
        self._last_mark = now
