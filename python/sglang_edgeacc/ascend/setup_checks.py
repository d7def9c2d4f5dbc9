"""Preflight checks of what the launch runs on: its arguments, the device, the Ascend generation, the checkpoint."""

from __future__ import annotations

from typing import Optional

from sglang_edgeacc.ascend.checkpoint import CheckpointFacts
from sglang_edgeacc.ascend.hardware import HardwareGuess
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, WARN, CheckResult


def check_launch_arguments(s: LaunchSettings, parse_problem: Optional[str]) -> CheckResult:
    if parse_problem:
        fix = (
            "fix the flag named above (0.5.23 spells --cuda-graph-bs as --cuda-graph-bs-decode)"
            if "cuda-graph" in parse_problem
            else "fix the flag named above"
        )
        return CheckResult("launch-arguments", FAIL, f"sglang's parser rejects the command: {parse_problem}", fix)
    parser = "sglang" if s.parsed_by == "sglang" else "the tolerant fallback"
    return CheckResult("launch-arguments", PASS, f"read by {parser} parser")


def check_device(s: LaunchSettings) -> CheckResult:
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


def check_hardware(hw: HardwareGuess) -> CheckResult:
    if hw.assumed:
        return CheckResult(
            "hardware", WARN,
            f"Ascend generation not detected; {hw.hardware.upper()} {hw.source}",
            "export SGLANG_EDGEACC_ASCEND_HARDWARE=a2  # or a3",
        )
    return CheckResult("hardware", PASS, f"{hw.hardware.upper()} (from {hw.source})")


def check_checkpoint(s: LaunchSettings, ckpt: Optional[CheckpointFacts]) -> CheckResult:
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

