"""adaptive_split: the policy that moves the prefill side's SM share with load (pure logic, CPU)."""

from __future__ import annotations

import logging
import random

import pytest

from sglang_edgeacc.edge_acc.adaptive_split import (
    AdaptiveSplitConfig,
    AdaptiveSplitPolicy,
    build_partitions_or_warn,
    default_sm_counts,
)
from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR

ITL, TTFT = 20.0, 1000.0


def make(n=5, start=2, **kw) -> AdaptiveSplitPolicy:
    cfg = AdaptiveSplitConfig(itl_slo_ms=ITL, ttft_slo_ms=TTFT, window=16, min_decode_samples=4, **kw)
    return AdaptiveSplitPolicy(cfg, n, initial_index=start, clock=iter(range(10**6)).__next__)


def feed(policy, decode_ms, n_decode=8, prefill_ms=100.0, tokens=2048, queued=0) -> int:
    for _ in range(n_decode):
        policy.observe_decode_step(decode_ms)
    policy.observe_prefill(prefill_ms, tokens, queued)
    return policy.choose()


def test_itl_breach_shrinks_at_once_and_stops_at_the_smallest_split():
    p = make(start=3)
    seen = [feed(p, decode_ms=30.0, queued=100_000) for _ in range(20)]
    assert seen[0] == 2  # no patience needed for a breach, even with a long prefill queue
    assert min(seen) == 0 and seen[-1] == 0
    assert all(b <= a for a, b in zip(seen, seen[1:]))  # never grows while decode breaches


def test_ttft_pressure_with_itl_headroom_grows_to_the_largest_split():
    p = make(start=0)
    # 2048 tokens in 100 ms with 40k queued: predicted TTFT ~2.1 s > 1 s; decode at 10 ms < 20 * 0.85.
    seen = [feed(p, decode_ms=10.0, queued=40_000) for _ in range(30)]
    assert seen[-1] == 4
    assert all(b - a in (0, 1) for a, b in zip(seen, seen[1:]))  # bounded: one step at a time
    assert seen[:2] == [1, 2]  # default patience 1: one step per decision


def test_patience_delays_a_grow():
    p = make(start=0, patience=3)
    seen = [feed(p, decode_ms=10.0, queued=40_000) for _ in range(4)]
    assert seen == [0, 0, 1, 1]


def test_no_grow_without_itl_headroom():
    p = make(start=1)
    # 19.5 ms is under the SLO but inside the hysteresis band (20 * 0.95 = 19): hold.
    seen = [feed(p, decode_ms=19.5, queued=40_000) for _ in range(20)]
    assert set(seen) == {1}


def test_prefill_slack_gives_sms_back_to_decode():
    p = make(start=4)
    # 2048 tokens in 50 ms, nothing queued: predicted TTFT 50 ms < 0.3 * 1 s.
    seen = [feed(p, decode_ms=10.0, prefill_ms=50.0, queued=0) for _ in range(30)]
    assert seen[-1] == 0


def test_within_band_holds():
    p = make(start=2)
    # TTFT 600 ms: between 0.3 x and 1 x the SLO; decode under the SLO: nothing to do.
    seen = [feed(p, decode_ms=15.0, prefill_ms=300.0, queued=2048) for _ in range(20)]
    assert set(seen) == {2}
    assert p.changes() == 0


def test_a_noisy_signal_on_the_boundary_does_not_flap():
    """Saturating prefill (always TTFT pressure); the SLO lies between split 2 (fine) and 3 (breaches).

    Without hysteresis and back-off the policy would alternate 2,3,2,3 every few batches.
    """
    rng = random.Random(7)
    p = make(start=0)

    def decode_ms(index: int) -> float:
        base = {0: 12.0, 1: 14.0, 2: 16.5, 3: 21.0, 4: 26.0}[index]
        return base + rng.uniform(-0.5, 0.5)

    seen = []
    for _ in range(200):
        for _ in range(8):
            p.observe_decode_step(decode_ms(p.index))
        p.observe_prefill(100.0, 2048, 60_000)
        seen.append(p.choose())
    tail = seen[50:]
    assert max(tail) <= 3 and min(tail) >= 2
    changes_in_tail = sum(1 for a, b in zip(tail, tail[1:]) if a != b)
    # Each visit to split 3 costs one breach; the back-off doubles the wait between visits, up to 32 decisions.
    assert changes_in_tail <= 2 * len(tail) // 16
    assert tail.count(2) > 0.7 * len(tail)


