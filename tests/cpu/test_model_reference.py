"""The GPU suite's verdict of the checkpoint itself (``tests.gpu.model_reference``), on the real tiny checkpoint.

The score is the model's own math (transformers, float64), and it reads the recorded GPU
runs as the suite now reads every run: the eager servers, plain and EdgeAcc, answer the
suite's logprob request as the model does; under ``--enable-torch-compile`` both depart
from it at the first decode step by more than a nat, together (which a comparison between
the two cannot see).
"""

from __future__ import annotations

import json
import pathlib
import random

import pytest
import torch

from tests import serving_models
from tests.gpu import model_reference, server_suite

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results"
TINY_VOCAB = 537


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(serving_models.sensitive_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-sensitive"))


def _logprob_prompt() -> list[int]:
    return server_suite.fixed_prompts(random.Random(server_suite.WORKLOAD_SEED), TINY_VOCAB)[3]


def test_the_score_is_the_models_own_greedy_logprobs(tiny):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, torch_dtype=torch.float64).eval()
    prompt = _logprob_prompt()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    answer = out.sequences[0, len(prompt):].tolist()
    expected = [float(torch.log_softmax(scores[0].double(), -1)[token]) for scores, token in zip(out.scores, answer)]
    # generate hands its scores over in float32: equal to that precision.
    assert model_reference.score(tiny, prompt, answer) == pytest.approx(expected, abs=1e-5)
    gone = model_reference.departure(tiny, prompt, answer, expected)
    assert gone["largest"] < 1e-5
    moved = list(expected)
    moved[2] -= 0.5
    assert gone["first_step"] is None
    assert model_reference.departure(tiny, prompt, answer, moved)["first_step"] == 2


def _recorded(name: str, *path: str) -> dict:
    entry = json.loads((RESULTS / name).read_text())
    for key in path:
        entry = entry[key]
    return entry["result"]


@pytest.mark.parametrize("path", [("tiny", "arms", "plain"), ("tiny", "arms", "edge-mps"),
                                  ("tiny-no-graph", "arms", "edge-mps"), ("tiny-no-overlap", "arms", "plain")])
def test_eager_servers_on_the_gpu_answered_as_the_model_does(tiny, path):
    result = _recorded("server_suite_h200.json", *path)
    gone = model_reference.departure(tiny, _logprob_prompt(), result["logprob_tokens"], result["logprob_values"])
    assert gone["largest"] < 5e-3 and gone["first_step"] is None, gone  # float32 on the GPU, float64 here


@pytest.mark.parametrize("name,path", [
    ("server_suite_h200.json", ("tiny-torch-compile", "arms", "plain")),
    ("server_suite_h200.json", ("tiny-torch-compile", "arms", "edge-mps")),
    ("server_suite_h100_torch_compile_deterministic.json",
     ("run_each_compiling_alone", "tiny-torch-compile-deterministic", "arms", "plain")),
    ("server_suite_h100_torch_compile_deterministic.json",
     ("run_each_compiling_alone", "tiny-torch-compile-deterministic", "arms", "edge-mps")),
])
def test_compiled_decode_on_the_gpu_host_departs_from_the_model_in_plain_and_edge_acc_alike(tiny, name, path):
    result = _recorded(name, *path)
    prompt = _logprob_prompt()
    gone = model_reference.departure(tiny, prompt, result["logprob_tokens"], result["logprob_values"])
    # The first token is the (eager) prefill's and is the model's; the first decode step is not.
    assert abs(result["logprob_values"][0] - gone["model_values"][0]) < 5e-3
    assert gone["first_step"] == 1 and abs(result["logprob_values"][1] - gone["model_values"][1]) > 1.0, gone


def test_the_suite_summary_gives_the_models_verdict_beside_each_arm(tiny):
    result = _recorded("server_suite_h200.json", "tiny-torch-compile", "arms", "plain")
    entry = {"passed": True, "started_s": 1.0, "result": result,
             "model_departure": model_reference.departure(tiny, _logprob_prompt(), result["logprob_tokens"],
                                                          result["logprob_values"])}
    lines = server_suite.summary_lines({"tiny-torch-compile": {"arms": {"plain": entry}}})
    assert lines[1] == ("     the model's own logprobs of this answer depart from the server's from step 1 on (token 262: "
                        "the server -3.4378, the model -7.7134), by up to 5.9276 nats"), lines
    eager = _recorded("server_suite_h200.json", "tiny", "arms", "plain")
    entry = dict(entry, result=eager, model_departure=model_reference.departure(
        tiny, _logprob_prompt(), eager["logprob_tokens"], eager["logprob_values"]))
    line = server_suite.summary_lines({"tiny": {"arms": {"plain": entry}}})[1]
    assert line.startswith("     the model's own logprobs of this answer are the server's, within 0.00"), line
