"""``sglang-edgeacc mps start|stop|status``: the CUDA MPS daemon EdgeAcc uses.

Exit codes: 0 done (``status``: a daemon answers), 3 ``status`` found no
daemon answering, 1 an error (the message on stderr says what to do).
``start`` prints one line on stdout whose first word is ``started`` or
``already-running``; scripts/sglang_launch_server.sh reads it to know whether
it must stop the daemon on exit. ``--timeout`` defaults to
``$SGLANG_EDGEACC_MPS_TIMEOUT``, else 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from sglang_edgeacc.mps.control import (
    DEFAULT_LOG_DIR,
    DEFAULT_PIPE_DIR,
    DEFAULT_TIMEOUT_S,
    LOG_DIR_ENV,
    PIPE_DIR_ENV,
    MpsError,
    resolve_dirs,
)
from sglang_edgeacc.mps.daemon import start_daemon, stop_daemon
from sglang_edgeacc.mps.multiuser import MULTIUSER_MODES
from sglang_edgeacc.mps.status import MpsStatus, read_status

STATUS_NOT_ANSWERING = 3
# Lets scripts/sglang_launch_server.sh users on slow hosts raise every timeout at once.
TIMEOUT_ENV = "SGLANG_EDGEACC_MPS_TIMEOUT"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("start", "stop", "status"), help="what to do")
    parser.add_argument(
        "--pipe-dir",
        default=None,
        help=f"MPS pipe directory (default: ${PIPE_DIR_ENV}, else {DEFAULT_PIPE_DIR}); "
        "the server must run with the same CUDA_MPS_PIPE_DIRECTORY",
    )
    parser.add_argument(
        "--log-dir",
        default=None,
        help=f"MPS log directory for start (default: ${LOG_DIR_ENV}, else {DEFAULT_LOG_DIR})",
    )
    parser.add_argument(
        "--multiuser-server",
        choices=MULTIUSER_MODES,
        default="auto",
        help="start: pass --multiuser-server to the daemon; auto = when the daemon's --help lists it, "
        "else when the driver's CUDA version is >= 12.8",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="stop: also stop a daemon that sglang-edgeacc did not start",
    )
    parser.add_argument("--json", action="store_true", help="start/status: print the status as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds allowed for each call of nvidia-cuda-mps-control and for the daemon to come up or go "
        f"(default: ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT_S:g})",
    )


def _describe(status: MpsStatus) -> str:
    if not status.answering:
        return f"no MPS control daemon answers on {status.pipe_dir}"
    owner = "started by sglang-edgeacc" if status.started_by_us else "not started by sglang-edgeacc"
    lines = [f"MPS control daemon answers on {status.pipe_dir} (pid {status.control_pid}, {owner})"]
    if status.record is not None and status.started_by_us:
        lines.append(
            f"  log dir {status.record.log_dir}, multiuser server: "
            f"{'yes' if status.record.multiuser_server else 'no'}"
        )
    if not status.servers:
        lines.append("  no MPS server yet (one starts with the first client)")
    for server in status.servers:
        clients = ", ".join(str(c) for c in server.clients) or "none"
        lines.append(f"  server {server.pid}: clients {clients}")
    return "\n".join(lines)


def _timeout(args: argparse.Namespace) -> float:
    if args.timeout is not None:
        value, source = args.timeout, "--timeout"
    elif os.environ.get(TIMEOUT_ENV):
        source = TIMEOUT_ENV
        try:
            value = float(os.environ[TIMEOUT_ENV])
        except ValueError:
            raise MpsError(
                f"{TIMEOUT_ENV} must be a number of seconds, got {os.environ[TIMEOUT_ENV]!r}"
            ) from None
    else:
        return DEFAULT_TIMEOUT_S
    if value <= 0:
        raise MpsError(f"{source} must be positive, got {value:g}")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        args.timeout = _timeout(args)
    except MpsError as exc:
        print(f"sglang-edgeacc mps {args.action}: error: {exc}", file=sys.stderr)
        return 1
    try:
        if args.action == "start":
            outcome = start_daemon(
                args.pipe_dir, args.log_dir, multiuser_server=args.multiuser_server, timeout=args.timeout
            )
            if args.json:
                print(json.dumps({"started": outcome.started, **outcome.status.to_json()}))
            else:
                word = "started" if outcome.started else "already-running"
                print(f"{word} pid={outcome.status.control_pid} pipe_dir={outcome.status.pipe_dir}")
            return 0
        if args.action == "stop":
            stopped = stop_daemon(args.pipe_dir, force=args.force, timeout=args.timeout)
            print("stopped" if stopped else "not-running")
            return 0
        status = read_status(resolve_dirs(args.pipe_dir, args.log_dir), timeout=args.timeout)
        print(json.dumps(status.to_json()) if args.json else _describe(status))
        return 0 if status.answering else STATUS_NOT_ANSWERING
    except MpsError as exc:
        print(f"sglang-edgeacc mps {args.action}: error: {exc}", file=sys.stderr)
        return 1
