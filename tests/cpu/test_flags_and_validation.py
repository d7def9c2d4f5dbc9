"""EdgeAcc's flags on sglang's own parser, and the launches refused before anything loads.

Everything goes through the real, pinned sglang with the plugin loaded the way
sglang loads it (``load_plugins()``), in subprocesses, so the plugin's
process-wide hooks never leak into the pytest process:

* one worker parses every case with ``prepare_server_args`` (one sglang import
  for all of them);
* a few real ``python -m sglang.launch_server`` and ``sglang serve`` command
  lines, run concurrently, show the refusal at the user's own command and the
  flags in ``--help``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_edgeacc.flags import EdgeAccFlags
from sglang_edgeacc.tiny_model import model_dir

BASE = ["--model-path", str(model_dir()), "--device", "cpu"]

# flag named in the error -> the extra arguments that break EdgeAcc
INCOMPATIBLE = {
    "nnodes": ("--nnodes", ["--nnodes", "2"]),
    "pp_size": ("--pp-size", ["--pp-size", "2"]),
    "disaggregation_prefill": ("--disaggregation-mode", ["--disaggregation-mode", "prefill"]),
    "disaggregation_decode": ("--disaggregation-mode", ["--disaggregation-mode", "decode"]),
    "pdmux": ("--enable-pdmux", ["--enable-pdmux"]),
    "speculative": ("--speculative-algorithm", ["--speculative-algorithm", "EAGLE"]),
    "mixed_chunk": ("--enable-mixed-chunk", ["--enable-mixed-chunk"]),
    "memory_saver": ("--enable-memory-saver", ["--enable-memory-saver"]),
    "lora": ("--enable-lora", ["--enable-lora"]),
    "hierarchical_cache": ("--enable-hierarchical-cache", ["--enable-hierarchical-cache"]),
    "embedding": ("--is-embedding", ["--is-embedding"]),
    "mla_backend": ("--attention-backend flashmla", ["--attention-backend", "flashmla"]),
    "mla_decode_backend": ("--decode-attention-backend trtllm_mla", ["--decode-attention-backend", "trtllm_mla"]),
    "amd_backend": ("--attention-backend aiter", ["--attention-backend", "aiter"]),
    "ascend_prefill_backend": ("--prefill-attention-backend ascend", ["--prefill-attention-backend", "ascend"]),
}
PERCENT_FLAGS = ("--edge-acc-prefill-sm-percent", "--edge-acc-decode-sm-percent")
OUT_OF_RANGE = ("0", "101")
# The opposite of the default, so the case shows the flag reaches the server.
VALID_PACING = "off" if EdgeAccFlags.edge_acc_decode_pacing == "on" else "on"
# Retired flags: case -> (the extra arguments, what argparse's error must say: the flag, that it was retired, the fix).
ADAPTIVE_RETIRED = ("error: argument --edge-acc-sm-partition: --edge-acc-sm-partition adaptive was retired",
                    "the default split (mps) paces decode steps to --edge-acc-itl-slo-ms",
                    "drop the flag or pass mps")
TTFT_SLO_RETIRED = ("error: --edge-acc-ttft-slo-ms was retired", "drop it; decode pacing follows --edge-acc-itl-slo-ms")
RETIRED = {
    "adaptive": (["--enable-edge-acc", "--edge-acc-sm-partition", "adaptive"], ADAPTIVE_RETIRED),
    "adaptive_equals": (["--edge-acc-sm-partition=adaptive"], ADAPTIVE_RETIRED),
    "ttft_slo": (["--enable-edge-acc", "--edge-acc-ttft-slo-ms", "2000"], TTFT_SLO_RETIRED),
    "ttft_slo_equals": (["--edge-acc-ttft-slo-ms=2000"], TTFT_SLO_RETIRED),
}

# Parses each argv with the plugin loaded; reports the flags it attached (also
# after a pickle round trip, which is how sglang hands ServerArgs to every
# spawned child) or the exit it raised.
WORKER = textwrap.dedent(
    """
    import contextlib, dataclasses, io, json, pickle, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang.srt.server_args import prepare_server_args
    from sglang_edgeacc.flags import get_flags

    results = {}
    for name, argv in json.load(sys.stdin).items():
        stderr = io.StringIO()  # where argparse prints its own errors
        try:
            with contextlib.redirect_stderr(stderr):
                server_args = prepare_server_args(argv)
        except SystemExit as exc:
            results[name] = {"exit": exc.code if isinstance(exc.code, int) else 1, "message": str(exc.code),
                             "stderr": stderr.getvalue()}
            continue
        copy = pickle.loads(pickle.dumps(server_args))
        results[name] = {
            "flags": dataclasses.asdict(get_flags(server_args)),
            "flags_after_pickle": dataclasses.asdict(get_flags(copy)),
            "flags_type_after_pickle": type(get_flags(copy)).__qualname__,
            "tp_size_after_pickle": copy.tp_size,
        }
    print("RESULTS " + json.dumps(results))
    """
)


def _cases() -> dict[str, list[str]]:
    cases = {}
    for name, (_, extra) in INCOMPATIBLE.items():
        cases[f"edge:{name}"] = BASE + ["--enable-edge-acc", *extra]
        cases[f"plain:{name}"] = BASE + extra
    for flag in PERCENT_FLAGS:
        for value in OUT_OF_RANGE:
            cases[f"percent:{flag}={value}"] = BASE + [flag, value]
            cases[f"edge-percent:{flag}={value}"] = BASE + ["--enable-edge-acc", flag, value]
    cases["edge:valid"] = BASE + [
        "--enable-edge-acc", "--tp", "2", "--edge-acc-prefill-sm-percent", "30",
        "--edge-acc-decode-sm-percent", "90", "--edge-acc-sm-partition", "green-context",
        "--edge-acc-decode-pacing", VALID_PACING,
    ]
    for name, (extra, _) in RETIRED.items():
        cases[f"retired:{name}"] = BASE + extra
    cases["edge:alias"] = BASE + ["--enable-semi-pd-disagg"]
    cases["off"] = list(BASE)
    return cases


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Nothing from the caller's environment may pick a platform or filter plugins.
    for name in ("SGLANG_PLATFORM", "SGLANG_PLUGINS", "SGLANG_EDGEACC", "SGLANG_EDGEACC_ROLE"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def parsed() -> dict[str, dict]:
    proc = subprocess.run(
        [sys.executable, "-c", WORKER], input=json.dumps(_cases()), capture_output=True, text=True,
        timeout=600, env=_worker_env(),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"worker failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
def test_incompatible_flag_is_refused_naming_it(parsed, case):
    flag, _ = INCOMPATIBLE[case]
    refused = parsed[f"edge:{case}"]
    assert refused.get("exit", 0) != 0, f"--enable-edge-acc with {flag} was accepted: {refused}"
    assert f"--enable-edge-acc with {flag}" in refused["message"]
    assert "sglang-edgeacc: error:" in refused["message"]
    # The same command line without EdgeAcc is upstream's business: it parses.
    assert "exit" not in parsed[f"plain:{case}"], parsed[f"plain:{case}"]


@pytest.mark.parametrize("flag", PERCENT_FLAGS)
@pytest.mark.parametrize("value", OUT_OF_RANGE)
@pytest.mark.parametrize("prefix", ["percent", "edge-percent"])
def test_out_of_range_percent_is_refused_with_or_without_edge_acc(parsed, prefix, flag, value):
    refused = parsed[f"{prefix}:{flag}={value}"]
    assert refused.get("exit", 0) != 0, refused
    assert f"{flag} {value} is outside 1..100" in refused["message"]


@pytest.mark.parametrize("case", list(RETIRED))
def test_a_retired_flag_stops_the_parse_saying_what_to_do_instead(parsed, case):
    refused = parsed[f"retired:{case}"]
    assert refused.get("exit") == 2, refused  # argparse's own usage error
    said = " ".join(refused["stderr"].split())
    for part in RETIRED[case][1]:
        assert part in said, refused["stderr"][-2000:]


def test_valid_flags_are_attached_and_survive_pickling(parsed):
    accepted = parsed["edge:valid"]
    assert "exit" not in accepted, accepted
    expected = {
        "enable_edge_acc": True,
        "edge_acc_prefill_sm_percent": 30,
        "edge_acc_decode_sm_percent": 90,
        "edge_acc_sm_partition": "green-context",
        "edge_acc_prefill_mps_priority": "below-normal",
        "edge_acc_skip_preflight": False,
        "edge_acc_itl_slo_ms": 50.0,
        "edge_acc_decode_pacing": VALID_PACING,
        "edge_acc_prefill_batches_in_flight": 2,
    }
    assert accepted["flags"] == expected
    assert accepted["flags_after_pickle"] == expected
    assert accepted["flags_type_after_pickle"] == "EdgeAccFlags"
    assert accepted["tp_size_after_pickle"] == 2


def test_alias_enables_edge_acc_and_defaults_hold_when_off(parsed):
    assert parsed["edge:alias"]["flags"]["enable_edge_acc"] is True
    off = parsed["off"]["flags_after_pickle"]
    # The parser's defaults are the dataclass's: one definition of each.
    assert off == dataclasses.asdict(EdgeAccFlags())
    assert off["enable_edge_acc"] is False


# --- the user's real command lines --------------------------------------------------

SGLANG_CLI = str(Path(sys.executable).parent / "sglang")
LAUNCH = [sys.executable, "-m", "sglang.launch_server"]
COMMANDS = {
    "launch_pp": (LAUNCH + BASE + ["--load-format", "dummy", "--enable-edge-acc", "--pp-size", "2"], "--pp-size"),
    "launch_percent": (LAUNCH + BASE + ["--load-format", "dummy", "--edge-acc-decode-sm-percent", "0"],
                       "--edge-acc-decode-sm-percent"),
    "serve_percent": ([SGLANG_CLI, "serve"] + BASE + ["--load-format", "dummy", "--edge-acc-prefill-sm-percent", "101"],
                      "--edge-acc-prefill-sm-percent"),
    "launch_help": (LAUNCH + ["--help"], None),
}
# What a launch that got past argument parsing (engine start, model load, KV pool) would have logged.
MODEL_LOAD_MARKERS = ("server_args=", "Load weight begin", "Memory pool end")


@pytest.fixture(scope="module")
def commands() -> dict[str, dict]:
    if not Path(SGLANG_CLI).exists():
        pytest.fail(f"sglang's console script is missing next to {sys.executable}")
    running = {}
    for name, (argv, _) in COMMANDS.items():
        running[name] = (time.monotonic(), subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
            env=_worker_env(), start_new_session=True,
        ))
    results = {}
    try:
        for name, (started, proc) in running.items():
            # Several sglang imports share 2 cores here; alone each exits in well under 60 s.
            out, err = proc.communicate(timeout=300)
            results[name] = {"rc": proc.returncode, "stdout": out, "stderr": err,
                             "seconds": time.monotonic() - started}
    finally:
        for _, proc in running.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
    return results


@pytest.mark.parametrize("name", ["launch_pp", "launch_percent", "serve_percent"])
def test_real_command_line_exits_before_model_load_naming_the_flag(commands, name):
    result, flag = commands[name], COMMANDS[name][1]
    assert result["rc"] != 0, result["stdout"][-2000:]
    assert flag in result["stderr"] and "sglang-edgeacc: error:" in result["stderr"], result["stderr"][-3000:]
    output = result["stdout"] + result["stderr"]
    assert not any(marker in output for marker in MODEL_LOAD_MARKERS), output[-3000:]
    assert result["seconds"] < 240


def test_launch_server_help_lists_the_flags_and_the_alias(commands):
    result = commands["launch_help"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    for flag in (
        "--enable-edge-acc", "--enable-semi-pd-disagg", "--edge-acc-prefill-sm-percent",
        "--edge-acc-decode-sm-percent", "--edge-acc-sm-partition", "--edge-acc-skip-preflight",
    ):
        assert flag in result["stdout"], f"{flag} missing from python -m sglang.launch_server --help"
    assert "EdgeAcc (sglang-edgeacc)" in result["stdout"]
    # The retired adaptive split and its first-token target are not offered.
    edge_acc_group = result["stdout"].split("EdgeAcc (sglang-edgeacc)", 1)[1].split("\n\n", 1)[0]
    assert "--edge-acc-sm-partition {mps,green-context,none}" in edge_acc_group
    assert "adaptive" not in edge_acc_group
    assert "--edge-acc-ttft-slo-ms" not in result["stdout"]
