"""Whether a prefill batch must wait for the decode step in flight: only while that step may write a freed slot.

The decode side allocates a prefill batch's KV slots. With the overlap schedule
a decode step is still running on the GPU while the result of the step before
it is processed, and that processing gives back the slots of the requests that
finished (a request is in the running step when the step before it finishes it,
and the running step writes one more slot for it); a retraction or a preemption
gives back a running request's slots in the same way. The allocator may hand
such a slot to the next prefill batch. Upstream runs both forwards on one
stream, so that write lands first; the prefill side runs on another stream of
another process, so its fence has to wait for the decode step then, and only
then: a fence that always waited would hold every prefill batch back by up to one
decode step, a lone prompt's included.

Slots that the radix cache evicts are not counted: a node it can evict belongs to
no running request, so no step in flight writes it (a request that just finished
may still read it in the running step, whose token for that request is dropped).
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol


class _Event(Protocol):
    def record(self, stream=None) -> None: ...

    def query(self) -> bool: ...


class FreedSlotGuard:
    """One owner of "the latest decode step launched before a slot was given back, unless it has ended"."""

    def __init__(self, new_event: Optional[Callable[[], _Event]]):
        # None where no step runs asynchronously (the CPU platform): nothing is ever in flight.
        self._new_event = new_event
        self._last_launch: Optional[_Event] = None
        self._writer: Optional[_Event] = None

    @classmethod
    def for_device(cls, device) -> "FreedSlotGuard":
        import torch

        if torch.device(device).type != "cuda":
            return cls(None)
        return cls(lambda: torch.cuda.Event(enable_timing=False))

    def launched(self, stream) -> None:
        """A decode step was just enqueued on ``stream``."""
        if self._new_event is None:
            return
        event = self._new_event()
        event.record(stream)
        self._last_launch = event

    def freed(self) -> None:
        """Slots were given back now: the latest step launched may still write some of them."""
        if self._last_launch is not None:
            self._writer = self._last_launch

    def prefill_must_wait(self) -> bool:
        """Whether a prefill batch allocated now must wait for the decode steps in flight."""
        if self._writer is None:
            return False
        if self._writer.query():
            self._writer = None
            return False
        return True
