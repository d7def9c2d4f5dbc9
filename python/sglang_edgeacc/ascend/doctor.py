"""``sglang-edgeacc doctor [--json] -- <the exact launch_server arguments>``.

Reads the launch arguments, the environment of this shell and the checkpoint's
JSON files, runs the Ascend preflight and prints one line per check (or, with
``--json``, ``{"ok": bool, "checks": [{"id", "status", "message", "fix"}]}``).
Exits 1 when a check fails, 0 otherwise, 2 when the command cannot be read.

Parsing: sglang's own parser (``prepare_server_args``, after loading the
installed sglang plugins so ``--edge-acc-*`` flags parse) whenever sglang is
importable, so the doctor sees the command exactly as the launcher will. When
sglang is not importable, or its parser rejects the command, a tolerant parser
of the flags the checks need takes over; a rejection is itself reported as the
failing check ``launch-arguments`` (the launch would stop there too), and the
other checks still run so one pass shows every problem.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import sys
from typing import Optional, Sequence

from sglang_edgeacc.ascend.launch_settings import (
    LaunchArgumentsError,
    LaunchSettings,
    parse_tolerant,
    settings_from_server_args,
)
from sglang_edgeacc.ascend.preflight_checks import run_preflight

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--hardware",
        choices=("a2", "a3"),
        default=None,
        help="Ascend generation (default: SGLANG_EDGEACC_ASCEND_HARDWARE, else npu-smi, else a2)",
    )
    parser.add_argument(
        "launch_args",
        nargs=argparse.REMAINDER,
        metavar="-- LAUNCH_ARGS",
        help="the exact arguments given to python -m sglang.launch_server, after --",
    )


def strip_launcher(argv: Sequence[str]) -> list[str]:
    """Drop a leading ``--`` and any ``python -m sglang.launch_server`` / ``sglang serve`` words."""
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    # launch_server takes only long options, so the first "--x" starts them ("-m" does not).
    first_flag = next((i for i, a in enumerate(args) if a.startswith("--")), len(args))
    return args[first_flag:]


def _parse_with_sglang(argv: list[str]):
    """(ServerArgs or None, the parser's error line or None); raises ImportError without sglang."""
    from sglang.srt.server_args import prepare_server_args  # noqa: WPS433 (optional dependency)

    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    except ImportError:  # an sglang without the plugin system: parse without our flags
        pass
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return prepare_server_args(argv), None
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if "error:" in line), lines[-1] if lines else "rejected")
        return None, error.split("error:", 1)[-1].strip()
    except Exception as exc:  # noqa: BLE001 - e.g. a --config file sglang cannot merge; report it, keep checking
        return None, f"{type(exc).__name__}: {exc}"


def read_launch_args(argv: Sequence[str]) -> tuple[LaunchSettings, Optional[str]]:
    """The settings of a launch command and, if sglang's parser rejected it, why."""
    argv = strip_launcher(argv)
    try:
        server_args, problem = _parse_with_sglang(argv)
    except ImportError:
        logger.info("sglang is not importable here; reading the launch flags with the tolerant parser")
        return parse_tolerant(argv), None
    if server_args is None:
        return parse_tolerant(argv), problem
    from sglang_edgeacc.flags import get_flags

    return settings_from_server_args(server_args, skip_preflight=get_flags(server_args).edge_acc_skip_preflight), None


def run(args: argparse.Namespace) -> int:
    try:
        settings, problem = read_launch_args(args.launch_args)
    except LaunchArgumentsError as exc:
        print(f"sglang-edgeacc doctor: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_preflight(settings, dict(os.environ), args.hardware, problem)
    except ValueError as exc:
        print(f"sglang-edgeacc doctor: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2))
    else:
        print(report.render())
    return 0 if report.ok else 1
