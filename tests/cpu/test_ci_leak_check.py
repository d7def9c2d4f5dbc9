"""``.ci/leaked.sh``: what CI counts as a process the tests left running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPAWN_AND_EXIT = (
    "import multiprocessing as mp\n"
    "p = mp.get_context('spawn').Process(target=abs, args=(1,))\n"
    "p.start(); p.join()\n"
)


def _python_under(tmp_path: Path) -> Path:
    """A python whose command line starts with a path no other process has."""
    python = tmp_path / "venv" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    return python


def _leaked(prefix: Path, grace_s: float) -> set[int]:
    result = subprocess.run(
        ["bash", str(REPO / ".ci" / "leaked.sh"), str(prefix), str(grace_s)],
        capture_output=True, text=True, timeout=grace_s + 30,
    )
    assert result.returncode == 0, result.stderr
    return {int(pid) for pid in result.stdout.split()}


def test_the_resource_tracker_ending_after_its_parent_is_not_a_leak(tmp_path):
    python = _python_under(tmp_path)
    for _ in range(5):
        # The tracker outlives this interpreter by a moment, as it outlives pytest.
        subprocess.run([str(python), "-c", SPAWN_AND_EXIT], check=True, timeout=60)
        assert _leaked(python.parent, grace_s=10) == set()


def test_a_process_that_ends_within_the_grace_period_is_not_a_leak(tmp_path):
    python = _python_under(tmp_path)
    proc = subprocess.Popen([str(python), "-c", "import time; time.sleep(1.5)"])
    try:
        started = time.monotonic()
        assert _leaked(python.parent, grace_s=10) == set()
        assert time.monotonic() - started < 9, "the check waited longer than the process lived"
    finally:
        proc.kill()
        proc.wait()


def test_a_process_still_running_after_the_grace_period_is_reported(tmp_path):
    python = _python_under(tmp_path)
    proc = subprocess.Popen([str(python), "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert _leaked(python.parent, grace_s=2) == {proc.pid}
        assert time.monotonic() - started >= 2
        assert proc.poll() is None, "the check itself must not kill anything"
    finally:
        proc.kill()
        proc.wait()
