"""The ``sglang-edgeacc`` command.

Each subcommand lives in the module that owns its feature and exposes
``add_arguments(parser)`` and ``run(args) -> int``; this module only routes, so
that ``sglang-edgeacc hccl-budget`` never imports torch or sglang. Only the
module of the subcommand being run is imported (``--help`` imports none), and a
module that fails to import disables its own subcommand, never the others.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass
from typing import Iterable, Optional

# What `sglang-edgeacc --help` says above the subcommands; plain text, since argparse prints it as written.
DESCRIPTION = "Tools of the sglang-edgeacc plugin for sglang: patch check, tiny model, CUDA MPS daemon, Ascend checks."

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "patches": ("sglang_edgeacc.patches.report",
                "list every upstream patch and whether it applies to the installed sglang"),
    "tiny-model": ("sglang_edgeacc.tiny_model", "print the directory of the shipped tiny random-weight model"),
    "mps": ("sglang_edgeacc.mps.cli", "start, stop or inspect the CUDA MPS control daemon EdgeAcc uses"),
    "hccl-budget": ("sglang_edgeacc.ascend.budget_cli", "compute the HCCL buffer DeepEP needs on Ascend"),
    "doctor": ("sglang_edgeacc.ascend.doctor", "check an Ascend launch command before it hangs"),
}


@dataclass(frozen=True)
class UnavailableSubcommand:
    """Stands in for a subcommand whose module could not be imported."""

    name: str
    module_name: str
    error: str

    def run(self, args: argparse.Namespace) -> int:
        del args
        print(
            f"sglang-edgeacc: error: subcommand '{self.name}' is unavailable: importing {self.module_name} "
            f"failed with {self.error}. Reinstall sglang-edgeacc (pip install -e .) or report the error; "
            f"the other subcommands are unaffected.",
            file=sys.stderr,
        )
        return 2


def _load_subcommand(name: str, module_name: str, sub_parser: argparse.ArgumentParser):
    try:
        module = importlib.import_module(module_name)
        module.add_arguments(sub_parser)
    except Exception as exc:  # any failure of that one module; reported when it is run
        logging.getLogger(__name__).debug("subcommand %s unavailable", name, exc_info=True)
        return UnavailableSubcommand(name, module_name, f"{type(exc).__name__}: {exc}")
    return module


def build_parser(load: Optional[Iterable[str]] = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """The parser, and the runnable module of each loaded subcommand.

    ``load`` names the subcommands whose modules are imported (their arguments
    only exist on the parser then); None imports all of them.
    """
    wanted = set(SUBCOMMANDS) if load is None else set(load)
    parser = argparse.ArgumentParser(prog="sglang-edgeacc", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name in wanted:
            modules[name] = _load_subcommand(name, module_name, sub_parser)
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    # The top-level parser has no options of its own besides --help, so the
    # subcommand, when there is one, is the first word.
    selected = [argv[0]] if argv and argv[0] in SUBCOMMANDS else []
    parser, modules = build_parser(load=selected)
    args, unknown = parser.parse_known_args(argv)
    module = modules[args.command]
    if unknown and not isinstance(module, UnavailableSubcommand):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # An unavailable subcommand accepts whatever was typed and reports why it cannot run.
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
