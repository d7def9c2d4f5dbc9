"""The EdgeAcc group decision over real gloo process groups."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, flags: list, out) -> None:
    import torch.distributed as dist

    from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # Two disjoint subgroups, as two attention-TP groups of a DP-attention launch.
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = groups[rank // 2]
    out.put((rank, [all_ranks_agree(f, mine) for f in flags[rank]]))
    dist.destroy_process_group()


def test_each_subgroup_agrees_on_its_own_slowest_rank():
    flags = [
        [True, False, True],   # group 0, rank 0
        [True, True, False],   # group 0, rank 1
        [False, True, True],   # group 1, rank 2
        [False, True, True],   # group 1, rank 3
    ]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, 4, port, flags, out)) for r in range(4)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1] == [True, False, False]
    assert results[2] == results[3] == [False, True, True]


def test_a_single_rank_group_decides_alone():
    import torch.distributed as dist

    from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        assert all_ranks_agree(True, dist.group.WORLD) is True
        assert all_ranks_agree(False, dist.group.WORLD) is False
    finally:
        dist.destroy_process_group()
