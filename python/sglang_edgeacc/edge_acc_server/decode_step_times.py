"""The decode side's inter-token time: measured once, read by the metrics.

Inter-token latency here is the time between two consecutive decode results,
whatever the loop did in between. :class:`DecodeStepClock` is its one owner: it
times each processed result against the previous one, and starts over when the
loop idles or processes a result that is not a decode step. Each step it returns
goes to the ``sglang_edgeacc_decode_*`` series
(:meth:`~sglang_edgeacc.edge_acc_server.metrics.EdgeAccStats.record_decode_step`),
labelled by whether a prefill batch was in flight beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class DecodeStep:
    seconds: float  # since the previous decode result
    beside_prefill: bool  # a prefill batch was in flight when this result was processed


class DecodeStepClock:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._last_done: Optional[float] = None

    def result(self, is_decode: bool, beside_prefill: bool) -> Optional[DecodeStep]:
        """One result processed: the decode step it ends, or None when there is no interval to time
        (the first decode result after a reset, or a result that is not a decode step)."""
        now = self._clock()
        if not is_decode:
            self._last_done = None
            return None
        last, self._last_done = self._last_done, now
        if last is None:
            return None
        return DecodeStep(seconds=now - last, beside_prefill=beside_prefill)

    def idle(self) -> None:
        """No decode step this iteration: the next one starts a new interval."""
        self._last_done = None

