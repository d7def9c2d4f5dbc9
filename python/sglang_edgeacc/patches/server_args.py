"""Patch ``server_args``: EdgeAcc's flags on sglang's own parser, validated at parse time.

Targets ``ServerArgs.add_cli_args`` (AROUND: adds the EdgeAcc argument group) and
``ServerArgs.from_cli_args`` (AROUND: before the original, turns prefill CUDA graphs
off under the green-context split; after it, validates the flags, attaches an
:class:`EdgeAccFlags` to the record and prepares the EdgeAcc launch environment).
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

import logging

from sglang_edgeacc import flags as edge_flags
from sglang_edgeacc.launch_environment import prepare_edge_acc_environment
from sglang_edgeacc.launch_validation import keep_prefill_graphs_inside_green_contexts, validate_launch
from sglang_edgeacc.patches._base import Patch, Target
from sglang_edgeacc.server_start.decode_warmup import NAME as WARMUP_NAME
from sglang_edgeacc.server_start.decode_warmup import add_to_launch

logger = logging.getLogger(__name__)

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"


def _around_add_cli_args(original, parser):
    original(parser)
    edge_flags.add_cli_args(parser)


def _around_from_cli_args(original, cls, args):
    parsed = edge_flags.EdgeAccFlags.from_namespace(args)
    keep_prefill_graphs_inside_green_contexts(parsed, args)  # must precede upstream's graph-config resolution
    server_args = original(cls, args)
    validate_launch(parsed, args)
    edge_flags.attach_flags(server_args, parsed)
    if parsed.enable_edge_acc:
        prepare_edge_acc_environment(parsed, args)
        if add_to_launch(server_args):
            logger.info("[edgeacc] the server warms every decode batch size before it listens (%s; "
                        "--skip-server-warmup leaves it out)", WARMUP_NAME)
    return server_args


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ADD_CLI_ARGS, _around_add_cli_args, HookType.AROUND)
    HookRegistry.register(FROM_CLI_ARGS, _around_from_cli_args, HookType.AROUND)


PATCH = Patch(
    name="server_args",
    summary="EdgeAcc flags on sglang's parser; incompatible combinations refused at parse time",
    targets=(
        Target(ADD_CLI_ARGS, params=("parser",)),
        Target(FROM_CLI_ARGS, params=("args",)),
    ),
    install=_install,
)
