"""The ``edgeacc_cpu`` platform: the real sglang server on a machine without a GPU.

Selected with ``SGLANG_PLATFORM=edgeacc_cpu``. It is how CI runs every
feature end to end against the pinned sglang, and how a developer works on
sglang-edgeacc from a laptop. ``activate()`` answers only when selected by name,
so installing the package never changes the platform of a GPU or NPU host.
"""

from __future__ import annotations

import os

PLATFORM_NAME = "edgeacc_cpu"


def is_selected() -> bool:
    return os.environ.get("SGLANG_PLATFORM") == PLATFORM_NAME


def activate() -> str | None:
    return "sglang_edgeacc.platform.cpu:EdgeAccCpuPlatform" if is_selected() else None
