"""The decode side's inter-token times, as the adaptive split reads them.

The adaptive split is driven by inter-token latency: the time between two
consecutive decode results, whatever the loop did in between. Only steps that
ran next to a prefill batch say anything about the partition that batch ran
on; steps next to an idle prefill side would be filed under the split in use.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional

# Bounded, since decoding can go on for a long time between two prefill batches.
MAX_STEPS = 256


class DecodeStepTimes:
    def __init__(self, enabled: bool):
        # Only the adaptive split reads these; with any other split nothing is kept.
        self.enabled = enabled
        self._steps: deque[float] = deque(maxlen=MAX_STEPS)
        self._last_done: Optional[float] = None

    def record(self, batch, prefill_in_flight: bool) -> None:
        """One result processed; ``prefill_in_flight`` says whether a prefill batch ran next to it."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if not batch.forward_mode.is_decode():
            self._last_done = None
            return
        if self._last_done is not None and prefill_in_flight:
            self._steps.append((now - self._last_done) * 1e3)
        self._last_done = now

    def idle(self) -> None:
        """No decode step this iteration: the next one starts a new interval."""
        self._last_done = None

    def take(self) -> tuple[float, ...]:
        """The steps since the previous batch, in ms, and start over."""
        steps = tuple(self._steps)
        self._steps.clear()
        return steps

    def __len__(self) -> int:
        return len(self._steps)
