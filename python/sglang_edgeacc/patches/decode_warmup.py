"""Patch ``decode_warmup``: EdgeAcc's warm-up through every decode batch size, in sglang's warm-up registry.

Target: ``sglang.srt.entrypoints.warmup.warmup`` (the decorator that names a warm-up for
``--warmups``), used as upstream's own warm-ups use it; ``execute_warmups`` and the
tokenizer manager's ``get_internal_state``, ``generate_request`` and ``flush_cache``, which
the warm-up relies on, are checked for their signatures. Launcher process only: the HTTP server runs
its warm-ups there. The ``server_args`` patch adds the warm-up's name to an EdgeAcc launch.
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

from sglang_edgeacc.patches._base import Patch, Target

WARMUP = "sglang.srt.entrypoints.warmup"
TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


def _install() -> None:
    from sglang.srt.entrypoints.warmup import warmup

    from sglang_edgeacc.server_start.decode_warmup import NAME, warm_decode_batch_sizes

    warmup(NAME)(warm_decode_batch_sizes)


PATCH = Patch(
    name="decode_warmup",
    summary="a named warm-up that runs the decode side through every batch size before the server listens",
    targets=(
        Target(f"{WARMUP}.warmup", params=("name",)),
        Target(f"{WARMUP}.execute_warmups", params=("disaggregation_mode", "warmup_names", "tokenizer_manager")),
        Target(f"{TOKENIZER_MANAGER}.get_internal_state", params=("self",)),
        Target(f"{TOKENIZER_MANAGER}.generate_request", params=("self", "obj", "request")),
        Target(f"{TOKENIZER_MANAGER}.flush_cache", params=("self", "timeout_s")),
    ),
    install=_install,
    only_in_launcher=True,
)
