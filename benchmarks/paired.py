"""Two arms on the same requests, compared request by request: the first token.

Every arm of a serving run gets the same prompts at the same arrival times (one seed per
workload), so a change shows in each request's own pair of first tokens, not only in two
medians of a few dozen requests each. For each arm against the run's first arm (the control):
the share of requests whose first token came earlier, the mean difference, and the median's
ratio with its spread over resampled request sets (the 5th to 95th percentile), so that a rule
asks for a gain the sample can show.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Optional

DRAWS = 2000
SEED = 0  # the resampling is the same on every report of the same run


@dataclass(frozen=True)
class PairedFirstTokens:
    requests: int  # pairs in which both arms answered
    earlier_share: float  # of those, the share where the other arm's first token came earlier
    mean_diff_ms: float  # the other arm's first token minus the control's, on average
    median_ratio: float
    median_ratio_low: float  # 5th percentile over resampled request sets
    median_ratio_high: float  # 95th


def request_details(result: dict) -> dict:
    """What a pairing needs of one bench_serving result: each request's first token and prompt length."""
    ttfts = result.get("ttfts") or []
    if not ttfts:
        return {}
    return {"ttfts_ms": [round(t * 1000, 3) for t in ttfts], "input_lens": list(result.get("input_lens") or [])}


def paired_first_tokens(control_ms: list[float], other_ms: list[float], draws: int = DRAWS,
                        seed: int = SEED) -> Optional[PairedFirstTokens]:
    """Request i of one arm against request i of the other; a request without a first token (failed) in
    either arm is left out. None where the lists do not pair."""
    if len(control_ms) != len(other_ms):
        return None
    pairs = [(a, b) for a, b in zip(control_ms, other_ms) if a > 0 and b > 0]
    if not pairs:
        return None
    control = [a for a, _ in pairs]
    other = [b for _, b in pairs]
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        picked = [rng.randrange(len(pairs)) for _ in pairs]
        ratios.append(statistics.median(other[i] for i in picked) / statistics.median(control[i] for i in picked))
    ratios.sort()
    return PairedFirstTokens(
        requests=len(pairs),
        earlier_share=sum(b < a for a, b in pairs) / len(pairs),
        mean_diff_ms=statistics.fmean(b - a for a, b in pairs),
        median_ratio=statistics.median(other) / statistics.median(control),
        median_ratio_low=ratios[int(0.05 * (draws - 1))],
        median_ratio_high=ratios[int(0.95 * (draws - 1))],
    )


def paired_table(arms: dict) -> str:
    """Per workload, each arm against the first arm that ran it with per-request results; empty where no
    workload has two such arms. Arms given other prompts (another seed, an older run) are named, not paired."""
    rows, unpaired = [], []
    workloads = list(dict.fromkeys(w for entry in arms.values() for w in entry.get("workloads", {})))
    for workload in workloads:
        measured = [(arm, entry["workloads"][workload]) for arm, entry in arms.items()
                    if entry.get("workloads", {}).get(workload, {}).get("ttfts_ms")]
        if len(measured) < 2:
            continue
        (control_arm, control), others = measured[0], measured[1:]
        for arm, result in others:
            if result.get("input_lens") != control.get("input_lens"):
                unpaired.append(f"- {workload}: {arm} and {control_arm} were not given the same requests")
                continue
            paired = paired_first_tokens(control["ttfts_ms"], result["ttfts_ms"])
            if paired is None:
                unpaired.append(f"- {workload}: no request had a first token from both {arm} and {control_arm}")
                continue
            rows.append(f"| {workload} | {arm} | {control_arm} | {paired.requests} | {paired.earlier_share:.0%} "
                        f"| {paired.mean_diff_ms:+.1f} | {paired.median_ratio:.3f} "
                        f"({paired.median_ratio_low:.3f}-{paired.median_ratio_high:.3f}) |")
    if not rows and not unpaired:
        return ""
    head = ["| workload | arm | against | requests | first token earlier | mean difference ms "
            "| TTFT p50 ratio (5th-95th percentile, resampled) |", "|---|---|---|---:|---:|---:|---|"]
    return "\n".join([*(head + rows if rows else []), *unpaired])
