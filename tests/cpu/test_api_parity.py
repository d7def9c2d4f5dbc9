"""The behaviour sglang's own tests check, on a plain server and on an EdgeAcc server side by side.

Every check runs against two pooled servers of the same launch, plain and with
``--enable-edge-acc`` (``PLAIN`` and ``EDGE``: the module starts exactly these
two). ``test_check[<check>-<arm>]`` runs one check on one arm and must pass;
``test_arms_agree[<check>]`` then requires the two arms to have the same outcome
and, where the check decodes greedily, the same output ids.

The tiny model has random weights, so a check can only be structural: status
codes, counts, finish reasons, matched stops, that constrained output matches
its grammar, logprob lengths and their equality across calls. Upstream checks
that need a real model's answers (``BasicDecodeCorrectnessMixin.test_capital_france``,
the JSON kit's schema with unbounded strings, the matched-stop kit's 1000-token
stops on newlines or words) cannot pass on either arm and are not run.

From sglang's wheel (imported, run against the pooled server's URL):

* ``sglang.test.kits.basic_api_contract_kit.BasicAPIContractMixin``: health,
  health_generate, get_server_info, get_model_info, OpenAI chat and completion.
* ``sglang.test.kits.basic_decode_correctness_kit.BasicDecodeCorrectnessMixin``:
  greedy determinism, a one-token request (at 16 new tokens, not 64).
* ``sglang.test.kits.matched_stop_kit.MatchedStopMixin``: finish on length,
  ``matched_stop`` null (completions and chat).
* ``sglang.test.kits.regex_constrained_kit.RegexConstrainedMixin`` and
  ``sglang.test.kits.ebnf_constrained_kit.EBNFConstrainedMixin``: every grammar
  whose language is finite (n=3 sampled outputs must match).
* ``sglang.test.kits.json_constrained_kit.JSONConstrainedMixin.test_json_invalid``.
* ``sglang.test.test_utils.run_logprob_check``: logprob list lengths for several
  input lengths, start lengths and top-k (one prompt longer than a prefill chunk).

Written here for the same behaviour:

* simple decode (length, counts, streamed ids equal to the non-streamed ones);
* batched decode (a batch of three prompts, one over a prefill chunk, gives what
  each prompt gives alone);
* parallel sampling, not streamed (n outputs, per prompt in a batch; greedy n
  equals greedy one) and streamed (/generate and /v1/completions, each index
  finishes);
* logprobs matching across calls (the same request twice; start length 0 against
  a later start length, over a prefill-chunk boundary);
* tokenize/detokenize (single, batch, special tokens, round trip of generated ids);
* stop strings, stop token ids, stop regex and EOS with the matched stop in
  /generate, /v1/completions and /v1/chat/completions;
* JSON schema constrained decoding (/generate and OpenAI ``response_format``),
  and a batch mixing regex, EBNF, JSON and unconstrained requests;
* ``get_server_info`` while generate and other info requests are in flight;
* custom logit processors, last: a processor class defined inside the check,
  sent through /generate (single, and a batch mixing requests with and without
  one), /v1/completions and /v1/chat/completions.
"""

from __future__ import annotations

import json
import math
import re
import unittest
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sglang.test.kits.basic_api_contract_kit import BasicAPIContractMixin
from sglang.test.kits.basic_decode_correctness_kit import BasicDecodeCorrectnessMixin
from sglang.test.kits.ebnf_constrained_kit import EBNFConstrainedMixin
from sglang.test.kits.json_constrained_kit import JSONConstrainedMixin
from sglang.test.kits.matched_stop_kit import MatchedStopMixin
from sglang.test.kits.regex_constrained_kit import RegexConstrainedMixin

from sglang_edgeacc.tiny_model import model_dir
from tests.harness import SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH

pytestmark = pytest.mark.server

PLAIN, EDGE = SHARED_LAUNCH, SHARED_EDGE_ACC_LAUNCH
ARMS = {"plain": PLAIN, "edge_acc": EDGE}

