"""Issue 4 on two GPUs: DP-attention collectives with idle DP groups, on both EdgeAcc sides at once.

Layout (dp 2, attn-tp 1, one P/D pair per GPU, four processes):

    rank 0: prefill side, GPU 0      rank 2: decode side, GPU 0
    rank 1: prefill side, GPU 1      rank 3: decode side, GPU 1

The world group is gloo (control only: NCCL refuses two ranks of one communicator on one
GPU); the prefill sides share one NCCL group, the decode sides another. Each step, every
rank all-gathers its local token count inside its side's group; if any rank of the side has
tokens, every rank of that side enters the same all_reduce (the dp_gather analogue), an
idle rank with an empty slice (the IDLE batch). Patterns cycle through group0 idle,
group1 idle, both busy and both idle, with random token counts, differently per side.
Every received slice is checked against its owner's tags, and every value must carry the
side's own tag: data from one side's group never appears in the other's.

``--idle-skips`` reintroduces the bug (an idle rank skips the all_reduce): the busy rank
then waits in a collective its peer never enters, the run hangs or corrupts, and the
parent reports it after ``--timeout`` seconds and kills the ranks.

    PYTHONPATH=python python3 -m tests.gpu.dp_attention_collectives --steps 2000
    PYTHONPATH=python python3 -m tests.gpu.dp_attention_collectives --idle-skips --timeout 40 --no-mps
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from datetime import timedelta
from typing import Optional

import torch

from sglang_edgeacc.edge_acc.sm_partition import child_env
from tests.gpu.proof_support import Child, child_send, mps_daemon_running

PATTERNS = ("group0-idle", "group1-idle", "both-busy", "both-idle")
WIDTH = 8
SIDES = ("prefill", "decode")


def tags(side: int, step: int, dp_rank: int, n: int, device) -> torch.Tensor:
    """Values that name their side, step, owner and position: any misplacement is visible."""
    t = torch.arange(n, dtype=torch.int64, device=device).view(n, 1)
    col = torch.arange(WIDTH, dtype=torch.int64, device=device).view(1, WIDTH)
    return ((side + 1) << 56) | (step << 24) | (dp_rank << 20) | (t << 4) | col


def local_tokens(side: int, step: int, dp_rank: int) -> tuple[str, int]:
    """This rank's token count at ``step``; both ranks of a side agree on the pattern, not on counts."""
    pattern = PATTERNS[random.Random(f"pattern-{side}-{step}").randrange(len(PATTERNS))]
    idle = pattern == "both-idle" or pattern == f"group{dp_rank}-idle"
    return pattern, 0 if idle else random.Random(f"n-{side}-{step}-{dp_rank}").randint(1, 64)


