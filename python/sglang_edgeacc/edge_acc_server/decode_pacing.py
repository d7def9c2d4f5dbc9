"""When decode steps wait, so that queued prompts get the GPU: the SM-split policy of the decode side.

The prefill side runs at below-normal MPS priority, so a decode step always gets
the SMs first; beside a prefill both run slower, and the prefill side keeps only
about 0.8 of the rate it has alone. That rate sets the time to first token, for a
lone prompt as much as for a queue. Decode has slack whenever its steps finish
well inside the inter-token target (``--edge-acc-itl-slo-ms``): then the next
step need not start at once. The pacer spaces decode steps to a fraction of that
target while the prefill side has a batch, and the prefill side has the whole GPU
in the gaps. With the prefill side idle, decode steps run back to back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

# Steps are spaced to this share of the inter-token target: what a step beside a
# prefill may take longer than the one before it stays inside the target.
TARGET_SHARE = 0.8


@dataclass(frozen=True)
class PacingDecision:
    wait_s: float  # how long to wait before the next decode step; 0: now


class DecodePacer:
    """Owns the time of the last decode launch; says how long the next one waits."""

    def __init__(self, itl_slo_ms: float, clock: Callable[[], float] = time.monotonic):
        self.interval_s = max(0.0, itl_slo_ms) * TARGET_SHARE / 1000.0
        self._clock = clock
        self._last_launch: Optional[float] = None

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def next_step(self, prefill_busy: bool) -> PacingDecision:
        """How long the next decode step waits: only while the prefill side has a batch."""
        if not (self.enabled and prefill_busy) or self._last_launch is None:
            return PacingDecision(0.0)
        return PacingDecision(max(0.0, self._last_launch + self.interval_s - self._clock()))

    def launched(self) -> None:
        self._last_launch = self._clock()

    def idle(self) -> None:
        """No decode step ran: the next one has nothing to be spaced from."""
        self._last_launch = None
