"""Where a decode step's time goes on the GPU: in its kernels, or between them.

Beside a prefill, a decode step takes three to four times as long as alone. Two causes look
alike from the host: each kernel runs slower (it gets fewer SMs, or less memory bandwidth),
or each kernel waits before its first block starts (the SMs are held by the other side's
blocks). The device timeline of the decode process tells them apart: the kernels' own
durations against the gaps between one kernel's end and the next one's start, on a stream
that has nothing else to do.

:func:`profile_steps` records ``steps`` calls of ``step`` with torch's profiler (CUPTI
kernel records, CUDA graph replays included) and returns :func:`timeline_stats` of the
decode process's kernels. On the CPU there are no kernels; the stats are then of the
profiler's top-level CPU ops, which only checks the plumbing.
"""

from __future__ import annotations

import statistics
from typing import Callable


def timeline_stats(intervals: list[tuple[float, float]], steps: int) -> dict:
    """Kernel time and the gaps between kernels, from (start, end) pairs in microseconds.

    Intervals that overlap (the same kernel reported twice, or nested CPU ops) are merged
    first, so time is counted once.
    """
    if not intervals or steps <= 0:
        return {"steps": steps, "kernels": 0}
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    busy = [end - start for start, end in merged]
    gaps = [nxt[0] - cur[1] for cur, nxt in zip(merged, merged[1:])]
    span = merged[-1][1] - merged[0][0]
    return {
        "steps": steps,
        "kernels": len(merged),
        "kernels_per_step": round(len(merged) / steps, 1),
        "busy_us_per_step": round(sum(busy) / steps, 1),
        "gap_us_per_step": round(sum(gaps) / steps, 1),
        "kernel_us_mean": round(statistics.fmean(busy), 2),
        "gap_us_mean": round(statistics.fmean(gaps), 2) if gaps else 0.0,
        "gap_us_p90": round(sorted(gaps)[int(0.9 * (len(gaps) - 1))], 2) if gaps else 0.0,
        "busy_share": round(sum(busy) / span, 3) if span > 0 else 0.0,
    }


def profile_steps(step: Callable[[], None], steps: int, cuda: bool) -> dict:
    """``step`` run ``steps`` times under torch's profiler; the timeline of what it ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    if cuda:
        intervals = [(e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]
    else:
        intervals = [(e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == DeviceType.CPU and e.cpu_parent is None]
    return timeline_stats(intervals, steps)


def comparison_lines(timelines: dict[str, dict], base: str = "decode-only") -> list[str]:
    """One line per arm: per step, kernel time and gap time against the decode-only arm's."""
    ref = timelines.get(base)
    lines = []
    for arm, t in timelines.items():
        if not t.get("kernels"):
            lines.append(f"{arm}: no kernels recorded")
            continue
        line = (f"{arm}: {t['kernels_per_step']} kernels/step, kernel time {t['busy_us_per_step'] / 1e3:.2f} ms/step "
                f"(mean {t['kernel_us_mean']:.1f} us), gaps {t['gap_us_per_step'] / 1e3:.2f} ms/step "
                f"(mean {t['gap_us_mean']:.1f} us, p90 {t['gap_us_p90']:.1f} us)")
        if ref and ref.get("kernels") and arm != base:
            line += (f"; against {base}: kernel time {t['busy_us_per_step'] / ref['busy_us_per_step']:.2f}x, "
                     f"gaps {(t['gap_us_per_step'] - ref['gap_us_per_step']) / 1e3:+.2f} ms/step")
        lines.append(line)
    return lines
