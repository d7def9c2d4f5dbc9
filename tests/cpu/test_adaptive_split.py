"""adaptive_split: the policy that moves the prefill side's SM share with load (pure logic, CPU)."""

from __future__ import annotations

import random

import pytest

from sglang_edgeacc.edge_acc import adaptive_table
from sglang_edgeacc.edge_acc.adaptive_partitions import default_sm_counts
from sglang_edgeacc.edge_acc.adaptive_split import HISTORY_LIMIT, AdaptiveSplitConfig, AdaptiveSplitPolicy

ITL, TTFT = 20.0, 1000.0


class _SimClock:
    """A clock the test moves by hand (still unless moved): cells never go stale on their own."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def make(n=5, start=2) -> AdaptiveSplitPolicy:
    cfg = AdaptiveSplitConfig(itl_slo_ms=ITL, ttft_slo_ms=TTFT)
    return AdaptiveSplitPolicy(cfg, n, initial_index=start, clock=iter(range(10**6)).__next__)


def feed(policy, decode_ms, n_decode=8, prefill_ms=100.0, tokens=2048, queued=0) -> int:
    for _ in range(n_decode):
        policy.observe_decode_step(decode_ms)
    policy.observe_prefill(prefill_ms, tokens, queued)
    return policy.choose()


def test_itl_breach_shrinks_at_once_and_stops_at_the_smallest_split():
    p = make(start=3)
    seen = [feed(p, decode_ms=30.0, queued=100_000) for _ in range(20)]
    assert seen[0] == 2  # a breach acts at once, even with a long prefill queue
    assert min(seen) == 0 and seen[-1] == 0
    assert all(b <= a for a, b in zip(seen, seen[1:]))  # never grows while decode breaches


def test_ttft_pressure_with_itl_headroom_grows_to_the_largest_split():
    p = make(start=0)
    # 2048 tokens in 100 ms with 40k queued: predicted TTFT ~2.1 s > 1 s; decode at 10 ms < 20 x 0.95.
    seen = [feed(p, decode_ms=10.0, queued=40_000) for _ in range(30)]
    assert seen[-1] == 4
    assert all(b - a in (0, 1) for a, b in zip(seen, seen[1:]))  # bounded: one step at a time
    assert seen[:2] == [1, 2]  # one step per decision


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


def test_a_new_split_is_held_until_enough_decode_steps_were_seen_at_it():
    p = make(start=3)
    assert feed(p, decode_ms=30.0) == 2
    # Four steps at the new split are too few to judge it: the old breach must not shrink again.
    assert feed(p, decode_ms=30.0, n_decode=4) == 2
    assert p.history[-1].reason == "cooldown"
    assert feed(p, decode_ms=30.0, n_decode=4) == 1  # eight: judged, and it breaches too


def test_bad_config_names_the_flag():
    with pytest.raises(ValueError, match="--edge-acc-itl-slo-ms"):
        AdaptiveSplitConfig(itl_slo_ms=0, ttft_slo_ms=1)
    with pytest.raises(ValueError, match="--edge-acc-ttft-slo-ms"):
        AdaptiveSplitConfig(itl_slo_ms=1, ttft_slo_ms=-5)
    with pytest.raises(ValueError, match="initial_index"):
        AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=1, ttft_slo_ms=1), 3, initial_index=3)


def test_default_sm_counts_on_an_h200():
    counts = default_sm_counts(132, 8, 8)
    assert all(c % 8 == 0 for c in counts)
    # 1/4 .. 7/8 of 132 rounded to 8, plus 128: 112 SMs capped prefill far below chunked prefill's throughput.
    assert counts == [32, 48, 72, 96, 112, 128]
    assert default_sm_counts(132, 8, 8, count=1) == [112, 128]


# --- the decode load: moving before a step at a new load breaches

# Decode P99 (ms) per decode batch and split, shaped like H200 measurements (batch 64 / 32;
# splits 32, 48, 72, 96, 112 SMs). ITL SLO 21.58 ms: at batch 64 only splits 0..2 hold it,
# at batch 32 all five do.
PLANT = {64: [16.7, 18.1, 20.6, 23.2, 27.0], 32: [13.8, 14.3, 15.9, 18.0, 20.4]}
SLO = 21.58


def make_at_load(start=0) -> AdaptiveSplitPolicy:
    cfg = AdaptiveSplitConfig(itl_slo_ms=SLO, ttft_slo_ms=2400.0)
    return AdaptiveSplitPolicy(cfg, 5, initial_index=start, clock=_SimClock().now)


def batch_at(policy, batch: int, next_batch: int, queued: int, prefill_ms=150.0, steps=8) -> int:
    """One prefill batch: decode steps at ``batch`` during it, then the load the next one runs next to."""
    policy.observe_decode_load(batch)
    for _ in range(steps):
        policy.observe_decode_step(PLANT[batch][policy.index])
    policy.observe_prefill(prefill_ms, 2048, queued)
    policy.observe_decode_load(next_batch)
    return policy.choose()


def burst_then_calm() -> tuple[list[int], AdaptiveSplitPolicy]:
    """calm-1 at batch 64 visiting splits 0..2, a burst at batch 32 that grows to the top, then batch 64 again."""
    p = make_at_load()
    seen = []
    for _ in range(12):  # calm-1: TTFT pressure, the ITL SLO stops the growth at split 2
        seen.append(batch_at(p, 64, 64, queued=40_000))
    for _ in range(12):  # burst: lighter decode, long queue
        seen.append(batch_at(p, 32, 32, queued=60_000))
    seen.append(batch_at(p, 32, 64, queued=60_000))  # the decode side now sends batch 64
    return seen, p


def test_a_heavier_decode_load_moves_the_split_before_any_step_at_it():
    """At split 4 (fine for batch 32) the decode batch doubles: split 4 would breach at
    batch 64 (27 ms), so the batch sent with the new load already runs on split 2."""
    seen, p = burst_then_calm()
    assert seen[-2] == 4  # the burst reached the top
    assert seen[-1] == 2  # the largest split known to hold the SLO at batch 64
    assert p.history[-1].reason.startswith("feed-forward")
    assert PLANT[64][seen[-1]] <= SLO < PLANT[64][seen[-2]]


def test_an_unmeasured_split_at_the_new_load_is_predicted_by_scaling():
    _, p = burst_then_calm()
    # (64, split 3) was never measured. Split 2 is the one measured at both loads (calm-1
    # visited 0..2 at batch 64, the burst 2..4 at batch 32): its batch-32 slowdown towards
    # split 3, raised to 1.5 for one doubling of the batch, times m(64, split 2).
    pred = p.table.predicted((64, 0), 3)
    assert pred == pytest.approx(20.6 * (18.0 / 15.9) ** 1.5, rel=1e-6)
    assert pred > PLANT[64][3]  # conservative against the (hidden) truth, 23.2 ms; a plain ratio gives 23.3
    assert p.table.predicted((64, 0), 1) == pytest.approx(18.1)  # measured
    # Towards a lighter load the plain ratio: (32, split 0) from split 2 seen at both loads.
    assert p.table.predicted((32, 0), 0) == pytest.approx(15.9 * 16.7 / 20.6, rel=1e-6)


def test_a_heavier_load_with_nothing_known_falls_back_to_a_safe_split():
    p = make_at_load(start=0)
    for _ in range(8):
        batch_at(p, 32, 32, queued=60_000)
    assert p.index == 4
    assert batch_at(p, 32, 128, queued=60_000) == 0  # batch 128 never seen: the smallest split


def test_a_lighter_load_keeps_the_split():
    p = make_at_load(start=2)
    # 10k queued: predicted TTFT (10_000 + 2048) x 150 / 2048 ~ 882 ms, between the relax
    # (720 ms) and drain (1200 ms) thresholds: nothing but a load change would move split 2.
    seen = [batch_at(p, 64, 64, queued=10_000) for _ in range(12)]
    assert set(seen) == {2}  # split 2 measured at batch 64 (20.6 ms, within the SLO)
    lighter = [batch_at(p, 64, 32, queued=10_000)] + [batch_at(p, 32, 32, queued=10_000) for _ in range(5)]
    assert lighter == [2] * 6  # what held at batch 64 holds at batch 32: no move on the lighter load
    assert not any(h.reason.startswith("feed-forward") for h in p.history)


def test_a_backlog_far_over_the_ttft_slo_drains_straight_to_the_largest_known_safe_split():
    p = make_at_load()
    for _ in range(12):
        batch_at(p, 32, 32, queued=60_000)  # learn every split at batch 32 (all safe)
    for _ in range(12):
        batch_at(p, 32, 32, queued=0, prefill_ms=20.0)  # no queue: relax back to 0
    assert p.index == 0
    # predicted TTFT (200_000 + 2048) * 150 / 2048 ms ~ 14.8 s >> 2.4 s
    assert batch_at(p, 32, 32, queued=200_000) == 4
    assert p.history[-1].reason.startswith("drain")


def test_no_multi_step_grow_into_a_split_predicted_to_breach():
    p = make_at_load()
    for _ in range(12):
        batch_at(p, 64, 64, queued=60_000)
    for _ in range(12):
        batch_at(p, 64, 64, queued=0, prefill_ms=20.0)
    assert p.index == 0
    seen = [batch_at(p, 64, 64, queued=200_000) for _ in range(6)]
    # Straight to the largest split measured within the SLO itself; split 3 (23.2 ms) is never tried.
    assert seen == [2, 2, 2, 2, 2, 2]


def test_a_steady_load_with_noise_does_not_flap():
    rng = random.Random(11)
    p = make_at_load(start=0)
    seen = []
    for _ in range(200):
        p.observe_decode_load(64)
        for _ in range(8):
            p.observe_decode_step(PLANT[64][p.index] + rng.uniform(-0.6, 0.6))
        p.observe_prefill(150.0, 2048, 60_000)
        seen.append(p.choose())
    tail = seen[40:]
    assert set(tail) <= {2, 3}
    assert sum(1 for a, b in zip(tail, tail[1:]) if a != b) <= 2 * len(tail) // 16


def test_stale_cells_predict_nothing():
    clock = _SimClock()
    p = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=SLO, ttft_slo_ms=2400.0), 5, initial_index=1,
                            clock=clock.now)
    p.observe_decode_load(64)
    for _ in range(8):
        p.observe_decode_step(18.0)
    assert p.table.predicted(p.decode_load, 1) == 18.0
    clock.t = adaptive_table.CELL_TTL_S + 1
    assert p.table.predicted(p.decode_load, 1) is None


def test_decode_load_is_bucketed_by_doubling_and_checked():
    from sglang_edgeacc.edge_acc.adaptive_split import load_key

    assert load_key(33) == load_key(64) == (64, 0)
    assert load_key(64, 131072) == (64, 131072)
    assert load_key(0) == (0, 0)
    with pytest.raises(ValueError, match="decode load"):
        make_at_load().observe_decode_load(-1)


# --- the arrival rate: a queue that grows breaks the TTFT SLO later, so it is acted on now

SERVICE_TOK_S = [4900.0, 7400.0, 10200.0, 11900.0, 13500.0]  # prefill tokens/s per split at batch 32


def simulate_queue(policy, arrivals_tok_s: float, seconds: float, backlog: float = 0.0) -> float:
    """Prompts arrive as a fluid at ``arrivals_tok_s``; each decision prefills one 2048-token piece.

    The policy's clock must be a _SimClock's (see ``make_timed``). Returns the backlog left.
    """
    clock = policy.clock.__self__
    while clock.t < seconds:
        if backlog < 2048:  # idle until a piece's worth has arrived
            clock.t += (2048 - backlog) / arrivals_tok_s
            backlog = 2048.0
        policy.observe_decode_load(32)
        for _ in range(8):
            policy.observe_decode_step(PLANT[32][policy.index])
        dt = 2048 / SERVICE_TOK_S[policy.index]
        clock.t += dt
        backlog += arrivals_tok_s * dt - 2048
        policy.observe_prefill(dt * 1e3, 2048, int(backlog))
        policy.choose()
    return backlog


def make_timed(start: int) -> AdaptiveSplitPolicy:
    cfg = AdaptiveSplitConfig(itl_slo_ms=SLO, ttft_slo_ms=2400.0)
    return AdaptiveSplitPolicy(cfg, 5, initial_index=start, clock=_SimClock().now)


def test_prompts_arriving_faster_than_the_split_prefills_drain_before_the_ttft_slo_breaks():
    """Burst: 13.3 k tok/s arrive, split 2 prefills 10.2 k. Predicted TTFT stays under the SLO
    for seconds while the backlog builds; the arrival rate moves the split at once."""
    p = make_timed(start=2)
    simulate_queue(p, 13_300.0, seconds=3.0)
    assert p.arrival_tok_s() == pytest.approx(13_300.0, rel=0.02)
    assert p.index == 4  # the only split that keeps up with 13.3 k tok/s, and predicted within the ITL SLO
    assert any(h.reason.startswith("drain: arrivals") for h in p.history)


def test_no_relax_into_a_split_that_would_not_keep_up():
    """11 k tok/s arrive; only splits 3 (11.9 k) and 4 keep up. Once the arrival rate is known
    the policy stays there although the short queue predicts a low TTFT."""
    p = make_timed(start=3)
    left = simulate_queue(p, 11_000.0, seconds=8.0)
    assert min(h.index for h in p.history if h.t > 2.0) >= 3
    assert left < 2048
    assert any(h.reason.startswith("TTFT low but the split below would not keep up") for h in p.history)
    assert p.changes() <= 6  # the cold start's relax steps, then the growth back: no flapping


def test_calm_arrivals_do_not_grow_the_split():
    p = make_timed(start=0)
    simulate_queue(p, 3_600.0, seconds=10.0)  # 0.44 prompts/s of 8192 tokens; split 0 does 4.9 k
    assert {h.index for h in p.history} == {0}


# --- the ITL-guarded backlog drain on a phased load (calm, burst, calm), simulated

SMS = [32, 48, 72, 96, 112, 128, 132]  # the H200 partitions measured; 132 is the all-lowprio top
# Decode P99 (ms) per decode batch and split, shaped like H200 measurements (batch 64 steady,
# batch 32 in a burst), and prefill tokens/s per split.
PHASED_PLANT = {64: [17.1, 18.4, 20.9, 23.3, 27.5, 37.7, 52.6], 32: [14.5, 15.0, 17.5, 18.7, 20.6, 31.0, 43.0]}
PHASED_SERVICE = {
    64: [4915, 7373, 10240, 11878, 13517, 15565, 18022],
    32: [5100, 7700, 10800, 12300, 14000, 15800, 18200],
}
PHASED_SLO = 21.87  # 1.05 x the 72-SM split's batch-64 P99: only splits up to 72 SMs hold it at batch 64
PROMPT, PIECE = 8192, 2048


def phased_run(phase_s=5.0, calm_rate=0.438, burst_rate=1.625):
    """calm-1 (batch 64), burst (batch 32), calm-2 (batch 64); prompts of 8192 tokens in 2048-token pieces.

    A fake clock advances by each piece's time at the chosen split; the decode side steps at
    the plant's percentile for (batch, split) meanwhile. Returns (first calm-2 prompt's TTFT
    ms, decode steps at a split over the SLO, per phase, the policy).
    """
    clock = _SimClock()
    cfg = AdaptiveSplitConfig(itl_slo_ms=PHASED_SLO, ttft_slo_ms=2400.0)
    policy = AdaptiveSplitPolicy(cfg, len(SMS), initial_index=0, clock=clock.now, sm_counts=SMS, total_sms=132)
    arrivals = []
    for k, rate in enumerate((calm_rate, burst_rate, calm_rate)):
        arrivals += [k * phase_s + i / rate for i in range(int(phase_s * rate - 1e-9) + 1) if i / rate < phase_s]
    batch_of = lambda t: 32 if phase_s <= t < 2 * phase_s else 64  # noqa: E731
    over = [0, 0, 0]
    ttft = {}
    queue: list[float] = []
    pending = list(arrivals)
    batch = 64
    while clock.t < 3 * phase_s + 3.0 and (pending or queue):
        queue += [a for a in pending if a <= clock.t]
        pending = [a for a in pending if a > clock.t]
        if not queue:
            clock.t = pending[0]
            continue
        arrived = queue.pop(0)
        for past in range(0, PROMPT, PIECE):
            batch = batch_of(clock.t)  # the decode side sends its load with the batch
            policy.observe_decode_load(batch)
            idx = policy.choose()
            dt = PIECE / PHASED_SERVICE[batch][idx]
            steps = max(1, round(dt * 1e3 / PHASED_PLANT[batch][idx]))
            for _ in range(steps):
                policy.observe_decode_step(PHASED_PLANT[batch][idx])
            if PHASED_PLANT[batch][idx] > PHASED_SLO:
                over[min(2, int(clock.t // phase_s))] += steps
            clock.t += dt
            queue += [a for a in pending if a <= clock.t]
            pending = [a for a in pending if a > clock.t]
            policy.observe_prefill(dt * 1e3, PIECE, len(queue) * PROMPT + (PROMPT - past - PIECE))
        ttft[arrived] = (clock.t - arrived) * 1e3
    calm2_first = ttft[min(a for a in arrivals if a >= 2 * phase_s)]
    return calm2_first, over, policy


def test_the_drain_meets_calm2_ttft_without_entering_a_split_that_breaches():
    ttft, over, p = phased_run()
    assert over == [0, 0, 0]  # not one decode step at a split over the ITL SLO
    assert ttft <= 2400  # the burst's backlog does not spill into calm-2
    burst = [h.index for h in p.history if 5.0 <= h.t < 10.0]
    assert max(burst) == SMS.index(112)  # 128 SMs (31 ms at batch 32) is predicted over the SLO, never tried
    calm2 = [h.index for h in p.history if h.t >= 10.0]
    assert max(calm2) <= SMS.index(72)  # at batch 64 nothing above 72 SMs is predicted to hold


def test_the_drain_uses_a_heavier_loads_measurement_as_a_bound():
    _, _, p = phased_run()
    p.observe_decode_load(32)
    kind, pred = p.table.guarded(p.decode_load, SMS.index(48))
    assert kind == "known"
    # (32, 48 SMs) was skipped in the burst (the jump went straight to 72): bounded by batch 64.
    assert pred == pytest.approx(PHASED_PLANT[64][1])


def test_the_drain_extrapolates_one_split_and_stops_at_a_predicted_breach():
    p = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=PHASED_SLO, ttft_slo_ms=2400.0),
                            len(SMS), initial_index=0, clock=_SimClock().now, sm_counts=SMS, total_sms=132)
    p.observe_decode_load(64)
    seen = []
    for _ in range(8):
        for _ in range(8):
            p.observe_decode_step(PHASED_PLANT[64][p.index])
        p.observe_prefill(400.0, 2048, 40_000)  # predicted TTFT ~8.2 s: pressure
        seen.append(p.choose())
    # 32 -> 48 by one exploring step (32 SMs has headroom), 48 -> 72 on the secant (21.4 ms
    # predicted, within 21.87), then 96 is predicted at 26.6 ms: never tried.
    assert seen[:3] == [1, 2, 2] and set(seen[2:]) == {2}
    kind, pred = p.table.guarded(p.decode_load, 3)
    assert kind == "guess" and pred > PHASED_SLO
    assert p.changes() == 1  # history starts at split 1: one change, 48 -> 72


def test_the_drain_does_not_flap_at_a_steady_load_with_noise():
    rng = random.Random(5)
    p = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=PHASED_SLO, ttft_slo_ms=2400.0),
                            len(SMS), initial_index=0, clock=_SimClock().now, sm_counts=SMS, total_sms=132)
    seen = []
    for _ in range(300):
        p.observe_decode_load(64)
        for _ in range(8):
            p.observe_decode_step(PHASED_PLANT[64][p.index] * (1 + rng.uniform(-0.03, 0.03)))
        p.observe_prefill(200.0, 2048, 60_000)
        seen.append(p.choose())
    tail = seen[20:]
    assert set(tail) <= {1, 2}
    assert sum(1 for a, b in zip(tail, tail[1:]) if a != b) <= 2 * len(tail) // 16


def test_sm_counts_are_checked():
    cfg = AdaptiveSplitConfig(itl_slo_ms=20.0, ttft_slo_ms=1000.0)
    with pytest.raises(ValueError, match="increasing SM counts"):
        AdaptiveSplitPolicy(cfg, 3, sm_counts=[32, 32, 48])


def steady_drain(slo_ms: float, unconfined_top: bool, decisions: int = 120) -> list[int]:
    """A saturating prompt queue at decode batch 64 on the measured plant above; the splits chosen."""
    cfg = AdaptiveSplitConfig(itl_slo_ms=slo_ms, ttft_slo_ms=1.0)
    p = AdaptiveSplitPolicy(cfg, len(SMS), initial_index=0, clock=_SimClock().now, sm_counts=SMS, total_sms=132,
                            unconfined_top=unconfined_top)
    seen = []
    for _ in range(decisions):
        p.observe_decode_load(64)
        for _ in range(8):
            p.observe_decode_step(PHASED_PLANT[64][p.index])
        p.observe_prefill(150.0, 2048, 60_000)
        seen.append(p.choose())
    return seen


def test_the_unconfined_top_is_not_guessed_from_the_green_context_secant():
    """At an ITL SLO of 50.37 ms the secant over 112/128 SMs guesses 44 ms for the whole-GPU
    top, which measures 52.6 ms: a visit would breach."""
    top = len(SMS) - 1
    secant = steady_drain(50.37, unconfined_top=False)
    assert top in secant  # taken for a green context, the top is walked into and breaches
    guarded = steady_drain(50.37, unconfined_top=True)
    assert top not in guarded and guarded[-1] == top - 1  # 37.7 x 1.45 = 54.7 ms > 50.37: stays at 128 SMs
    loose = steady_drain(56.0, unconfined_top=True)
    assert loose[-10:] == [top] * 10  # the guess (54.7) and the measurement (52.6) both hold 56 ms


def test_the_unconfined_top_guess_scales_the_split_below():
    p = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=50.0, ttft_slo_ms=1.0), len(SMS), initial_index=len(SMS) - 2,
                            clock=_SimClock().now, sm_counts=SMS, total_sms=132, unconfined_top=True)
    p.observe_decode_load(64)
    top = len(SMS) - 1
    assert p.table.guarded(p.decode_load, top) == ("unknown", None)  # nothing measured below it: no exploring step
    for _ in range(8):
        p.observe_decode_step(40.0)
    kind, pred = p.table.guarded(p.decode_load, top)
    assert kind == "guess" and pred == pytest.approx(40.0 * adaptive_table.UNCONFINED_TOP_FACTOR)


def test_the_policy_module_needs_no_torch():
    """The policy runs wherever the decode side's messages are read; only the partitions need a GPU."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, sglang_edgeacc.edge_acc.adaptive_split; sys.exit('torch' in sys.modules)"
    python_dir = Path(__file__).resolve().parents[2] / "python"
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(python_dir)}, timeout=60)
    assert done.returncode == 0


