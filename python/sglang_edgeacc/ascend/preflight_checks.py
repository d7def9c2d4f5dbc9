"""The Ascend preflight: each check turns (launch flags, environment, checkpoint) into pass / warn / fail.

A check that fails names the configuration that would hang at "Capturing
batches" or die in a DeepEP kernel (``aclnnDispatchNormalA2``,
``aclnnMoeDistributeDispatchV2``) and gives a one-line fix: the exact
``export``/``unset`` or flag to change. :func:`run_preflight` is what both
``sglang-edgeacc doctor`` and the launcher hook call; nothing here imports
sglang or torch.

The checks themselves, one module per family: :mod:`.setup_checks` (arguments,
device, hardware, checkpoint), :mod:`.speculative_checks` (MTP layer,
speculative variables), :mod:`.dispatch_checks` (HCCL buffer, ant-moving,
tokens per rank) and :mod:`.network_checks` (multi-node environment). The
token counts per rank come from :mod:`.dispatch_plan`; the result and report
types are in :mod:`.preflight_report`.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from sglang_edgeacc.ascend.checkpoint import CheckpointFacts, read_checkpoint
from sglang_edgeacc.ascend.dispatch_checks import check_ant_moving, check_buffer, check_ll_tokens, check_normal_tokens
from sglang_edgeacc.ascend.dispatch_plan import plan_dispatch, read_ant_moving
from sglang_edgeacc.ascend.hardware import HardwareGuess, detect_hardware
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.network_checks import check_a2_two_node_env, check_ifnames
from sglang_edgeacc.ascend.preflight_report import CheckResult, PreflightReport
from sglang_edgeacc.ascend.setup_checks import check_checkpoint, check_device, check_hardware, check_launch_arguments
from sglang_edgeacc.ascend.speculative_checks import check_mtp, check_spec_env


def run_checks(
    s: LaunchSettings,
    env: Mapping[str, str],
    ckpt: Optional[CheckpointFacts],
    hw: HardwareGuess,
    parse_problem: Optional[str] = None,
) -> PreflightReport:
    checks: list[CheckResult] = [check_launch_arguments(s, parse_problem)]
    checks.append(check_device(s))
    checks.append(check_hardware(hw))
    checks.append(check_checkpoint(s, ckpt))
    checks.append(check_mtp(s, ckpt))
    checks.append(check_spec_env(s, env))
    plan = plan_dispatch(s, env, hw.hardware)
    ant, ant_problems = read_ant_moving(env)
    buffer_check, auto = check_buffer(s, env, plan, hw.hardware, ckpt, ant)
    checks.append(buffer_check)
    checks.append(check_ant_moving(s, plan, ant, ant_problems))
    checks.append(check_normal_tokens(s, plan))
    checks.append(check_ll_tokens(s, plan))
    checks.extend(check_a2_two_node_env(s, env, plan, hw.hardware))
    checks.extend(check_ifnames(s, env))
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
