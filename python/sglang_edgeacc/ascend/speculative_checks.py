"""Preflight checks of speculative decoding: the checkpoint's MTP layer and the speculative-only variables."""

from __future__ import annotations

import os
from typing import Mapping, Optional

from sglang_edgeacc.ascend.checkpoint import UNQUANTIZED, CheckpointFacts
from sglang_edgeacc.ascend.dispatch_plan import env_truthy
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, WARN, CheckResult

SPEC_ENV_VARS = ("SGLANG_ENABLE_SPEC_V2", "SGLANG_ENABLE_OVERLAP_PLAN_STREAM")

# Algorithms that draft with the target checkpoint's own MTP layer unless a draft model is given.
MTP_ALGORITHMS = ("NEXTN", "EAGLE")
SPECULATIVE_FLAGS = (
    "--speculative-algorithm/--speculative-num-steps/--speculative-eagle-topk/--speculative-num-draft-tokens"
)


def _uses_target_mtp(s: LaunchSettings) -> bool:
    draft = s.speculative_draft_model_path
    same = draft is None or os.path.normpath(str(draft)) == os.path.normpath(s.model_path)
    return (s.speculative_algorithm or "").upper() in MTP_ALGORITHMS and same


def check_mtp(s: LaunchSettings, ckpt: Optional[CheckpointFacts]) -> CheckResult:
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


def check_spec_env(s: LaunchSettings, env: Mapping[str, str]) -> CheckResult:
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

