"""What a stopped EdgeAcc server leaves in /dev/shm: nothing of EdgeAcc's, however it stops.

The real CPU server shares its weights, KV pool and request table between the two
sides through shared memory. Those must not outlive the server, neither after a
SIGTERM of its process group nor after every one of its processes is SIGKILLed
(upstream's ``kill_process_tree`` on a child failure, a container stop, the OOM
killer). What the server does leave is upstream's own load-snapshot file, which
plain sglang leaves as well (docs/troubleshooting.md).
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.harness import SHM_DIR, CpuServer, shm_creator_pid, shm_in_use, started_together

pytestmark = pytest.mark.server

EDGE_ACC = ("--enable-edge-acc", "--skip-server-warmup")


def _torch_entries(pids: set[int]) -> set[str]:
    return {name for name in os.listdir(SHM_DIR) if name.startswith("torch_") and shm_creator_pid(name) in pids}


def _serve_one_request(server: CpuServer) -> None:
    assert server.generate("The capital of France is", max_new_tokens=4)["meta_info"]["completion_tokens"] == 4
    server.observe()


def _assert_only_upstreams_load_file(left: set[str]) -> None:
    """Upstream's scheduler leaves its load-snapshot file; a prefill side's own must not be there."""
    loads = {name for name in left if name.startswith("sglang_loads_")}
    assert left == loads, f"EdgeAcc left {sorted(left - loads)} in {SHM_DIR}"
    assert len(loads) == 1, f"one load-snapshot file per server (the decode side's), found {sorted(loads)}"


@pytest.fixture(scope="module")
def launched():
    """Each test's own server, both launched at once (a start leaves a core idle for a while)."""
    with started_together({stop: CpuServer(args=EDGE_ACC) for stop in ("sigterm", "sigkill")}) as servers:
        yield servers


def test_sigterm_leaves_nothing_of_edge_acc_in_dev_shm(launched):
    server = launched["sigterm"]
    try:
        _serve_one_request(server)
        # The shared tensors have no name in /dev/shm even while the server runs.
        assert _torch_entries(server.seen_pids) == set()
        server.stop(remove_shm=False)
        assert _torch_entries(server.seen_pids) == set()
        _assert_only_upstreams_load_file(server.shm_left())
    finally:
        server.stop()
    assert server.shm_left() == set(), "the harness removes what the server left"


def test_sigkill_of_every_server_process_leaves_nothing_of_edge_acc_in_dev_shm(launched):
    server = launched["sigkill"]
    try:
        _serve_one_request(server)
        tree = [psutil.Process(server.proc.pid)] + server.descendants()
        assert any(p.name().startswith("sglang::scheduler_edgeacc_prefill") for p in tree)
        assert shm_in_use(p.pid for p in tree), "the server maps shared memory: the test would prove nothing"
        # Every process at once, daemons that left the process group included, as a
        # tree kill or a container stop does: no process gets to clean anything up.
        for proc in tree:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=30)
        server.stop(remove_shm=False)
        assert _torch_entries(server.seen_pids) == set()
        _assert_only_upstreams_load_file(server.shm_left())
    finally:
        server.stop()
