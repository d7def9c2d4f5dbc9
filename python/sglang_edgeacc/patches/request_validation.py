"""Patch ``request_validation``: an empty prompt is a 400 from the tokenizer manager, not a dead scheduler.

Target: ``TokenizerManager._validate_one_request`` (BEFORE hook), the check the
tokenizer manager runs on every prompt after tokenization, one call per prompt
of a batch; it is where upstream refuses a prompt longer than the context with
a ``ValueError``, which ``/generate``, ``/v1/completions`` and the other HTTP
routes answer with a 400 carrying the message.

A prompt of no tokens reaches the scheduler unchecked when it comes as text
(``{"text": ""}`` tokenizes to nothing with a tokenizer that adds no BOS) or as
an entry of a batch (``{"text": ["a", ""]}``, ``{"input_ids": [[]]}``); upstream
refuses only a top-level ``"input_ids": []``. A forward of such a prompt alone
has no last position to take the logits of (``IndexError`` in the logits
processor): the scheduler dies, and every later request fails. With EdgeAcc
the prefill side dies the same way and takes its decode side down. Batched with
other prompts it does not crash but is answered with the logits of another
prompt's position.

The hook raises the same kind of error for a prompt of zero tokens, except in a
session, where upstream lets the session's history supply the prompt and its
session controller refuses what is still empty. Requests given as
``input_embeds`` carry no token ids here and are left alone.
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
