"""The benchmark client keeps its own collector pauses out of what it measures, and records them."""

from __future__ import annotations

import gc
import json
import time

import pytest

from benchmarks import client_gc, serving_vs_upstream


@pytest.fixture(autouse=True)
def _unfrozen():
    yield
    gc.unfreeze()


def _full_collection_ms() -> float:
    began = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - began) * 1000


def test_a_full_collection_during_a_run_no_longer_walks_the_clients_imports():
    import sglang.benchmark.serving  # noqa: F401 - the heap bench_serving runs on

    gc.unfreeze()
    outside = min(_full_collection_ms() for _ in range(2))
    pauses = client_gc.ClientPauses().start()
    try:
        inside = min(_full_collection_ms() for _ in range(2))
    finally:
        pauses.stop()
    assert pauses.frozen_objects > 100_000
    # sglang, torch and datasets: a full collection of them takes tens to hundreds of ms on any host.
    assert inside < outside / 5, (inside, outside)


def test_every_collection_during_a_run_is_counted_and_the_long_ones_listed(monkeypatch):
    monkeypatch.setattr(client_gc, "LISTED_MS", 0.0)
    pauses = client_gc.ClientPauses().start()
    gc.collect()
    seen = pauses.stop()
    assert seen["collections"] >= 1 and seen["max_ms"] > 0
    assert any(entry["generation"] == 2 for entry in seen["listed"]) and seen["by_generation"][2] >= 1
    gc.collect()  # after stop: not counted
    assert pauses.stop()["collections"] == seen["collections"]


def test_each_bench_serving_run_writes_the_clients_pauses_beside_its_result(tmp_path):
    gc_file = tmp_path / "run.client_gc.json"
    plan = {"runs": [["--help"]], "counter_files": [str(tmp_path / "run.counters.json")],
            "gc_files": [str(gc_file)], "metrics_url": None}
    serving_vs_upstream.bench_serving_many(plan)  # upstream's own argument parser exits on --help
    seen = json.loads(gc_file.read_text())
    assert seen["frozen_objects"] > 100_000 and "max_ms" in seen


def test_the_report_names_a_client_pause_long_enough_to_show_as_a_gap():
    base = {"total_throughput": 1000.0, "median_ttft_ms": 100.0, "p99_ttft_ms": 200.0, "median_itl_ms": 10.0,
            "p99_itl_ms": 20.0, "max_itl_ms": 450.0}
    arms = {"upstream": {"workloads": {"poisson_8": {**base, "client_gc_max_ms": 12.0}}},
            "edgeacc": {"workloads": {"poisson_8": {**base, "client_gc_max_ms": 431.0}}}}
    notes = serving_vs_upstream.client_pause_notes(arms)
    assert "edgeacc/poisson_8: the client itself paused 431 ms" in notes
    assert "upstream/poisson_8" not in notes
    assert notes in serving_vs_upstream.report_from_arms(arms)
