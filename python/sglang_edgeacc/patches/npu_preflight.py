"""Ascend preflight at server start: refuse a launch that would hang or crash, size the HCCL buffer.

Target: the resolution step ``handle_npu_backends`` of sglang's argument pipeline,
wrapped through upstream's ``register_resolution_hook``. It runs in the launcher,
before any scheduler process, process group or device memory exists, and ahead of the
built-in step, whose NPU defaults query the device's memory.

With ``--device npu`` it runs the ``sglang-edgeacc doctor`` checks on the arguments,
the environment and the checkpoint's JSON files:

* a failing check stops the launch (:class:`NpuPreflightFailed`, a SystemExit whose
  text is the doctor's report) unless ``--edge-acc-skip-preflight`` is given, which logs
  the report as a warning and goes on;
* with DeepEP and neither ``HCCL_BUFFSIZE`` nor ``DEEPEP_HCCL_BUFFSIZE`` set, it exports
  ``DEEPEP_HCCL_BUFFSIZE`` = the model's requirement + max(200 MB, 10%), which the
  spawned schedulers inherit. An explicit setting is never changed.

With any other ``--device`` it calls the built-in step and does nothing else.
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, MutableMapping, Optional

from sglang_edgeacc.patches._base import Patch, Target

logger = logging.getLogger(__name__)

STEP = "handle_npu_backends"

_installed = False


class NpuPreflightFailed(SystemExit):
    """The Ascend preflight refused the launch; the exit message is the report."""

    def __init__(self, report) -> None:
        self.report = report
        super().__init__(
            report.render()
            + "\nThe launch was stopped before touching the NPU. Fix the failing checks, "
            "or pass --edge-acc-skip-preflight to start anyway."
        )


def _is_npu(server_args) -> bool:
    device = getattr(server_args, "device", None)
    return device is not None and str(device).split(":", 1)[0] == "npu"


def _settings_of(server_args):
    from sglang_edgeacc.ascend.launch_settings import settings_from_server_args
    from sglang_edgeacc.flags import get_flags

    try:
        from sglang.srt.arg_groups.overrides import resolving_view

        # What resolution has decided so far (e.g. a model id resolved to a local path,
        # the deprecated --enable-dp-attention turned into --attn-dp-size).
        view = resolving_view(server_args)
    except ImportError:
        view = server_args
    return settings_from_server_args(view, skip_preflight=get_flags(server_args).edge_acc_skip_preflight)


def run_npu_preflight(server_args, env: Optional[MutableMapping[str, str]] = None):
    """Run the preflight for an npu launch; returns the report (None when not npu).

    Raises :class:`NpuPreflightFailed` on a failing check unless skipped. Sets
    ``DEEPEP_HCCL_BUFFSIZE`` in ``env`` (default ``os.environ``) when it sizes the buffer.
    """
    if not _is_npu(server_args):
        return None
    from sglang_edgeacc.ascend.preflight_checks import run_preflight
    from sglang_edgeacc.ascend.preflight_report import WARN

    env = os.environ if env is None else env
    settings = _settings_of(server_args)
    report = run_preflight(settings, env)
    if not report.ok:
        if settings.skip_preflight:
            logger.warning(
                "Ascend preflight found failing checks; starting anyway because of --edge-acc-skip-preflight:\n%s",
                report.render(),
            )
        else:
            logger.error("Ascend preflight refused the launch:\n%s", report.render())
            raise NpuPreflightFailed(report)
    elif any(c.status == WARN for c in report.checks):
        logger.warning("Ascend preflight passed with warnings:\n%s", report.render())
    else:
        logger.info("Ascend preflight passed (%d checks)", len(report.checks))
    auto = report.auto_sizing
    if auto is not None:
        env[auto.variable] = str(auto.mb)
        logger.info("Ascend preflight: export %s=%d (%s)", auto.variable, auto.mb, auto.derivation)
    return report


def preflight_then_npu_defaults(server_args, previous: Callable) -> None:
    """The resolution-step wrapper: preflight first, then upstream's NPU defaults."""
    run_npu_preflight(server_args)
    previous(server_args)


def _install() -> None:
    global _installed
    if _installed:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    register_resolution_hook(STEP)(preflight_then_npu_defaults)
    _installed = True


PATCH = Patch(
    name="npu_preflight",
    summary=("Ascend: refuse launches that hang or crash in DeepEP, size DEEPEP_HCCL_BUFFSIZE, "
             "before any NPU memory is used"),
    targets=(
        Target("sglang.srt.arg_groups.resolution_hooks.register_resolution_hook", ("name",)),
        Target("sglang.srt.arg_groups.platform_hook.handle_npu_backends", ("server_args",)),
        Target("sglang.srt.arg_groups.overrides.resolving_view", ("server_args",)),
        # Reads DEEPEP_HCCL_BUFFSIZE/HCCL_BUFFSIZE when the HCCL groups are built; what auto-sizing relies on.
        Target("sglang.srt.distributed.parallel_state.get_torch_distributed_pg_options", ("group_name",)),
    ),
    install=_install,
)
