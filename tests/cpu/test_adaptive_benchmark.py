"""The issue-7 benchmark's own mechanics, on the CPU (tiny shape): pacing and the settling phase.

The numbers in docs/benchmarks-history.md come from this script on the H200; here only its
arms' bookkeeping is checked, so that a change to the script cannot silently turn a
paced arm into an unpaced one or report the ramp as the settled split.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "adaptive_split.py"


def _load_bench():
    spec = importlib.util.spec_from_file_location("adaptive_split_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_paced_arm_waits_and_settled_arm_reports_the_ramp_apart(tmp_path):
    bench = _load_bench()
    rc = bench.main([
        "--dry-run", "--whole-gpu-top", "--skip-chunked", "--skip-phased", "--steady-fixed", "none",
        "--paced-fixed", "all-lowprio:25", "--adaptive-itl-factors", "50", "--settle-seconds", "0.3",
        "--seconds", "0.6", "--out", str(tmp_path),
    ])
    assert rc == 0
    result = json.loads((tmp_path / "adaptive_split.json").read_text())
    by_arm = {r["arm"]: r for r in result["steady"]}
    paced = by_arm["green-all-lowprio-pace25"]
    assert paced["decode_steps"] > 3
    assert paced["decode_p50_ms"] >= 25.0 * 0.95  # a tiny decode step is far shorter: the pace sets the interval
    (adaptive,) = result["adaptive_steady"]
    assert adaptive["decode_p50_ms"] < 25.0 * 0.5  # the same decode steps, unpaced, next to prefill
    assert adaptive["phase"] == "saturating"  # the measured phase, not the settling one
    assert "settling 0.3 s before" in by_arm[adaptive["arm"]]["note"]


def test_end_paced_arm_keeps_the_pace_and_fixed_arms_get_their_overlap_cost(tmp_path):
    bench = _load_bench()
    rc = bench.main([
        "--dry-run", "--whole-gpu-top", "--skip-chunked", "--skip-phased", "--skip-adaptive-steady",
        "--steady-fixed", "all-lowprio", "--paced-fixed", "all-lowprio:25:end", "--overlap-cost",
        "--seconds", "0.6", "--out", str(tmp_path),
    ])
    assert rc == 0
    result = json.loads((tmp_path / "adaptive_split.json").read_text())
    by_arm = {r["arm"]: r for r in result["steady"]}
    paced = by_arm["green-all-lowprio-paceend25"]
    # Timed from the previous step's end by the recent median step: the interval is still the pace.
    assert 25.0 * 0.95 <= paced["decode_p50_ms"] < 25.0 * 1.5
    rows = {v["arm"]: v for v in result["vs_chunked"]}
    for arm in ("green-all-lowprio", "green-all-lowprio-paceend25"):
        assert rows[arm]["prefill_alone_tok_s"] > 0
        assert rows[arm]["decode_cost_ms"] is not None


def test_overlap_cost_is_the_prefill_time_each_decode_step_takes_away():
    bench = _load_bench()
    # Alone 24k tok/s; next to 18 decode steps/s it makes 18k: the steps took 1/4 s, 13.89 ms each.
    cost = bench.overlap_cost(18000.0, 18.0, 24000.0, 14.0)
    assert cost["decode_cost_ms"] == 13.89
    assert cost["ratio_ceiling"] == round(14.0 / 13.8889, 2)
    # Steps that take nothing from prefill leave no ceiling; no steps, nothing to say.
    assert bench.overlap_cost(24000.0, 18.0, 24000.0, 14.0)["ratio_ceiling"] is None
    assert bench.overlap_cost(18000.0, 0.0, 24000.0, 14.0) == {"decode_cost_ms": None, "ratio_ceiling": None}


def test_packed_chunks_are_full_and_cover_every_prompt_token_once():
    sys.path.insert(0, str(BENCH.parent))
    from latency_physics import chunk_cycles

    # A divisor: packing changes nothing, one prompt per cycle set.
    assert chunk_cycles(8192, 2048, packed=True) == chunk_cycles(8192, 2048) == [[(p, 2048)] for p in range(0, 8192, 2048)]
    # Unpacked 1536 leaves a 512-token chunk per prompt: one more decode step than full chunks need.
    assert [sum(n for _, n in c) for c in chunk_cycles(8192, 1536)] == [1536] * 5 + [512]
    cycles = chunk_cycles(8192, 1536, packed=True)
    assert all(sum(n for _, n in c) == 1536 for c in cycles)
    assert len(cycles) == 16  # lcm(8192, 1536) / 1536: three prompts, then the cycles repeat
    covered = [past + i for c in cycles for past, n in c for i in range(n)]
    assert sorted(covered) == sorted(list(range(8192)) * 3)
    assert cycles[5] == [(7680, 512), (0, 1024)]  # the end of one prompt and the start of the next
