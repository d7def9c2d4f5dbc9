"""What a running EdgeAcc server says about itself: the ``edge_acc`` entry of ``/get_server_info`` and one log line.

``/get_server_info`` (and ``/server_info``) lists, under ``internal_states``,
the answer of one scheduler per DP rank to upstream's internal-state query. A
decode side is that scheduler, and adds ``edge_acc`` to its answer: that
EdgeAcc is on, the SM split in effect on each side, the gap between tokens that
decode pacing aims at while the prefill side has a batch (the knob between the
first token and the gaps between tokens), and the pids of the decode side (the scheduler
process upstream started) and of the prefill side (the process EdgeAcc started)
of every rank of its attention-TP group. The same facts go to the startup log
once per group, as one INFO line.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR, SideSplit
from sglang_edgeacc.edge_acc_server import roles


def decode_side_split(mode: str, device_type: str, environ: Optional[Mapping[str, str]] = None) -> SideSplit:
    """The SM split the decode side runs under: what the launcher put in its environment.

    Only the MPS split confines the decode side (``launch_environment`` sets its
    thread percentage); under green contexts only the prefill side is confined.
    """
    env = os.environ if environ is None else environ
    if device_type != "cuda":
        return SideSplit(roles.DECODE, "none", None, {}, f"none ({device_type} platform has no SMs to split)")
    limited = env.get(MPS_PERCENT_VAR)
    if mode != "none" and limited:
        return SideSplit(roles.DECODE, "mps", int(limited), {}, f"mps, {MPS_PERCENT_VAR}={limited}")
    return SideSplit(roles.DECODE, "none", None, {}, "unconfined, the whole GPU")


def gather_pairs(own: dict, group) -> list[dict]:
    """Every rank's pair of pids in ``group`` (a CPU process group; None for a group of one), by TP rank.

    A collective: every rank of the group calls it at the same point of its start.
    """
    import torch.distributed as dist

    if group is None or dist.get_world_size(group=group) == 1:
        return [own]
    gathered: list = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(gathered, own, group=group)
    return sorted(gathered, key=lambda pair: pair["tp_rank"])


def pacing_entry(itl_slo_ms: float, pacer) -> dict:
    """Decode pacing as in effect: the target it follows and the gaps between tokens it aims at (None: off).

    ``pacer``: the :class:`~sglang_edgeacc.edge_acc_server.decode_pacing.DecodePacer`, retargeted first.
    """
    if not pacer.enabled:
        return {"itl_slo_ms": itl_slo_ms, "aimed_gap_ms": None}
    return {"itl_slo_ms": itl_slo_ms, "aimed_gap_ms": {"prompts_waiting": round(pacer.aim_s(True) * 1000, 1),
                                                       "none_waiting": round(pacer.aim_s(False) * 1000, 1)}}


def edge_acc_entry(sm_partition: str, prefill: SideSplit, decode: SideSplit, pacing: dict, pairs: list[dict],
                   dp_rank: Optional[int]) -> dict:
    """The ``edge_acc`` entry of a decode side's internal state: plain values only (it is serialized)."""
    return {
        "enabled": True,
        "sm_partition": sm_partition,  # as asked on the command line
        "sm_split": {  # as in effect on this platform
            "mode": prefill.mode,
            "prefill": prefill.detail,
            "decode": decode.detail,
            "prefill_sm_percent": prefill.percent,
            "decode_sm_percent": decode.percent,
        },
        "decode_pacing": dict(pacing),
        "dp_rank": dp_rank,
        "sides": [dict(pair) for pair in pairs],
    }


def startup_line(entry: dict) -> str:
    """The startup log's one line for a group, from its ``edge_acc`` entry."""
    split = entry["sm_split"]
    if split["prefill"] == split["decode"]:
        said = split["prefill"]
    else:
        said = f"prefill side {split['prefill']}; decode side {split['decode']}"
    sides = "; ".join(
        f"tp{pair['tp_rank']}: decode side pid {pair['decode_pid']} (the scheduler), "
        f"prefill side pid {pair['prefill_pid']}"
        for pair in entry["sides"]
    )
    dp = "" if entry["dp_rank"] is None else f" (dp{entry['dp_rank']})"
    return f"EdgeAcc on{dp}. SM split: {said}. {pacing_said(entry['decode_pacing'])}. {sides}"


def pacing_said(pacing: dict, target_named: str = "--edge-acc-itl-slo-ms") -> str:
    """Decode pacing in words, its target named as ``target_named`` (the flag at start)."""
    gaps = pacing["aimed_gap_ms"]
    if gaps is None:
        return "Decode pacing off: decode steps back to back beside a prefill"
    # The gap is what a user trades: wider, the prefill side has more of the GPU and the first
    # token comes sooner.
    waiting, none_waiting = gaps["prompts_waiting"], gaps["none_waiting"]
    if waiting == none_waiting:
        apart = f"about {waiting:g} ms apart"
    else:
        apart = f"about {waiting:g} ms apart while prompts wait for the prefill side, {none_waiting:g} ms while none does"
    return f"Beside a prefill, decode steps wait so that tokens come {apart} ({target_named} {pacing['itl_slo_ms']:g})"
