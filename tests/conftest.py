"""Shared fixtures: device markers, and real CPU servers shared across a session."""

from __future__ import annotations

import importlib.util

import pytest

from tests.harness import CpuServer


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
    """One server per distinct flag set, started on first use, stopped at session end.

    The CI machine has 2 cores: at most ``MAX_ALIVE`` servers run at once (the
    least recently used one is stopped first), enough to compare two launches.
    """

    MAX_ALIVE = 2

    def __init__(self):
        self._servers: dict[tuple, CpuServer] = {}

    def get(self, *args: str, env: dict[str, str] | None = None) -> CpuServer:
        """The server of ``args`` (launched with ``env`` added to its environment)."""
        key = (args, tuple(sorted((env or {}).items())))
        if key in self._servers:
            self._servers[key] = self._servers.pop(key)  # most recently used last
            return self._servers[key]
        while len(self._servers) >= self.MAX_ALIVE:
            self._release_key(next(iter(self._servers)))
        self._servers[key] = CpuServer(args=args).start(env=env)
        return self._servers[key]

    def release(self, *args: str, env: dict[str, str] | None = None) -> None:
        self._release_key((args, tuple(sorted((env or {}).items()))))

    def _release_key(self, key) -> None:
        server = self._servers.pop(key, None)
        if server is not None:
            server.stop()

    def stop_all(self) -> None:
        for key in list(self._servers):
            self._release_key(key)


@pytest.fixture(scope="session")
def cpu_servers():
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.stop_all()
