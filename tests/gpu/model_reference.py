"""What the checkpoint itself says of a server's answer: each answered token's logprob under transformers in float64.

The suite's oracles compare servers with each other (tokens, top-k logprobs), so an
error every server shares cannot show in them. Under ``--enable-torch-compile`` on the
GPU host, plain sglang's compiled decode is such an error: on the suite's tiny checkpoint
its first decode step picks a token the model gives -7.7 nats, at -3.4, where eager sglang
(plain and EdgeAcc alike) picks the model's own greedy token within 2e-3 of its logprob.
Scoring every server's answer against the model tells a server that computes the model
from one that computes something else, whoever else does the same.

The score is teacher-forced: one forward of the prompt and the server's own answer, so a
server that has parted from the model's greedy path is still scored token by token on
the path it took. The tiny checkpoint runs on the CPU in a fraction of a second.
"""

from __future__ import annotations

import functools
import threading

_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _model(path: str):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float64).eval()


def score(path: str, prompt: list[int], answer: list[int]) -> list[float]:
    """The model's logprob of each token of ``answer``, given ``prompt`` and the answer's tokens before it."""
    import torch

    with _LOCK:  # the suite scores from several threads; one load and one forward at a time
        model = _model(path)
        with torch.no_grad():
            logits = model(torch.tensor([list(prompt) + list(answer)])).logits[0]
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    start = len(prompt) - 1  # the logits at position i predict token i + 1
    return [float(logprobs[start + i, token]) for i, token in enumerate(answer)]


# More than float32 against float64 on the tiny checkpoint moves a logprob (below 5e-3 on the GPU).
DEPARTS_NATS = 0.01


def departure(path: str, prompt: list[int], answer: list[int], values: list[float]) -> dict:
    """How far a server's logprobs of its own answer are from the model's: the largest difference, and the
    first step that departs by more than DEPARTS_NATS (None: none does)."""
    model_values = score(path, prompt, answer)
    gaps = [abs(a - b) for a, b in zip(values, model_values)]
    first = next((i for i, gap in enumerate(gaps) if gap > DEPARTS_NATS), None)
    return {"model_values": model_values, "largest": max(gaps, default=0.0), "first_step": first}
