"""The EdgeAcc group decisions over real gloo process groups."""

from __future__ import annotations

import os

import pytest

from tests.gloo_ranks import free_port, run_ranks


def _two_subgroups(rank: int):
    """Two disjoint subgroups, as two attention-TP groups of a DP-attention launch; this rank's."""
    import torch.distributed as dist

    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return groups[rank // 2]


def _agree(rank: int, flags: list) -> list:
    from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree

    mine = _two_subgroups(rank)
    return [all_ranks_agree(f, mine) for f in flags[rank]]


def test_each_subgroup_agrees_on_its_own_slowest_rank():
    flags = [
        [True, False, True],   # group 0, rank 0
        [True, True, False],   # group 0, rank 1
        [False, True, True],   # group 1, rank 2
        [False, True, True],   # group 1, rank 3
    ]
    results = run_ranks(_agree, 4, flags)
    assert results[0] == results[1] == [True, False, False]
    assert results[2] == results[3] == [False, True, True]


def test_a_single_rank_group_decides_alone():
    import torch.distributed as dist

    from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert all_ranks_agree(True, dist.group.WORLD) is True
        assert all_ranks_agree(False, dist.group.WORLD) is False
    finally:
        dist.destroy_process_group()

