"""The decode side's inter-token time: measured once, read by the metrics and by the adaptive split.

Inter-token latency here is the time between two consecutive decode results,
whatever the loop did in between. :class:`DecodeStepClock` is its one owner: it
times each processed result against the previous one, and starts over when the
loop idles or processes a result that is not a decode step. Each step it returns
goes to both readers: the ``sglang_edgeacc_decode_*`` series
(:meth:`~sglang_edgeacc.edge_acc_server.metrics.EdgeAccStats.record_decode_step`)
and, for the adaptive split, :class:`DecodeStepWindow`. Only steps that ran next
to a prefill batch say anything about the partition that batch ran on; steps
next to an idle prefill side would be filed under the split in use, so the
window keeps only the former.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

# Bounded, since decoding can go on for a long time between two prefill batches.
MAX_STEPS = 256


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


class DecodeStepWindow:
    """The steps the adaptive split has not seen yet: those beside a prefill, in ms."""

    def __init__(self, enabled: bool):
        # Only the adaptive split reads these; with any other split nothing is kept.
        self.enabled = enabled
        self._steps: deque[float] = deque(maxlen=MAX_STEPS)

    def add(self, step: DecodeStep) -> None:
        if self.enabled and step.beside_prefill:
            self._steps.append(step.seconds * 1e3)

    def take(self) -> tuple[float, ...]:
        """The steps since the previous batch, in ms, and start over."""
        steps = tuple(self._steps)
        self._steps.clear()
        return steps

    def __len__(self) -> int:
        return len(self._steps)
