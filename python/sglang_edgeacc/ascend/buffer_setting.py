"""The HCCL buffer a launch gives DeepEP: what the environment sets, and what automatic sizing exports.

Only the standard library is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

# HCCL_BUFFSIZE when neither DEEPEP_HCCL_BUFFSIZE nor HCCL_BUFFSIZE is set
# (CANN default; sglang's get_torch_distributed_pg_options uses the same).
DEFAULT_HCCL_BUFFSIZE_MB = 200
# The kernels parse the value with std::stoi into a uint16_t: larger values wrap.
MAX_HCCL_BUFFSIZE_MB = 65535

# Automatic sizing: the requirement plus max(AUTO_MARGIN_MIN_MB, AUTO_MARGIN_FRACTION).
# 200 MB covers the older sgl-kernel-npu wheels, whose notify window was 204 MB
# instead of 102 MB (A3) and whose constants changed five times in 2025-26; the
# 10% covers the A2 layered dispatch, which splits whatever lies beyond its
# fixed 804 MB into per-(expert, source rank) slots and so wants headroom when
# the routing is unbalanced.
AUTO_MARGIN_MIN_MB = 200
AUTO_MARGIN_FRACTION = 0.10


@dataclass(frozen=True)
class BufferSetting:
    """The HCCL_BUFFSIZE DeepEP's communicator gets, and where it came from."""

    mb: int
    source: str  # "DEEPEP_HCCL_BUFFSIZE", "HCCL_BUFFSIZE" or "default"
    raw: Optional[str] = None

    @property
    def explicit(self) -> bool:
        return self.source != "default"


def configured_buffer(env: Mapping[str, str]) -> BufferSetting:
    """DEEPEP_HCCL_BUFFSIZE, else HCCL_BUFFSIZE, else 200 (the order DeepEP and sglang read them).

    A value that is not a positive integer raises ValueError naming the variable.
    """
    for name in ("DEEPEP_HCCL_BUFFSIZE", "HCCL_BUFFSIZE"):
        raw = env.get(name)
        # sglang's `os.environ.get(...) or ...` skips an empty string, so do we.
        if raw:
            try:
                value = int(raw.strip())
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer number of MB; export {name}=<MB>") from None
            if value <= 0:
                raise ValueError(f"{name}={raw!r} must be a positive number of MB")
            return BufferSetting(value, name, raw)
    return BufferSetting(DEFAULT_HCCL_BUFFSIZE_MB, "default")


def auto_buffer_mb(required_mb: int) -> tuple[int, int]:
    """(value to export, margin included) for automatic sizing."""
    margin = max(AUTO_MARGIN_MIN_MB, math.ceil(required_mb * AUTO_MARGIN_FRACTION))
    return required_mb + margin, margin
