"""What the GPU proofs share: byte patterns both processes can recompute, MPS detection, and
spawning a child with its own environment, a pipe and a hard timeout.

Torch, the standard library and sglang_edgeacc only; no pytest, so the proofs also run without it, as modules
from the repository root (``PYTHONPATH=python python3 -m tests.gpu.test_ordering_gpu``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from sglang_edgeacc.edge_acc.sm_partition import environment_for_child

PATTERN_CHUNK = 1 << 24


def salt_of(name: str) -> int:
    return zlib.crc32(name.encode()) & 0xFFFF


def _pattern_chunk(start: int, end: int, salt: int, dtype: torch.dtype, device) -> torch.Tensor:
    idx = torch.arange(start, end, dtype=torch.int64, device=device)
    # Position-dependent and salt-dependent, small enough never to overflow int64.
    vals = ((idx % 1000003) * 7919 + salt * 131) % 2001 - 1000
    if dtype.is_floating_point:
        return (vals.to(torch.float32) * 2e-5).to(dtype)  # |w| <= 0.02, like real weights
    return vals.to(dtype)


def fill_pattern_(tensor: torch.Tensor, salt: int) -> None:
    """Overwrite every element of a contiguous tensor with the pattern for ``salt``."""
    flat = tensor.view(-1)
    for start in range(0, flat.numel(), PATTERN_CHUNK):
        end = min(flat.numel(), start + PATTERN_CHUNK)
        flat[start:end].copy_(_pattern_chunk(start, end, salt, tensor.dtype, tensor.device))


def pattern_mismatched_bytes(tensor: torch.Tensor, salt: int) -> int:
    """How many bytes of ``tensor`` differ from the pattern for ``salt`` (every byte compared)."""
    flat = tensor.view(-1)
    bad = torch.zeros((), dtype=torch.int64, device=tensor.device)
    for start in range(0, flat.numel(), PATTERN_CHUNK):
        end = min(flat.numel(), start + PATTERN_CHUNK)
        expected = _pattern_chunk(start, end, salt, tensor.dtype, tensor.device)
        bad += (flat[start:end].view(torch.uint8) != expected.view(torch.uint8)).sum()
    return int(bad)


def mps_daemon_running() -> bool:
    """True when an MPS control daemon listens in this process's CUDA_MPS_PIPE_DIRECTORY."""
    pipe_dir = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    return (pipe_dir / "control").exists()


def mps_expected() -> bool:
    """The device script sets EDGEACC_EXPECT_MPS=1 after starting the daemon: MPS must then work."""
    return os.environ.get("EDGEACC_EXPECT_MPS") == "1"


class Child:
    """A spawned process with a duplex pipe; every receive has a timeout, and ``close`` kills leftovers."""

    def __init__(self, target: Callable, args: tuple, env: Optional[Mapping[str, str]] = None):
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        with environment_for_child(dict(env or {})):
            # Arguments travel as one plain pickle: torch's multiprocessing pickler would
            # re-share (and move) CPU tensors that edge_acc.tensor_share already exported.
            self.proc = ctx.Process(target=_trampoline, args=(child_conn, target, pickle.dumps(args)), daemon=True)
            self.proc.start()
        child_conn.close()

    def send(self, obj: Any) -> None:
        self.conn.send_bytes(pickle.dumps(obj))

    def recv(self, timeout_s: float) -> Any:
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"child pid {self.proc.pid} sent nothing in {timeout_s}s (exitcode {self.proc.exitcode})")
        return pickle.loads(self.conn.recv_bytes())

    def close(self, timeout_s: float = 60) -> Optional[int]:
        self.proc.join(timeout_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        return self.proc.exitcode


def _trampoline(conn, target: Callable, payload: bytes) -> None:
    target(conn, *pickle.loads(payload))


def child_send(conn, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj))


def child_recv(conn, timeout_s: float) -> Any:
    if not conn.poll(timeout_s):
        raise TimeoutError(f"parent sent nothing in {timeout_s}s")
    return pickle.loads(conn.recv_bytes())


def nvidia_smi_compute_apps() -> str:
    """nvidia-smi's per-process memory table, or why there is none (never raises, never hangs)."""
    import subprocess

    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return (res.stdout or res.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi unavailable: {exc}"


def cuda_ok() -> bool:
    return torch.cuda.is_available()
