"""Prepare the launcher's environment for an EdgeAcc launch that passed validation.

Everything here runs in the launcher process, after the flags were accepted and
before upstream spawns any scheduler: it sets the variables every child
inherits and checks the host can honour the SM split asked for (an MPS control
daemon answers, the CUDA allocator can share its memory). A host that cannot is
refused with :class:`EdgeAccConfigError`, as a bad flag combination is.
"""

from __future__ import annotations

import argparse
import logging
import os

from sglang_edgeacc.flags import EdgeAccFlags
from sglang_edgeacc.launch_validation import EdgeAccConfigError, on_cpu_platform

logger = logging.getLogger(__name__)


def refuse_without_a_gpu(args: argparse.Namespace) -> None:
    """Refuse a launch that left the device to upstream's detection on a host where torch sees no GPU.

    Left alone, such a launch fails on the missing MPS daemon instead, whose fix
    (``--edge-acc-sm-partition none``) only leads to the next failure. EdgeAcc
    without a GPU is its CPU platform, selected by the environment. An explicit
    ``--device`` is the user's word on the host and is not second-guessed here.
    """
    if getattr(args, "device", None) is not None:
        return
    import torch

    if torch.cuda.is_available():
        return
    from sglang_edgeacc.platform import PLATFORM_NAME

    raise EdgeAccConfigError(
        f"--enable-edge-acc found no CUDA GPU on this host (torch.cuda.is_available() is False, torch "
        f"{torch.__version__}). To run EdgeAcc on the CPU, set SGLANG_PLATFORM={PLATFORM_NAME} in the "
        f"server's environment (the two sides then time-slice the host). On a GPU host, check the NVIDIA "
        f"driver and that this torch is a CUDA build."
    )


def prepare_edge_acc_environment(flags: EdgeAccFlags, args: argparse.Namespace) -> None:
    """Launcher side of an accepted EdgeAcc launch: environment every child inherits.

    ``SGLANG_EDGEACC=1`` makes the scheduler processes install the EdgeAcc
    scheduler; the decode side's SM share is set here because upstream spawns
    the decode sides (and they must see it before CUDA starts). The prefill
    side's share is set by its decode side when it spawns it.
    """
    from sglang_edgeacc.edge_acc_server.roles import ENABLED_ENV

    os.environ[ENABLED_ENV] = "1"
    if on_cpu_platform(args):
        logger.info("[edgeacc] CPU platform: the two sides time-slice the host; SM split is off")
        return
    refuse_without_a_gpu(args)
    if flags.edge_acc_sm_partition != "none":
        # Kernels of two processes run at the same time only under MPS, whatever
        # confines them (an MPS percentage, or green contexts inside an
        # unlimited MPS client).
        from sglang_edgeacc.mps.daemon import MpsError, require_daemon

        try:
            require_daemon()
        except MpsError as exc:
            raise EdgeAccConfigError(
                f"--edge-acc-sm-partition {flags.edge_acc_sm_partition} needs a running CUDA MPS control "
                f"daemon: {exc} (or run time-sliced with --edge-acc-sm-partition none)"
            ) from exc
    from sglang_edgeacc.edge_acc.sm_partition import MPS_PERCENT_VAR, mps_priority_env

    if flags.edge_acc_sm_partition == "mps":
        os.environ[MPS_PERCENT_VAR] = str(flags.edge_acc_decode_sm_percent)
    os.environ.update(mps_priority_env("decode", flags.edge_acc_prefill_mps_priority, flags.edge_acc_sm_partition))
    from sglang_edgeacc.edge_acc.tensor_share import AllocatorNotShareableError, refuse_unshareable_cuda_allocator

    try:
        refuse_unshareable_cuda_allocator()
    except AllocatorNotShareableError as exc:
        raise EdgeAccConfigError(str(exc)) from exc
