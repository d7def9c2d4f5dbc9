"""Patch ``shm_reclaim``: a starting server removes what killed servers left in ``/dev/shm``.

Target: ``engine._set_envs_and_config`` (BEFORE), the launcher's first step of
``Engine._launch_subprocesses`` after sglang configured its logging and before
it spawns anything; every launch goes through it (``launch_server``, ``sglang
serve``, the Python ``Engine``). Runs
:func:`~sglang_edgeacc.server_start.shm_reclaim.reclaim_and_log`, which logs what
it freed; the rules that keep a live process's and another user's entries are
in that module.
"""

from __future__ import annotations

import logging

from sglang_edgeacc.patches._base import Patch, Target, hook_installer
from sglang_edgeacc.server_start import shm_reclaim

logger = logging.getLogger(__name__)

SET_ENVS_AND_CONFIG = "sglang.srt.entrypoints.engine._set_envs_and_config"


def _reclaim_before_spawning(*args, **kwargs):
    del args, kwargs
    try:
        shm_reclaim.reclaim_and_log()
    except Exception:  # leftovers of other servers must never stop this one's start
        logger.warning("[edgeacc] reclaiming /dev/shm failed; starting anyway", exc_info=True)


PATCH = Patch(
    name="shm_reclaim",
    summary="at start, shared memory and semaphores of dead sglang processes that nobody holds are removed",
    targets=(Target(SET_ENVS_AND_CONFIG, params=("server_args",)),),
    install=hook_installer((SET_ENVS_AND_CONFIG, _reclaim_before_spawning, "BEFORE")),
    only_in_launcher=True,
)