def rank_main(
    conn, rank: int, port: int, steps: int, idle_skips: bool, group_timeout_s: float, cpu_debug: bool = False
) -> None:
    import torch.distributed as dist

    report: dict = {"rank": rank, "side": SIDES[rank // 2], "gpu": rank % 2}
    try:
        side, dp_rank = rank // 2, rank % 2
        if cpu_debug:  # the same logic over gloo on the CPU, to debug this script without GPUs
            device, backend = torch.device("cpu"), "gloo"
        else:
            torch.cuda.set_device(dp_rank)
            device, backend = torch.device("cuda", dp_rank), "nccl"
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4, timeout=timedelta(seconds=120)
        )
        groups = [
            dist.new_group([0, 1], backend=backend, timeout=timedelta(seconds=group_timeout_s)),
            dist.new_group([2, 3], backend=backend, timeout=timedelta(seconds=group_timeout_s)),
        ]
        group = groups[side]
        counts = torch.zeros(2, dtype=torch.int64, device=device)
        stats = {p: 0 for p in PATTERNS}
        reduces = bad = cross = 0
        t0 = time.perf_counter()
        for step in range(steps):
            pattern, n = local_tokens(side, step, dp_rank)
            stats[pattern] += 1
            dist.all_gather_into_tensor(counts, torch.tensor([n], dtype=torch.int64, device=device), group=group)
            c = counts.tolist()
            total = sum(c)
            if total == 0:
                continue  # nobody in the side has tokens: nobody enters, consistently
            if idle_skips and n == 0:
                continue  # THE BUG: an idle DP rank skips the collective its busy peer enters
            buf = torch.zeros(total, WIDTH, dtype=torch.int64, device=device)
            offset = sum(c[:dp_rank])
            if n:
                buf[offset : offset + n] = tags(side, step, dp_rank, n, device)
            dist.all_reduce(buf, group=group)
            reduces += 1
            start = 0
            for j in range(2):
                if not torch.equal(buf[start : start + c[j]], tags(side, step, j, c[j], device)):
                    bad += 1
                start += c[j]
            if bool(((buf >> 56) != side + 1).any()):
                cross += 1
        report.update(
            steps=steps,
            patterns=stats,
            all_reduces=reduces,
            bad_slices=bad,
            cross_group_values=cross,
            seconds=round(time.perf_counter() - t0, 3),
        )
        dist.barrier()
        dist.destroy_process_group()
        report["ok"] = True
    except Exception:
        import traceback

        report["ok"] = False
        report["error"] = traceback.format_exc()[-2000:]
    child_send(conn, report)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(
    steps: int, idle_skips: bool, timeout_s: float, use_mps: bool, prefill_percent: int = 50, cpu_debug: bool = False
) -> dict:
    port = free_port()
    group_timeout = max(10.0, timeout_s - 5) if idle_skips else timeout_s
    children = []
    for rank in range(4):
        role = SIDES[rank // 2]
        env = child_env(role, prefill_percent if role == "prefill" else 100, "mps", tp_rank=0) if use_mps else {}
        children.append(Child(rank_main, (rank, port, steps, idle_skips, group_timeout, cpu_debug), env))
    deadline = time.monotonic() + timeout_s
    reports: list[Optional[dict]] = [None] * 4
    for rank, child in enumerate(children):
        try:
            reports[rank] = child.recv(max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            reports[rank] = None
    for child in children:
        child.close(timeout_s=5)
    hung = [r for r, rep in enumerate(reports) if rep is None]
    failed = [r for r, rep in enumerate(reports) if rep is not None and not rep.get("ok")]
    corrupt = [
        r for r, rep in enumerate(reports) if rep and rep.get("ok") and (rep["bad_slices"] or rep["cross_group_values"])
    ]
    return {
        "steps": steps,
        "idle_skips": idle_skips,
        "mps": use_mps,
        "mps_daemon": mps_daemon_running(),
        "timeout_s": timeout_s,
        "hung_ranks": hung,
        "failed_ranks": failed,
        "corrupt_ranks": corrupt,
        "reports": reports,
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds before the parent declares a hang")
    ap.add_argument("--idle-skips", action="store_true", help="reintroduce the bug: idle ranks skip the all_reduce")
    ap.add_argument("--no-mps", action="store_true", help="do not give the ranks MPS percentages")
    ap.add_argument("--cpu-debug", action="store_true", help="gloo on the CPU instead of NCCL on 2 GPUs")
    args = ap.parse_args(argv)
    if torch.cuda.device_count() < 2 and not args.cpu_debug:
        print("needs 2 GPUs")
        return 2
    result = run(
        args.steps, args.idle_skips, args.timeout, use_mps=not args.no_mps and not args.cpu_debug, cpu_debug=args.cpu_debug
    )
    print(json.dumps(result, indent=1, default=str))
    clean = not (result["hung_ranks"] or result["failed_ranks"] or result["corrupt_ranks"])
    if args.idle_skips:
        print("IDLE-SKIP BUG REPRODUCED (hang/failure/corruption)" if not clean else "idle-skip run did NOT misbehave")
        return 0 if not clean else 1
    print("DP ATTENTION COLLECTIVES OK" if clean else "DP ATTENTION COLLECTIVES FAILED")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
