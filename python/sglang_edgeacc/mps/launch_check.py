"""The launch-time check that an MPS control daemon answers before the EdgeAcc sides are spawned."""

from __future__ import annotations

from typing import Optional

from sglang_edgeacc.mps.control import (
    DEFAULT_PIPE_DIR,
    DEFAULT_TIMEOUT_S,
    PIPE_DIR_ENV,
    MpsControlNotFound,
    MpsDaemonNotRunning,
    find_control_binary,
    resolve_dirs,
    send_command,
)

START_COMMAND = "sglang-edgeacc mps start"


def require_daemon(pipe_dir: Optional[str] = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Raise unless an MPS control daemon answers where the EdgeAcc children will look.

    The EdgeAcc launcher calls this before it spawns the prefill and decode
    sides with any SM split but ``none``: without a daemon, the CUDA driver
    ignores ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, the kernels of the two
    processes never overlap, and both sides would time-slice the whole GPU
    without saying so.
    """
    dirs = resolve_dirs(pipe_dir, None)
    hint = f"start one with `{START_COMMAND}`"
    if str(dirs.pipe_dir) != DEFAULT_PIPE_DIR:
        hint = f"start one with `{START_COMMAND} --pipe-dir {dirs.pipe_dir}`"
    try:
        binary = find_control_binary()
    except MpsControlNotFound as exc:
        raise MpsDaemonNotRunning(
            f"EdgeAcc's concurrent sides need the CUDA MPS control daemon, but {exc}"
        ) from exc
    if send_command("get_server_list", dirs, timeout=timeout, binary=binary) is None:
        raise MpsDaemonNotRunning(
            f"EdgeAcc's concurrent sides need a CUDA MPS control daemon, and none "
            f"answers on {PIPE_DIR_ENV}={dirs.pipe_dir}: {hint} (scripts/sglang_launch_server.sh "
            "does this for you), or pass --edge-acc-sm-partition none to let the sides time-slice."
        )
