"""The test-only faults live in tests/fault_injection, not in the server package.

The real-server tests that use them (test_edge_acc_server.py) take minutes; these
checks fail at once when a hooked method is renamed or a switch creeps back in.
"""

from __future__ import annotations

import os
from pathlib import Path

import sglang_edgeacc
from tests.fault_injection import edgeacc_faults


def test_the_server_package_reads_no_test_switch():
    root = Path(sglang_edgeacc.__file__).parent
    for path in root.rglob("*.py"):
        assert "SGLANG_EDGEACC_TEST_" not in path.read_text(), path


def test_the_hooked_methods_exist_on_the_prefill_side():
    from sglang_edgeacc.edge_acc_server.prefill_side import PrefillSideScheduler

    for name in ("_edge_prefill_connect", "_edge_join_group_step"):
        assert callable(getattr(PrefillSideScheduler, name)), name


def test_server_env_puts_the_faults_first_on_the_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/a", "", "/b"]))
    env = edgeacc_faults.server_env(**{edgeacc_faults.SKIP_IDLE_SYNC_ENV: "1"})
    folder = str(Path(edgeacc_faults.__file__).resolve().parent)
    assert env["PYTHONPATH"].split(os.pathsep) == [folder, "/a", "/b"]
    assert (Path(folder) / "sitecustomize.py").is_file()
    assert env[edgeacc_faults.SKIP_IDLE_SYNC_ENV] == "1"


def test_a_server_with_faults_still_runs_the_sitecustomize_it_shadows(tmp_path, monkeypatch):
    """The GPU host bundle installs its shims from a sitecustomize; the faults' own must not hide it."""
    import subprocess
    import sys

    host = tmp_path / "host_site"
    host.mkdir()
    marker = tmp_path / "host_site_ran"
    (host / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.setenv("PYTHONPATH", str(host))  # as env.sh puts the bundle's site first
    env = {**os.environ, **edgeacc_faults.server_env()}
    probe = "import sys; print('edgeacc_faults' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"  # the faults were installed
    assert marker.read_text() == "ran"  # and the host's sitecustomize ran too
