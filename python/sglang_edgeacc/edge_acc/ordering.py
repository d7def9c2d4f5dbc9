"""Explicit cross-process GPU ordering between EdgeAcc's prefill and decode sides.

A message on a socket is not a memory fence: when the decode side writes
``req_to_token`` on its stream and then sends "prefill these rids", the kernel may
still be queued when the prefill side's stream reads the table. The same holds
for the KV the prefill side writes and the decode side then attends over.

The pattern, one fence pair per direction::

    # writer process (e.g. decode side, after writing req_to_token on `stream`)
    fence = WriteFence(device)                       # once; owns a ring of IPC events
    token = fence.signal(stream)                     # records the next event of the ring
    send((message, token))                           # the token pickles

    # reader process (e.g. prefill side, before reading on its stream)
    waiter = ReadFence(device)                       # once; caches opened events
    waiter.wait(token, stream)                       # the GPU waits, the host does not

Modes (:class:`FenceMode`):

* ``"event"`` (CUDA default): ``torch.cuda.Event(interprocess=True)``; the reader
  opens it with ``torch.cuda.Event.from_ipc_handle`` and enqueues
  ``cudaStreamWaitEvent`` on its stream. The writer reuses a ring of
  ``ring_size`` events instead of creating one per handoff. Reusing a slot is safe:
  a wait binds to the event's most recent record at the moment ``wait`` is
  called, so a re-recorded slot can only make a reader wait for *later* work,
  never for less. Keep fewer than ``ring_size`` tokens in flight (signalled but
  not yet waited on): beyond that a reader may wait for later writer work, and if
  that later work itself waits on this reader (fences in both directions), the two
  streams wait on each other. A request/reply handoff has one token in flight.
* ``"host"``: the documented fallback. ``signal`` synchronizes the writer's stream
  before returning, so the writes are complete before the message leaves;
  ``wait`` is a no-op. Costs the writer a host stall per handoff.
* ``"none"``: the CPU platform. Tensors are written by the host before the
  message is sent, so program order is the fence; both calls are no-ops that
  still return and accept :class:`OrderingToken`.

A fence orders write-then-read. For the opposite hazard (the writer overwriting
memory the reader is still reading, e.g. KV slots freed and reused), the reader
signals its own ``WriteFence`` after its reads and the writer waits on that token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Optional

import torch

logger = logging.getLogger(__name__)

FenceMode = Literal["event", "host", "none"]
FENCE_MODES: tuple[str, ...] = ("event", "host", "none")
DEFAULT_RING_SIZE = 64


class OrderingError(RuntimeError):
    """A token cannot be used by this fence (wrong device, wrong platform)."""


@dataclass(frozen=True)
class OrderingToken:
    """Proof that the writer's GPU work up to ``sequence`` is ordered before the reader's."""

    mode: str
    sequence: int
    device_index: int = -1
    slot: int = -1
    event_handle: bytes = b""


def _device_index(device: Optional[torch.device | str | int]) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def default_fence_mode(device: Optional[torch.device | str | int] = None) -> str:
    """``"event"`` for a CUDA device (or none given with CUDA present), else ``"none"``."""
    if device is None:
        return "event" if torch.cuda.is_available() else "none"
    if isinstance(device, int):
        return "event"
    return "event" if torch.device(device).type == "cuda" else "none"


class WriteFence:
    """Writer side: ``signal(stream)`` after enqueuing writes, send the token along."""

    def __init__(
        self,
        device: Optional[torch.device | str | int] = None,
        *,
        mode: Optional[str] = None,
        ring_size: int = DEFAULT_RING_SIZE,
    ):
        self.mode = default_fence_mode(device) if mode is None else mode
        if self.mode not in FENCE_MODES:
            raise ValueError(f"WriteFence: mode must be one of {FENCE_MODES}, got {self.mode!r}")
        if ring_size < 1:
            raise ValueError(f"WriteFence: ring_size must be >= 1, got {ring_size}")
        self._sequence = 0
        self._events: list[torch.cuda.Event] = []
        self._handles: list[bytes] = []
        self.device_index = -1
        if self.mode in ("event", "host"):
            if not torch.cuda.is_available():
                raise OrderingError(f"WriteFence: mode {self.mode!r} needs CUDA; use mode 'none' on the CPU")
            self.device_index = _device_index(device)
        if self.mode == "event":
            with torch.cuda.device(self.device_index):
                for _ in range(ring_size):
                    event = torch.cuda.Event(interprocess=True)
                    # Recording once creates the event on this device and makes an
                    # early wait on an unused slot complete at once.
                    event.record()
                    self._events.append(event)
                    self._handles.append(bytes(event.ipc_handle()))

    @property
    def ring_size(self) -> int:
        return len(self._events)

    def signal(self, stream: Optional[torch.cuda.Stream] = None) -> OrderingToken:
        """Order everything enqueued on ``stream`` (default: current) before the token's readers."""
        self._sequence += 1
        if self.mode == "none":
            return OrderingToken(mode="none", sequence=self._sequence)
        stream = torch.cuda.current_stream(self.device_index) if stream is None else stream
        if self.mode == "host":
            stream.synchronize()
            return OrderingToken(mode="host", sequence=self._sequence, device_index=self.device_index)
        slot = self._sequence % len(self._events)
        self._events[slot].record(stream)
        return OrderingToken(
            mode="event",
            sequence=self._sequence,
            device_index=self.device_index,
            slot=slot,
            event_handle=self._handles[slot],
        )


class ReadFence:
    """Reader side: ``wait(token, stream)`` before enqueuing the reads of the writer's data."""

    def __init__(self, device: Optional[torch.device | str | int] = None):
        self.device_type = "cuda" if default_fence_mode(device) == "event" else "cpu"
        self.device_index = _device_index(device) if self.device_type == "cuda" else -1
        self._opened: dict[bytes, torch.cuda.Event] = {}
        self.last_sequence = 0

    def wait(self, token: OrderingToken, stream: Optional[torch.cuda.Stream] = None) -> None:
        if not isinstance(token, OrderingToken):
            raise OrderingError(f"ReadFence.wait: expected an OrderingToken, got {type(token).__name__}")
        self.last_sequence = token.sequence
        if token.mode in ("none", "host"):
            return
        if self.device_type != "cuda":
            raise OrderingError("ReadFence.wait: an event token reached a CPU reader; both sides must use one platform")
        if token.device_index != self.device_index:
            raise OrderingError(
                f"ReadFence.wait: token from cuda:{token.device_index} on a reader for cuda:{self.device_index}; "
                f"the two EdgeAcc sides of one GPU must use the same device"
            )
        event = self._opened.get(token.event_handle)
        if event is None:
            event = torch.cuda.Event.from_ipc_handle(self.device_index, token.event_handle)
            self._opened[token.event_handle] = event
        stream = torch.cuda.current_stream(self.device_index) if stream is None else stream
        event.wait(stream)


__all__ = [
    "DEFAULT_RING_SIZE",
    "FENCE_MODES",
    "FenceMode",
    "OrderingError",
    "OrderingToken",
    "ReadFence",
    "WriteFence",
    "default_fence_mode",
]