# --- load buckets with a dead band, an idle decode side, bounded history

def alternating_context(context_values, decisions=200, start=0) -> AdaptiveSplitPolicy:
    """Decode batch 64 whose total context cycles through ``context_values``; a saturating prompt queue.

    Decode steps take PLANT[64] at the split (the context barely matters, as around one boundary).
    """
    p = make_at_load(start=start)
    for k in range(decisions):
        p.observe_decode_load(64, context_values[k % len(context_values)])
        for _ in range(8):
            p.observe_decode_step(PLANT[64][p.index])
        p.observe_prefill(150.0, 2048, 60_000)
        p.observe_decode_load(64, context_values[(k + 1) % len(context_values)])
        p.choose()
    return p


def test_a_context_hovering_at_a_power_of_two_keeps_its_bucket_and_the_split():
    """Requests grow and finish around 2**19 context tokens. Without the dead band each crossing
    would be a new load (back to a known-safe split, decode window cleared)."""
    hovering = [2**19 - 30_000, 2**19 + 30_000, 2**19 + 5_000, 2**19 - 10_000]
    p = alternating_context(hovering)
    quiet = alternating_context([2**19 - 30_000])  # the same plant at one steady context
    assert p.changes() <= quiet.changes() + 2, [h.index for h in p.history][:40]
    assert [h.index for h in p.history][-50:] == [h.index for h in quiet.history][-50:]
    assert not any(h.reason.startswith("feed-forward") for h in list(p.history)[20:])


