"""Every change sglang-edgeacc makes to upstream sglang, one module per area.

Each module defines ``PATCH``, a :class:`~sglang_edgeacc.patches._base.Patch`
that lists the upstream symbols it touches; :func:`install_all` verifies all of
them against the installed sglang before installing any, so a mismatch stops
the load naming the patch and the symbol. ``sglang-edgeacc patches`` prints the
same verification.

Patch table (target / why / how / when it can be removed)
=========================================================

(filled in below as patches land)

* ``npu_preflight`` — target: resolution step ``handle_npu_backends``
  (``sglang.srt.arg_groups.platform_hook``) through ``register_resolution_hook``.
  Why: Ascend launches with DeepEP hang at "Capturing batches" or die in
  ``aclnnDispatchNormalA2`` when HCCL_BUFFSIZE is too small, ant-moving is set on
  the A2 two-node path, or NEXTN/EAGLE runs on a checkpoint without (matching)
  MTP weights. How: with ``--device npu`` only, runs the ``sglang-edgeacc doctor``
  checks before the built-in step, stops the launch on a failing check (unless
  ``--edge-acc-skip-preflight``) and exports ``DEEPEP_HCCL_BUFFSIZE`` when no
  buffer is set. Removable when upstream validates DeepEP's buffer and the MTP
  layer at argument resolution.
"""

from __future__ import annotations

import importlib
import logging

from sglang_edgeacc.patches._base import Patch, PatchMismatch, verify

logger = logging.getLogger(__name__)

PATCH_MODULES: tuple[str, ...] = (
    "sglang_edgeacc.patches.server_args",
    "sglang_edgeacc.patches.cpu_platform",
    "sglang_edgeacc.patches.edge_acc",
    "sglang_edgeacc.patches.npu_preflight",
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