MODEL = "default"  # the served model answers to any name; the kits send this one
TIMEOUT_S = 120
CHUNK = 128  # --chunked-prefill-size above
VOCAB_SIZE = json.loads((model_dir() / "config.json").read_text())["vocab_size"]
EOS_ID = json.loads((model_dir() / "config.json").read_text())["eos_token_id"]

PROMPT = "The quick brown fox"


def _ids(count: int, step: int) -> list[int]:
    """A prompt of ``count`` ordinary token ids.

    Ids 0-2 are the tokenizer's special tokens. The last id is left out too: sglang 0.5.23
    reports it as 0 in ``input_token_logprobs`` (plain and EdgeAcc alike), which would
    hide what the logprob checks compare.
    """
    return [3 + (step * i) % (VOCAB_SIZE - 4) for i in range(count)]


SHORT_IDS = _ids(5, 7)
MID_IDS = _ids(40, 11)
LONG_IDS = _ids(CHUNK + 22, 13)  # prefilled in two chunks


# --- requests ---------------------------------------------------------------------------


def _post(server, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server.url}{path}", json=body, timeout=TIMEOUT_S)


def _ok(response: requests.Response):
    assert response.status_code == 200, f"{response.request.url}: {response.status_code} {response.text[:500]}"
    return response.json()


def _generate(server, prompt, max_new_tokens: int = 8, **extra):
    """/generate, greedy unless ``sampling_params`` in ``extra`` say otherwise."""
    key = "input_ids" if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str) else "text"
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, **extra.pop("sampling_params", {})}
    return _ok(_post(server, "/generate", {key: prompt, "sampling_params": sampling, **extra}))


