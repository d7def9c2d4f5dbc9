"""Real gloo process groups for tests: spawn ``world`` ranks and collect what each returns."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

RANK_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_entry(target, rank: int, world: int, port: int, out, args) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out.put((rank, target(rank, *args)))
    finally:
        dist.destroy_process_group()


def run_ranks(target, world: int, *args) -> dict:
    """``target(rank, *args)`` in ``world`` spawned processes of one gloo group; ``{rank: its result}``.

    ``target`` must be a module-level function (spawn pickles it by name).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(target, r, world, port, out, args)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=RANK_TIMEOUT_S) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results
