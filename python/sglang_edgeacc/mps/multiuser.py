"""Whether ``start`` passes ``--multiuser-server`` to the MPS control daemon.

The reference deployment passed it on CUDA >= 12.8. ``auto`` (the default)
decides from the daemon itself: if its ``--help`` lists the flag it is passed;
if the help lists options but not this one it is not; if the help says nothing
useful, the CUDA version in the ``nvidia-smi`` header decides (>= 12.8 passes
it). When an ``auto`` start with the flag is refused by the daemon, the start is
retried once without it. (On the lent H200, driver 580.159.04 / CUDA 13.0,
``--help`` lists ``-M,--multiuser-server  Enable multi-user mode`` and auto
passed it.)
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Optional

from sglang_edgeacc.mps.control import CONTROL_BINARY, DEFAULT_TIMEOUT_S, MpsError, run_command

logger = logging.getLogger(__name__)

MULTIUSER_SERVER_FLAG = "--multiuser-server"
MULTIUSER_SERVER_MIN_CUDA = (12, 8)
MULTIUSER_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class MultiuserDecision:
    use: bool
    reason: str


def parse_cuda_version(nvidia_smi_output: str) -> Optional[tuple[int, int]]:
    """The driver's CUDA version from the ``CUDA Version: X.Y`` field of nvidia-smi's header."""
    match = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", nvidia_smi_output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def detect_cuda_version(timeout: float = DEFAULT_TIMEOUT_S) -> Optional[tuple[int, int]]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = run_command([smi], env=os.environ, timeout=timeout)
    except MpsError as exc:
        logger.warning("could not read the CUDA version from nvidia-smi: %s", exc)
        return None
    return parse_cuda_version(proc.stdout)


def decide_multiuser_server(
    mode: str, binary: str, *, timeout: float = DEFAULT_TIMEOUT_S
) -> MultiuserDecision:
    if mode not in MULTIUSER_MODES:
        raise MpsError(f"--multiuser-server must be one of {', '.join(MULTIUSER_MODES)}, got {mode!r}")
    if mode == "on":
        return MultiuserDecision(True, "--multiuser-server on")
    if mode == "off":
        return MultiuserDecision(False, "--multiuser-server off")
    try:
        proc = run_command([binary, "--help"], env=os.environ, timeout=timeout)
        help_text = proc.stdout + proc.stderr
    except MpsError as exc:
        logger.debug("%s --help failed: %s", binary, exc)
        help_text = ""
    if MULTIUSER_SERVER_FLAG in help_text:
        return MultiuserDecision(True, f"{CONTROL_BINARY} --help lists {MULTIUSER_SERVER_FLAG}")
    if re.search(r"(^|[\s\[|])-d\b", help_text):
        return MultiuserDecision(False, f"{CONTROL_BINARY} --help does not list {MULTIUSER_SERVER_FLAG}")
    cuda = detect_cuda_version(timeout)
    if cuda is None:
        return MultiuserDecision(False, "CUDA version unknown (no nvidia-smi header)")
    shown = f"{cuda[0]}.{cuda[1]}"
    if cuda >= MULTIUSER_SERVER_MIN_CUDA:
        return MultiuserDecision(True, f"driver CUDA {shown} >= 12.8")
    return MultiuserDecision(False, f"driver CUDA {shown} < 12.8")
