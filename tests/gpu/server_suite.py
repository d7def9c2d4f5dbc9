"""The GPU server suite: EdgeAcc's greedy outputs against plain sglang's, in the real server.

Each *family* is one set of launch flags; in it, a plain sglang server and one
EdgeAcc server per SM mode run the same fixed workload (:func:`fingerprint`),
and every EdgeAcc result must equal plain sglang's. The tiny family serves a
checkpoint whose outputs depend on the whole context (``serving_models``), so a
KV cache read from the wrong slots changes the tokens; the Qwen3-8B-shaped
family serves dummy weights at production shapes (pool, tokenizer, kernels), and the
Qwen3-32B-shaped one (picked by name) the reference deployment's model, its
servers one at a time. Under ``--enable-torch-compile`` plain sglang's tokens
change with the batch, so that family is judged by top-k logprobs on the same
greedy prefix instead (:mod:`tests.gpu.topk_oracle`).

    # on the GPU host, MPS daemon started, from the repository root:
    source .gpu-bundle/env.sh && python3 -m tests.gpu.server_suite --out $OUT/suite.json
    # the same flow on the CPU platform (a subset of the arms), from the repository root:
    python3 -m tests.gpu.server_suite --platform cpu --families tiny --out /tmp/suite.json

The servers of a phase start together (each with a capped KV pool) and then run
their workloads; ``tests/gpu/on_device.sh`` runs it with its MPS
daemon, ``tests/gpu/test_server_suite_gpu.py`` is the pytest entry.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import pathlib
import random
import re
import shutil
import sys
import tempfile
import threading
import time
import traceback

import requests

from tests import serving_models
from tests.gpu import model_reference, topk_oracle
from tests.harness import SglangServer

ANSWER_REGEX = "(yes|no) [0-9]{3}"
JSON_SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
LOGPROB_TOLERANCE = 2e-3
# A bfloat16 logit carries 8 significant bits: below 16 in magnitude two logits one step apart (2^-4 at
# most) are a tie that batch-dependent rounding earlier in the sequence may break either way.
BF16_TIE_STEP = 2.0 ** -4

# Plain sglang is the arm "plain" of every family. A family judged by the top-k oracle has a second plain
# server, "plain-again" (its spread from "plain" sets the tolerance, and what it answers exactly as plain
# did is the control, :func:`control_compare`), and may have plain servers of other flags that are not
# judged, only compared with plain and EdgeAcc (:func:`diagnose`).
PLAIN_VARIANTS = {
    "plain-again": (),
    # No eager forward before its decode graphs are compiled, as on EdgeAcc's decode side (which captures no
    # prefill graphs): where EdgeAcc differs from plain, this one tells whether that order is enough to differ.
    "plain-no-prefill-graph": ("--disable-prefill-cuda-graph",),
    # Plain sglang as a client of the suite's MPS daemon (below): where EdgeAcc differs from plain, this
    # one tells whether being an MPS client is enough to differ.
    "plain-mps": (),
}
PLAIN_ARMS = ("plain", *PLAIN_VARIANTS)
DIAGNOSTIC_ARMS = tuple(arm for arm in PLAIN_VARIANTS if arm != "plain-again")
# EdgeAcc arms: name -> extra flags.
EDGE_ARMS = {
    "edge-mps": ("--enable-edge-acc",),
    "edge-none": ("--enable-edge-acc", "--edge-acc-sm-partition", "none"),
    "edge-green": ("--enable-edge-acc", "--edge-acc-sm-partition", "green-context"),
    # EdgeAcc with no MPS daemon at all (time-slicing): the other side of that question.
    "edge-no-mps": ("--enable-edge-acc", "--edge-acc-sm-partition", "none"),  # edge-none's flags
    # EdgeAcc beside plain-no-prefill-graph: both sides without prefill graphs.
    "edge-no-prefill-graph": ("--enable-edge-acc", "--disable-prefill-cuda-graph"),
    # A second EdgeAcc server of edge-mps's flags: EdgeAcc's own spread from server to server, where its
    # answers move while plain's do not.
    "edge-again": ("--enable-edge-acc",),
}
# EdgeAcc servers are clients of the suite's MPS daemon, plain ones are not; one of each is the other way round.
PLAIN_MPS_CLIENTS = ("plain-mps",)
EDGE_NOT_MPS_CLIENTS = ("edge-no-mps",)
ARM_FLAGS = {**PLAIN_VARIANTS, **EDGE_ARMS}
CPU_ARMS = ("edge-mps",)  # the CPU platform has no SMs to split: one EdgeAcc arm shows the flow


# How much of each server's log the suite keeps (its end): EDGEACC_SUITE_LOG_CHARS raises it for a run
# whose logs carry more than the usual start and warnings (TORCH_LOGS=output_code writes every compiled graph).
LOG_CHARS = int(os.environ.get("EDGEACC_SUITE_LOG_CHARS", "200000"))

# Inductor's mode that picks kernel configs without benchmarking them on the device.
INDUCTOR_DETERMINISTIC_ENV = "TORCHINDUCTOR_DETERMINISTIC"


def inductor_has_deterministic_mode() -> bool:
    """Whether this host's torch knows the mode (the servers run the same torch as the suite)."""
    try:
        from torch._inductor import config
    except ImportError:
        return False
    return hasattr(config, "deterministic")


