"""What a decode step costs at each SM split under each decode load: measured, or predicted.

The adaptive split (:mod:`.adaptive_split`) has to judge a split at the decode load now
before decode has stepped next to it there: trying a split first and measuring after is
exactly what breaks the ITL SLO. So decode-step times are kept per cell (load bucket,
split), and a cell with too few fresh samples borrows from others, most trusted first:

* **bound**: the same split measured under a load at least as heavy in every known
  dimension (decode at a lighter load was never slower at the same split on an H200);
* **carried over**: a split measured under both this load and another one scales the other
  load's measurement at this split (towards a heavier load the ratio is raised to
  ``1 + HEAVIER_LOAD_EXPONENT`` per doubling);
* **extrapolated**: a secant over the splits measured at this load, in the SMs prefill
  leaves decode; trusted for the first split above them only.

A decode load is (running requests, their total context tokens), each bucketed by doubling
with a dead band (:func:`next_load_key`). Standard library only: the policy runs wherever
the decode side's messages are read, and only the partitions need a GPU.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

LoadKey = tuple[int, int]  # (decode batch bucket, decode context tokens bucket); 0: unknown

ITL_PERCENTILE = 99.0  # the decode-step percentile the ITL SLO is held to
ITL_WINDOW_STEPS = 64  # decode steps a percentile is taken over (the policy's window and each cell)
MIN_CELL_SAMPLES = 8  # decode steps a cell needs before it predicts
CELL_TTL_S = 60.0  # the load's mix drifts: a cell not refreshed for this long predicts nothing
# On an H200 a doubled decode batch turned a split's slowdown r into about r ** 1.5; plain
# ratios under-predicted the heavier load and picked a split that breached.
HEAVIER_LOAD_EXPONENT = 0.5
# The secant runs in x = 1 / (total SMs + this - split SMs): decode squeezed into the SMs
# prefill leaves it, softened because decode also runs inside the prefill partition at a
# higher priority. On an H200 at decode batch 64 it came within 10 % one split above the
# measured ones and under-predicted further up, hence one split at most.
EXTRAPOLATION_SM_OFFSET = 16
# The whole-GPU least-priority top is no green context: prefill there is unconfined and
# yields only at block boundaries, so the secant over the confined splits under-predicts it.
# Until measured at a load it is the split below times this (1.27-1.42 measured on an H200).
UNCONFINED_TOP_FACTOR = 1.45
# Width in doublings of the dead band above each power of two (see _sticky_bucket). Requests
# grow and finish continuously, so the total context hovers at a power of two for long
# stretches; a quarter doubling (19 %) is wider than that wobble and narrower than the 2x a
# bucket stands for. Without it every crossing was a load change that moved the split.
LOAD_BUCKET_HYSTERESIS = 0.25


def percentile(values: Sequence[float]) -> float:
    """The ITL_PERCENTILE of ``values`` (nearest rank)."""
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(ITL_PERCENTILE / 100 * (len(ordered) - 1))))
    return ordered[idx]


def _pow2_bucket(n: int) -> int:
    """The smallest power of two >= n (0 for unknown): one bucket per doubling of the load."""
    return 0 if n <= 0 else 1 << (int(n) - 1).bit_length()


def _sticky_bucket(value: int, current: int) -> int:
    """The doubling bucket of ``value``, but ``current`` while ``value`` is in the dead band above it.

    A Schmitt trigger on each power of two ``p``: a value in bucket ``p`` (``(p/2, p]``) moves up
    only above ``p x 2**LOAD_BUCKET_HYSTERESIS``; one in a heavier bucket moves down at ``p``.
    The band lies above ``p`` rather than around it because loads sit exactly on powers of two
    (batch caps, CUDA-graph sizes): 64 must stay bucket 64 from either side. Unknown (0) on
    either side moves at once.
    """
    fresh = _pow2_bucket(value)
    if not current or not fresh or fresh <= current:
        return fresh
    return fresh if value > current * 2.0 ** LOAD_BUCKET_HYSTERESIS else current


def load_key(batch_size: int, context_tokens: int = 0) -> LoadKey:
    """The plain doubling buckets of a decode load."""
    return (_pow2_bucket(batch_size), _pow2_bucket(context_tokens))


def next_load_key(batch_size: int, context_tokens: int, current: Optional[LoadKey]) -> LoadKey:
    """The bucket of a decode load that was ``current`` before (None: the first load seen)."""
    if current is None:
        return load_key(batch_size, context_tokens)
    return (_sticky_bucket(batch_size, current[0]), _sticky_bucket(context_tokens, current[1]))


def _doublings(heavy: LoadKey, light: LoadKey) -> float:
    """How many doublings of load ``heavy`` is above ``light`` (0 when it is not heavier)."""
    ratio = (heavy[0] / light[0]) if heavy[0] and light[0] else 1.0
    if heavy[1] and light[1]:
        ratio *= heavy[1] / light[1]
    return max(0.0, math.log2(ratio)) if ratio > 0 else 0.0


def heavier(a: LoadKey, b: LoadKey) -> bool:
    """Load ``a`` is heavier than ``b`` in some dimension (an unknown context compares as equal)."""
    return a[0] > b[0] or bool(a[1] and b[1] and a[1] > b[1])


@dataclass
class _Cell:
    samples: deque
    updated: float


class DecodeStepTable:
    """Decode-step times per (load, split) and the predictions drawn from them.

    ``sm_counts`` / ``total_sms``: the partitions' SMs and the GPU's (the secant needs their
    spacing; default evenly spaced, the top one short by one). ``unconfined_top``: the last
    partition is the whole GPU at the least priority, not a green context.
    """

    def __init__(self, num_partitions: int, sm_counts: Optional[Sequence[int]] = None,
                 total_sms: Optional[int] = None, unconfined_top: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        sm_counts = list(range(1, num_partitions + 1)) if sm_counts is None else list(sm_counts)
        if len(sm_counts) != num_partitions or sm_counts != sorted(set(sm_counts)):
            raise ValueError(f"sm_counts {sm_counts} must be {num_partitions} increasing SM counts")
        total_sms = sm_counts[-1] + 1 if total_sms is None else total_sms
        if total_sms < sm_counts[-1]:
            raise ValueError(f"total_sms {total_sms} is below the largest partition {sm_counts[-1]}")
        self.num_partitions, self.sm_counts, self.total_sms = num_partitions, sm_counts, total_sms
        self.unconfined_top, self.clock = unconfined_top, clock
        self._cells: dict[tuple[LoadKey, int], _Cell] = {}

    def record(self, load: LoadKey, index: int, ms: float) -> None:
        cell = self._cells.get((load, index))
        if cell is None:
            cell = self._cells[(load, index)] = _Cell(deque(maxlen=ITL_WINDOW_STEPS), 0.0)
        cell.samples.append(float(ms))
        cell.updated = self.clock()

    def measured(self, load: LoadKey, index: int) -> Optional[float]:
        """The percentile of the cell, if it has enough fresh samples."""
        cell = self._cells.get((load, index))
        if cell is None or len(cell.samples) < MIN_CELL_SAMPLES:
            return None
        if self.clock() - cell.updated > CELL_TTL_S:
            return None
        return percentile(cell.samples)

    def _floor(self, load: LoadKey, index: int) -> Optional[float]:
        """The worst measured split below ``index``: a larger prefill split never leaves decode faster."""
        return max((m for j in range(index) if (m := self.measured(load, j)) is not None), default=None)

    def predicted(self, load: Optional[LoadKey], index: int) -> Optional[float]:
        """Measured, else carried over from other loads (the most pessimistic); None if unknown."""
        if load is None:
            return None
        floor = self._floor(load, index)
        own = self.measured(load, index)
        if own is not None:
            return own if floor is None else max(own, floor)
        guesses = []
        for other in {k for k, _ in self._cells if k != load}:
            there = self.measured(other, index)
            if there is None:
                continue
            power = 1.0 + HEAVIER_LOAD_EXPONENT * _doublings(load, other)
            for j in range(self.num_partitions):
                here_j, there_j = self.measured(load, j), self.measured(other, j)
                if here_j is not None and there_j:
                    guesses.append(here_j * (there / there_j) ** power)
        if not guesses:
            return None
        guess = max(guesses)
        return guess if floor is None else max(guess, floor)

    def _heavier_bound(self, load: LoadKey, index: int) -> Optional[float]:
        """The smallest percentile measured at ``index`` under a load at least as heavy in every known dimension."""
        bounds = []
        for other in {k for k, _ in self._cells}:
            if other == load or other[0] < load[0] or (other[1] and load[1] and other[1] < load[1]):
                continue
            if (m := self.measured(other, index)) is not None:
                bounds.append(m)
        return min(bounds) if bounds else None

    def _x(self, index: int) -> float:
        return 1.0 / (self.total_sms + EXTRAPOLATION_SM_OFFSET - self.sm_counts[index])

    def _extrapolated(self, load: LoadKey, index: int) -> Optional[float]:
        """The secant from the splits below ``index`` measured at ``load``, its slope the steepest pair's."""
        below = [(j, m) for j in range(index) if (m := self.measured(load, j)) is not None]
        if len(below) < 2:
            return None
        slope = max(max(0.0, (mb - ma) / (self._x(b) - self._x(a))) for (a, ma), (b, mb) in zip(below, below[1:]))
        top, m_top = below[-1]
        return m_top + slope * (self._x(index) - self._x(top))

    def guarded(self, load: Optional[LoadKey], index: int) -> tuple[str, Optional[float]]:
        """(kind, ms) a move at ``load`` may trust at ``index``.

        ``known``: measured, or bounded by a heavier load (never below a measured smaller
        split); ``guess``: the larger of the secant and the carried-over estimate (for the
        unconfined top, the split below times UNCONFINED_TOP_FACTOR instead of the secant,
        and never an exploring step); ``explore``: nothing but the split just below,
        measured here (its value is returned); ``unknown``.
        """
        if load is None:
            return "unknown", None
        floor = self._floor(load, index)
        own = self.measured(load, index)
        known = own if own is not None else self._heavier_bound(load, index)
        if known is not None:
            return "known", known if floor is None else max(known, floor)
        below = self.measured(load, index - 1) if index > 0 else None
        if self.unconfined_top and index == self.num_partitions - 1:
            scaled = None if below is None else below * UNCONFINED_TOP_FACTOR
            guesses = [g for g in (scaled, self.predicted(load, index)) if g is not None]
            return ("guess", max(guesses)) if guesses else ("unknown", None)
        guesses = [g for g in (self._extrapolated(load, index), self.predicted(load, index)) if g is not None]
        if guesses:
            return "guess", max(guesses)
        return ("explore", below) if below is not None else ("unknown", None)

    def largest_known_within(self, load: LoadKey, top: int, limit_ms: float) -> Optional[int]:
        """The largest split <= ``top`` known to hold ``limit_ms`` at ``load``, walking up from 0.

        Splits only get worse for decode as they grow: the walk stops at the first one that
        is unknown or over.
        """
        best = None
        for j in range(top + 1):
            kind, ms = self.guarded(load, j)
            if kind != "known" or ms > limit_ms:
                break
            best = j
        return best


__all__ = ["DecodeStepTable", "LoadKey", "heavier", "load_key", "next_load_key", "percentile"]
