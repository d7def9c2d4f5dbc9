"""sm_partition: the environment each EdgeAcc side is spawned with, checked in real children."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os

import pytest
import torch

from sglang_edgeacc.edge_acc.sm_partition import (
    GREEN_CONTEXT_PERCENT_VAR,
    MPS_PERCENT_VAR,
    SideSplit,
    SmPartitionError,
    apply_child_env,
    child_env,
    environment_for_child,
    green_context_stream,
    green_context_stream_from_env,
    green_contexts_available,
    side_split,
    sm_count_for_percent,
)

TIMEOUT_S = 120


def test_mps_mode_sets_the_thread_percentage_for_both_sides():
    assert child_env("prefill", 30, "mps") == {MPS_PERCENT_VAR: "30"}
    # Decode at 100 is explicit so an inherited limit cannot apply to it.
    assert child_env("decode", 100, "mps") == {MPS_PERCENT_VAR: "100"}


def test_green_context_mode_never_sets_the_mps_variable():
    env = child_env("prefill", 40, "green-context")
    assert env == {GREEN_CONTEXT_PERCENT_VAR: "40"}


def test_none_mode_and_cpu_platform_set_nothing():
    assert child_env("prefill", 50, "none") == {}
    assert child_env("prefill", 50, "mps", device_type="cpu") == {}


@pytest.mark.parametrize(
    "role,percent,mode,needle",
    [
        ("prefill", 0, "mps", "--edge-acc-prefill-sm-percent"),
        ("decode", 101, "mps", "--edge-acc-decode-sm-percent"),
        ("decode", 50.0, "mps", "--edge-acc-decode-sm-percent"),
        ("prefill", 50, "mig", "--edge-acc-sm-partition"),
        ("prefill", 50, "adaptive", "--edge-acc-sm-partition"),
        ("encode", 50, "mps", "role"),
    ],
)
def test_bad_values_name_the_flag(role, percent, mode, needle):
    with pytest.raises(ValueError, match=needle):
        child_env(role, percent, mode)


def test_the_split_is_logged_under_the_prefix_of_the_process_that_prints_it(caplog):
    # The decode side spawns its prefill side and prints the line: its role, not the prefill side's.
    with caplog.at_level(logging.INFO, logger="sglang_edgeacc.edge_acc.sm_partition"):
        child_env("prefill", 30, "mps", tp_rank=3, log_prefix="[edgeacc decode tp3]")
        child_env("prefill", 30, "none", tp_rank=3)
    assert "[edgeacc decode tp3] prefill side's SM split: mps, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in caplog.text
    assert "[edgeacc tp3] prefill side's SM split: none (the two sides time-slice the whole GPU)" in caplog.text
    assert "[edgeacc prefill" not in caplog.text


def test_the_split_in_effect_is_described():
    assert side_split("prefill", 60, "mps", device_type="cpu") == SideSplit(
        "prefill", "none", None, {}, "none (cpu platform has no SMs to split)")
    assert side_split("prefill", 40, "green-context").percent == 40


def _report_env(conn) -> None:
    conn.send({k: os.environ.get(k) for k in (MPS_PERCENT_VAR, GREEN_CONTEXT_PERCENT_VAR)})
    conn.close()


def test_spawned_children_see_their_own_share_and_the_parent_is_restored(monkeypatch):
    monkeypatch.delenv(MPS_PERCENT_VAR, raising=False)
    monkeypatch.setenv(GREEN_CONTEXT_PERCENT_VAR, "77")
    ctx = mp.get_context("spawn")
    seen = {}
    for role, percent in (("prefill", 30), ("decode", 100)):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_report_env, args=(child,))
        with environment_for_child(child_env(role, percent, "mps")):
            proc.start()
        assert parent.poll(TIMEOUT_S)
        seen[role] = parent.recv()
        proc.join(TIMEOUT_S)
        assert proc.exitcode == 0
    assert seen["prefill"][MPS_PERCENT_VAR] == "30"
    assert seen["decode"][MPS_PERCENT_VAR] == "100"
    assert MPS_PERCENT_VAR not in os.environ
    assert os.environ[GREEN_CONTEXT_PERCENT_VAR] == "77"


def test_apply_child_env_sets_variables(monkeypatch):
    monkeypatch.delenv(MPS_PERCENT_VAR, raising=False)
    apply_child_env({MPS_PERCENT_VAR: "25"})
    assert os.environ[MPS_PERCENT_VAR] == "25"


def test_sm_count_rounding():
    assert sm_count_for_percent(30, 132, 8, 8) == 32  # 39.6 -> 39 -> 32
    assert sm_count_for_percent(1, 132, 8, 8) == 8  # never below the minimum
    assert sm_count_for_percent(100, 132, 8, 8) == 128
    assert sm_count_for_percent(50, 108, 4, 2) == 54
    with pytest.raises(ValueError):
        sm_count_for_percent(0, 132, 8, 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CPU-only host")
def test_green_context_on_cpu_is_a_clear_error():
    assert not green_contexts_available()
    with pytest.raises(SmPartitionError, match="--edge-acc-sm-partition mps or none"):
        green_context_stream(16)


def test_green_context_from_env_is_none_when_not_asked():
    assert green_context_stream_from_env(environ={}) is None


def test_green_context_from_env_rejects_garbage(monkeypatch):
    with pytest.raises(SmPartitionError, match=GREEN_CONTEXT_PERCENT_VAR):
        green_context_stream_from_env(environ={GREEN_CONTEXT_PERCENT_VAR: "lots"})


def test_the_prefill_side_is_a_below_normal_mps_client_and_the_decode_side_normal():
    from sglang_edgeacc.edge_acc.sm_partition import MPS_PRIORITY_VAR, mps_priority_env

    for mode in ("mps", "green-context"):
        assert mps_priority_env("prefill", "below-normal", mode) == {MPS_PRIORITY_VAR: "1"}
        # Explicit 0: a value inherited from the launcher cannot lower the decode side.
        assert mps_priority_env("decode", "below-normal", mode) == {MPS_PRIORITY_VAR: "0"}
        assert mps_priority_env("prefill", "normal", mode) == {MPS_PRIORITY_VAR: "0"}
    # No daemon to schedule by priority, or no GPU: nothing to set.
    assert mps_priority_env("prefill", "below-normal", "none") == {}
    assert mps_priority_env("prefill", "below-normal", "mps", device_type="cpu") == {}
    with pytest.raises(ValueError, match="--edge-acc-prefill-mps-priority"):
        mps_priority_env("prefill", "low", "mps")


def test_a_gpu_split_as_server_info_and_the_startup_line_report_it():
    from sglang_edgeacc.edge_acc_server.decode_pacing import DecodePacer
    from sglang_edgeacc.edge_acc_server.server_info import decode_side_split, edge_acc_entry, pacing_entry, startup_line

    launcher_set = {MPS_PERCENT_VAR: "100"}
    decode = decode_side_split("mps", "cuda", launcher_set)
    assert (decode.mode, decode.percent) == ("mps", 100)
    # Green contexts confine only the prefill side; a time-sliced launch ignores a stray MPS variable.
    assert decode_side_split("green-context", "cuda", {}).detail == "unconfined, the whole GPU"
    assert decode_side_split("none", "cuda", launcher_set).percent is None
    pairs = [{"tp_rank": 0, "decode_pid": 11, "prefill_pid": 12}, {"tp_rank": 1, "decode_pid": 21, "prefill_pid": 22}]
    pacer = DecodePacer(itl_slo_ms=75.0)
    entry = edge_acc_entry("mps", side_split("prefill", 60, "mps"), decode,
                           pacing_entry(75.0, pacer), pairs, dp_rank=1)
    assert entry["sm_split"] == {"mode": "mps", "prefill": f"mps, {MPS_PERCENT_VAR}=60",
                                 "decode": f"mps, {MPS_PERCENT_VAR}=100", "prefill_sm_percent": 60,
                                 "decode_sm_percent": 100}
    # The gaps the pacer actually aims at, not the target: 0.9 of it while prompts wait, 0.9 of the
    # calm target (50 ms) while none does.
    assert entry["decode_pacing"] == {"itl_slo_ms": 75.0,
                                      "aimed_gap_ms": {"prompts_waiting": 67.5, "none_waiting": 45.0}}
    assert startup_line(entry) == (
        f"EdgeAcc on (dp1). SM split: prefill side mps, {MPS_PERCENT_VAR}=60; decode side mps, {MPS_PERCENT_VAR}=100. "
        "Beside a prefill, decode steps wait so that tokens come about 67.5 ms apart while prompts wait for the "
        "prefill side, 45 ms while none does (--edge-acc-itl-slo-ms 75). "
        "tp0: decode side pid 11 (the scheduler), prefill side pid 12; "
        "tp1: decode side pid 21 (the scheduler), prefill side pid 22")
    off = edge_acc_entry("mps", side_split("prefill", 60, "mps"), decode,
                         pacing_entry(50.0, DecodePacer(itl_slo_ms=0.0)), pairs[:1], dp_rank=None)
    assert off["decode_pacing"] == {"itl_slo_ms": 50.0, "aimed_gap_ms": None}
    assert "Decode pacing off: decode steps back to back beside a prefill. tp0:" in startup_line(off)
