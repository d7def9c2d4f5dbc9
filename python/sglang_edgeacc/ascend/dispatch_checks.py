"""Preflight checks of DeepEP's dispatch: the HCCL buffer, ant-moving and the tokens per rank of each mode.

The token counts per rank these checks compare come from :mod:`.dispatch_plan`.
"""

from __future__ import annotations

import math
from typing import Optional

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.buffer_setting import (
    AUTO_MARGIN_FRACTION,
    AUTO_MARGIN_MIN_MB,
    MAX_HCCL_BUFFSIZE_MB,
    auto_buffer_mb,
    configured_buffer,
)
from sglang_edgeacc.ascend.checkpoint import CheckpointFacts
from sglang_edgeacc.ascend.dispatch_inputs import (
    ANT_MOVING_DEFAULT_PER_ROUND_TOKENS,
    ANT_MOVING_MAX_TOTAL_TOKENS,
    DEFAULT_ANT_MOVING,
    ant_moving_problems,
    model_shape_from_config,
)
from sglang_edgeacc.ascend.dispatch_plan import (
    ANT_ROUND,
    ANT_TOKENS,
    LL_TOKENS_ENV,
    DispatchPlan,
    buffer_requirements,
)
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, WARN, AutoSizing, CheckResult

AUTO_SIZED_VAR = "DEEPEP_HCCL_BUFFSIZE"


def check_buffer(
    s: LaunchSettings, env, plan: DispatchPlan, hardware: str, ckpt: Optional[CheckpointFacts], ant
) -> tuple[CheckResult, Optional[AutoSizing]]:
    cid = "hccl-buffer"
    if not s.uses_deepep:
        return CheckResult(cid, PASS, "DeepEP not in use (--moe-a2a-backend is not deepep)"), None
    try:
        configured = configured_buffer(env)
    except ValueError as exc:
        return CheckResult(cid, FAIL, str(exc), "export HCCL_BUFFSIZE=<MB, a positive integer>"), None
    if configured.mb > MAX_HCCL_BUFFSIZE_MB:
        return CheckResult(
            cid, FAIL,
            f"{configured.source}={configured.mb} exceeds {MAX_HCCL_BUFFSIZE_MB}: "
            "DeepEP reads it into a uint16 and it wraps",
            f"export {configured.source}=<MB, at most {MAX_HCCL_BUFFSIZE_MB}>",
        ), None
    if ckpt is None or not ckpt.readable:
        return CheckResult(
            cid, WARN,
            f"{configured.mb} MB from {configured.source}; requirement unknown without config.json",
            "pass the local checkpoint directory as --model-path, or size it with `sglang-edgeacc hccl-budget`",
        ), None
    try:
        shape = model_shape_from_config(ckpt.config, s.ep_num_redundant_experts)
    except ValueError as exc:
        return CheckResult(cid, WARN, str(exc)), None
    reqs = buffer_requirements(plan, hardware, shape, ant)
    binding = max(reqs.values(), key=lambda r: r.required_mb)
    parts = "; ".join(
        f"{mode} {r.required_mb} MB [{r.path}, {r.tokens_per_rank} tokens/rank]" for mode, r in reqs.items()
    )
    auto_mb, margin = auto_buffer_mb(binding.required_mb)
    derivation = (
        f"requirement {binding.required_mb} MB = max over the dispatch modes of --deepep-mode {s.deepep_mode}: "
        f"{parts}; margin {margin} MB = max({AUTO_MARGIN_MIN_MB} MB, {int(AUTO_MARGIN_FRACTION * 100)}%)"
    )
    if configured.explicit:
        if configured.mb < binding.required_mb:
            return CheckResult(
                cid, FAIL,
                f"{configured.source}={configured.mb} MB is below the {binding.required_mb} MB DeepEP needs "
                f"({parts}); the dispatch tiling fails ('HCCL_BUFFSIZE is too SMALL', aclnn...Dispatch... failed) "
                "or the kernel asserts",
                f"export {configured.source}={auto_mb}",
            ), None
        return CheckResult(
            cid, PASS, f"{configured.source}={configured.mb} MB >= {binding.required_mb} MB needed ({parts})"
        ), None
    if s.device == "npu":
        auto = AutoSizing(AUTO_SIZED_VAR, auto_mb, binding.required_mb, margin, derivation)
        return CheckResult(
            cid, PASS,
            f"HCCL_BUFFSIZE/DEEPEP_HCCL_BUFFSIZE not set: the launch will export {AUTO_SIZED_VAR}={auto_mb} "
            f"({binding.required_mb} MB needed + {margin} MB margin; {parts})",
            f"export {AUTO_SIZED_VAR}={auto_mb}  # to pin it",
        ), auto
    if configured.mb < binding.required_mb:
        return CheckResult(
            cid, FAIL,
            f"no HCCL buffer set: the default {configured.mb} MB is below the {binding.required_mb} MB "
            f"DeepEP needs ({parts})",
            f"export {AUTO_SIZED_VAR}={auto_mb}",
        ), None
    return CheckResult(cid, PASS, f"default {configured.mb} MB >= {binding.required_mb} MB needed ({parts})"), None