_MODE_IN_KERNEL = re.compile(r"inductor_meta=\{[^\n]*?'deterministic': (True|False)")


def deterministic_mode_in_log(log: str) -> bool | None:
    """Whether the kernels a server compiled were compiled under inductor's deterministic mode.

    Read from the generated code its log carries under ``TORCH_LOGS=output_code`` (each Triton kernel's
    ``inductor_meta``): True when every kernel says so, False when any does not, None when the log has
    no kernel (the mode cannot be told from outside the server otherwise).
    """
    found = {m.group(1) for m in _MODE_IN_KERNEL.finditer(log)}
    return None if not found else found == {"True"}


def families(platform: str) -> dict[str, dict]:
    tiny_pool = ("--max-total-tokens", "40000", "--mem-fraction-static", "0.3", "--max-running-requests", "32")
    gpu = platform == "cuda"
    all_modes = tuple(EDGE_ARMS) if gpu else CPU_ARMS
    fams = {
        "tiny": dict(model="tiny", args=("--chunked-prefill-size", "128", *tiny_pool), arms=all_modes),
        "tiny-page16": dict(model="tiny", args=("--chunked-prefill-size", "128", "--page-size", "16", *tiny_pool),
                            arms=("edge-mps",)),
        "tiny-no-graph": dict(model="tiny", args=("--chunked-prefill-size", "128", "--disable-cuda-graph",
                                                  *tiny_pool), arms=("edge-mps",)),
        "tiny-no-overlap": dict(model="tiny", args=("--chunked-prefill-size", "128", "--disable-overlap-schedule",
                                                    *tiny_pool), arms=("edge-mps",)),
    }
    # Two GPUs (or two CPU ranks): the layouts of the multi-GPU issue; picked by name, or by default
    # where two GPUs are visible. A lone request leaves the other DP group idle; the burst feeds both.
    multi = {
        "tiny-tp2": ("--tp", "2"),
        "tiny-dp2": ("--dp", "2"),
        "tiny-dp2-attention": ("--tp", "2", "--dp", "2", "--enable-dp-attention"),
    }
    for name, layout in multi.items():
        fams[name] = dict(model="tiny", args=("--chunked-prefill-size", "128", *layout, *tiny_pool),
                          arms=("edge-mps",), phase=4, gpus=2)
    if gpu:
        # Plain sglang's greedy tokens under compile change with the batch and with the server process
        # (each autotunes its kernels): judged by top-k logprobs against two plain servers, and by the
        # control. Plain compiles first and the others load its kernels from the same inductor cache, so
        # all of them run the same kernels and what is left between them is the scheduling.
        fams["tiny-torch-compile"] = dict(
            model="tiny", args=("--chunked-prefill-size", "128", "--enable-torch-compile",
                                "--torch-compile-max-bs", "4", *tiny_pool),
            arms=("plain-again", "plain-no-prefill-graph", "plain-mps", "edge-mps", "edge-no-mps",
                  "edge-no-prefill-graph"), phase=3,
            oracle="topk",
            compiled_by="plain")
        # The same under inductor's deterministic mode, which chooses every kernel config without timing it
        # on the device: if the tunings each server times are what sets EdgeAcc's rounding apart, here it
        # answers exactly as plain, so the token oracle applies again. Picked by name.
        fams["tiny-torch-compile-deterministic"] = dict(
            model="tiny", args=fams["tiny-torch-compile"]["args"], arms=("plain-again", "edge-mps", "edge-again"),
            phase=3,
            env={INDUCTOR_DETERMINISTIC_ENV: "1"}, needs_inductor_deterministic=True, compiled_by="plain",
            by_name=True)
        # The reference deployment's compile settings: graphs compiled for batch sizes up to 64 (the family
        # above stops at 4 to fit a device call with all its diagnostic arms). Plain compiles alone first, the
        # other two load its kernels. Picked by name.
        fams["tiny-torch-compile-bs64"] = dict(
            model="tiny", args=("--chunked-prefill-size", "128", "--enable-torch-compile", "--torch-compile-max-bs",
                                "64", "--cuda-graph-max-bs-decode", "64", "--max-total-tokens", "40000",
                                "--mem-fraction-static", "0.3", "--max-running-requests", "64"),
            arms=("plain-again", "edge-mps"), phase=3, oracle="topk", compiled_by="plain", by_name=True)
        fams["qwen3-8b"] = dict(
            model="qwen3-8b", args=("--chunked-prefill-size", "2048", "--max-total-tokens", "120000",
                                    "--mem-fraction-static", "0.45", "--cuda-graph-max-bs-decode", "64"),
            arms=("edge-mps",), phase=2)
        # The attention backends users run, picked by name: FlashInfer needs .gpu-flashinfer on the
        # host of scripts/gpu-host (built for these shapes), and serves neither float32 nor head dim 16.
        # The tiny model in bfloat16: its solo answers reuse the KV its burst wrote (the radix cache), whose
        # rounding follows each server's batches, so an answer may part from plain's at a one-step tie.
        for backend in ("flashinfer", "fa3"):
            fams[f"tiny-h64-{backend}"] = dict(
                model="tiny-h64", args=("--attention-backend", backend, "--chunked-prefill-size", "128",
                                        *tiny_pool), arms=("edge-mps",), phase=6, by_name=True,
                tie_step=BF16_TIE_STEP)
            fams[f"tiny-h64-{backend}-page16"] = dict(
                model="tiny-h64", args=("--attention-backend", backend, "--chunked-prefill-size", "128",
                                        "--page-size", "16", *tiny_pool), arms=("edge-mps",), phase=6, by_name=True,
                tie_step=BF16_TIE_STEP)
            # The production shape (pool, tokenizer, head dim 128, CUDA graphs) under the backend, one server
            # at a time: on an 80 GB card two of them at 0.45 leave FA3's no room for its KV cache.
            fams[f"qwen3-8b-{backend}"] = dict(
                model="qwen3-8b", args=("--attention-backend", backend, "--chunked-prefill-size", "2048",
                                        "--max-total-tokens", "120000", "--mem-fraction-static", "0.45",
                                        "--cuda-graph-max-bs-decode", "64"), arms=("edge-mps",), phase=7, by_name=True,
                alone=True)
        # The reference deployment's model: 64 GB of weights, so its servers run one at a time;
        # picked by name only (about 8 minutes of a 10-minute step).
        fams["qwen3-32b"] = dict(
            model="qwen3-32b", args=("--chunked-prefill-size", "2048", "--max-total-tokens", "100000",
                                     "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "64"),
            arms=("edge-mps",), phase=5, alone=True, by_name=True)
    return fams


# ----------------------------------------------------------------- the workload
def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def _post(server, payload: dict, timeout: float = 300) -> dict:
    response = requests.post(f"{server.url}/generate", json=payload, timeout=timeout)
    response.raise_for_status()
    return response.json()


def _gen(server, ids, n=16, **extra) -> dict:
    return server.generate(ids, max_new_tokens=n, **extra)


def _top_two(server, ids, n=16) -> list:
    """The greedy answer's top two [logprob, token] at every position: where two servers' answers part, whether
    the place was a near tie (rounding may break it either way) or a real difference."""
    out = server.generate(ids, max_new_tokens=n, return_logprob=True, top_logprobs_num=2)
    return [[[entry[0], entry[1]] for entry in position] for position in out["meta_info"]["output_top_logprobs"]]


def _abort_mid_stream(server, ids) -> int:
    """Stream a long request and drop the connection after two chunks; returns the chunks seen."""
    payload = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 400, "temperature": 0}}
    seen = 0
    with requests.post(f"{server.url}/generate", json=payload, stream=True, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                seen += 1
                if seen >= 2:
                    break
    return seen


WORKLOAD_SEED = 1234


def fixed_prompts(rng: random.Random, vocab: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """The workload's first prompts, drawn in this order: short, long, a partial hit on long, the logprob prompt."""
    short, long = _ids(rng, 12, vocab), _ids(rng, 1000, vocab)
    partial = long[:650] + _ids(rng, 200, vocab)
    return short, long, partial, _ids(rng, 40, vocab)


def fingerprint(server, vocab: int, sensitive: bool) -> dict:
    """Everything the comparison looks at, from one fixed workload (same seed on every server)."""
    rng = random.Random(WORKLOAD_SEED)
    short, long, partial, mid = fixed_prompts(rng, vocab)
    burst_prompts = [_ids(rng, rng.randrange(100, 600), vocab) for _ in range(8)]
    out: dict = {}
    out["solo_short"] = _gen(server, short)["output_ids"]
    out["solo_long"] = _gen(server, long)["output_ids"]
    hit = _gen(server, long)
    out["radix_hit"] = hit["output_ids"]
    out["radix_hit_cached"] = hit["meta_info"]["cached_tokens"] > 0
    part = _gen(server, partial)
    out["partial_hit"] = part["output_ids"]
    out["partial_hit_cached"] = part["meta_info"]["cached_tokens"] >= 512
    lp = _gen(server, mid, n=6, return_logprob=True, top_logprobs_num=3, logprob_start_len=0)["meta_info"]
    out["logprob_prompt"] = mid
    out["logprob_tokens"] = [x[1] for x in lp["output_token_logprobs"]]
    out["logprob_values"] = [x[0] for x in lp["output_token_logprobs"]]
    out["logprob_top_ids"] = [[t[1] for t in x] for x in lp["output_top_logprobs"]]
    out["input_logprob_count"] = len(lp["input_token_logprobs"])
    out["input_logprob_values"] = [x[0] for x in lp["input_token_logprobs"] if x[0] is not None][-8:]
    chunks = server.generate_stream(short, max_new_tokens=16)
    out["stream_chunks_gt1"] = len(chunks) > 1
    out["stream_final"] = chunks[-1].get("output_ids")
    out["aborted_chunks"] = _abort_mid_stream(server, _ids(rng, 900, vocab))
    out["after_abort_long"] = _gen(server, long)["output_ids"]
    regex = server.generate("Answer:", max_new_tokens=12, sampling={"regex": ANSWER_REGEX})["text"]
    out["regex_text"] = regex
    out["regex_matches"] = bool(re.fullmatch(ANSWER_REGEX, regex))
    out["json_text"] = server.generate("Answer:", max_new_tokens=16, sampling={"json_schema": JSON_SCHEMA})["text"]
    with cf.ThreadPoolExecutor(len(burst_prompts)) as pool:
        burst = list(pool.map(lambda p: _gen(server, p)["output_ids"], burst_prompts))
    out["burst"] = burst
    # Concurrent requests share batches whose composition depends on timing; batched
    # kernels round differently from solo ones, and this model amplifies any rounding.
    out["burst_solo"] = [_gen(server, p)["output_ids"] for p in burst_prompts]
    # Read only where answers part (``parting_points``); asked apart, so the answers above stay tokens-only.
    out["top_two"] = {"solo_short": _top_two(server, short), "solo_long": _top_two(server, long),
                      "burst_solo": [_top_two(server, p) for p in burst_prompts]}
    if sensitive:
        # The oracle guard: a page of tokens changed 50 positions back must change the answer.
        changed = serving_models.changed_context(long)
        out["context_changes_output"] = _gen(server, changed)["output_ids"] != out["solo_long"]
    return out


def _solo_answers(plain: dict, edge: dict):
    """Each answer asked alone, with both servers' top two at every token: (name, plain's, EdgeAcc's, tops)."""
    plain_top, edge_top = plain.get("top_two") or {}, edge.get("top_two") or {}
    for key in ("solo_short", "solo_long"):
        yield key, plain.get(key), edge.get(key), (plain_top.get(key), edge_top.get(key))
    runs = [top.get("burst_solo") or [] for top in (plain_top, edge_top)]
    for j, (a, b) in enumerate(zip(plain.get("burst_solo") or [], edge.get("burst_solo") or [])):
        yield f"burst_solo[{j}]", a, b, tuple(run[j] if j < len(run) else None for run in runs)


def _first_difference(a: list, b: list):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def _tie(at: int, choices: set, tops: tuple, tie_step: float) -> bool:
    """Both servers list the two chosen tokens as their top two at ``at``, no more than ``tie_step`` apart."""
    if tie_step <= 0:
        return False
    for top in tops:
        if top is None or at >= len(top):
            return False
        (first, a), (second, b) = top[at]
        if {a, b} != choices or first - second > tie_step:
            return False
    return True


def tied_answers(plain: dict, edge: dict, tie_step: float) -> set[str]:
    """The solo answers that part from plain's only at a tie, every token before it equal."""
    tied = set()
    for name, ours, theirs, tops in _solo_answers(plain, edge):
        at = _first_difference(ours or [], theirs or [])
        if at is not None and _tie(at, {ours[at], theirs[at]}, tops, tie_step):
            tied.add(name)
    return tied


def compare(plain: dict, edge: dict, tie_step: float = 0.0) -> list[str]:
    """Where ``edge`` differs from ``plain`` (empty: equal).

    With ``tie_step`` an answer asked alone may part from plain's at a tie (:func:`tied_answers`), and a
    concurrent answer equal to EdgeAcc's own answer alone, so tied, is plain's too.
    """
    tied = tied_answers(plain, edge, tie_step)
    problems = []
    for key, expected in plain.items():
        got = edge.get(key)
        if key.endswith("logprob_values"):
            if len(got or []) != len(expected) or any(abs(a - b) > LOGPROB_TOLERANCE for a, b in zip(got, expected)):
                problems.append(f"{key}: {got} != {expected} (tolerance {LOGPROB_TOLERANCE})")
        elif key in ("aborted_chunks", "top_two"):
            continue
        elif key == "burst":
            # A concurrent request must answer as plain sglang did for it in a batch or alone:
            # plain sglang itself differs between the two (batch-dependent rounding).
            solo, own_solo = plain.get("burst_solo") or [], edge.get("burst_solo") or []
            for i, tokens in enumerate(got or []):
                allowed = [expected[i]] + ([solo[i]] if i < len(solo) else [])
                if f"burst_solo[{i}]" in tied and i < len(own_solo):
                    allowed.append(own_solo[i])
                if tokens not in allowed:
                    problems.append(f"burst[{i}]: {tokens} is neither plain's batched {expected[i]} nor its solo answer")
        elif key == "burst_solo":
            if len(got or []) != len(expected) or any(
                    a != b and f"burst_solo[{j}]" not in tied for j, (a, b) in enumerate(zip(expected, got))):
                problems.append(f"{key}: {str(got)[:300]} != {str(expected)[:300]}")
        elif key in tied:
            continue
        elif got != expected:
            problems.append(f"{key}: {str(got)[:300]} != {str(expected)[:300]}")
    return problems


def parting_points(plain: dict, edge: dict) -> list[str]:
    """Where EdgeAcc's solo answers part from plain's, each server's top two at that token.

    A gap of a few thousandths between plain's two candidates is a near tie that the two
    processes' kernels may break differently; a wide gap, or a token plain does not list,
    is a real difference. Said beside the verdict; only a family's ``tie_step`` lets a tie pass.
    """
    lines = []
    for name, ours, theirs, tops in _solo_answers(plain, edge):
        at = _first_difference(ours or [], theirs or [])
        if at is None:
            continue
        if any(t is None or at >= len(t) for t in tops):
            lines.append(f"{name} parts at token {at}: no top two recorded there")
            continue
        (p1, p2), (e1, e2) = tops[0][at], tops[1][at]
        lines.append(f"{name} parts at token {at}: plain chose {ours[at]}, EdgeAcc {theirs[at]}; plain's top two "
                     f"{p1[1]} {p1[0]:.4f}, {p2[1]} {p2[0]:.4f} (gap {p1[0] - p2[0]:.4f}); EdgeAcc's "
                     f"{e1[1]} {e1[0]:.4f}, {e2[1]} {e2[0]:.4f} (gap {e1[0] - e2[0]:.4f})")
    return lines


def self_checks(result: dict, sensitive: bool, expect_cache_hits: bool = True,
                self_consistent: bool = True) -> list[str]:
    """What must hold on every server, plain included.

    With ``--dp`` upstream's round-robin sends a repeated prompt to the other DP group, whose radix
    tree has not seen it, so cache hits are not expected there. Where plain sglang is not
    self-consistent (``oracle="topk"``), a request need not repeat its own answer.
    """
    checks = {
        "radix_hit_cached": "the repeated long prompt did not hit the radix cache",
        "partial_hit_cached": "the shared 650-token prefix did not hit the radix cache",
        "stream_chunks_gt1": "streaming returned a single chunk",
        "regex_matches": "the regex output does not match the regex",
    }
    if not expect_cache_hits:
        checks = {k: v for k, v in checks.items() if not k.endswith("_cached")}
    problems = [why for key, why in checks.items() if not result.get(key)]
    if self_consistent and result.get("stream_final") not in (None, result.get("solo_short")):
        problems.append("the streamed tokens differ from the same request unstreamed")
    if self_consistent and result.get("after_abort_long") != result.get("solo_long"):
        problems.append("after an aborted stream the same request answers differently")
    if not str(result.get("json_text", "")).lstrip().startswith("{"):
        problems.append("the JSON-schema output does not start an object")
    if sensitive and not result.get("context_changes_output"):
        problems.append("the model ignores its context: this comparison could not see a wrong KV read")
    return problems


# ----------------------------------------------------------------- running
def model_path(kind: str, workdir: pathlib.Path) -> tuple[str, bool, int, bool]:
    """(path, dummy weights, vocab for prompts, outputs depend on context)."""
    if kind == "tiny":
        return str(serving_models.sensitive_tiny_model(workdir / "tiny-sensitive")), False, 537, True
    if kind == "tiny-h64":
        path = serving_models.sensitive_tiny_model(workdir / "tiny-h64-sensitive", head_dim=64, dtype="bfloat16")
        return str(path), False, 537, True
    shape = {"qwen3-8b": "8b", "qwen3-32b": "32b"}[kind]
    return str(serving_models.qwen3_shaped_model(workdir / kind, shape)), True, 151000, False


def _is_mps_client(arm: str) -> bool:
    return arm in PLAIN_MPS_CLIENTS if arm in PLAIN_ARMS else arm not in EDGE_NOT_MPS_CLIENTS


def _arm_env(arm: str, platform: str) -> dict[str, str]:
    if platform != "cuda" or not _is_mps_client(arm):
        return {}
    pipe = os.environ.get("EDGEACC_SUITE_MPS_PIPE")
    if not pipe:
        return {}
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": os.environ.get("EDGEACC_SUITE_MPS_LOG", pipe)}


def server_env(arm: str, platform: str, fam: dict, shared_cache: dict[str, str]) -> dict[str, str]:
    """A server's environment: its MPS client settings, the family's shared inductor cache and the family's own."""
    return {**_arm_env(arm, platform), **shared_cache, **fam.get("env", {})}


def _compile_cache_env(name: str, fam: dict, workdir: pathlib.Path) -> dict[str, str]:
    """One fresh inductor cache for a family whose servers share compiled kernels (none otherwise)."""
    if not fam.get("compiled_by"):
        return {}
    cache = workdir / f"inductor-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(cache)}


def _wait_for_lead(key: tuple[str, str], server: SglangServer, after: str = "compiled kernels cached") -> None:
    """The others start once it is healthy; one that fails to start is reported by its own arm."""
    try:
        server.wait_healthy()
        print(f"[suite] {key[0]}/{key[1]} healthy after {server.started_s:.0f} s, {after}", flush=True)
    except (RuntimeError, TimeoutError):
        print(f"[suite] {key[0]}/{key[1]} did not start; the servers after it go on", flush=True)


class CacheWriters:
    """Which server wrote which files of a shared inductor cache: what appeared or changed while it started.

    Known for a server waited for at launch: a family's compiling server, or every server with
    ``--one-at-a-time``; servers started together have no entry (their files could be any one's). A kernel
    tuning (a small JSON file, which a later server may rewrite under the same name) is read when its
    server's start ends, so each server is reported with the config it chose. With ``out_dir`` each
    server's list is written there as soon as it is known (``{family}_{arm}.inductor_written.txt``), so a
    run its time limit cuts off still returns what the servers healthy by then wrote.
    """

    def __init__(self, out_dir: pathlib.Path | None = None):
        self._stats: dict[str, dict[str, tuple[int, int]]] = {}
        # server -> {file written: the config it holds, for a tuning; "" otherwise}
        self.written: dict[tuple[str, str], dict[str, str]] = {}
        self._out_dir = out_dir

    def snapshot(self, key: tuple[str, str], server) -> None:
        cache = getattr(server, "env", {}).get("TORCHINDUCTOR_CACHE_DIR")
        if not cache:
            return
        root = pathlib.Path(cache)
        now = {}
        for path in root.rglob("*"):
            if path.is_file():
                stat = path.stat()
                now[str(path.relative_to(root))] = (stat.st_mtime_ns, stat.st_size)
        before = self._stats.get(cache, {})
        self.written[key] = {name: self._chosen(root / name) for name in sorted(now) if before.get(name) != now[name]}
        self._stats[cache] = now
        if self._out_dir is not None:
            (self._out_dir / f"{key[0]}_{key[1]}.inductor_written.txt").write_text(self.describe(key))
        print(f"[suite] {key[0]}/{key[1]} wrote to the shared inductor cache: "
              f"{written_kinds(list(self.written[key])) or 'nothing'}", flush=True)

    @staticmethod
    def _chosen(path: pathlib.Path) -> str:
        if not path.name.endswith(".best_config"):
            return ""
        try:
            return path.read_text().strip()
        except OSError:
            return ""

    def describe(self, key: tuple[str, str]) -> str:
        """One line a file, a tuning with the config it chose."""
        return "".join(f"{name} {chosen}".rstrip() + "\n" for name, chosen in self.written.get(key, {}).items())


def written_kinds(files: list[str]) -> dict[str, int]:
    """How many compiled graphs, AOT entries, kernel tunings and other files a server wrote."""
    counts: dict[str, int] = {}
    for name in files:
        kind = ("fxgraph" if name.startswith("fxgraph/") else "aotautograd" if name.startswith("aotautograd/")
                else "best_config" if name.endswith(".best_config") else "other")
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def launch_together(servers: dict, leads: set, stagger_s: float = 1.0, one_at_a_time: bool = False,
                    writers: CacheWriters | None = None) -> None:
    """Launch every server; a family's compiling server first, healthy (its kernels cached) before the others.

    ``one_at_a_time``: every server healthy before the next starts (slower; what each writes to a shared
    inductor cache is then its own, see :class:`CacheWriters`).
    """
    for key in sorted(servers, key=lambda k: k not in leads):
        servers[key].launch()
        if key in leads or one_at_a_time:
            _wait_for_lead(key, servers[key], "compiled kernels cached" if key in leads else "the next starts")
            if writers is not None:
                writers.snapshot(key, servers[key])
        time.sleep(stagger_s)  # staggered: each measures free memory after the previous one started


def run_phase(fams: dict[str, dict], platform: str, workdir: pathlib.Path, log_dir: pathlib.Path,
              partial_out: pathlib.Path | None = None, previous: dict | None = None,
              one_at_a_time: bool = False) -> dict:
    servers: dict[tuple[str, str], SglangServer] = {}
    results: dict = {name: {"args": list(f["args"]), "oracle": f.get("oracle", "tokens"),
                            "tie_step": f.get("tie_step", 0.0), "arms": {}} for name, f in fams.items()}
    leads = set()
    for name, fam in fams.items():
        path, dummy, _, _ = model_path(fam["model"], workdir)
        shared = _compile_cache_env(name, fam, workdir)
        if fam.get("compiled_by"):
            leads.add((name, fam["compiled_by"]))
        for arm in ("plain", *fam["arms"]):
            flags = ARM_FLAGS.get(arm, ())
            servers[(name, arm)] = SglangServer(args=(*fam["args"], *flags), model_path=path, platform=platform,
                                                dummy_weights=dummy, env=server_env(arm, platform, fam, shared),
                                                startup_timeout_s=420)
    alone = any(fam.get("alone") for fam in fams.values())
    writers = CacheWriters(log_dir)
    if not alone:
        launch_together(servers, leads, one_at_a_time=one_at_a_time, writers=writers)
        print(f"[suite] launched {len(servers)} servers", flush=True)

    def run_one(key):
        name, arm = key
        server = servers[key]
        fam = fams[name]
        path, _, vocab, sensitive = model_path(fam["model"], workdir)
        entry: dict = {"flags": list(server.args)}
        try:
            if alone:
                server.launch()
            if not server.started_s:  # a family's compiling server was waited for at launch
                server.wait_healthy()
            entry["started_s"] = round(server.started_s, 1)
            if key in writers.written:
                entry["inductor_cache_written"] = written_kinds(list(writers.written[key]))
            t0 = time.monotonic()
            # The top-k requests first, on a fresh server: what the workload leaves in the radix tree
            # would otherwise feed them KV computed in other batches, which rounds otherwise.
            topk = topk_oracle.fingerprint(server.generate, vocab) if fam.get("oracle") == "topk" else None
            entry["result"] = fingerprint(server, vocab, sensitive)
            if topk is not None:
                entry["result"]["topk"] = topk
            entry["workload_s"] = round(time.monotonic() - t0, 1)
            if sensitive:
                # A comparison between servers cannot see an error they share: the checkpoint's own verdict.
                result = entry["result"]
                entry["model_departure"] = model_reference.departure(
                    path, result["logprob_prompt"], result["logprob_tokens"], result["logprob_values"])
            entry["self_check_problems"] = self_checks(entry["result"], sensitive,
                                                       expect_cache_hits="--dp" not in fam["args"],
                                                       self_consistent=fam.get("oracle") != "topk")
            if fam.get("needs_inductor_deterministic"):
                # The family means nothing where the mode did not reach the server's compile.
                mode = entry["inductor_deterministic"] = deterministic_mode_in_log(server.log_tail(LOG_CHARS))
                if mode is False:
                    entry["self_check_problems"].append(
                        f"inductor's deterministic mode was not in effect: this server compiled kernels with "
                        f"'deterministic': False although {INDUCTOR_DETERMINISTIC_ENV}=1 was in its environment")
        except Exception:
            entry["error"] = traceback.format_exc()[-3000:]
            entry["log_tail"] = server.log_tail(4000)
            causes = [line for line in entry["log_tail"].splitlines() if "Error" in line]
            entry["cause"] = causes[-1][:400] if causes else ""
        print(f"[suite] {name}/{arm}: {'error' if 'error' in entry else 'done'}", flush=True)
        return key, entry

    lock = threading.Lock()

    def record(key, entry):
        with lock:
            results[key[0]]["arms"][key[1]] = entry
            judge(results)
            if partial_out is not None:
                partial_out.write_text(json.dumps({**(previous or {}), **results}, indent=1))

    stopped = set()

    def stop(item):
        (name, arm), server = item
        if server.proc is None or (name, arm) in stopped:
            return
        stopped.add((name, arm))
        server.stop()
        try:
            (log_dir / f"{name}_{arm}.log").write_text(server.log_tail(LOG_CHARS))
        except OSError:
            pass

    try:
        if alone:  # each server has the GPU to itself: start, run, stop, then the next
            for item in servers.items():
                try:
                    record(*run_one(item[0]))
                finally:
                    stop(item)
        else:
            with cf.ThreadPoolExecutor(len(servers)) as pool:
                for key, entry in pool.map(run_one, list(servers)):
                    record(key, entry)
    finally:
        # Together: one at a time, a dozen servers' shutdowns outlast the step's time limit.
        with cf.ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(stop, servers.items()))
    return results


# Not part of the control: the count of chunks streamed before an abort follows timing, the top two are
# read only where answers part, and a concurrent burst's batches (and so the KV its solo answers reuse)
# follow each server's scheduling, which EdgeAcc's is not.
UNCONTROLLED_KEYS = ("topk", "top_two", "aborted_chunks", "burst", "burst_solo")


def _same(key: str, a, b) -> bool:
    """Equal as the token comparison has it: logprob values within ``LOGPROB_TOLERANCE``, the rest exactly."""
    if key.endswith("logprob_values"):
        return a is not None and b is not None and len(a) == len(b) and all(
            abs(x - y) <= LOGPROB_TOLERANCE for x, y in zip(a, b))
    return a == b


def _controlled(plain: dict, again: dict) -> list[str]:
    """The keys of the token workload that a second plain server answered as plain did."""
    return [key for key in plain if key not in UNCONTROLLED_KEYS and _same(key, again.get(key), plain[key])]


def control_compare(plain: dict, again: dict, edge: dict) -> list[str]:
    """Where ``edge`` differs from ``plain`` though a second plain server did not (empty: nowhere).

    Under torch.compile, with every server on the first one's compiled kernels, a second plain server
    repeats plain's answers except where the scheduling's timing enters; where it does, plain's own
    spread is nothing, so EdgeAcc must repeat them too.
    """
    return [f"{key}: {str(edge.get(key))[:200]} != {str(plain[key])[:200]}, which a second plain server repeated"
            for key in _controlled(plain, again) if not _same(key, edge.get(key), plain[key])]


def diagnose(plain: dict, again: dict, others: dict[str, tuple[dict, dict]]) -> dict[str, list[str]]:
    """For a plain server of other flags: the controlled keys where it differs from each reference.

    ``others`` maps a reference's name to (the reference's result, the diagnosed server's result).
    """
    keys = _controlled(plain, again)
    return {name: [key for key in keys if not _same(key, result.get(key), diagnosed.get(key))]
            for name, (result, diagnosed) in others.items()}


def judge(results: dict) -> None:
    """Compare every finished EdgeAcc arm with its family's plain arm (in place)."""
    for fam in results.values():
        plain = fam["arms"].get("plain", {}).get("result")
        again = fam["arms"].get("plain-again", {}).get("result")
        for arm, entry in fam["arms"].items():
            if arm in PLAIN_ARMS:
                entry["passed"] = "result" in entry and not entry.get("self_check_problems")
                if arm == "plain-again" and fam.get("oracle", "tokens") == "tokens" and plain is not None \
                        and "result" in entry:
                    # Where tokens are the oracle, a second plain server must answer as the first.
                    entry["mismatches"] = compare(plain, entry["result"], fam.get("tie_step", 0.0))
                    entry["passed"] = entry["passed"] and not entry["mismatches"]
                if arm in DIAGNOSTIC_ARMS and None not in (plain, again) and "result" in entry:
                    refs = {"plain": plain, **{name: e["result"] for name, e in fam["arms"].items()
                                               if name not in PLAIN_ARMS and "result" in e}}
                    entry["differs_from"] = diagnose(plain, again, {name: (ref, entry["result"])
                                                                    for name, ref in refs.items()})
            elif plain is not None and "result" in entry:
                if fam.get("oracle") == "topk":
                    if again is None:
                        entry["mismatches"] = ["no second plain server's run to set the tolerance from"]
                    else:
                        entry["tolerance"] = topk_oracle.tolerance(plain["topk"], again["topk"])
                        entry["mismatches"] = (topk_oracle.mismatches(plain["topk"], again["topk"],
                                                                      entry["result"]["topk"])
                                               + control_compare(plain, again, entry["result"]))
                else:
                    entry["mismatches"] = compare(plain, entry["result"], fam.get("tie_step", 0.0))
                    entry["parting_points"] = parting_points(plain, entry["result"])
                entry["passed"] = not entry["mismatches"] and not entry.get("self_check_problems")
            else:
                entry["passed"] = False


def summary_lines(results: dict) -> list[str]:
    lines = []
    for name, fam in results.items():
        for arm, entry in fam["arms"].items():
            status = "PASS" if entry.get("passed") else "FAIL"
            detail = entry.get("mismatches") or entry.get("self_check_problems") or []
            if "error" in entry:
                detail = [entry.get("cause") or entry["error"].strip().splitlines()[-1]]
            lines.append(f"{status} {name}/{arm} start {entry.get('started_s', '-')} s"
                         + (f": {'; '.join(detail)[:600]}" if detail else ""))
            if entry.get("parting_points"):
                lines.append(f"     where answers part: {'; '.join(entry['parting_points'])[:900]}")
            if entry.get("inductor_cache_written") is not None:
                written = ", ".join(f"{n} {kind}" for kind, n in sorted(entry["inductor_cache_written"].items()))
                lines.append(f"     wrote to the shared inductor cache: {written or 'nothing'}")
            for ref, keys in (entry.get("differs_from") or {}).items():
                lines.append(f"     differs from {ref} in: {', '.join(keys) or 'nothing'}")
            if entry.get("model_departure"):
                lines.append("     " + departure_line(entry))
    return lines


def departure_line(entry: dict) -> str:
    """The checkpoint's verdict on an arm's answer to the logprob request (transformers, float64)."""
    gone = entry["model_departure"]
    step = gone["first_step"]
    if step is None:
        return f"the model's own logprobs of this answer are the server's, within {gone['largest']:.4f} nats"
    ours = entry["result"]["logprob_values"][step]
    token = entry["result"]["logprob_tokens"][step]
    return (f"the model's own logprobs of this answer depart from the server's from step {step} on (token {token}: "
            f"the server {ours:.4f}, the model {gone['model_values'][step]:.4f}), by up to {gone['largest']:.4f} nats")


def visible_gpus(platform: str) -> int:
    if platform != "cuda":
        return 2  # the CPU platform runs several ranks on the host
    import torch

    return torch.cuda.device_count()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--platform", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--families", default="", help="comma-separated family names (default: all)")
    parser.add_argument("--out", default="", help="JSON results file")
    parser.add_argument("--workdir", default="", help="where model directories are built (default: a temp dir)")
    parser.add_argument("--arms", default="", help="comma-separated arms each family runs beside plain, started in "
                        "this order (default: the family's own); an arm the family does not have is an error")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="start each server once the one before is healthy (what each writes to a shared "
                        "inductor cache is then its own, reported per arm)")
    args = parser.parse_args(argv)
    fams = families(args.platform)
    if not args.families:
        fams = {k: v for k, v in fams.items()
                if v.get("gpus", 1) <= visible_gpus(args.platform) and not v.get("by_name")}
    if args.families:
        wanted = args.families.split(",")
        unknown = [f for f in wanted if f not in fams]
        if unknown:
            parser.error(f"unknown families {unknown}; known: {sorted(fams)}")
        fams = {k: v for k, v in fams.items() if k in wanted}
        lacking = [k for k, v in fams.items() if v.get("needs_inductor_deterministic")
                   and not inductor_has_deterministic_mode()]
        if lacking:
            import torch

            parser.error(f"{lacking} need inductor's deterministic mode ({INDUCTOR_DETERMINISTIC_ENV}), "
                         f"which torch {torch.__version__} lacks")
    if args.arms:
        wanted_arms = tuple(args.arms.split(","))
        for name, fam in fams.items():
            missing = [arm for arm in wanted_arms if arm != "plain" and arm not in fam["arms"]]
            if missing:
                parser.error(f"--arms: family {name} has no arms {missing}; it has {list(fam['arms'])}")
            # In the order asked for: with --one-at-a-time the servers start in it, after the family's plain.
            fams[name] = {**fam, "arms": tuple(arm for arm in wanted_arms if arm in fam["arms"])}
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="edgeacc-suite-"))
    out = pathlib.Path(args.out) if args.out else workdir / "suite.json"
    log_dir = out.parent / "suite_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.platform == "cpu":
        os.environ.setdefault("SGLANG_PLATFORM", "edgeacc_cpu")
    results: dict = {}
    for phase in sorted({f.get("phase", 1) for f in fams.values()}):
        chosen = {k: v for k, v in fams.items() if v.get("phase", 1) == phase}
        started = time.monotonic()
        results.update(run_phase(chosen, args.platform, workdir, log_dir, partial_out=out, previous=results,
                                 one_at_a_time=args.one_at_a_time))
        out.write_text(json.dumps(results, indent=1))
        print(f"[suite] phase {phase} took {time.monotonic() - started:.0f} s", flush=True)
    out.write_text(json.dumps(results, indent=1))
    lines = summary_lines(results)
    print("\n".join(lines))
    return 0 if all(line.startswith("PASS") for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
