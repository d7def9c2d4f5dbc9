"""The GPU server suite under pytest: EdgeAcc's greedy outputs equal plain sglang's in the real server.

Needs CUDA, the pinned sglang (or the bundle of ``scripts/gpu-host/``: ``source .gpu-bundle/env.sh``) and,
for the EdgeAcc arms, an MPS daemon whose pipe directory ``EDGEACC_SUITE_MPS_PIPE`` names
(``tests/gpu/on_device.sh`` provides both).
``EDGEACC_SUITE_FAMILIES`` picks families (default: the tiny ones).
"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

DEFAULT_FAMILIES = "tiny,tiny-page16,tiny-no-graph,tiny-no-overlap"


def test_edge_acc_answers_as_plain_sglang_on_the_gpu(tmp_path):
    if not os.environ.get("EDGEACC_SUITE_MPS_PIPE"):
        pytest.skip("no MPS daemon named by EDGEACC_SUITE_MPS_PIPE: run through tests/gpu/on_device.sh")
    from tests.gpu import server_suite

    families = os.environ.get("EDGEACC_SUITE_FAMILIES", DEFAULT_FAMILIES)
    rc = server_suite.main(["--families", families, "--out", str(tmp_path / "suite.json"),
                            "--workdir", str(tmp_path / "models")])
    assert rc == 0, (tmp_path / "suite.json").read_text()[-4000:]
