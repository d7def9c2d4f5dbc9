"""The decode side refuses to go on after a weight update that moved shared memory."""

from __future__ import annotations

import pytest
import torch

from sglang_edgeacc.edge_acc_server.weight_update_guard import GuardedWeightUpdater, SharedWeightsMoved


class _Updater:
    """Stands in for upstream's SchedulerWeightUpdaterManager (slotted, read-only methods): two ways an update can go."""

    __slots__ = ("model",)

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def update_weights_from_disk(self, request):
        with torch.no_grad():
            self.model.weight.copy_(torch.full_like(self.model.weight, request))
        return "ok"

    def update_weights_from_tensor(self, request):
        self.model.weight = torch.nn.Parameter(torch.full_like(self.model.weight, request))
        return "ok"


def _guarded(settle=lambda name: None):
    model = torch.nn.Linear(4, 4)
    return model, GuardedWeightUpdater(_Updater(model), lambda: model, "[edgeacc decode tp0]", settle=settle)


def test_the_prefill_side_is_settled_before_the_weights_are_written():
    seen = []
    model, updater = _guarded(settle=lambda name: seen.append((name, model.weight.detach().clone())))
    before = model.weight.detach().clone()
    updater.update_weights_from_disk(2.0)
    assert [name for name, _ in seen] == ["update_weights_from_disk"]
    assert torch.equal(seen[0][1], before)  # settled while the old weights were still there


def test_an_in_place_update_passes_and_keeps_the_memory():
    model, updater = _guarded()
    address = model.weight.data_ptr()
    assert updater.update_weights_from_disk(2.0) == "ok"
    assert model.weight.data_ptr() == address and torch.all(model.weight == 2.0)


def test_an_update_that_reallocates_stops_with_the_reason():
    model, updater = _guarded()
    with pytest.raises(SharedWeightsMoved, match=r"update_weights_from_tensor replaced the memory of 1 .*weight"):
        updater.update_weights_from_tensor(3.0)


def test_everything_else_passes_through():
    seen = []
    model, updater = _guarded(settle=seen.append)
    assert updater.model is model
    assert seen == []
