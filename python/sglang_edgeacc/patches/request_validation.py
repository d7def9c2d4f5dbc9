"""Patch ``request_validation``: an empty prompt is a 400 from the tokenizer manager, not a dead scheduler.

Target: ``TokenizerManager._validate_one_request`` (BEFORE hook), which upstream runs on
every prompt after tokenization, one call per prompt of a batch. The hook raises a
``ValueError`` for a prompt of zero tokens, the kind upstream raises for a prompt longer
than the context and the HTTP routes answer with a 400. A session's request is left to
upstream, whose history may supply the prompt; ``input_embeds`` requests carry no token
ids here and are left alone. Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

from sglang_edgeacc.patches._base import Patch, Target

VALIDATE_ONE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


class EmptyPromptError(ValueError):
    """A prompt of zero tokens; a ValueError so that sglang's HTTP layer answers 400."""


def empty_prompt_message(obj) -> str:
    if getattr(obj, "text", None) is not None:
        return ("The input text is empty after tokenization (0 tokens); "
                "a request needs at least one prompt token.")
    return "The input (0 tokens) is empty; a request needs at least one prompt token."


def _in_session(obj) -> bool:
    params = getattr(obj, "session_params", None)
    return isinstance(params, dict) and bool(params.get("id"))


def refuse_empty_prompt(tokenizer_manager, obj, input_ids, *args, **kwargs) -> None:
    """BEFORE hook: raise :class:`EmptyPromptError` for a prompt of zero tokens outside a session."""
    del tokenizer_manager, args, kwargs
    if input_ids is not None and len(input_ids) == 0 and not _in_session(obj):
        raise EmptyPromptError(empty_prompt_message(obj))


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_ONE_REQUEST, refuse_empty_prompt, HookType.BEFORE)


PATCH = Patch(
    name="request_validation",
    summary="an empty prompt is refused with a 400 by the tokenizer manager instead of killing the scheduler",
    targets=(Target(VALIDATE_ONE_REQUEST, params=("self", "obj", "input_ids")),),
    install=_install,
)
