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

