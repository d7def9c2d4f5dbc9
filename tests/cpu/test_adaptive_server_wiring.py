"""How the server feeds and applies the adaptive split (CPU): the GPU a rank confines, what the
decode side counts as queued and as a step under a partition, and what runs when green contexts
cannot be made. One choice per attention-TP group: test_adaptive_server_split.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_edgeacc.edge_acc import sm_partition
from sglang_edgeacc.edge_acc.adaptive_partitions import build_partitions_or_warn
from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR, child_env
from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler, queued_prompt_tokens
from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStepClock, DecodeStepWindow
from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats
from sglang_edgeacc.edge_acc_server.prefill_side import runner_gpu


def test_the_partitions_are_made_on_the_gpu_of_the_rank_not_gpu_0():
    # Upstream's model runner keeps the device bare and the GPU apart.
    assert runner_gpu(SimpleNamespace(device="cuda", gpu_id=3)) == torch.device("cuda", 3)
    assert runner_gpu(SimpleNamespace(device="cuda:1", gpu_id=5)) == torch.device("cuda", 1)
    assert runner_gpu(SimpleNamespace(device="cpu", gpu_id=0)) == torch.device("cpu")


def _req(prompt_len: int, extend_end=None):
    return SimpleNamespace(origin_input_ids=list(range(prompt_len)), extend_end=extend_end)


def test_the_queue_includes_the_rest_of_the_prompt_being_chunked():
    waiting = [_req(1000), _req(500)]
    assert queued_prompt_tokens(waiting, None) == 1500
    # A 32k prompt of which the batch just sent ends at 8192: 24576 tokens are still to come.
    assert queued_prompt_tokens(waiting, _req(32768, extend_end=8192)) == 1500 + 24576
    assert queued_prompt_tokens([], _req(4096, extend_end=None)) == 0


class _DecodeSide(DecodeSideScheduler):
    """Only what _edge_process_decode_result reads."""

    def __init__(self):
        self.decode_clock = DecodeStepClock()
        self.decode_step_window = DecodeStepWindow(enabled=True)
        self.edge_acc_stats = EdgeAccStats()
        self.prefill_link = SimpleNamespace(busy=False)

    def process_batch_result(self, batch, result):
        pass


def test_decode_steps_count_only_while_a_prefill_batch_runs_next_to_them():
    side = _DecodeSide()
    decode = SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: True))
    for _ in range(4):  # the prefill side is idle: these steps belong to no partition
        side._edge_process_decode_result(decode, None)
    assert side.decode_step_window.take() == ()
    side.prefill_link.busy = True
    for _ in range(3):
        side._edge_process_decode_result(decode, None)
    assert len(side.decode_step_window.take()) == 3


def test_adaptive_without_green_contexts_starts_the_prefill_side_on_the_fixed_mps_split(monkeypatch, caplog):
    monkeypatch.setattr(sm_partition, "green_contexts_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        env = child_env("prefill", 80, "adaptive")
    assert env == {MPS_PERCENT_VAR: "80"}
    assert "falling back to the fixed MPS split" in caplog.text
    assert "--edge-acc-prefill-sm-percent" in caplog.text
    monkeypatch.setattr(sm_partition, "green_contexts_available", lambda: True)
    assert child_env("prefill", 80, "adaptive") == {}


def test_a_prefill_side_started_on_the_mps_split_says_it_runs_that_split(monkeypatch, caplog):
    monkeypatch.setenv(MPS_PERCENT_VAR, "50")
    with caplog.at_level(logging.WARNING):
        assert build_partitions_or_warn() is None
    assert f"limited by {MPS_PERCENT_VAR}=50; running that fixed split" in caplog.text


def test_without_green_contexts_and_without_a_cap_the_prefill_side_says_it_runs_unconfined(monkeypatch, caplog):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: green contexts may be made here")
    monkeypatch.delenv(MPS_PERCENT_VAR, raising=False)
    with caplog.at_level(logging.WARNING):
        assert build_partitions_or_warn() is None
    assert "needs CUDA and torch.cuda.green_contexts" in caplog.text
    assert "runs unconfined" in caplog.text
