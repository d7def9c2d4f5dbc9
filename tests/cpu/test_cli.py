"""The ``sglang-edgeacc`` command: its subcommands, the tiny model, and that one broken module stays contained.

Also checks that README.md's test command is the one ``.ci/run`` runs, so a
newcomer's command and CI's never drift apart.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_edgeacc import cli

REPO = Path(__file__).resolve().parents[2]


def _console_script(name: str) -> list[str]:
    beside_python = Path(sys.executable).parent / name
    if not beside_python.exists():
        pytest.fail(f"console script {name} is not installed next to {sys.executable}: run pip install -e .")
    return [str(beside_python)]


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_tiny_model_prints_a_loadable_model_directory():
    result = _run(_console_script("sglang-edgeacc") + ["tiny-model"])
    assert result.returncode == 0, result.stderr
    directory = Path(result.stdout.strip())
    assert directory.is_dir()
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"], config
    tokenizer = json.loads((directory / "tokenizer.json").read_text())
    assert tokenizer["model"]["vocab"], "tokenizer.json has no vocabulary"


def test_help_lists_every_subcommand_without_importing_them():
    result = _run(_console_script("sglang-edgeacc") + ["--help"])
    assert result.returncode == 0, result.stderr
    for name, (_, help_text) in cli.SUBCOMMANDS.items():
        assert re.search(rf"^\s+{re.escape(name)}\b", result.stdout, re.M), f"{name} missing from --help"
        assert help_text.split()[0] in result.stdout
    # Listing the subcommands imports none of their modules.
    probe = _run([sys.executable, "-c", (
        "import sys\n"
        "from sglang_edgeacc import cli\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m in {name for name, _ in cli.SUBCOMMANDS.values()}))\n"
    )])
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_each_subcommand_shows_its_own_help():
    for name in cli.SUBCOMMANDS:
        parser, modules = cli.build_parser(load=[name])
        assert set(modules) == {name}
        assert not isinstance(modules[name], cli.UnavailableSubcommand), modules[name]
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0


@pytest.fixture
def broken_subcommands(tmp_path, monkeypatch):
    """Two extra subcommands: one whose module is missing, one whose module raises on import."""
    (tmp_path / "edgeacc_broken_subcommand.py").write_text("raise RuntimeError('half-installed on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.SUBCOMMANDS, "missing", ("edgeacc_no_such_module", "a subcommand whose module is absent"))
    monkeypatch.setitem(cli.SUBCOMMANDS, "raising", ("edgeacc_broken_subcommand", "a subcommand whose module raises"))
    yield
    sys.modules.pop("edgeacc_broken_subcommand", None)


def test_a_broken_subcommand_module_does_not_break_the_others(broken_subcommands, capsys):
    del broken_subcommands
    parser, modules = cli.build_parser()
    assert isinstance(modules["missing"], cli.UnavailableSubcommand)
    assert isinstance(modules["raising"], cli.UnavailableSubcommand)
    assert not isinstance(modules["tiny-model"], cli.UnavailableSubcommand)
    assert "missing" in parser.format_help() and "raising" in parser.format_help()

    assert cli.main(["tiny-model"]) == 0
    assert Path(capsys.readouterr().out.strip(), "config.json").is_file()

    assert cli.main(["raising", "--any", "thing"]) == 2
    err = capsys.readouterr().err
    assert "'raising' is unavailable" in err
    assert "edgeacc_broken_subcommand" in err and "RuntimeError: half-installed on purpose" in err

    assert cli.main(["missing"]) == 2
    assert "edgeacc_no_such_module" in capsys.readouterr().err


def test_readme_test_command_is_what_ci_runs():
    ci_script = (REPO / ".ci" / "run").read_text()
    match = re.search(r'^TEST_COMMAND="(.+)"$', ci_script, re.M)
    assert match, ".ci/run has no TEST_COMMAND line"
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)```", quick_start, re.S)
    assert any(match.group(1) in block.splitlines() for block in commands), (
        f"README's Quick start does not show CI's test command: {match.group(1)}"
    )


def test_help_prints_no_restructuredtext(capsys):
    texts = [_run(_console_script("sglang-edgeacc") + ["--help"]).stdout]
    for name in cli.SUBCOMMANDS:
        parser, _ = cli.build_parser(load=[name])
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--help"])
        texts.append(capsys.readouterr().out)
    for text in texts:
        assert "usage: sglang-edgeacc" in text, text
        assert "``" not in text and not re.search(r":[a-z]+:`", text), text


def test_quickstart_flag_table_gives_every_flag_with_its_default():
    import argparse

    from sglang_edgeacc import flags

    parser = argparse.ArgumentParser()
    flags.add_cli_args(parser)
    defaults = {a.option_strings[0]: a.default for a in parser._actions
                if a.option_strings[0].startswith("--e") and a.help is not argparse.SUPPRESS}
    quickstart = (REPO / "docs" / "quickstart.md").read_text()
    rows = dict(re.findall(r"^\| `(--[a-z-]+)[^|]*\| ([^|]+?) \|", quickstart, re.M))
    for option, default in defaults.items():
        assert option in rows, f"docs/quickstart.md's flag table lacks {option}"
        expected = "off" if default is False else f"{default:g}" if isinstance(default, float) else str(default)
        assert rows[option].strip("`") == expected, f"{option}: the table says {rows[option]}, the parser {default}"
