"""The picklable bundle one EdgeAcc side exports and the other imports: plain data, no memory.

How the memory behind it is shared, and how long it must live, is told in
:mod:`.tensor_share`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class SharedTensorsError(RuntimeError):
    """A bundle cannot be exported, imported or bound as asked."""


@dataclass(frozen=True)
class SharedTensorSpec:
    """How to rebuild one tensor in another process. Plain data only: pickles anywhere."""

    name: str
    device_type: str  # "cuda" or "cpu"
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    # Identifies the memory segment the tensor lives in (CUDA IPC handle, or the device
    # and inode of the shared-memory object): tensors with the same key are views into
    # one mapping in the importer.
    segment_key: bytes
    rebuild_args: tuple


@dataclass(frozen=True)
class SharedTensors:
    """A picklable bundle of named tensors exported by ``owner_pid``."""

    specs: tuple[SharedTensorSpec, ...]
    owner_pid: int

    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def segment_count(self) -> int:
        """How many distinct memory segments (CUDA IPC handles / shared-memory objects) the bundle spans."""
        return len({s.segment_key for s in self.specs})

    def total_bytes(self) -> int:
        """Bytes of the tensors themselves (views counted each, as the importer sees them)."""
        return sum(s.nbytes for s in self.specs)