def test_noise_inside_the_hysteresis_band_never_changes_the_split():
    rng = random.Random(3)
    p = make(start=2)
    seen = [feed(p, decode_ms=19.0 + rng.uniform(0, 0.99), queued=60_000) for _ in range(100)]
    assert set(seen) == {2}


def test_load_step_up_then_down_moves_the_split_and_back():
    p = make(start=2)
    # Phase 1: light decode, long queue -> grow. Phase 2: heavy decode -> shrink. Phase 3: light again.
    ph1 = [feed(p, decode_ms=11.0, queued=50_000) for _ in range(20)]
    ph2 = [feed(p, decode_ms=25.0, queued=50_000) for _ in range(20)]
    ph3 = [feed(p, decode_ms=11.0, queued=50_000) for _ in range(40)]
    assert ph1[-1] == 4 and ph2[-1] == 0 and ph3[-1] == 4


def test_decisions_are_deterministic_and_recorded():
    def run():
        p = make(start=1)
        return [feed(p, decode_ms=d, queued=q) for d, q in [(10, 50_000)] * 6 + [(30, 0)] * 6], p

    a, pa = run()
    b, _ = run()
    assert a == b
    assert len(pa.history) == 12
    assert pa.history[-1].decode_pct_ms == 30.0
    assert any(h.reason.startswith("shrink") for h in pa.history)


def test_cooldown_holds_after_a_change_until_new_samples_arrive():
    p = make(start=3, cooldown_batches=1)
    assert feed(p, decode_ms=30.0) == 2
    # No decode samples at the new split yet: the old breach must not shrink again.
    assert p.choose() == 2
    assert p.history[-1].reason == "cooldown"


def test_bad_config_names_the_flag():
    with pytest.raises(ValueError, match="--edge-acc-itl-slo-ms"):
        AdaptiveSplitConfig(itl_slo_ms=0, ttft_slo_ms=1)
    with pytest.raises(ValueError, match="--edge-acc-ttft-slo-ms"):
        AdaptiveSplitConfig(itl_slo_ms=1, ttft_slo_ms=-5)
    with pytest.raises(ValueError, match="initial_index"):
        AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=1, ttft_slo_ms=1), 3, initial_index=3)


def test_default_sm_counts_on_an_h200():
    counts = default_sm_counts(132, 8, 8)
    assert counts == sorted(counts) and len(counts) == 5
    assert all(c % 8 == 0 for c in counts)
    assert counts[0] == 32 and counts[-1] == 112  # 1/4 .. 7/8 of 132, rounded to 8
    assert default_sm_counts(132, 8, 8, count=1) == [112]


def test_fallback_returns_none_and_warns_inside_an_mps_client(monkeypatch, caplog):
    monkeypatch.setenv(MPS_PERCENT_VAR, "50")
    with caplog.at_level(logging.WARNING):
        assert build_partitions_or_warn(fixed_percent=50) is None
    assert "falling back to the fixed split at 50%" in caplog.text
    assert MPS_PERCENT_VAR in caplog.text


def test_fallback_without_cuda_returns_none_and_warns(monkeypatch, caplog):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present: the no-green-context path is covered by the MPS-client case")
    monkeypatch.delenv(MPS_PERCENT_VAR, raising=False)
    with caplog.at_level(logging.WARNING):
        assert build_partitions_or_warn() is None
    assert "needs CUDA and torch.cuda.green_contexts" in caplog.text
