"""``sglang-edgeacc hccl-budget``: the HCCL buffer DeepEP needs, and what makes it up.

Example (DeepSeek-V3.2 prefill on one A3 node, 2125 tokens per rank)::

    sglang-edgeacc hccl-budget --hardware a3 --mode normal --hidden-size 7168 \\
        --topk 8 --num-experts 256 --tokens-per-rank 2125

``--tokens-per-rank`` is the most tokens one rank sends in one dispatch: for
normal (prefill) dispatch the prefill batch of a DP rank divided by its
attention-TP ranks; for low-latency (decode) dispatch the value of
``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``. ``sglang-edgeacc doctor``
derives both from a launch command.
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.buffer_setting import auto_buffer_mb
from sglang_edgeacc.ascend.dispatch_inputs import DEFAULT_ANT_MOVING, AntMoving, ModelShape, ant_moving_problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hardware", choices=hb.HARDWARE_CHOICES, required=True, help="a2 (910B) or a3 (910_93)")
    parser.add_argument("--mode", choices=("normal", "low_latency"), required=True,
                        help="normal (prefill) or low_latency (decode) dispatch")
    parser.add_argument("--hidden-size", type=int, required=True, help="config.json hidden_size")
    parser.add_argument("--topk", type=int, required=True, help="config.json num_experts_per_tok")
    parser.add_argument("--num-experts", type=int, required=True,
                        help="routed experts (n_routed_experts) plus redundant ones")
    parser.add_argument("--tokens-per-rank", type=int, required=True, help="most tokens one rank sends in one dispatch")
    parser.add_argument("--nodes", type=int, default=1,
                        help="servers (default 1); two A2 servers take the layered kernels")
    parser.add_argument("--ranks", type=int, default=None, help="EP ranks (default: 8 per A2 node, 16 per A3 node)")
    parser.add_argument("--shared-experts", type=int, default=0,
                        help="shared experts dispatched through DeepEP (sglang: 0)")
    parser.add_argument(
        "--ant-moving",
        nargs=2,
        type=int,
        metavar=("ROUNDS", "PER_ROUND_TOKENS"),
        help="DEEPEP_NORMAL_LONG_SEQ_ROUND and DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS (normal mode)",
    )
    parser.add_argument("--int8-dispatch", action="store_true",
                        help="int8 low-latency dispatch (shrinks A3 dispatch slots)")
    parser.add_argument("--json", action="store_true", help="print a JSON object with required_mb and the terms")


def compute(args: argparse.Namespace) -> hb.Requirement:
    if args.nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {args.nodes}")
    ranks = args.ranks if args.ranks is not None else hb.default_ranks(args.hardware, args.nodes)
    if args.hardware == "a2" and args.nodes > 1 and ranks <= hb.A2_RANKS_PER_NODE:
        raise ValueError(f"--ranks {ranks} on --nodes {args.nodes}: an A2 node holds {hb.A2_RANKS_PER_NODE} ranks, "
                         f"so {args.nodes} nodes are {args.nodes * hb.A2_RANKS_PER_NODE}")
    shape = ModelShape(args.hidden_size, args.topk, args.num_experts, args.shared_experts)
    if args.mode == "normal":
        if args.int8_dispatch:
            # The normal dispatch slot is sized for bf16 either way; say so instead of silently ignoring it.
            print("note: --int8-dispatch does not change normal-mode slots (sized for bf16 by the kernel)",
                  file=sys.stderr)
        ant = None
        if args.ant_moving:
            ant = AntMoving(*args.ant_moving)
            problems = ant_moving_problems(ant)
            if problems:
                raise ValueError("; ".join(problems))
            if args.tokens_per_rank > ant.capacity:
                raise ValueError(
                    f"--tokens-per-rank {args.tokens_per_rank} exceeds ROUND x PER_ROUND_TOKENS = {ant.capacity}")
        elif args.tokens_per_rank > DEFAULT_ANT_MOVING.capacity and not hb.is_layered(args.hardware, ranks):
            raise ValueError(
                f"--tokens-per-rank {args.tokens_per_rank} exceeds one 8192-token round; "
                "add --ant-moving ROUNDS PER_ROUND_TOKENS with ROUNDS x PER_ROUND_TOKENS >= it"
            )
        if hb.is_layered(args.hardware, ranks) and args.tokens_per_rank > hb.A2_INTERNODE_MAX_TOKENS_PER_RANK:
            raise ValueError(f"--tokens-per-rank {args.tokens_per_rank} exceeds the A2 two-node normal limit "
                             f"of {hb.A2_INTERNODE_MAX_TOKENS_PER_RANK}")
        return hb.normal_requirement(args.hardware, shape, ranks, args.tokens_per_rank, ant)
    if args.ant_moving:
        raise ValueError("--ant-moving applies to --mode normal only")
    if args.tokens_per_rank > hb.LL_MAX_DISPATCH_TOKENS_PER_RANK:
        raise ValueError(f"--tokens-per-rank {args.tokens_per_rank}: low-latency dispatch allows at most "
                         f"{hb.LL_MAX_DISPATCH_TOKENS_PER_RANK}")
    return hb.low_latency_requirement(args.hardware, shape, ranks, args.tokens_per_rank, args.int8_dispatch)


def render(req: hb.Requirement) -> str:
    auto, margin = auto_buffer_mb(req.required_mb)
    width = max(len(t.name) for t in req.terms)
    lines = [f"HCCL_BUFFSIZE >= {req.required_mb} MB  ({req.path}, {req.tokens_per_rank} tokens per rank)"]
    for t in req.terms:
        lines.append(f"  {t.name:<{width}}  {t.mb:12.3f} MB  {t.formula}")
    lines.append(f"  {'total':<{width}}  {req.required_bytes / hb.MB:12.3f} MB  -> rounded up to {req.required_mb} MB")
    lines.append(f"suggested: export DEEPEP_HCCL_BUFFSIZE={auto}  "
                 f"(+{margin} MB margin, as the launcher's automatic sizing)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        req = compute(args)
    except (ValueError, hb.UnsupportedDispatch) as exc:
        print(f"sglang-edgeacc hccl-budget: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out = req.to_dict()
        out["suggested_mb"] = auto_buffer_mb(req.required_mb)[0]
        print(json.dumps(out, indent=2))
    else:
        print(render(req))
    return 0
