"""The ``sglang-edgeacc`` command.

Each subcommand lives in the module that owns its feature and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this module only routes, so
that ``sglang-edgeacc hccl-budget`` never imports torch or sglang.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "patches": ("sglang_edgeacc.patches.report", "list every upstream patch and whether it applies to the installed sglang"),
    "tiny-model": ("sglang_edgeacc.tiny_model", "print the directory of the shipped tiny random-weight model"),
    "mps": ("sglang_edgeacc.edge_acc.mps_cli", "start, stop or inspect the CUDA MPS control daemon EdgeAcc uses"),
    "hccl-budget": ("sglang_edgeacc.ascend.budget_cli", "compute the HCCL buffer DeepEP needs on Ascend"),
    "doctor": ("sglang_edgeacc.ascend.doctor", "check an Ascend launch command before it hangs"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="sglang-edgeacc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