def check_ant_moving(s: LaunchSettings, plan: DispatchPlan, ant, ant_problems: list[str]) -> CheckResult:
    cid = "ant-moving"
    fix_unset = f"unset {ANT_ROUND} {ANT_TOKENS}"
    if ant_problems:
        return CheckResult(
            cid, FAIL, ant_problems[0], f"export {ANT_ROUND}=<rounds> {ANT_TOKENS}=<tokens>  # both, or {fix_unset}"
        )
    if ant is None and not (s.uses_deepep and "normal" in plan.modes):
        return CheckResult(cid, PASS, "ant-moving not set")
    if ant is not None and not s.uses_deepep:
        return CheckResult(cid, WARN, f"{ANT_ROUND}/{ANT_TOKENS} set but DeepEP is not in use", fix_unset)
    if ant is not None:
        problems = ant_moving_problems(ant)
        if problems:
            return CheckResult(
                cid, FAIL, "; ".join(problems),
                f"export {ANT_ROUND}=<1..256> {ANT_TOKENS}=<32..8192>  # product <= {ANT_MOVING_MAX_TOTAL_TOKENS}",
            )
        if plan.layered:
            return CheckResult(
                cid, FAIL,
                f"ant-moving ({ANT_ROUND}={ant.rounds}, {ANT_TOKENS}={ant.per_round_tokens}) is set on the A2 two-node "
                "(internode, layered) normal dispatch, which does not support it: aclnnDispatchNormalA2 fails tiling",
                fix_unset,
            )
    if "normal" not in plan.modes or plan.layered:
        return CheckResult(
            cid, PASS,
            "ant-moving not set" if ant is None else f"{ant.rounds} x {ant.per_round_tokens} (no normal dispatch)",
        )
    capacity = (ant or DEFAULT_ANT_MOVING).capacity
    if plan.prefill_tokens_per_rank > capacity:
        rounds = math.ceil(plan.prefill_tokens_per_rank / ANT_MOVING_DEFAULT_PER_ROUND_TOKENS)
        return CheckResult(
            cid, FAIL,
            f"{plan.prefill_tokens_per_rank} tokens per rank per normal dispatch ({plan.prefill_derivation}) exceed "
            f"ROUND x PER_ROUND_TOKENS = {capacity}" + (" (the defaults 1 x 8192)" if ant is None else "")
            + ": deep_ep.cpp get_dispatch_layout asserts",
            f"export {ANT_ROUND}={rounds} {ANT_TOKENS}={ANT_MOVING_DEFAULT_PER_ROUND_TOKENS}"
            "  # or lower --chunked-prefill-size",
        )
    if ant is None:
        return CheckResult(
            cid, PASS, f"ant-moving not set; {plan.prefill_tokens_per_rank} tokens per rank fit one 8192-token round"
        )
    return CheckResult(
        cid, PASS,
        f"{ant.rounds} x {ant.per_round_tokens} = {capacity} >= {plan.prefill_tokens_per_rank} tokens per rank",
    )


