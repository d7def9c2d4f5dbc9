"""With EdgeAcc off, the plugin changes nothing: resolved server arguments equal upstream's.

The same matrix of real command lines is parsed and resolved
(``prepare_server_args`` + ``ServerArgs.resolve_once``) in two fresh
interpreters: one where sglang loads every installed plugin but ours
(``SGLANG_PLUGINS`` lists the others) and one where it loads them all. Both
run with ``--device cpu`` and without ``SGLANG_PLATFORM``, so the
``edgeacc_cpu`` platform (which does change defaults, on purpose) is not
selected in either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from importlib.metadata import entry_points

import pytest

from sglang_edgeacc.tiny_model import model_dir

BASE = ["--model-path", str(model_dir()), "--device", "cpu"]
MATRIX = {
    "plain": [],
    "tp2": ["--tp", "2"],
    "dp2": ["--dp", "2"],
    "dp_attention": ["--tp", "2", "--dp", "2", "--enable-dp-attention"],
    "page_size": ["--page-size", "16"],
    "chunked_prefill": ["--chunked-prefill-size", "512"],
    "no_radix_cache": ["--disable-radix-cache"],
    "max_running": ["--max-running-requests", "8"],
    "lpm": ["--schedule-policy", "lpm"],
}
OUR_PLUGIN = "edgeacc"  # the entry point name in pyproject.toml
# Drawn at random by upstream on every resolution.
NONDETERMINISTIC = {"random_seed"}

WORKER = textwrap.dedent(
    """
    import json, sys
    from sglang.srt.plugins import load_plugins
    load_plugins()
    import msgspec
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    drop = set(json.loads(sys.argv[1]))
    out = {"edge_acc_flags_in_help": False, "cases": {}}
    import argparse
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    out["edge_acc_flags_in_help"] = "--enable-edge-acc" in parser.format_help()
    for name, argv in json.load(sys.stdin).items():
        server_args = prepare_server_args(argv)
        raw = msgspec.structs.asdict(server_args)
        server_args.resolve_once()
        resolved = server_args.resolved_dict()
        out["cases"][name] = {
            "raw": {k: v for k, v in raw.items() if k not in drop},
            "resolved": {k: v for k, v in resolved.items() if k not in drop},
            "edge_acc_attached": "_edge_acc" in vars(server_args),
        }
    print("RESULTS " + json.dumps(out, default=repr, sort_keys=True))
    """
)


def _run_worker(plugins: str | None, workdir) -> tuple[subprocess.Popen, object]:
    env = dict(os.environ)
    for name in ("SGLANG_PLATFORM", "SGLANG_PLUGINS", "SGLANG_EDGEACC", "SGLANG_EDGEACC_ROLE"):
        env.pop(name, None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    cases = workdir / f"cases-{plugins}.json"
    cases.write_text(json.dumps({name: BASE + extra for name, extra in MATRIX.items()}))
    # Files, not pipes: the dump is far larger than a pipe buffer.
    output = tempfile.TemporaryFile(mode="w+", dir=workdir)
    with cases.open() as stdin:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, json.dumps(sorted(NONDETERMINISTIC))],
            stdin=stdin, stdout=output, stderr=subprocess.STDOUT, text=True, env=env,
        )
    return proc, output


def _collect(proc: subprocess.Popen, output) -> dict:
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    output.seek(0)
    text = output.read()
    lines = [line for line in text.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and lines, f"worker failed (rc {proc.returncode}):\n{text[-4000:]}"
    return json.loads(lines[-1][len("RESULTS "):])


@pytest.fixture(scope="module")
def upstream_and_plugin(tmp_path_factory) -> tuple[dict, dict]:
    workdir = tmp_path_factory.mktemp("equivalence")
    # Upstream as installed: every other general plugin (sglang's dependencies
    # ship some) still loads; only ours is filtered out.
    others = sorted({ep.name for ep in entry_points(group="sglang.srt.plugins")} - {OUR_PLUGIN})
    # Concurrently: each is one sglang import, and there are two cores.
    upstream = _run_worker(plugins=",".join(others) or "none-such", workdir=workdir)
    plugin = _run_worker(plugins=None, workdir=workdir)
    return _collect(*upstream), _collect(*plugin)


def test_the_plugin_really_loaded_in_one_and_not_the_other(upstream_and_plugin):
    upstream, plugin = upstream_and_plugin
    assert plugin["edge_acc_flags_in_help"] and not upstream["edge_acc_flags_in_help"]
    assert all(case["edge_acc_attached"] for case in plugin["cases"].values())
    assert not any(case["edge_acc_attached"] for case in upstream["cases"].values())


@pytest.mark.parametrize("case", list(MATRIX))
def test_resolved_args_equal_upstream(upstream_and_plugin, case):
    upstream, plugin = upstream_and_plugin
    for stage in ("raw", "resolved"):
        ours, theirs = plugin["cases"][case][stage], upstream["cases"][case][stage]
        differing = {k: (theirs.get(k), ours.get(k)) for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k)}
        assert not differing, f"{stage} server args differ from upstream (upstream, plugin): {differing}"


def test_the_matrix_exercises_different_resolutions(upstream_and_plugin):
    # Guards the comparison itself: distinct command lines must resolve differently.
    upstream, _ = upstream_and_plugin
    resolved = [json.dumps(upstream["cases"][case]["resolved"], sort_keys=True) for case in MATRIX]
    assert len(set(resolved)) == len(MATRIX)
    dp_attention = upstream["cases"]["dp_attention"]["resolved"]
    assert (dp_attention["tp_size"], dp_attention["attn_dp_size"]) == (2, 2)