def _stream(server, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed reply; it must end with [DONE]."""
    with requests.post(f"{server.url}{path}", json={**body, "stream": True}, stream=True,
                       timeout=TIMEOUT_S) as response:
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text[:500]}"
        events = [line[5:].strip() for line in response.iter_lines() if line.startswith(b"data:")]
    assert events and events[-1] == b"[DONE]", events[-3:]
    return [json.loads(event) for event in events[:-1]]


def _assert_length_finish(reply: dict, max_new_tokens: int) -> None:
    meta = reply["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": max_new_tokens}, meta["finish_reason"]
    assert meta["completion_tokens"] == max_new_tokens == len(reply["output_ids"]), meta


# --- the checks ---------------------------------------------------------------------------
# Each takes the server and returns what must be equal on both arms (greedy ids), or None
# where the outputs are sampled. A check fails by raising.

CHECKS: dict = {}


def check(name: str):
    def register(fn):
        assert name not in CHECKS
        CHECKS[name] = fn
        return fn
    return register


def _kit(mixin, method: str, **attributes):
    """Run one test method of an upstream kit against a server, as a unittest case of its own."""
    def run(server):
        case_class = type(f"{mixin.__name__}OnPooledServer", (mixin, unittest.TestCase),
                          {"base_url": server.url, "model": MODEL, **attributes})
        getattr(case_class(method), method)()
        return None
    return run


for _method in ("test_health", "test_health_generate", "test_get_server_info", "test_get_model_info",
                "test_openai_chat_completion", "test_openai_completion"):
    check(f"kit_api_contract.{_method}")(_kit(BasicAPIContractMixin, _method))


@check("decode_single")
def check_decode_single(server):
    first = _generate(server, PROMPT, max_new_tokens=8)
    _assert_length_finish(first, 8)
    tokens = _ok(_post(server, "/tokenize", {"prompt": PROMPT}))["tokens"]
    assert first["meta_info"]["prompt_tokens"] == len(tokens), (first["meta_info"], tokens)
    again = _generate(server, PROMPT, max_new_tokens=8)
    assert again["output_ids"] == first["output_ids"], "greedy decode differs between two calls"
    events = _stream(server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert events[-1]["output_ids"] == first["output_ids"], "streamed ids differ from the non-streamed ones"
    assert events[-1]["text"] == first["text"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    return first["output_ids"]


for _method in ("test_determinism_temp_zero", "test_max_token_one"):
    # 16 new tokens instead of 64: the structure is the same and the CI machine has two cores.
    check(f"kit_decode.{_method}")(_kit(BasicDecodeCorrectnessMixin, _method, sanity_max_new_tokens_short=16))


@check("decode_batch")
def check_decode_batch(server):
    prompts = [SHORT_IDS, MID_IDS, LONG_IDS]
    batch = _generate(server, prompts, max_new_tokens=6)
    assert isinstance(batch, list) and len(batch) == len(prompts), batch
    alone = [_generate(server, prompt, max_new_tokens=6) for prompt in prompts]
    for prompt, in_batch, single in zip(prompts, batch, alone):
        _assert_length_finish(in_batch, 6)
        assert in_batch["meta_info"]["prompt_tokens"] == len(prompt)
        assert in_batch["output_ids"] == single["output_ids"], (
            f"a {len(prompt)}-token prompt decodes differently in a batch than alone")
    return [reply["output_ids"] for reply in batch]


# Sampled at temperature 0.9 the tiny model can draw its end-of-sequence token, by chance: these
# checks count copies and lengths, so they ignore it.
@check("parallel_sampling")
def check_parallel_sampling(server):
    sampled = _generate(server, PROMPT, max_new_tokens=5, sampling_params={"n": 3, "temperature": 0.9, "ignore_eos": True})
    assert isinstance(sampled, list) and len(sampled) == 3, sampled
    for reply in sampled:
        _assert_length_finish(reply, 5)
    assert len({reply["meta_info"]["id"] for reply in sampled}) == 3

    # A batch of two prompts with n=2: two outputs per prompt, told apart by their prompt length.
    batch = _generate(server, [SHORT_IDS, MID_IDS], max_new_tokens=4, sampling_params={"n": 2, "temperature": 0.9, "ignore_eos": True})
    assert isinstance(batch, list) and len(batch) == 4, batch
    assert sorted(reply["meta_info"]["prompt_tokens"] for reply in batch) == sorted([len(SHORT_IDS), len(MID_IDS)] * 2)
    for reply in batch:
        _assert_length_finish(reply, 4)

    # Greedy with n=2: every copy is the greedy output.
    greedy = _generate(server, PROMPT, max_new_tokens=5, sampling_params={"n": 2})
    single = _generate(server, PROMPT, max_new_tokens=5)
    assert [reply["output_ids"] for reply in greedy] == [single["output_ids"]] * 2
    return single["output_ids"]


@check("parallel_sampling_streamed")
def check_parallel_sampling_streamed(server):
    events = _stream(server, "/generate", {"text": PROMPT, "sampling_params": {
        "max_new_tokens": 5, "temperature": 0.9, "n": 3, "ignore_eos": True}})
    last = {}
    for event in events:
        last[event["index"]] = event
    assert sorted(last) == [0, 1, 2], sorted(last)
    for event in last.values():
        _assert_length_finish(event, 5)

    chunks = _stream(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                                                 "temperature": 0.9, "n": 2, "ignore_eos": True})
    finish = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice.get("finish_reason"):
                finish[choice["index"]] = choice["finish_reason"]
    assert finish == {0: "length", 1: "length"}, finish
    return None


def _logprob_case(server, arguments: tuple) -> None:
    from sglang.test.test_utils import run_logprob_check  # its module imports much of sglang: only when run

    case = type("LogprobCheckOnPooledServer", (unittest.TestCase,), {"base_url": server.url})()
    run_logprob_check(case, arguments)


@check("kit_logprob_lengths")
def check_kit_logprob_lengths(server):
    # (input_len, output_len, temperature, logprob_start_len, return_logprob, top_logprobs_num)
    for arguments in ((20, 4, 0, 0, True, 3), (20, 4, 0, 10, True, 0), (CHUNK + 40, 3, 0, CHUNK - 10, True, 2),
                      (24, 3, 0.7, 5, True, 2), (16, 3, 0, 0, False, 0)):
        _logprob_case(server, arguments)
    return None


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


def _same_logprobs(first: list, second: list) -> bool:
    """Entries are [logprob, token id, text]: the same ids, and logprobs equal up to float noise."""
    return len(first) == len(second) and all(
        a[1] == b[1] and _close(a[0], b[0]) for a, b in zip(first, second))


@check("logprobs_match_across_calls")
def check_logprobs_match_across_calls(server):
    def meta(start: int) -> dict:
        reply = _generate(server, LONG_IDS, max_new_tokens=4, return_logprob=True,
                          logprob_start_len=start, top_logprobs_num=2)
        return {**reply["meta_info"], "output_ids": reply["output_ids"]}

    whole, later, again = meta(0), meta(CHUNK - 20), meta(0)
    assert len(whole["input_token_logprobs"]) == len(LONG_IDS)
    assert len(later["input_token_logprobs"]) == len(LONG_IDS) - (CHUNK - 20)
    assert [entry[1] for entry in whole["input_token_logprobs"]] == LONG_IDS
    assert [entry[1] for entry in whole["output_token_logprobs"]] == whole["output_ids"]
    for name in ("input_token_logprobs", "output_token_logprobs"):
        assert _same_logprobs(whole[name], again[name]), f"{name} differ between two identical calls"
    assert _same_logprobs(whole["output_token_logprobs"], later["output_token_logprobs"])
    # The first entry of a logprob range has no logprob; past it, both ranges must agree.
    assert later["input_token_logprobs"][0][0] is None
    assert _same_logprobs(whole["input_token_logprobs"][CHUNK - 20 + 1:], later["input_token_logprobs"][1:]), (
        "input logprobs depend on the logprob start length")
    for top in (*whole["output_top_logprobs"], *whole["input_top_logprobs"][1:]):
        assert len(top) == 2, top
    return whole["output_ids"]


@check("tokenize_detokenize")
def check_tokenize_detokenize(server):
    texts = ["Hello world", "The capital of France is"]
    single = _ok(_post(server, "/tokenize", {"model": MODEL, "prompt": texts[0]}))
    assert single["count"] == len(single["tokens"]) > 0 and single["max_model_len"] > 0, single
    batch = _ok(_post(server, "/v1/tokenize", {"model": MODEL, "prompt": texts}))
    assert batch["tokens"][0] == single["tokens"] and batch["count"] == [len(t) for t in batch["tokens"]], batch
    without_specials = _ok(_post(server, "/tokenize", {"prompt": texts[0], "add_special_tokens": False}))
    assert without_specials["tokens"] == single["tokens"]  # this tokenizer adds no BOS

    assert _ok(_post(server, "/detokenize", {"tokens": single["tokens"]}))["text"] == texts[0]
    assert _ok(_post(server, "/v1/detokenize", {"tokens": batch["tokens"]}))["text"] == texts
    with_eos = single["tokens"] + [EOS_ID]
    assert _ok(_post(server, "/detokenize", {"tokens": with_eos}))["text"] == texts[0]
    kept = _ok(_post(server, "/detokenize", {"tokens": with_eos, "skip_special_tokens": False}))["text"]
    assert kept.startswith(texts[0]) and len(kept) > len(texts[0]), kept

    generated = _generate(server, texts[1], max_new_tokens=8)
    assert _ok(_post(server, "/detokenize", {"tokens": generated["output_ids"]}))["text"] == generated["text"]
    return [batch["tokens"], generated["output_ids"]]


check("kit_matched_stop.test_finish_length")(_kit(MatchedStopMixin, "test_finish_length"))


def _stop_string(text: str) -> str:
    """Three characters from the middle of ``text``, shifted to avoid whitespace at either end."""
    for start in range(len(text) // 2, len(text) - 2):
        candidate = text[start:start + 3]
        if candidate.strip() == candidate and "\ufffd" not in candidate:
            return candidate
    raise AssertionError(f"no stop string to take from {text!r}")


@check("stop_and_matched_stop")
def check_stop_and_matched_stop(server):
    full = _generate(server, PROMPT, max_new_tokens=12)
    stop = _stop_string(full["text"])
    expected_text = full["text"][:full["text"].index(stop)]

    by_string = _generate(server, PROMPT, max_new_tokens=12, sampling_params={"stop": [stop]})
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}, by_string["meta_info"]
    assert by_string["text"] == expected_text, (by_string["text"], full["text"], stop)

    by_regex = _generate(server, PROMPT, max_new_tokens=12, sampling_params={"stop_regex": re.escape(stop)})
    assert by_regex["meta_info"]["finish_reason"] == {"type": "stop", "matched": re.escape(stop)}, by_regex["meta_info"]

    stop_id = full["output_ids"][3]
    cut = full["output_ids"].index(stop_id) + 1
    by_id = _generate(server, PROMPT, max_new_tokens=12, sampling_params={"stop_token_ids": [stop_id]})
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}, by_id["meta_info"]
    assert by_id["output_ids"] == full["output_ids"][:cut]

    # EOS made the only likely token: the finish is a stop on the EOS id.
    eos = _generate(server, PROMPT, max_new_tokens=12, sampling_params={"logit_bias": {str(EOS_ID): 100.0}})
    assert eos["meta_info"]["finish_reason"] == {"type": "stop", "matched": EOS_ID}, eos["meta_info"]

    completion = _ok(_post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 12,
                                                         "temperature": 0, "stop": stop}))["choices"][0]
    assert (completion["finish_reason"], completion["matched_stop"], completion["text"]) == (
        "stop", stop, expected_text), completion
    eos_completion = _ok(_post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 12,
                                                             "temperature": 0, "logit_bias": {str(EOS_ID): 100.0}}))
    choice = eos_completion["choices"][0]
    assert (choice["finish_reason"], choice["matched_stop"]) == ("stop", EOS_ID), choice

    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": 0}
    chat_text = _ok(_post(server, "/v1/chat/completions", chat_body))["choices"][0]["message"]["content"]
    chat_stop = _stop_string(chat_text)
    chat = _ok(_post(server, "/v1/chat/completions", {**chat_body, "stop": [chat_stop]}))["choices"][0]
    assert (chat["finish_reason"], chat["matched_stop"]) == ("stop", chat_stop), chat
    assert chat["message"]["content"] == chat_text[:chat_text.index(chat_stop)], (chat, chat_text)
    return [full["output_ids"], by_id["output_ids"]]


for _method in ("test_regex_generate_email", "test_regex_generate_greeting", "test_regex_generate_number",
                "test_regex_generate_phone", "test_regex_generate_date", "test_regex_generate_hex_color"):
    check(f"kit_regex.{_method}")(_kit(RegexConstrainedMixin, _method))

for _method in ("test_ebnf_generate_email", "test_ebnf_generate_greeting", "test_ebnf_generate_number",
                "test_ebnf_generate_phone", "test_ebnf_generate_date", "test_ebnf_generate_hex_color",
                "test_ebnf_generate_all_optional_function_params"):
    check(f"kit_ebnf.{_method}")(_kit(EBNFConstrainedMixin, _method))

check("kit_json.test_json_invalid")(_kit(JSONConstrainedMixin, "test_json_invalid"))

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome"]}, "capital": {"type": "boolean"}},
    "required": ["city", "capital"],
    "additionalProperties": False,
}


def _whitespace_bias(server) -> dict[str, float]:
    """A logit bias against every token that is only whitespace.

    The JSON grammar allows any amount of whitespace between tokens, and the random
    model prefers it: unbiased, it fills all its new tokens with blank lines.
    """
    texts = _ok(_post(server, "/detokenize", {"tokens": [[i] for i in range(VOCAB_SIZE)]}))["text"]
    blank = [i for i, text in enumerate(texts) if text and not text.strip()]
    assert blank, "the tokenizer has no whitespace tokens?"
    return {str(i): -100.0 for i in blank}


def _assert_city(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"city", "capital"}, value
    assert value["city"] in ("Paris", "Rome") and isinstance(value["capital"], bool), value


@check("json_schema")
def check_json_schema(server):
    bias = _whitespace_bias(server)
    reply = _generate(server, "Return JSON:", max_new_tokens=48, sampling_params={
        "json_schema": json.dumps(CITY_SCHEMA), "logit_bias": bias})
    assert reply["meta_info"]["finish_reason"]["type"] == "stop", reply["meta_info"]
    _assert_city(reply["text"])

    chat = _ok(_post(server, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "Return JSON:"}], "max_tokens": 48,
        "temperature": 0, "logit_bias": bias,
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}},
    }))["choices"][0]
    assert chat["finish_reason"] == "stop", chat
    _assert_city(chat["message"]["content"])
    return reply["output_ids"]


@check("constrained_mixed_batch")
def check_constrained_mixed_batch(server):
    bias = _whitespace_bias(server)
    grammars = [
        {"regex": r"(yes|no), [0-9]{3}"},
        {"ebnf": 'root ::= "#" hex hex hex\nhex ::= [0-9] | [A-F]'},
        {"json_schema": json.dumps(CITY_SCHEMA), "logit_bias": bias},
        {},
    ]
    replies = _ok(_post(server, "/generate", {
        "text": [PROMPT] * len(grammars),
        "sampling_params": [{"max_new_tokens": 32, "temperature": 0, **grammar} for grammar in grammars]}))
    assert len(replies) == len(grammars), replies
    regex, ebnf, schema, free = replies
    assert re.fullmatch(r"(yes|no), [0-9]{3}", regex["text"]), regex["text"]
    assert re.fullmatch(r"#[0-9A-F]{3}", ebnf["text"]), ebnf["text"]
    _assert_city(schema["text"])
    for reply in (regex, ebnf, schema):
        assert reply["meta_info"]["finish_reason"]["type"] == "stop", reply["meta_info"]
    _assert_length_finish(free, 32)
    assert free["output_ids"] == _generate(server, PROMPT, max_new_tokens=32)["output_ids"], (
        "an unconstrained request decodes differently beside constrained ones")
    return [reply["output_ids"] for reply in replies]


@check("get_server_info_under_concurrency")
def check_get_server_info_under_concurrency(server):
    with ThreadPoolExecutor(max_workers=10) as pool:
        generating = [pool.submit(_generate, server, prompt, 12) for prompt in (PROMPT, MID_IDS)]
        infos = [pool.submit(requests.get, f"{server.url}/get_server_info", timeout=TIMEOUT_S) for _ in range(8)]
        outputs = [future.result() for future in generating]
        replies = [future.result() for future in infos]
    for reply in replies:
        info = _ok(reply)
        assert info["grammar_backend"] == "xgrammar" and info["enable_custom_logit_processor"] is True, info
        assert info["chunked_prefill_size"] == CHUNK
        states = info["internal_states"]
        assert isinstance(states, list) and len(states) == 1, states
        assert isinstance(states[0]["last_gen_throughput"], (int, float)), states[0].keys()
        assert "memory_usage" in states[0]
    for output in outputs:
        _assert_length_finish(output, 12)
    return [output["output_ids"] for output in outputs]


# --- custom logit processors: last, a request that kills a server must not hide the other checks ---


def _serialize(processor_class) -> str:
    """``CustomLogitProcessor.to_str()`` of a class the server cannot import.

    dill refers to the module a class's methods come from by its name, and the server
    cannot import this test module; with ``recurse`` the pickle carries the globals the
    methods use instead (builtins only here).
    """
    import dill

    saved = dill.settings["recurse"]
    dill.settings["recurse"] = True
    try:
        return processor_class.to_str()
    finally:
        dill.settings["recurse"] = saved


def _forcing_processor() -> str:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class ForceToken(CustomLogitProcessor):
        """Leaves only ``custom_params["token_id"]`` possible in the rows that name one."""

        def __call__(self, logits, custom_param_list=None):
            for row, params in enumerate(custom_param_list or []):
                if params and "token_id" in params:
                    logits[row, :] = float("-inf")
                    logits[row, params["token_id"]] = 0.0
            return logits

    return _serialize(ForceToken)


def _token_id(server, text: str) -> int:
    tokens = _ok(_post(server, "/tokenize", {"prompt": text}))["tokens"]
    assert len(tokens) == 1, tokens
    return tokens[0]


@check("custom_logit_processor_single")
def check_custom_logit_processor_single(server):
    processor, forced = _forcing_processor(), _token_id(server, "H")
    for temperature in (0, 0.9):  # the processor decides, whatever the sampling
        reply = _generate(server, PROMPT, max_new_tokens=5, custom_logit_processor=processor,
                          sampling_params={"temperature": temperature, "custom_params": {"token_id": forced}})
        assert reply["output_ids"] == [forced] * 5, reply
        _assert_length_finish(reply, 5)
    return reply["output_ids"]


@check("custom_logit_processor_mixed_batch")
def check_custom_logit_processor_mixed_batch(server):
    processor = _forcing_processor()
    first, second = _token_id(server, "H"), _token_id(server, "a")
    plain_ids = _generate(server, MID_IDS, max_new_tokens=5)["output_ids"]
    replies = _ok(_post(server, "/generate", {
        "input_ids": [SHORT_IDS, MID_IDS, LONG_IDS],
        "custom_logit_processor": [processor, None, processor],
        "sampling_params": [
            {"max_new_tokens": 5, "temperature": 0, "custom_params": {"token_id": first}},
            {"max_new_tokens": 5, "temperature": 0},
            {"max_new_tokens": 5, "temperature": 0, "custom_params": {"token_id": second}},
        ]}))
    assert [reply["output_ids"] for reply in replies] == [[first] * 5, plain_ids, [second] * 5], replies
    return [reply["output_ids"] for reply in replies]


@check("custom_logit_processor_openai")
def check_custom_logit_processor_openai(server):
    processor, forced = _forcing_processor(), _token_id(server, "H")
    common = {"model": MODEL, "max_tokens": 4, "temperature": 0, "custom_logit_processor": processor,
              "custom_params": {"token_id": forced}}
    completion = _ok(_post(server, "/v1/completions", {**common, "prompt": PROMPT}))
    assert completion["choices"][0]["text"] == "H" * 4, completion
    assert completion["usage"]["completion_tokens"] == 4
    chat = _ok(_post(server, "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": PROMPT}]}))
    assert chat["choices"][0]["message"]["content"] == "H" * 4, chat
    return [completion["choices"][0]["text"], chat["choices"][0]["message"]["content"]]


# --- the tests ------------------------------------------------------------------------------

_OUTCOMES: dict[tuple[str, str], tuple[str, object]] = {}
_SERVERS: dict[str, object] = {}


@pytest.fixture(scope="module", autouse=True)
def _no_dead_server_left_in_the_pool(cpu_servers):
    """Both arms start together; a server a check killed is dropped from the pool, so later modules
    start a fresh one."""
    cpu_servers.prepare(*((args, None) for args in ARMS.values()))
    yield
    for arm, server in _SERVERS.items():
        if server.proc.poll() is not None:
            cpu_servers.release(*ARMS[arm])


@pytest.mark.parametrize("name,arm", [pytest.param(name, arm, id=f"{name}-{arm}") for name in CHECKS for arm in ARMS])
def test_check(cpu_servers, name, arm):
    try:
        server = _SERVERS[arm] = cpu_servers.get(*ARMS[arm])
        if server.proc.poll() is not None:
            raise AssertionError(f"the {arm} server exited during an earlier check:\n{server.log_tail()}")
        value = CHECKS[name](server)
    except Exception as exc:
        _OUTCOMES[name, arm] = ("fail", f"{type(exc).__name__}: {exc}"[:300])
        server = _SERVERS.get(arm)
        if server is not None and server.proc.poll() is not None:
            raise AssertionError(f"{name} on {arm}: the server exited:\n{server.log_tail()}") from exc
        raise
    _OUTCOMES[name, arm] = ("pass", value)


@pytest.mark.parametrize("name", list(CHECKS))
def test_arms_agree(name):
    outcomes = {arm: _OUTCOMES.get((name, arm)) for arm in ARMS}
    missing = [arm for arm, outcome in outcomes.items() if outcome is None]
    if missing:
        pytest.skip(f"{name} did not run on {', '.join(missing)} in this session")
    plain, edge = outcomes["plain"], outcomes["edge_acc"]
    failure = plain[1] if edge[0] == "pass" else edge[1]
    assert plain[0] == edge[0], f"{name}: plain {plain[0]}, EdgeAcc {edge[0]} ({failure})"
    if plain[0] == "pass":
        assert edge[1] == plain[1], f"{name}: greedy outputs differ\n  plain:   {plain[1]}\n  EdgeAcc: {edge[1]}"