def check_normal_tokens(s: LaunchSettings, plan: DispatchPlan) -> CheckResult:
    cid = "normal-tokens-per-rank"
    if not s.uses_deepep or "normal" not in plan.modes:
        return CheckResult(cid, PASS, "no DeepEP normal dispatch")
    if plan.layered and plan.prefill_tokens_per_rank > hb.A2_INTERNODE_MAX_TOKENS_PER_RANK:
        scatter = max(1, s.tp_size // max(1, s.attn_dp_size))
        chunk = hb.A2_INTERNODE_MAX_TOKENS_PER_RANK * scatter * max(1, s.attn_dp_size)
        return CheckResult(
            cid, FAIL,
            f"{plan.prefill_tokens_per_rank} tokens per rank ({plan.prefill_derivation}) exceed the A2 two-node normal "
            f"dispatch limit of {hb.A2_INTERNODE_MAX_TOKENS_PER_RANK}: aclnnDispatchNormalA2 fails tiling",
            f"--chunked-prefill-size {chunk} "
            f"--max-prefill-tokens {min(s.max_prefill_tokens, chunk // max(1, s.attn_dp_size))}",
        )
    return CheckResult(
        cid, PASS, f"{plan.prefill_tokens_per_rank} tokens per rank per normal dispatch ({plan.prefill_derivation})"
    )


def check_ll_tokens(s: LaunchSettings, plan: DispatchPlan) -> CheckResult:
    cid = "low-latency-tokens-per-rank"
    if not s.uses_deepep or "low_latency" not in plan.modes:
        return CheckResult(cid, PASS, "no DeepEP low-latency dispatch")
    n, graph = plan.ll_max_dispatch_tokens, plan.graph_tokens_per_rank
    if plan.ll_max_dispatch_tokens_raw is not None and not str(plan.ll_max_dispatch_tokens_raw).strip().isdigit():
        return CheckResult(
            cid, FAIL,
            f"{LL_TOKENS_ENV}={plan.ll_max_dispatch_tokens_raw!r} is not an integer",
            f"export {LL_TOKENS_ENV}={graph or hb.LL_DEFAULT_MAX_DISPATCH_TOKENS_PER_RANK}",
        )
    if n > hb.LL_MAX_DISPATCH_TOKENS_PER_RANK or n < 1:
        return CheckResult(
            cid, FAIL,
            f"{LL_TOKENS_ENV}={n} is outside [1, {hb.LL_MAX_DISPATCH_TOKENS_PER_RANK}] "
            "(sglang's DeepEP dispatcher asserts)",
            f"export {LL_TOKENS_ENV}={min(max(graph or 1, 1), hb.LL_MAX_DISPATCH_TOKENS_PER_RANK)}",
        )
    if plan.layered and n > hb.A2_LAYERED_LL_MAX_TOKENS_PER_RANK:
        return CheckResult(
            cid, FAIL,
            f"{LL_TOKENS_ENV}={n} exceeds the A2 two-node low-latency limit of "
            f"{hb.A2_LAYERED_LL_MAX_TOKENS_PER_RANK} tokens per rank",
            f"export {LL_TOKENS_ENV}={hb.A2_LAYERED_LL_MAX_TOKENS_PER_RANK}",
        )
    if graph is None:
        return CheckResult(
            cid, WARN,
            f"{LL_TOKENS_ENV}={n}; {plan.graph_derivation}, so a decode step may exceed it",
            "add --max-running-requests <N> or enable decode CUDA graphs",
        )
    if graph > n:
        within_layered = not (plan.layered and graph > hb.A2_LAYERED_LL_MAX_TOKENS_PER_RANK)
        if graph <= hb.LL_MAX_DISPATCH_TOKENS_PER_RANK and within_layered:
            fix = f"export {LL_TOKENS_ENV}={graph}"
        else:
            fix = "lower --cuda-graph-bs-decode (older releases: --cuda-graph-bs) or --speculative-num-draft-tokens"
        return CheckResult(
            cid, FAIL,
            f"decode dispatches up to {graph} tokens per rank ({plan.graph_derivation}) but {LL_TOKENS_ENV}={n}: "
            "the low-latency dispatch fails while capturing the decode graphs (peers then wait at 'Capturing batches')",
            fix,
        )
    return CheckResult(cid, PASS, f"{LL_TOKENS_ENV}={n} >= {graph} tokens per rank ({plan.graph_derivation})")