def test_the_load_bucket_moves_only_past_a_dead_band_in_either_direction():
    p = make_at_load(start=0)
    band = 2**19 * 2**0.25  # the dead band above 2**19: (2**19, 2**19 x 1.19]
    for context, bucket in [
        (2**19 - 30_000, 2**19),
        (2**19 + 60_000, 2**19),  # past the plain edge but inside the band: kept
        (int(band) - 1, 2**19),
        (int(band) + 1, 2**20),  # above the band: up
        (2**19 + 30_000, 2**20),  # back inside the band from above: kept
        (2**19, 2**19),  # at or below the power of two: down
        (2**19 + 30_000, 2**19),
    ]:
        p.observe_decode_load(64, context)
        assert p.decode_load == (64, bucket), context
    # Decode batches sit on powers of two: 64 and 32 keep their plain buckets from either side.
    for batch, bucket in [(64, 64), (32, 32), (36, 32), (64, 64), (40, 64), (32, 32), (100, 128), (64, 64)]:
        p.observe_decode_load(batch)
        assert p.decode_load == (bucket, 0), batch  # a context of 0 is unknown


def test_a_crossing_to_a_clearly_heavier_load_still_feeds_forward():
    p = alternating_context([2**19 - 30_000], decisions=40, start=0)
    assert p.index == 2  # split 3 breaches at batch 64
    p.observe_decode_load(64, 2**19 - 30_000)
    for _ in range(8):
        p.observe_decode_step(PLANT[64][p.index])
    p.observe_prefill(150.0, 2048, 60_000)
    p.observe_decode_load(128, 2**20 + 100_000)  # nothing known at this load: back to the smallest split
    assert p.choose() == 0
    assert p.history[-1].reason.startswith("feed-forward")


