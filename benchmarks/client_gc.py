"""The benchmark client's own garbage-collector pauses: kept out of what it measures, and recorded.

``bench_serving`` times every streamed token in one Python process. Importing it
brings about 850,000 objects (sglang, torch, ``datasets``); a full collection of
that heap takes about 0.3 s, and while it runs no stream is read and no request is
sent, so every running request shows a gap and every arrival a later first token
that the server never caused. The client therefore collects and freezes its heap
before each run, as sglang freezes its own processes after warmup, and records every
collection during the run so a report can tell a client pause from a server stall.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field

# A collection at least this long is listed on its own; shorter ones are only counted.
LISTED_MS = 20.0


@dataclass
class ClientPauses:
    """Every collection of the client's heap from :meth:`start` to :meth:`stop`."""

    collections: int = 0
    by_generation: dict[int, int] = field(default_factory=dict)
    total_ms: float = 0.0
    max_ms: float = 0.0
    listed: list[dict] = field(default_factory=list)  # {"generation", "ms", "at_s"} for each >= LISTED_MS
    frozen_objects: int = 0
    _began: float | None = field(default=None, repr=False)
    _origin: float = field(default=0.0, repr=False)

    def start(self) -> "ClientPauses":
        """Freeze what the client holds now (imports, earlier runs), then time every collection after."""
        gc.collect()
        gc.freeze()
        self.frozen_objects = gc.get_freeze_count()
        self._origin = time.perf_counter()
        gc.callbacks.append(self._on_gc)
        return self

    def stop(self) -> dict:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        return {"collections": self.collections, "by_generation": dict(self.by_generation),
                "total_ms": round(self.total_ms, 3), "max_ms": round(self.max_ms, 3), "listed": self.listed,
                "frozen_objects": self.frozen_objects}

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
            return
        if self._began is None:
            return
        ms = (now - self._began) * 1000
        self._began = None
        self.collections += 1
        generation = info.get("generation")
        self.by_generation[generation] = self.by_generation.get(generation, 0) + 1
        self.total_ms += ms
        self.max_ms = max(self.max_ms, ms)
        if ms >= LISTED_MS:
            self.listed.append({"generation": generation, "ms": round(ms, 3),
                                "at_s": round(now - self._origin, 3)})
