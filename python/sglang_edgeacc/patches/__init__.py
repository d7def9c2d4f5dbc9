"""Every change sglang-edgeacc makes to upstream sglang, one module per area.

Each module defines ``PATCH``, a :class:`~sglang_edgeacc.patches._base.Patch`
that lists the upstream symbols it touches; :func:`install_all` verifies all of
them against the installed sglang before installing any, so a mismatch stops
the load naming the patch and the symbol. ``sglang-edgeacc patches`` prints the
same verification.

Patch table (target / why / how / when it can be removed)
=========================================================

(filled in below as patches land)
"""

from __future__ import annotations

import importlib
import logging

from sglang_edgeacc.patches._base import Patch, PatchMismatch, verify

logger = logging.getLogger(__name__)

PATCH_MODULES: tuple[str, ...] = (
    "sglang_edgeacc.patches.server_args",
    "sglang_edgeacc.patches.cpu_platform",
)

_installed = False


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]


def install_all() -> None:
    """Verify every patch, then install those that apply to this process. Idempotent."""
    global _installed
    if _installed:
        return
    patches = all_patches()
    for patch in patches:
        verify(patch)
    for patch in patches:
        if patch.applies():
            patch.install()
    _installed = True


__all__ = ["Patch", "PatchMismatch", "all_patches", "install_all"]
