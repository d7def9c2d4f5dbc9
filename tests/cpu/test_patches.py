"""The patch framework against the real, pinned sglang, and the ``edgeacc_cpu`` platform it serves.

* ``sglang-edgeacc patches`` verifies every patch of ``PATCH_MODULES``;
* a target that is missing or whose signature changed stops the load with
  :class:`PatchMismatch`, naming the patch and the symbol, before any patch is
  installed;
* registering the plugin twice installs every hook once;
* the patch table in ``patches/__init__.py`` has a complete row per patch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import sglang_edgeacc.patches as patches_pkg
from sglang_edgeacc import plugin
from sglang_edgeacc.patches import PATCH_MODULES, Patch, PatchMismatch, all_patches
from sglang_edgeacc.patches._base import Target, check_target, verify
from sglang_edgeacc.platform import PLATFORM_NAME, activate

HOOK_REGISTER = "sglang.srt.plugins.hook_registry.HookRegistry.register"
HOOK_REGISTER_PARAMS = ("target", "hook", "hook_type", "source")

# Registers the plugin as sglang does (load_plugins) and then twice more by
# hand, on the edgeacc_cpu platform so that the cpu_platform patch installs too;
# reports how many hooks each target got and whether sglang's parser still builds.
REGISTER_TWICE = textwrap.dedent(
    """
    import argparse, json
    from sglang.srt.plugins import load_plugins
    load_plugins()
    from sglang_edgeacc import plugin
    plugin.register()
    plugin.register()
    from sglang.srt.arg_groups import resolution_hooks
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs
    from sglang_edgeacc.patches import cpu_platform, request_validation, server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)  # a hook applied twice would add --enable-edge-acc twice and raise
    def ours(hooks):
        # Other installed plugins (sglang's dependency smg-grpc-servicer) hook the parser too.
        # A hook registered outside load_plugins() (the calls by hand) has no source: counted as ours.
        return [hook for _, hook, source in hooks if source is None or source.dist_name == "sglang-edgeacc"]

    counts = {t: len(ours(HookRegistry._hooks.get(t, ()))) for t in (
        server_args.ADD_CLI_ARGS, server_args.FROM_CLI_ARGS, cpu_platform.DP_ATTENTION + ".memcpy",
        request_validation.VALIDATE_ONE_REQUEST)}
    counts["handle_npu_backends"] = len(resolution_hooks._HOOKS.get("handle_npu_backends", ()))
    print("RESULTS " + json.dumps({"counts": counts, "help": sum("--enable-edge-acc" in a.option_strings for a in parser._actions)}))
    """
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("SGLANG_PLATFORM", "SGLANG_PLUGINS", "SGLANG_EDGEACC", "SGLANG_EDGEACC_ROLE"):
        env.pop(name, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def subprocess_results(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """``sglang-edgeacc patches`` and the register-twice worker, run concurrently."""
    workdir = tmp_path_factory.mktemp("patches")
    cli = [sys.executable, "-m", "sglang_edgeacc.cli"]
    commands = {
        "patches": (cli + ["patches"], _clean_env()),
        "patches_json": (cli + ["patches", "--json"], _clean_env()),
        "register_twice": ([sys.executable, "-c", REGISTER_TWICE], _clean_env(SGLANG_PLATFORM=PLATFORM_NAME)),
        "graph_input_copy": ([sys.executable, "-c", GRAPH_INPUT_COPY], _clean_env()),
    }
    running = {}
    for name, (argv, env) in commands.items():
        log = (workdir / f"{name}.out").open("w+")
        running[name] = (argv, subprocess.Popen(argv, stdout=log, stderr=subprocess.PIPE, text=True, env=env,
                                                 stdin=subprocess.DEVNULL), log)
    results = {}
    for name, (argv, proc, log) in running.items():
        try:
            _, err = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        log.seek(0)
        results[name] = subprocess.CompletedProcess(argv, proc.returncode, log.read(), err)
        log.close()
    return results


def test_patches_command_verifies_every_patch_module(subprocess_results):
    result = subprocess_results["patches"]
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    names = [patch.name for patch in all_patches()]
    assert len(names) == len(PATCH_MODULES)
    for name in names:
        assert re.search(rf"^\[ok\] {re.escape(name)}: ", result.stdout, re.M), f"{name} not listed as ok"
    assert "all patches apply" in result.stdout
    assert "FAIL" not in result.stdout


def test_patches_json_lists_every_target_as_found(subprocess_results):
    result = subprocess_results["patches_json"]
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["sglang"] == report["pin"]
    by_name = {row["patch"]: row for row in report["patches"]}
    for patch in all_patches():
        row = by_name[patch.name]
        assert [t["target"] for t in row["targets"]] == [t.path for t in patch.targets]
        assert all(t["ok"] for t in row["targets"]), row


def test_register_twice_installs_every_hook_once(subprocess_results):
    result = subprocess_results["register_twice"]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(lines[-1][len("RESULTS "):])
    assert set(report["counts"].values()) == {1}, report["counts"]
    assert report["help"] == 1  # the parser has the flag exactly once


# Installs the graph_input_copy patch as an EdgeAcc process would and calls the graph-input copy's
# kernel entry with what upstream's own function cannot take (it raises on objects that are not tensors).
GRAPH_INPUT_COPY = textwrap.dedent(
    """
    import json, os
    from sglang.kernels.ops.memory import small_copy
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_edgeacc.patches import graph_input_copy
    from sglang_edgeacc.patches._base import verify

    def declines():
        try:
            return small_copy.try_small_copy([object(), object()], [object(), object()]) is False
        except AttributeError:
            return "upstream's"
    patch = graph_input_copy.PATCH
    verify(patch)
    seen = {"plain": patch.applies(), "upstream": declines()}
    os.environ["SGLANG_EDGEACC"] = "1"
    seen["edge_acc"] = patch.applies()
    patch.install()
    HookRegistry.apply_hooks()
    seen["installed"] = declines()
    print("RESULTS " + json.dumps(seen))
    """
)


def test_an_edge_acc_process_copies_graph_inputs_without_the_kernel_triton_compiles_at_run_time(subprocess_results):
    result = subprocess_results["graph_input_copy"]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-3000:]
    assert json.loads(lines[-1][len("RESULTS "):]) == {
        "plain": False, "upstream": "upstream's", "edge_acc": True, "installed": True}


# --- verification: a mismatch names the patch and the symbol --------------------------


def _patch(*targets: Target, install=lambda: None) -> Patch:
    return Patch(name="probe_patch", summary="a patch written against another sglang", targets=targets,
                 install=install)


def test_verify_accepts_a_matching_target():
    assert check_target(Target(HOOK_REGISTER, params=HOOK_REGISTER_PARAMS)).ok
    verify(_patch(Target(HOOK_REGISTER, params=HOOK_REGISTER_PARAMS)))


@pytest.mark.parametrize(
    "target, detail",
    [
        (Target("sglang.srt.plugins.hook_registry.HookRegistry.no_such_method"), "missing"),
        (Target("sglang.srt.no_such_module.some_function"), "missing"),
        (Target(HOOK_REGISTER, params=("target", "hook")), "signature changed"),
        (Target(HOOK_REGISTER, params=("cls", *HOOK_REGISTER_PARAMS)), "signature changed"),
    ],
    ids=["missing_attribute", "missing_module", "fewer_params", "other_params"],
)
def test_mismatch_names_the_patch_and_the_symbol(target, detail):
    with pytest.raises(PatchMismatch) as raised:
        verify(_patch(Target(HOOK_REGISTER, params=HOOK_REGISTER_PARAMS), target))
    message = str(raised.value)
    assert "'probe_patch'" in message
    assert f"'{target.path}'" in message
    assert detail in message


def test_install_all_verifies_every_patch_before_installing_any(monkeypatch):
    installed = []
    good = Patch("good", "fine", (Target(HOOK_REGISTER, params=HOOK_REGISTER_PARAMS),),
                 install=lambda: installed.append("good"))
    broken = Patch("broken", "stale", (Target(HOOK_REGISTER, params=("target",)),),
                   install=lambda: installed.append("broken"))
    monkeypatch.setattr(patches_pkg, "_installed", False)
    monkeypatch.setattr(patches_pkg, "all_patches", lambda: [good, broken])
    with pytest.raises(PatchMismatch, match="'broken'"):
        patches_pkg.install_all()
    assert installed == []

    monkeypatch.setattr(patches_pkg, "all_patches", lambda: [good])
    patches_pkg.install_all()
    patches_pkg.install_all()
    assert installed == ["good"]


def test_install_all_skips_patches_that_do_not_apply_here(monkeypatch):
    installed = []
    elsewhere = Patch("elsewhere", "another platform", (Target(HOOK_REGISTER),),
                      install=lambda: installed.append("elsewhere"), applies=lambda: False)
    monkeypatch.setattr(patches_pkg, "_installed", False)
    monkeypatch.setattr(patches_pkg, "all_patches", lambda: [elsewhere])
    patches_pkg.install_all()
    assert installed == []


def _install_in_a_spawned_child(result):
    """What install_all does with a launcher-only patch in a process the launcher spawned."""
    import sys

    from sglang_edgeacc import patches as child_patches

    stale = Patch("launcher_only", "stale", (Target(HOOK_REGISTER, params=("target",)),),
                  install=lambda: result.put("installed"), only_in_launcher=True)
    launcher_patches = [patch for patch in child_patches.all_patches() if patch.only_in_launcher]
    child_patches.all_patches = lambda: [stale, *launcher_patches]
    child_patches.install_all()
    result.put(f"verified nothing; http_server imported: {'sglang.srt.entrypoints.http_server' in sys.modules}")


def test_a_launcher_only_patch_is_verified_and_installed_in_the_launcher_only(monkeypatch):
    import multiprocessing

    stale = Patch("launcher_only", "stale", (Target(HOOK_REGISTER, params=("target",)),),
                  install=lambda: None, only_in_launcher=True)
    monkeypatch.setattr(patches_pkg, "_installed", False)
    monkeypatch.setattr(patches_pkg, "all_patches", lambda: [stale])
    with pytest.raises(PatchMismatch, match="'launcher_only'"):
        patches_pkg.install_all()  # this process was not spawned by another: it is a launcher

    ctx = multiprocessing.get_context("spawn")
    result = ctx.Queue()
    child = ctx.Process(target=_install_in_a_spawned_child, args=(result,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert result.get(timeout=5) == "verified nothing; http_server imported: False"
    assert result.empty()


def test_the_launcher_patches_are_launcher_only():
    """Their targets (sglang's HTTP server, uvicorn) are not imported by schedulers for nothing."""
    by_name = {patch.name: patch for patch in all_patches()}
    assert all(by_name[name].only_in_launcher for name in ("start_failure", "http_port", "shm_reclaim"))


def test_plugin_turns_a_mismatch_into_an_exit_sglang_cannot_swallow(monkeypatch):
    def stale():
        raise PatchMismatch("sglang-edgeacc patch 'probe_patch' cannot apply: upstream symbol 'x.y' is missing")

    monkeypatch.setattr(patches_pkg, "install_all", stale)
    with pytest.raises(SystemExit) as raised:
        plugin.register()
    assert not isinstance(raised.value, Exception)  # sglang's loader catches Exception only
    assert "'probe_patch'" in str(raised.value.code) and "'x.y'" in str(raised.value.code)


# --- the patch table -----------------------------------------------------------------


def _table_rows() -> dict[str, str]:
    table = patches_pkg.__doc__.split("Patch table", 1)[1]
    rows = re.split(r"^\* ", table, flags=re.M)[1:]
    return {re.match(r"``(\w+)``", row).group(1): row for row in rows}


@pytest.mark.parametrize("module", PATCH_MODULES)
def test_patch_table_has_a_complete_row_per_patch(module):
    rows = _table_rows()
    name = module.rsplit(".", 1)[1]
    assert name in rows, f"patches/__init__.py's table has no row for {name}"
    row = " ".join(rows[name].split())
    for part in ("target:", "Why:", "How:", "Removable"):
        assert part in row, f"row {name} lacks '{part}'"


def test_patch_table_lists_only_existing_patches():
    names = {module.rsplit(".", 1)[1] for module in PATCH_MODULES}
    assert set(_table_rows()) == names
    assert {patch.name for patch in all_patches()} == names


# --- the edgeacc_cpu platform ----------------------------------------------------------


@pytest.mark.parametrize("selected", [None, "", "cuda", "edgeacc_cpu_typo"])
def test_platform_answers_only_when_selected_by_name(monkeypatch, selected):
    if selected is None:
        monkeypatch.delenv("SGLANG_PLATFORM", raising=False)
    else:
        monkeypatch.setenv("SGLANG_PLATFORM", selected)
    assert activate() is None


def test_platform_when_selected_names_a_loadable_platform_class(monkeypatch):
    monkeypatch.setenv("SGLANG_PLATFORM", PLATFORM_NAME)
    target = activate()
    module_name, _, class_name = target.partition(":")
    import importlib

    platform_class = getattr(importlib.import_module(module_name), class_name)
    platform = platform_class()
    assert platform.get_device() == "cpu"
    assert platform.get_torch_distributed_backend_str() == "gloo"
    assert platform.get_default_attention_backend() == "torch_native"


@pytest.mark.parametrize("cores, ranks", [(range(8), 2), (range(8), 4), (range(8), 8), ([0, 2, 5, 7, 9, 11], 3)])
def test_thread_binding_gives_each_rank_its_own_cores(monkeypatch, cores, ranks):
    from sglang_edgeacc.platform import cpu

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cores))
    groups = [set(map(int, group.split(","))) for group in cpu._thread_binding(ranks).split("|")]
    assert len(groups) == ranks
    assert all(groups)
    assert sum(len(group) for group in groups) == len(set().union(*groups)), f"overlapping groups: {groups}"
    assert set().union(*groups) == set(cores)


def test_thread_binding_on_this_host_for_two_ranks():
    from sglang_edgeacc.platform import cpu

    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        pytest.skip("needs at least 2 cores")
    first, second = (set(map(int, g.split(","))) for g in cpu._thread_binding(2).split("|"))
    assert first and second and not first & second
    assert first | second == set(available)
