"""Structured output across the two sides: a request's grammar travels as its filled vocab mask.

A grammar (an xgrammar matcher, an llguidance parser) is native state that cannot
cross a process boundary, and it belongs to the decode side, which accepts every
token the request produces. The prefill side needs it for one thing: the vocab
mask of the first token it samples. So the decode side fills the batch's mask
before sending the batch, with upstream's own
``SamplingBatchInfo.update_regex_vocab_mask``, and the batch codec sends every
grammar as a :class:`PrefilledGrammarMask` holding that mask. On the prefill side
upstream's sampling code asks the stand-in to allocate a mask (it gets the filled
one), to fill its row (already done) and to apply it (the real backend's kernel).
The first token is accepted into the real grammar by the decode side's result
processing, as upstream does after a prefill it ran itself.
"""

from __future__ import annotations

import inspect

import torch
from sglang.srt.constrained.base_grammar_backend import BaseGrammarObject


class PrefilledGrammarMask(BaseGrammarObject):
    """The prefill side's view of one request's grammar: the batch's mask, filled by the decode side."""

    def __init__(self, batch_mask: torch.Tensor, backend: type, terminated: bool, finished: bool):
        super().__init__()
        self.batch_mask = batch_mask
        self.backend = backend
        self.terminated = terminated
        self.finished = finished

    def __reduce__(self):
        return PrefilledGrammarMask, (self.batch_mask, self.backend, self.terminated, self.finished)

    def is_terminated(self) -> bool:
        return self.terminated

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device) -> torch.Tensor:
        if batch_size != self.batch_mask.shape[0]:
            raise RuntimeError(
                f"EdgeAcc: the grammar mask was filled for {self.batch_mask.shape[0]} requests, "
                f"the prefill batch has {batch_size}"
            )
        return self.batch_mask.clone()

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, idx: int) -> None:
        pass  # the decode side filled every row

    def move_vocab_mask(self, vocab_mask: torch.Tensor, device) -> torch.Tensor:
        return self._backend_call("move_vocab_mask", vocab_mask, device)

    def apply_vocab_mask(self, logits: torch.Tensor, vocab_mask: torch.Tensor) -> None:
        self._backend_call("apply_vocab_mask", logits, vocab_mask)

    def _backend_call(self, name: str, *args):
        # Backends declare these static (llguidance) or as instance methods that read
        # no instance state (xgrammar's apply_vocab_mask); either way the backend's code runs.
        method = getattr(self.backend, name)
        if isinstance(inspect.getattr_static(self.backend, name), staticmethod):
            return method(*args)
        return method(self, *args)

    def accept_token(self, token: int) -> None:
        raise RuntimeError("EdgeAcc: the prefill side never advances a grammar; the decode side owns it")


def prefilled_grammar_masks(batch) -> dict[int, PrefilledGrammarMask]:
    """``id(grammar) -> stand-in`` for every grammar of a decode side's prefill batch (empty without one)."""
    grammars = [req.grammar for req in batch.reqs]
    if not any(grammars):
        return {}
    info = batch.sampling_info
    saved = info.grammars, info.grammar_mask
    info.grammars = grammars
    try:
        info.update_regex_vocab_mask()
        batch_mask = info.grammar_mask.vocab_mask.cpu()
    finally:
        info.grammars, info.grammar_mask = saved
    return {
        id(g): PrefilledGrammarMask(batch_mask, type(g), bool(g.is_terminated()), bool(g.finished))
        for g in grammars
        if g
    }
