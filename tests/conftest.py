"""Shared fixtures: device markers, and real CPU servers shared across a session."""

from __future__ import annotations

import importlib.util
import os

import psutil
import pytest

from tests.harness import SERVER_LOG_DIR_ENV, SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH, CpuServer

# Every server a test stops (SIGTERM to its process group) looks crashed to upstream's launcher, which
# then waits 5 s "to let GPU activity settle" before py-spy and CUDA core dumps; there is no GPU
# activity here and nothing reads the dumps. Inherited by every process the tests start.
os.environ.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
os.environ.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _has_npu() -> bool:
    return importlib.util.find_spec("torch_npu") is not None


def pytest_collection_modifyitems(config, items):
    del config
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU: docs/testing.md, 'The GPU suite'")
    skip_npu = pytest.mark.skip(reason="needs an Ascend NPU with torch_npu")
    cuda, npu = _has_cuda(), _has_npu()
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(skip_gpu)
        if "npu" in item.keywords and not npu:
            item.add_marker(skip_npu)


class ServerPool:
    """One server per distinct flag set (and environment), started on first use and kept for the session.

    A kept server that no test is using is paused: SIGSTOP to its process group, SIGCONT when
    a test asks for it again. Idle servers are not free on two cores (DP ranks poll each other
    without pause), paused ones cost only memory. When ``MAX_KEPT`` are kept, and before any test
    while memory is low, one is stopped: the least recently used, the two of the shared launch
    (``harness.SHARED_LAUNCH``, which tests of many files use) only when no other is left.
    """

    MAX_KEPT = 4
    # What the next test may take: an EdgeAcc --dp 2 server of its own is about 8 GB of processes.
    MIN_AVAILABLE_BYTES = 10 << 30

    def __init__(self):
        self._servers: dict[tuple, CpuServer] = {}

    @staticmethod
    def _key(args: tuple[str, ...], env: dict[str, str] | None) -> tuple:
        return args, tuple(sorted((env or {}).items()))

    def get(self, *args: str, env: dict[str, str] | None = None) -> CpuServer:
        """The server of ``args`` (launched with ``env`` added to its environment), running and healthy;
        every other kept server is paused (a test compares servers one after the other, never side by
        side), except one still starting (see :meth:`prepare`)."""
        key = self._key(args, env)
        for other_key, other in self._servers.items():
            if other_key != key and other.started_s:
                other.pause()
        server = self._servers.pop(key, None)
        if server is not None:
            server.resume()
            if server.proc.poll() is None:
                self._servers[key] = server  # most recently used last
                return server if server.started_s else server.wait_healthy()
            server.stop()  # it died under an earlier test: start it again
        self._make_room_for_one()
        self._servers[key] = CpuServer(args=args).start(env=env)
        return self._servers[key]

    def prepare(self, *launches: tuple[tuple[str, ...], dict[str, str] | None]) -> None:
        """Launch the servers of ``launches`` (args, env) that are not kept, without waiting: :meth:`get`
        waits for each. A start leaves a core idle while one process imports; two starts fill it."""
        for args, env in launches:
            key = self._key(args, env)
            if key in self._servers:
                continue
            self._make_room_for_one()
            self._servers[key] = CpuServer(args=args).launch(env=env)

    def _make_room_for_one(self) -> None:
        while len(self._servers) >= self.MAX_KEPT:
            self._release_key(self._next_to_stop())
        self.make_room()

    def release(self, *args: str, env: dict[str, str] | None = None) -> None:
        self._release_key(self._key(args, env))

    def _release_key(self, key) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.stop()

    def _next_to_stop(self) -> tuple:
        shared = (SHARED_LAUNCH, SHARED_EDGE_ACC_LAUNCH)
        return next((key for key in self._servers if key[0] not in shared), next(iter(self._servers)))

    def make_room(self) -> None:
        """Stop kept servers until the next test has memory to run in."""
        while self._servers and psutil.virtual_memory().available < self.MIN_AVAILABLE_BYTES:
            self._release_key(self._next_to_stop())

    def pause_all(self) -> None:
        # One still starting (a test failed between prepare and get) goes on starting: paused, it
        # would run into its start deadline.
        for server in self._servers.values():
            if server.started_s:
                server.pause()

    def stop_all(self) -> None:
        for key in list(self._servers):
            self._release_key(key)


_POOL: list[ServerPool] = []  # the session's pool, once a test asked for it


@pytest.fixture(scope="session", autouse=True)
def _server_logs_in_pytests_temporary_directory(tmp_path_factory):
    # Hundreds of servers a run: their logs go where pytest keeps only the last three runs, not into /tmp.
    os.environ[SERVER_LOG_DIR_ENV] = str(tmp_path_factory.mktemp("server-logs"))
    yield
    os.environ.pop(SERVER_LOG_DIR_ENV, None)


@pytest.fixture(scope="session")
def cpu_servers():
    pool = ServerPool()
    _POOL.append(pool)
    try:
        yield pool
    finally:
        _POOL.clear()
        pool.stop_all()


@pytest.fixture(autouse=True)
def _kept_servers_leave_room_and_rest_between_tests(request):
    # Every test, also one that starts servers of its own, starts with memory to spare; one that
    # takes a server the test before it kept must find it still there.
    if request.node.get_closest_marker("reuses_kept_server") is None:
        for pool in _POOL:
            pool.make_room()
    yield
    for pool in _POOL:
        pool.pause_all()
