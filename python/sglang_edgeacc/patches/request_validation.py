"""Patch ``request_validation``: a request the scheduler cannot serve is a 400, not a dead scheduler.

Target: ``TokenizerManager._validate_one_request`` (BEFORE hook), which upstream runs on
every prompt after tokenization, one call per prompt of a batch. The hook raises a
``ValueError`` (the kind upstream raises for a prompt longer than the context, which the
HTTP routes answer with a 400) for a prompt of zero tokens, for a prompt token id
outside the model's vocabulary, and for logprob arguments the scheduler cannot serve
(more top logprobs than the vocabulary has tokens; a ``logprob_start_len`` below -1);
each of these otherwise raises in the scheduler and takes the server down. A
``stop_regex`` that does not compile is refused too: upstream answers it with a bare
500 ("Internal Server Error"). A session's
empty prompt is left to upstream, whose history may supply it; ``input_embeds`` requests
carry no token ids here, and a multimodal request's ids may hold its processor's
placeholders, so both are left alone.
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

import re

from sglang_edgeacc.patches._base import Patch, Target

VALIDATE_ONE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"

_MULTIMODAL_FIELDS = ("image_data", "video_data", "audio_data")


class UnservableRequest(ValueError):
    """A request the scheduler cannot serve; a ValueError so that sglang's HTTP layer answers 400 with the message."""


def empty_prompt_message(obj) -> str:
    if getattr(obj, "text", None) is not None:
        return ("The input text is empty after tokenization (0 tokens); "
                "a request needs at least one prompt token.")
    return "The input (0 tokens) is empty; a request needs at least one prompt token."


def _in_session(obj) -> bool:
    params = getattr(obj, "session_params", None)
    return isinstance(params, dict) and bool(params.get("id"))


def _multimodal(obj) -> bool:
    return any(getattr(obj, name, None) for name in _MULTIMODAL_FIELDS)


def out_of_vocab(input_ids, vocab_size: int) -> tuple[int, int] | None:
    """The first (position, id) of ``input_ids`` outside ``[0, vocab_size)``, or None."""
    if min(input_ids) >= 0 and max(input_ids) < vocab_size:  # the common case, without a Python loop
        return None
    return next((i, t) for i, t in enumerate(input_ids) if not 0 <= t < vocab_size)


def logprob_argument_error(obj, vocab_size: int) -> str | None:
    """What is wrong with a request's logprob arguments, or None; only asked for logprobs count."""
    if not getattr(obj, "return_logprob", False):
        return None
    top = getattr(obj, "top_logprobs_num", 0) or 0
    if top > vocab_size:
        return (f"top_logprobs_num (top_logprobs in the OpenAI API) is {top}, more than the model's vocabulary "
                f"of {vocab_size} tokens; ask for at most {vocab_size}.")
    start = getattr(obj, "logprob_start_len", -1)
    if start is not None and start < -1:
        return (f"logprob_start_len is {start}; use -1 for the output's logprobs only, or a prompt position "
                "(0 or more) to start the prompt's logprobs from.")
    return None


def stop_regex_error(obj) -> str | None:
    """Why a request's ``stop_regex`` does not compile, or None."""
    params = getattr(obj, "sampling_params", None)
    patterns = params.get("stop_regex") if isinstance(params, dict) else None
    for pattern in [patterns] if isinstance(patterns, str) else patterns or ():
        if not isinstance(pattern, str):
            continue  # upstream's own checks name the type
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"stop_regex {pattern!r} is not a valid regular expression: {exc}."
    return None


def prompt_error(obj, input_ids, vocab_size: int) -> str | None:
    """What is wrong with a prompt's token ids, or None."""
    if input_ids is None:
        return None
    if len(input_ids) == 0:
        return None if _in_session(obj) else empty_prompt_message(obj)
    bad = None if _multimodal(obj) else out_of_vocab(input_ids, vocab_size)
    if bad is None:
        return None
    position, token_id = bad
    return (f"The input has token id {token_id} at position {position}, outside the model's vocabulary "
            f"[0, {vocab_size}); send token ids of this model's tokenizer.")


def refuse_unservable_prompt(tokenizer_manager, obj, input_ids, *args, **kwargs) -> None:
    """BEFORE hook: raise :class:`UnservableRequest` with the first problem found, if any."""
    del args, kwargs
    vocab_size = tokenizer_manager.model_config.vocab_size
    problem = (logprob_argument_error(obj, vocab_size) or stop_regex_error(obj)
               or prompt_error(obj, input_ids, vocab_size))
    if problem is not None:
        raise UnservableRequest(problem)


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_ONE_REQUEST, refuse_unservable_prompt, HookType.BEFORE)


PATCH = Patch(
    name="request_validation",
    summary="a request that kills upstream's scheduler (an empty prompt, a token id outside the vocabulary, more "
            "top logprobs than the vocabulary has, a logprob_start_len below -1) or gets a bare 500 (a stop_regex "
            "that does not compile) is refused with a 400 that names the field",
    targets=(Target(VALIDATE_ONE_REQUEST, params=("self", "obj", "input_ids")),),
    install=_install,
)
