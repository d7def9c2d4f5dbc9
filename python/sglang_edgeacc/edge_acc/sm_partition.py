"""How EdgeAcc splits a GPU's SMs between its prefill side and its decode side.

Three modes, matching ``--edge-acc-sm-partition``:

* ``mps``: each side is a CUDA MPS client. The launcher puts
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` into the side's environment *before* the
  side initializes CUDA (the limit is read once, at context creation, and is
  fixed for the process's life). It caps a client, it does not reserve SMs: the
  two sides can still meet on an SM. Needs a running MPS control daemon (see
  ``sglang_edgeacc.mps``); without one the variable is ignored and nothing is split.
* ``green-context``: no daemon. The side reads ``EDGEACC_GREEN_CONTEXT_SM_PERCENT``
  and runs its work on a stream of a torch green context limited to that share
  of SMs (:func:`green_context_stream`). Green contexts cannot be created inside
  an MPS client that has a thread percentage (checked on an H200: "resources are
  insufficient"), so this mode never sets the MPS variable.
* ``none``: time-slicing, no variables.

On the CPU platform there is nothing to split: :func:`child_env` returns ``{}``.

Use::

    env = child_env("prefill", flags.edge_acc_prefill_sm_percent, flags.edge_acc_sm_partition, tp_rank=tp)
    with environment_for_child(env):     # only around Process.start() of a spawned child
        proc.start()

or, first thing inside the child before any CUDA call, ``apply_child_env(env)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional

import torch

logger = logging.getLogger(__name__)

MPS_PERCENT_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# 0: normal, 1: below normal. Read once, when the client's CUDA context is made.
MPS_PRIORITY_VAR = "CUDA_MPS_CLIENT_PRIORITY"
MPS_PRIORITIES: tuple[str, ...] = ("below-normal", "normal")
GREEN_CONTEXT_PERCENT_VAR = "EDGEACC_GREEN_CONTEXT_SM_PERCENT"
SM_PARTITION_MODES: tuple[str, ...] = ("mps", "green-context", "none")
ROLES: tuple[str, ...] = ("prefill", "decode")
_PERCENT_FLAGS = {"prefill": "--edge-acc-prefill-sm-percent", "decode": "--edge-acc-decode-sm-percent"}


class SmPartitionError(RuntimeError):
    """An SM split was asked for that cannot be made."""


def _log_prefix(role: str, tp_rank: int) -> str:
    return f"[edgeacc {role} tp{tp_rank}]"


def _validate(role: str, percent: int, mode: str) -> None:
    if role not in ROLES:
        raise ValueError(f"SM split: role must be one of {ROLES}, got {role!r}")
    if mode not in SM_PARTITION_MODES:
        raise ValueError(
            f"--edge-acc-sm-partition must be one of {SM_PARTITION_MODES}, got {mode!r}"
        )
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise ValueError(f"{_PERCENT_FLAGS[role]} must be an integer from 1 to 100, got {percent!r}")


@dataclass(frozen=True)
class SideSplit:
    """The SM split one side is spawned with: what is in effect and the variables that set it."""

    role: str
    # In effect: "mps", "green-context" or "none".
    mode: str
    # The side's fixed share of SMs; None where no fixed share applies (none).
    percent: Optional[int]
    env: dict[str, str]
    # One phrase for the logs and /get_server_info.
    detail: str

    def log(self, log_prefix: str) -> None:
        """Log the split under the prefix of the process that prints it (the side's spawner)."""
        logger.info("%s %s side's SM split: %s", log_prefix, self.role, self.detail)


def side_split(role: str, percent: int, mode: str, *, device_type: str = "cuda") -> SideSplit:
    """The SM split a side to be spawned gets, without logging it (:meth:`SideSplit.log`).

    Merge ``env`` into the child's environment before it initializes CUDA.
    ``mps`` always sets the variable, also at 100, so that a value inherited from
    the launcher cannot leak into the wrong side.
    """
    _validate(role, percent, mode)
    if device_type != "cuda":
        return SideSplit(role, "none", None, {}, f"none ({device_type} platform has no SMs to split)")
    if mode == "mps":
        return SideSplit(role, "mps", percent, {MPS_PERCENT_VAR: str(percent)}, f"mps, {MPS_PERCENT_VAR}={percent}")
    if mode == "green-context":
        return SideSplit(role, "green-context", percent, {GREEN_CONTEXT_PERCENT_VAR: str(percent)},
                         f"green-context, {percent}% of SMs on a green-context stream")
    return SideSplit(role, "none", None, {}, "none (the two sides time-slice the whole GPU)")


def child_env(
    role: str,
    percent: int,
    mode: str,
    *,
    tp_rank: int = 0,
    device_type: str = "cuda",
    log_prefix: Optional[str] = None,
) -> dict[str, str]:
    """The environment variables a spawned EdgeAcc side needs for its SM share (:func:`side_split`).

    The split is logged under ``log_prefix``, the prefix of the process that
    spawns the side and prints the line, not of the side it describes.
    """
    split = side_split(role, percent, mode, device_type=device_type)
    split.log(log_prefix or f"[edgeacc tp{tp_rank}]")
    return split.env


def mps_priority_env(role: str, priority: str, mode: str, *, device_type: str = "cuda") -> dict[str, str]:
    """The MPS client priority of a side: the prefill side at ``priority``, the decode side always normal.

    Under MPS the GPU's block scheduler gives a normal-priority client's waiting
    blocks the SMs before a below-normal one's, so a prefill side at below normal
    fills the SMs a decode step leaves idle without holding that step back. Set
    always (also ``normal``) so a value inherited from the launcher cannot leak
    into the wrong side. Without an MPS daemon (``none``) and off CUDA: nothing.
    """
    if role not in ROLES:
        raise ValueError(f"MPS priority: role must be one of {ROLES}, got {role!r}")
    if priority not in MPS_PRIORITIES:
        raise ValueError(f"--edge-acc-prefill-mps-priority must be one of {MPS_PRIORITIES}, got {priority!r}")
    if device_type != "cuda" or mode == "none":
        return {}
    below = role == "prefill" and priority == "below-normal"
    return {MPS_PRIORITY_VAR: "1" if below else "0"}


@contextlib.contextmanager
def environment_for_child(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the duration of the block, then restore it.

    A ``spawn``/``forkserver`` child copies the parent's environment when it
    starts, so hold this only around ``Process.start()``. Not thread-safe: the
    launcher starts its children from one thread.
    """
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def apply_child_env(env: Mapping[str, str]) -> None:
    """Inside a freshly spawned side: set ``env`` before this process touches CUDA."""
    if env and torch.cuda.is_available() and torch.cuda.is_initialized():
        raise SmPartitionError(
            f"apply_child_env: CUDA is already initialized in pid {os.getpid()}, so {sorted(env)} would be "
            f"ignored; call it first thing in the child, before any CUDA tensor or device query"
        )
    os.environ.update(env)


def sm_granularity(device_index: int = 0) -> tuple[int, int]:
    """(minimum, multiple) SM counts for a green-context partition on this device.

    CUDA's guidance: compute capability 9.0 and newer allocate SMs in groups of 8,
    8.x in groups of 2 with a minimum of 4, older devices one by one.
    """
    major, _minor = torch.cuda.get_device_capability(device_index)
    if major >= 9:
        return 8, 8
    if major == 8:
        return 4, 2
    return 1, 1


def sm_count_for_percent(percent: int, total_sms: int, minimum: int, multiple: int) -> int:
    """The SM count for ``percent`` of ``total_sms``, rounded down to ``multiple``, at least ``minimum``."""
    if not 1 <= percent <= 100:
        raise ValueError(f"SM percent must be from 1 to 100, got {percent}")
    count = (total_sms * percent // 100) // multiple * multiple
    return min(max(count, minimum), total_sms)


@dataclass(frozen=True)
class GreenContextStream:
    """A stream whose kernels run only on ``num_sms`` SMs; keep this object alive while using it."""

    stream: torch.cuda.Stream
    num_sms: int
    total_sms: int
    context: object  # torch.cuda.green_contexts.GreenContext


def green_contexts_available() -> bool:
    """True when this torch has ``torch.cuda.green_contexts.GreenContext`` with streams and CUDA is present."""
    if not torch.cuda.is_available():
        return False
    try:
        from torch.cuda.green_contexts import GreenContext
    except ImportError:
        return False
    return hasattr(GreenContext, "create") and hasattr(GreenContext, "Stream")


def green_context_stream(
    num_sms: int, device_index: int = 0, *, role: str = "prefill", tp_rank: int = 0
) -> GreenContextStream:
    """Create a green context of ``num_sms`` SMs on ``device_index`` and return a stream in it.

    Run a side's work under ``with torch.cuda.stream(gcs.stream):``. Ordering with
    other streams is the caller's job (events). Raises :class:`SmPartitionError`
    naming the fix when this torch or driver cannot do it, or when the process is
    an MPS client with a thread percentage.
    """
    if not green_contexts_available():
        raise SmPartitionError(
            f"--edge-acc-sm-partition green-context needs CUDA and torch.cuda.green_contexts.GreenContext "
            f"with create() and Stream() (torch {torch.__version__} here lacks them); use "
            f"--edge-acc-sm-partition mps or none"
        )
    if os.environ.get(MPS_PERCENT_VAR):
        raise SmPartitionError(
            f"green contexts cannot be created in an MPS client limited by {MPS_PERCENT_VAR}="
            f"{os.environ[MPS_PERCENT_VAR]}; unset it for --edge-acc-sm-partition green-context"
        )
    from torch.cuda.green_contexts import GreenContext

    total = torch.cuda.get_device_properties(device_index).multi_processor_count
    try:
        try:
            ctx = GreenContext.create(num_sms=num_sms, device_id=device_index)
        except TypeError:  # releases whose create() takes no device_id use the current device
            with torch.cuda.device(device_index):
                ctx = GreenContext.create(num_sms=num_sms)
        stream = ctx.Stream()
    except Exception as exc:  # the driver's message says which resource failed
        raise SmPartitionError(
            f"{_log_prefix(role, tp_rank)} could not create a {num_sms}-SM green context on cuda:{device_index} "
            f"({exc}); use --edge-acc-sm-partition mps or none"
        ) from exc
    logger.info(
        "%s SM split: green-context stream on %d of %d SMs (cuda:%d)",
        _log_prefix(role, tp_rank),
        num_sms,
        total,
        device_index,
    )
    return GreenContextStream(stream=stream, num_sms=num_sms, total_sms=total, context=ctx)


def green_context_stream_from_env(
    device_index: int = 0,
    *,
    role: str = "prefill",
    tp_rank: int = 0,
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[GreenContextStream]:
    """The green-context stream :func:`child_env` asked this side for, or None when it asked for none."""
    env = os.environ if environ is None else environ
    raw = env.get(GREEN_CONTEXT_PERCENT_VAR)
    if not raw:
        return None
    try:
        percent = int(raw)
    except ValueError:
        raise SmPartitionError(f"{GREEN_CONTEXT_PERCENT_VAR}={raw!r} is not an integer percent (1-100)") from None
    total = torch.cuda.get_device_properties(device_index).multi_processor_count
    minimum, multiple = sm_granularity(device_index)
    return green_context_stream(
        sm_count_for_percent(percent, total, minimum, multiple), device_index, role=role, tp_rank=tp_rank
    )


def visible_sm_count(device_index: int = 0) -> int:
    """SMs this process's CUDA context reports (an MPS percentage lowers it); 0 without CUDA."""
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.get_device_properties(device_index).multi_processor_count


__all__ = [
    "GREEN_CONTEXT_PERCENT_VAR",
    "MPS_PRIORITIES",
    "MPS_PRIORITY_VAR",
    "mps_priority_env",
    "GreenContextStream",
    "MPS_PERCENT_VAR",
    "ROLES",
    "SM_PARTITION_MODES",
    "SideSplit",
    "SmPartitionError",
    "apply_child_env",
    "child_env",
    "environment_for_child",
    "green_context_stream",
    "green_context_stream_from_env",
    "green_contexts_available",
    "side_split",
    "sm_count_for_percent",
    "sm_granularity",
    "visible_sm_count",
]
