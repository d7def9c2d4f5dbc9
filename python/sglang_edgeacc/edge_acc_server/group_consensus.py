"""One decision taken together by the ranks that run a forward together."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_ranks_agree(flag: bool, group) -> bool:
    """True only if ``flag`` is True on every rank of ``group`` (a CPU/gloo group).

    Every rank of ``group`` must call this the same number of times: it is a
    collective (a MIN all-reduce of one integer).
    """
    if dist.get_world_size(group=group) == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)
    return bool(value.item())


def is_group_leader(group) -> bool:
    """True on the first rank of ``group`` (the one whose choice :func:`leader_decides` hands out)."""
    return dist.get_world_size(group=group) == 1 or dist.get_rank(group=group) == 0


def leader_decides(value: int, group) -> int:
    """``value`` of the group's first rank, on every rank of ``group`` (a CPU/gloo group).

    For a choice every rank must make alike, such as the SM partition of a batch
    whose forward has TP collectives: ranks that chose apart would run at the pace
    of the smallest partition while the others hold SMs decode needs. A collective,
    like :func:`all_ranks_agree`.
    """
    if dist.get_world_size(group=group) == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(tensor, src=dist.get_global_rank(group, 0), group=group)
    return int(tensor.item())
