"""The issue-7 benchmark's own mechanics, on the CPU (tiny shape): pacing and the settling phase.

The numbers in docs/benchmarks.md come from this script on the H200; here only its
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
