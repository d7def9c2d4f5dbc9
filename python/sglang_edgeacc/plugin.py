"""Entry point of the ``sglang.srt.plugins`` group: registers every patch, nothing else.

sglang calls :func:`register` early in every process it starts (launcher, data
parallel controller, schedulers, detokenizer), then applies the registered
hooks. It is cheap (no model, no device) and idempotent.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    from sglang_edgeacc.patches import PatchMismatch, install_all

    try:
        install_all()
    except PatchMismatch as exc:
        # sglang logs and swallows a plugin's Exception and would then run
        # unpatched; a SystemExit is not swallowed, so the process stops here.
        logger.critical("%s", exc)
        raise SystemExit(f"sglang-edgeacc: {exc}") from exc