def idle_decode_run(explicit_zero: bool, decisions: int = 12) -> AdaptiveSplitPolicy:
    """Prefill-only traffic: seven splits, no decode steps, a queue predicting ~7.4 s of TTFT."""
    cfg = AdaptiveSplitConfig(itl_slo_ms=PHASED_SLO, ttft_slo_ms=2400.0)
    p = AdaptiveSplitPolicy(cfg, len(SMS), clock=_SimClock().now, sm_counts=SMS, total_sms=132)
    for _ in range(decisions):
        if explicit_zero:
            p.observe_decode_load(0)
        p.observe_prefill(150.0, 2048, 100_000)
        p.choose()
    return p


@pytest.mark.parametrize("explicit_zero", [False, True])
def test_with_nothing_decoding_ttft_pressure_grows_to_the_top(explicit_zero):
    p = idle_decode_run(explicit_zero)
    seen = [h.index for h in p.history]
    assert seen[-1] == len(SMS) - 1, [h.reason for h in p.history]
    assert set(seen[2:]) == {len(SMS) - 1}
    assert not any(h.reason == "cooldown" for h in p.history)


def test_a_decode_side_going_idle_is_noticed_and_its_return_feeds_forward():
    """The server sends no load with an empty decode batch, so the last load stays: two decisions in a
    row without a decode step mean nothing decodes; when the decode side returns, its load is new."""
    p = alternating_context([2**19 - 30_000], decisions=40, start=0)
    assert p.index == 2
    p.observe_prefill(150.0, 2048, 100_000)
    assert p.choose() == 2  # one decision without a step: decode may simply not have stepped yet
    seen = []
    for _ in range(4):
        p.observe_prefill(150.0, 2048, 100_000)
        seen.append(p.choose())
    assert seen[-1] == 4  # no ITL to protect: the top
    p.observe_decode_load(64, 2**19 - 30_000)  # decode is back at its old load
    assert p.choose() == 2  # split 2 is the largest measured within the SLO at batch 64
    assert p.history[-1].reason.startswith("feed-forward")


