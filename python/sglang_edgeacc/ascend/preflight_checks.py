"""The Ascend preflight: each check turns (launch flags, environment, checkpoint) into pass / warn / fail.

A check that fails names the configuration that would hang at "Capturing
batches" or die in a DeepEP kernel (``aclnnDispatchNormalA2``,
``aclnnMoeDistributeDispatchV2``) and gives a one-line fix: the exact
``export``/``unset`` or flag to change. :func:`run_preflight` is what both
``sglang-edgeacc doctor`` and the launcher hook call; nothing here imports
sglang or torch.

The token counts per rank the dispatch checks compare come from
:mod:`.dispatch_plan`; the result and report types are in :mod:`.preflight_report`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Mapping, Optional

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.checkpoint import UNQUANTIZED, CheckpointFacts, read_checkpoint
from sglang_edgeacc.ascend.dispatch_plan import (
    ANT_ROUND,
    ANT_TOKENS,
    LL_TOKENS_ENV,
    DispatchPlan,
    buffer_requirements,
    env_truthy,
    plan_dispatch,
    read_ant_moving,
)
from sglang_edgeacc.ascend.hardware import HardwareGuess, detect_hardware
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, WARN, AutoSizing, CheckResult, PreflightReport

SPEC_ENV_VARS = ("SGLANG_ENABLE_SPEC_V2", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM")
AUTO_SIZED_VAR = "DEEPEP_HCCL_BUFFSIZE"

# Algorithms that draft with the target checkpoint's own MTP layer unless a draft model is given.
MTP_ALGORITHMS = ("NEXTN", "EAGLE")
SPECULATIVE_FLAGS = (
    "--speculative-algorithm/--speculative-num-steps/--speculative-eagle-topk/--speculative-num-draft-tokens"
)


def _shown(value: Optional[str]) -> str:
    return "not set" if value is None else repr(value)


def _check_device(s: LaunchSettings) -> CheckResult:
    if s.device == "npu":
        return CheckResult("device", PASS, "--device npu")
    if s.device is None:
        return CheckResult(
            "device", WARN,
            "--device not given: sglang picks the NPU on an Ascend host, "
            "but the launch will not size the HCCL buffer by itself",
            "add --device npu",
        )
    return CheckResult("device", WARN, f"--device {s.device}: these checks are for Ascend launches", "add --device npu")


def _check_hardware(hw: HardwareGuess) -> CheckResult:
    if hw.assumed:
        return CheckResult(
            "hardware", WARN,
            f"Ascend generation not detected; {hw.hardware.upper()} {hw.source}",
            "export SGLANG_EDGEACC_ASCEND_HARDWARE=a2  # or a3",
        )
    return CheckResult("hardware", PASS, f"{hw.hardware.upper()} (from {hw.source})")


def _check_checkpoint(s: LaunchSettings, ckpt: Optional[CheckpointFacts]) -> CheckResult:
    if ckpt is None:
        return CheckResult(
            "checkpoint", WARN, f"--model-path {s.model_path} is not a local directory; checkpoint checks skipped",
            "pass the local checkpoint directory as --model-path",
        )
    if ckpt.problems:
        return CheckResult(
            "checkpoint", FAIL, "; ".join(ckpt.problems), f"repair or re-download the files named in {ckpt.path}"
        )
    if not ckpt.readable:
        return CheckResult(
            "checkpoint", FAIL, f"{ckpt.path} has no config.json",
            "point --model-path at the checkpoint directory that holds config.json",
        )
    found = (
        f"{ckpt.path}: config.json"
        + (", index" if ckpt.weight_names is not None else "")
        + (", quant_model_description.json" if ckpt.quant_description is not None else "")
    )
    return CheckResult("checkpoint", PASS, found)


def _uses_target_mtp(s: LaunchSettings) -> bool:
    draft = s.speculative_draft_model_path
    same = draft is None or os.path.normpath(str(draft)) == os.path.normpath(s.model_path)
    return (s.speculative_algorithm or "").upper() in MTP_ALGORITHMS and same


def _check_mtp(s: LaunchSettings, ckpt: Optional[CheckpointFacts]) -> CheckResult:
    cid = "speculative-mtp"
    if not s.speculative:
        return CheckResult(cid, PASS, "no speculative decoding")
    if not _uses_target_mtp(s):
        return CheckResult(
            cid, PASS,
            f"{s.speculative_algorithm} drafts with {s.speculative_draft_model_path or 'no MTP layer'}; "
            "the target's MTP layer is not used",
        )
    drop = (
        f"remove {SPECULATIVE_FLAGS} (and unset {' '.join(SPEC_ENV_VARS)}), "
        "or use a checkpoint that ships the MTP layer"
    )
    if ckpt is None or not ckpt.readable:
        return CheckResult(
            cid, WARN,
            f"{s.speculative_algorithm} needs the checkpoint's MTP layer, "
            "and the checkpoint cannot be read to confirm it has one",
            "pass the local checkpoint directory as --model-path",
        )
    layers = ckpt.num_hidden_layers
    if ckpt.num_nextn_predict_layers < 1:
        return CheckResult(
            cid, FAIL,
            f"{s.speculative_algorithm} drafts with the MTP layer, but config.json has num_nextn_predict_layers "
            f"{(ckpt.config or {}).get('num_nextn_predict_layers', 'missing')}: the checkpoint has no MTP layer",
            drop,
        )
    present = ckpt.mtp_weights_present()
    if present is False:
        return CheckResult(
            cid, FAIL,
            f"{s.speculative_algorithm} drafts with the MTP layer, but model.safetensors.index.json has no "
            f"{ckpt.mtp_prefix}* tensors (layer {layers} = num_hidden_layers): the MTP weights were not exported; "
            "sglang skips missing tensors silently, "
            "so the draft model runs uninitialised (the capture hangs or the load fails)",
            drop,
        )
    main, mtp = ckpt.main_quantization(), ckpt.mtp_quantization()
    draft_quant = (s.speculative_draft_model_quantization or "").lower()
    if main is not None and main != UNQUANTIZED:
        if mtp in (None, UNQUANTIZED):
            where = "has no entries for" if mtp is None else "marks FLOAT (bf16)"
            if draft_quant == "unquant":
                return CheckResult(
                    cid, PASS,
                    f"MTP layer {ckpt.mtp_prefix}* is bf16 while the main model is {main}; "
                    "--speculative-draft-model-quantization unquant says so",
                )
            return CheckResult(
                cid, FAIL,
                f"the main model is {main} but quant_model_description.json {where} the MTP layer {ckpt.mtp_prefix}*: "
                "the draft would be loaded as quantized without quantized weights",
                "add --speculative-draft-model-quantization unquant "
                "(or use a checkpoint whose MTP layer is quantized, e.g. a '-mtp' ModelSlim export)",
            )
        if draft_quant == "unquant":
            return CheckResult(
                cid, FAIL,
                f"the MTP layer is quantized ({mtp}) "
                "but --speculative-draft-model-quantization unquant loads it as bf16",
                "remove --speculative-draft-model-quantization unquant",
            )
        return CheckResult(
            cid, PASS,
            f"MTP layer {ckpt.mtp_prefix}* present and quantized like the main model ({mtp})"
            + ("" if present else "; no index, tensors not listed"),
        )
    if main == UNQUANTIZED and mtp not in (None, UNQUANTIZED) and not draft_quant:
        return CheckResult(
            cid, FAIL,
            f"the main model is unquantized but the MTP layer is {mtp}",
            f"add --speculative-draft-model-quantization {s.quantization or 'modelslim'}",
        )
    if present is None:
        return CheckResult(
            cid, WARN,
            f"num_nextn_predict_layers={ckpt.num_nextn_predict_layers}, but without model.safetensors.index.json "
            f"the MTP tensors {ckpt.mtp_prefix}* cannot be confirmed without opening the weights",
            "check that the safetensors hold " + str(ckpt.mtp_prefix) + "* tensors",
        )
    return CheckResult(cid, PASS, f"MTP layer {ckpt.mtp_prefix}* present")


def _check_spec_env(s: LaunchSettings, env: Mapping[str, str]) -> CheckResult:
    cid = "speculative-env"
    set_vars = [v for v in SPEC_ENV_VARS if env_truthy(env.get(v))]
    if set_vars and not s.speculative:
        return CheckResult(
            cid, WARN,
            f"{', '.join(set_vars)} set without speculative decoding (left over from an MTP setup)",
            f"unset {' '.join(set_vars)}",
        )
    if "SGLANG_ENABLE_SPEC_V2" in set_vars and (s.speculative_eagle_topk or 1) != 1:
        return CheckResult(
            cid, WARN,
            f"SGLANG_ENABLE_SPEC_V2 needs --speculative-eagle-topk 1, got {s.speculative_eagle_topk}",
            "use --speculative-eagle-topk 1",
        )
    found = ", ".join(set_vars) + " set with speculative decoding" if set_vars else "no speculative-only variables set"
    return CheckResult(cid, PASS, found)


def _check_buffer(
    s: LaunchSettings, env, plan: DispatchPlan, hardware: str, ckpt: Optional[CheckpointFacts], ant
) -> tuple[CheckResult, Optional[AutoSizing]]:
    cid = "hccl-buffer"
    if not s.uses_deepep:
        return CheckResult(cid, PASS, "DeepEP not in use (--moe-a2a-backend is not deepep)"), None
    try:
        configured = hb.configured_buffer(env)
    except ValueError as exc:
        return CheckResult(cid, FAIL, str(exc), "export HCCL_BUFFSIZE=<MB, a positive integer>"), None
    if configured.mb > hb.MAX_HCCL_BUFFSIZE_MB:
        return CheckResult(
            cid, FAIL,
            f"{configured.source}={configured.mb} exceeds {hb.MAX_HCCL_BUFFSIZE_MB}: "
            "DeepEP reads it into a uint16 and it wraps",
            f"export {configured.source}=<MB, at most {hb.MAX_HCCL_BUFFSIZE_MB}>",
        ), None
    if ckpt is None or not ckpt.readable:
        return CheckResult(
            cid, WARN,
            f"{configured.mb} MB from {configured.source}; requirement unknown without config.json",
            "pass the local checkpoint directory as --model-path, or size it with `sglang-edgeacc hccl-budget`",
        ), None
    try:
        shape = hb.model_shape_from_config(ckpt.config, s.ep_num_redundant_experts)
    except ValueError as exc:
        return CheckResult(cid, WARN, str(exc)), None
    reqs = buffer_requirements(plan, hardware, shape, ant)
    binding = max(reqs.values(), key=lambda r: r.required_mb)
    parts = "; ".join(
        f"{mode} {r.required_mb} MB [{r.path}, {r.tokens_per_rank} tokens/rank]" for mode, r in reqs.items()
    )
    auto_mb, margin = hb.auto_buffer_mb(binding.required_mb)
    derivation = (
        f"requirement {binding.required_mb} MB = max over the dispatch modes of --deepep-mode {s.deepep_mode}: "
        f"{parts}; margin {margin} MB = max({hb.AUTO_MARGIN_MIN_MB} MB, {int(hb.AUTO_MARGIN_FRACTION * 100)}%)"
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


def _check_ant_moving(s: LaunchSettings, plan: DispatchPlan, ant, ant_problems: list[str]) -> CheckResult:
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
        problems = hb.ant_moving_problems(ant)
        if problems:
            return CheckResult(
                cid, FAIL, "; ".join(problems),
                f"export {ANT_ROUND}=<1..256> {ANT_TOKENS}=<32..8192>  # product <= {hb.ANT_MOVING_MAX_TOTAL_TOKENS}",
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
    capacity = (ant or hb.DEFAULT_ANT_MOVING).capacity
    if plan.prefill_tokens_per_rank > capacity:
        rounds = math.ceil(plan.prefill_tokens_per_rank / hb.ANT_MOVING_DEFAULT_PER_ROUND_TOKENS)
        return CheckResult(
            cid, FAIL,
            f"{plan.prefill_tokens_per_rank} tokens per rank per normal dispatch ({plan.prefill_derivation}) exceed "
            f"ROUND x PER_ROUND_TOKENS = {capacity}" + (" (the defaults 1 x 8192)" if ant is None else "")
            + ": deep_ep.cpp get_dispatch_layout asserts",
            f"export {ANT_ROUND}={rounds} {ANT_TOKENS}={hb.ANT_MOVING_DEFAULT_PER_ROUND_TOKENS}"
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


def _check_normal_tokens(s: LaunchSettings, plan: DispatchPlan) -> CheckResult:
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


def _check_ll_tokens(s: LaunchSettings, plan: DispatchPlan) -> CheckResult:
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


def _check_a2_two_node_env(s: LaunchSettings, env, plan: DispatchPlan, hardware: str) -> list[CheckResult]:
    two_node_a2 = hardware == "a2" and (plan.layered or s.nnodes > 1)
    ids = ("hccl-intra-pcie", "hccl-intra-roce", "hccl-op-expansion-mode")
    if not two_node_a2:
        return [CheckResult(i, PASS, "not a multi-node A2 launch") for i in ids]
    out = []
    pcie = env.get("HCCL_INTRA_PCIE_ENABLE")
    out.append(
        CheckResult(ids[0], PASS, "HCCL_INTRA_PCIE_ENABLE=1")
        if (pcie or "").strip() == "1"
        else CheckResult(
            ids[0], FAIL,
            f"HCCL_INTRA_PCIE_ENABLE={_shown(pcie)}: the A2 two-node DeepEP kernels need 1 "
            "(intra-server traffic over PCIe, the layered path)",
            "export HCCL_INTRA_PCIE_ENABLE=1",
        )
    )
    roce = env.get("HCCL_INTRA_ROCE_ENABLE")
    out.append(
        CheckResult(ids[1], PASS, "HCCL_INTRA_ROCE_ENABLE=0")
        if (roce or "").strip() == "0"
        else CheckResult(
            ids[1], FAIL,
            f"HCCL_INTRA_ROCE_ENABLE={_shown(roce)}: the A2 two-node DeepEP kernels need 0",
            "export HCCL_INTRA_ROCE_ENABLE=0",
        )
    )
    mode = env.get("HCCL_OP_EXPANSION_MODE")
    out.append(
        CheckResult(
            ids[2], FAIL,
            "HCCL_OP_EXPANSION_MODE=AIV is not supported by DeepEP on A2 (unknown operator errors)",
            "unset HCCL_OP_EXPANSION_MODE",
        )
        if (mode or "").strip().upper() == "AIV"
        else CheckResult(ids[2], PASS, f"HCCL_OP_EXPANSION_MODE={mode}" if mode else "HCCL_OP_EXPANSION_MODE not set")
    )
    return out


_LOOPBACK = re.compile(r"^=?lo\d*$")


def _check_ifnames(s: LaunchSettings, env) -> list[CheckResult]:
    out = []
    for var in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        cid = var.lower().replace("_", "-")
        if s.nnodes <= 1:
            out.append(CheckResult(cid, PASS, "single node"))
            continue
        value = (env.get(var) or "").strip()
        fix = f"export {var}=<the NIC that reaches {s.dist_init_addr or 'the other node'}, e.g. eth0>"
        if not value:
            out.append(CheckResult(
                cid, FAIL,
                f"{var} is not set on a {s.nnodes}-node launch: the rendezvous may bind the wrong interface",
                fix,
            ))
        elif any(_LOOPBACK.match(part.strip()) for part in value.split(",")):
            out.append(CheckResult(
                cid, FAIL, f"{var}={value} names the loopback interface; the other node cannot reach it", fix
            ))
        else:
            out.append(CheckResult(cid, PASS, f"{var}={value}"))
    return out


def _check_launch_arguments(s: LaunchSettings, parse_problem: Optional[str]) -> CheckResult:
    if parse_problem:
        fix = (
            "fix the flag named above (0.5.23 spells --cuda-graph-bs as --cuda-graph-bs-decode)"
            if "cuda-graph" in parse_problem
            else "fix the flag named above"
        )
        return CheckResult("launch-arguments", FAIL, f"sglang's parser rejects the command: {parse_problem}", fix)
    parser = "sglang" if s.parsed_by == "sglang" else "the tolerant fallback"
    return CheckResult("launch-arguments", PASS, f"read by {parser} parser")


def run_checks(
    s: LaunchSettings,
    env: Mapping[str, str],
    ckpt: Optional[CheckpointFacts],
    hw: HardwareGuess,
    parse_problem: Optional[str] = None,
) -> PreflightReport:
    checks: list[CheckResult] = [_check_launch_arguments(s, parse_problem)]
    checks.append(_check_device(s))
    checks.append(_check_hardware(hw))
    checks.append(_check_checkpoint(s, ckpt))
    checks.append(_check_mtp(s, ckpt))
    checks.append(_check_spec_env(s, env))
    plan = plan_dispatch(s, env, hw.hardware)
    ant, ant_problems = read_ant_moving(env)
    buffer_check, auto = _check_buffer(s, env, plan, hw.hardware, ckpt, ant)
    checks.append(buffer_check)
    checks.append(_check_ant_moving(s, plan, ant, ant_problems))
    checks.append(_check_normal_tokens(s, plan))
    checks.append(_check_ll_tokens(s, plan))
    checks.extend(_check_a2_two_node_env(s, env, plan, hw.hardware))
    checks.extend(_check_ifnames(s, env))
    summary = f"{hw.hardware.upper()}, {plan.ranks} ranks on {s.nnodes} node(s)"
    if plan.layered:
        summary += ", layered A2 path"
    return PreflightReport(tuple(checks), auto, summary)


def run_preflight(
    s: LaunchSettings,
    env: Mapping[str, str],
    hardware: Optional[str] = None,
    parse_problem: Optional[str] = None,
    probe=None,
) -> PreflightReport:
    """Read the checkpoint and the hardware, then run every check."""
    ckpt = read_checkpoint(s.model_path) if os.path.isdir(s.model_path) else None
    hw = detect_hardware(env, hardware, probe) if probe is not None else detect_hardware(env, hardware)
    return run_checks(s, env, ckpt, hw, parse_problem)
