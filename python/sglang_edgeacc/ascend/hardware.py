"""Which Ascend generation this is (A2 = Atlas 800I/800T A2, 910B; A3 = Atlas A3, 910_93).

DeepEP builds different kernels for the two (``csrc/deepep/ops2`` for A2,
``ops`` for A3) with different buffer constants, so the preflight has to know.
The answer comes, in order, from an explicit choice, the environment variable
``SGLANG_EDGEACC_ASCEND_HARDWARE``, or ``npu-smi info`` (run with a timeout; it
reads the driver and touches no device memory). Without any of them the
preflight assumes A2 and says so.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_EDGEACC_ASCEND_HARDWARE"
NPU_SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class HardwareGuess:
    hardware: str  # "a2" or "a3"
    source: str  # how it was decided
    assumed: bool = False


def hardware_from_npu_smi(output: str) -> Optional[str]:
    """Read the chip name from ``npu-smi info`` (910B* is A2; 910_93* / Ascend910 is A3)."""
    text = output.replace(" ", "")
    if "910B" in text:
        return "a2"
    if "910_93" in text or "Ascend910" in text:
        return "a3"
    return None


def _run_npu_smi() -> Optional[str]:
    exe = shutil.which("npu-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=NPU_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("npu-smi info did not answer (%s); cannot tell A2 from A3", exc)
        return None
    return done.stdout if done.returncode == 0 else None


def detect_hardware(env: Mapping[str, str], explicit: Optional[str] = None, probe=_run_npu_smi) -> HardwareGuess:
    if explicit in ("a2", "a3"):
        return HardwareGuess(explicit, "--hardware")
    value = (env.get(ENV_VAR) or "").strip().lower()
    if value:
        if value not in ("a2", "a3"):
            raise ValueError(f"{ENV_VAR}={value!r}: expected a2 or a3")
        return HardwareGuess(value, ENV_VAR)
    output = probe()
    found = hardware_from_npu_smi(output) if output else None
    if found:
        return HardwareGuess(found, "npu-smi info")
    return HardwareGuess("a2", "assumed (no npu-smi; set " + ENV_VAR + "=a2|a3)", assumed=True)