def test_history_is_bounded_and_changes_counts_every_change():
    p = make(start=2)
    for k in range(5000):
        # Alternate a long queue (grow) and none (relax): a change every decision.
        feed(p, decode_ms=10.0, prefill_ms=100.0, queued=40_000 if k % 2 else 0)
    assert len(p.history) == HISTORY_LIMIT == 4096
    assert p.changes() == 4999
    assert p.history[-1].t > p.history[0].t


def test_the_servers_empty_decode_batches_let_the_split_grow():
    """Through edge_acc_server.adaptive: it observes no load when the decode batch is empty."""
    from sglang_edgeacc.edge_acc_server.adaptive import AdaptiveSplit
    from sglang_edgeacc.edge_acc_server.messages import PrefillWork

    class Partitions:
        sm_counts = SMS

        def __len__(self) -> int:
            return len(SMS)

        def stream(self, index: int) -> int:
            return index

    policy = AdaptiveSplitPolicy(AdaptiveSplitConfig(itl_slo_ms=PHASED_SLO, ttft_slo_ms=2400.0), len(SMS),
                                 initial_index=2, clock=_SimClock().now, sm_counts=SMS, total_sms=132)
    split = AdaptiveSplit(partitions=Partitions(), policy=policy, tp_rank=0)
    work = PrefillWork(seq=1, batch=b"", written=None, decode_step_ms=(), queued_tokens=100_000, decode_batch_size=0)
    seen = []
    for _ in range(6):
        seen.append(split.stream_for(work))
        split.observe(work, forward_ms=150.0, tokens=2048)
    assert seen[-1] == len(SMS) - 1, [h.reason for h in policy.history]
