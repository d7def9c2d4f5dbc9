"""When the prefill batch at the head of the link should have its first tokens ready.

Under the overlap schedule the decode loop launches the next step before it reads the
last one's result, and a prefill reply taken while it reads joins the step after the one
just launched: up to three steps from a request's first token to its second. Where the
reply is due before the step on the device ends, reading that result before the next
launch lets the reply join the next step (``DecodePacer.reply_due_during_step``). This
module says when a reply is due, from how long recent batches took per prompt token.

A batch's time is counted from when it could start on the device (its hand-over, or the
previous batch's first tokens, since batches in flight run one after the other on the
prefill side's stream) to its own first tokens on the host, so it covers the fence, the
forward and the reply's copy. The median of the recent rates, not the mean: one batch
slowed by a compile or a long decode step beside it should not move the next prediction.
"""

from __future__ import annotations

import statistics
from collections import deque
from typing import Optional

# How many replies the rate looks back on.
RECENT_REPLIES = 8


class ReplyEta:
    """Owns the recent prefill batches' seconds per prompt token; predicts the next reply's time."""

    def __init__(self):
        self._per_token: deque[float] = deque(maxlen=RECENT_REPLIES)
        self._last_ready: Optional[float] = None

    def _start(self, sent_at: float) -> float:
        return sent_at if self._last_ready is None else max(sent_at, self._last_ready)

    def replied(self, sent_at: float, tokens: int, ready_at: float) -> None:
        """A batch of ``tokens`` prompt tokens sent at ``sent_at`` had its first tokens on the host at ``ready_at``."""
        start = self._start(sent_at)
        if tokens > 0 and ready_at > start:
            self._per_token.append((ready_at - start) / tokens)
        self._last_ready = ready_at

    def due_at(self, sent_at: float, tokens: int) -> Optional[float]:
        """When the batch at the head of the link should reply (``time.monotonic``); None: no rate yet."""
        if not self._per_token or tokens <= 0:
            return None
        return self._start(sent_at) + statistics.median(self._per_token) * tokens
