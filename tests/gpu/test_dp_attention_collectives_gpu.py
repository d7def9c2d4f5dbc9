"""pytest wrapper for tests.gpu.dp_attention_collectives: 4 processes on 2 GPUs, idle DP groups, no hang, no cross-talk."""

from __future__ import annotations

import json

import pytest
import torch

from tests.gpu import dp_attention_collectives as dpc
from tests.gpu.proof_support import mps_daemon_running


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs (run through the device tool)")
def test_idle_dp_groups_enter_every_collective_on_both_sides():
    result = dpc.run(steps=2000, idle_skips=False, timeout_s=240, use_mps=mps_daemon_running())
    print("DP_COLLECTIVES_REPORT " + json.dumps(result, default=str))
    assert result["hung_ranks"] == [] and result["failed_ranks"] == [], result
    assert result["corrupt_ranks"] == [], result
    for rep in result["reports"]:
        assert rep["steps"] == 2000
        assert all(rep["patterns"][p] > 0 for p in dpc.PATTERNS), rep["patterns"]
        assert rep["all_reduces"] > 0
