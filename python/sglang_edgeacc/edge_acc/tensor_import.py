"""The importer's side of tensor sharing: map a bundle's tensors, release them, bind them into a module.

The prefill side maps what the decode side exported with :func:`import_tensors`
and completes a model built on the meta device with :func:`bind_into_module`;
:mod:`.tensor_share` tells how each platform shares the memory and when to
release it.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import torch

from sglang_edgeacc.edge_acc.tensor_bundle import SharedTensors, SharedTensorsError, SharedTensorSpec

logger = logging.getLogger(__name__)


def _open_cpu_segment(spec: SharedTensorSpec) -> torch.UntypedStorage:
    owner_pid, fd, storage_bytes, identity = spec.rebuild_args[:4]
    path = f"/proc/{owner_pid}/fd/{fd}"
    gone = (
        f"import_tensors: the shared memory of {spec.name!r} (descriptor {fd} of pid {owner_pid}) is gone: "
        f"the owner freed the tensor, exited, or sent it through torch.multiprocessing's pickling under the "
        f"file_system strategy, which moves a CPU storage to a new file"
    )
    try:
        local_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise SharedTensorsError(f"{gone} ({exc})") from exc
    except PermissionError as exc:
        raise SharedTensorsError(
            f"import_tensors: cannot open {path} for {spec.name!r} ({exc}); the importer must run as the "
            f"owner's user, with /proc mounted without hidepid"
        ) from exc
    try:
        # A descriptor number the owner closed may since name another file.
        found = os.fstat(local_fd)
        if (found.st_dev, found.st_ino) != tuple(identity):
            raise SharedTensorsError(f"{gone} (descriptor {fd} now names another file)")
        return torch.UntypedStorage._new_shared_fd_cpu(local_fd, storage_bytes)
    finally:
        # torch keeps a duplicate of the descriptor for as long as the storage lives.
        os.close(local_fd)


def _rebuild_cpu(spec: SharedTensorSpec, segments: dict[bytes, torch.UntypedStorage]) -> torch.Tensor:
    offset, shape, stride = spec.rebuild_args[4:]
    storage = segments.get(spec.segment_key)
    if storage is None:
        storage = segments[spec.segment_key] = _open_cpu_segment(spec)
    return torch.empty(0, dtype=spec.dtype).set_(storage, offset, shape, stride)


def _rebuild_cuda(spec: SharedTensorSpec) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    tensor = rebuild_cuda_tensor(*spec.rebuild_args)
    # The owner's Parameter class travels in the args; the importer wants plain tensors.
    return tensor.detach() if tensor.requires_grad else tensor


class ImportedTensors:
    """Tensors mapped from another process's memory, with an explicit release."""

    def __init__(self, tensors: dict[str, torch.Tensor], owner_pid: int):
        self._tensors: Optional[dict[str, torch.Tensor]] = tensors
        self.owner_pid = owner_pid

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        if self._tensors is None:
            raise SharedTensorsError("these imported tensors were released; import the bundle again")
        return self._tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def released(self) -> bool:
        return self._tensors is None

    def release(self) -> None:
        """Drop this side's references so the mappings close (idempotent).

        Everything bound from these tensors (a module's parameters, a pool's views)
        must be dropped too; a reference kept elsewhere keeps its mapping open. On
        CUDA the device is synchronized first so no queued kernel still reads the
        owner's memory; torch's deleter then tells the owner the block is unused.
        """
        if self._tensors is None:
            return
        on_cuda = any(t.is_cuda for t in self._tensors.values())
        if on_cuda:
            torch.cuda.synchronize()
        self._tensors.clear()
        self._tensors = None
        logger.info("Released tensors imported from pid %d", self.owner_pid)


def import_tensors(bundle: SharedTensors) -> ImportedTensors:
    """Map every tensor of ``bundle`` into this process, with zero copies."""
    tensors: dict[str, torch.Tensor] = {}
    # One mapping per CPU segment: the views of a pool share it, as on CUDA.
    cpu_segments: dict[bytes, torch.UntypedStorage] = {}
    for spec in bundle.specs:
        if spec.device_type == "cuda":
            tensors[spec.name] = _rebuild_cuda(spec)
        elif spec.device_type == "cpu":
            tensors[spec.name] = _rebuild_cpu(spec, cpu_segments)
        else:
            raise SharedTensorsError(f"import_tensors: unknown device type {spec.device_type!r} for {spec.name!r}")
    logger.info(
        "Imported %d tensors (%.2f GiB) from pid %d without copying",
        len(tensors),
        bundle.total_bytes() / 2**30,
        bundle.owner_pid,
    )
    return ImportedTensors(tensors, bundle.owner_pid)


def bind_into_module(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
    """Install imported tensors as ``module``'s parameters/buffers by name, without copying.

    Meant for a model built on the meta device. Parameters become frozen
    ``nn.Parameter``s around the shared memory. With ``strict`` any parameter or
    buffer left on the meta device, and any name the module does not have, is an
    error that lists them.
    """
    unknown = []
    for name, tensor in tensors.items():
        owner_name, _, leaf = name.rpartition(".")
        try:
            owner = module.get_submodule(owner_name) if owner_name else module
        except AttributeError:
            unknown.append(name)
            continue
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=False)
        elif leaf in owner._buffers:
            owner._buffers[leaf] = tensor
        else:
            unknown.append(name)
    if not strict:
        return
    missing = [n for n, p in module.named_parameters(remove_duplicate=False) if p.is_meta]
    missing += [n for n, b in module.named_buffers(remove_duplicate=False) if b is not None and b.is_meta]
    if unknown or missing:
        raise SharedTensorsError(
            f"bind_into_module: {len(unknown)} shared tensor(s) have no slot in the module "
            f"{unknown[:5]}, {len(missing)} module tensor(s) were not shared {missing[:5]}. "
            f"The two sides must build the same model architecture from the same config."
        )
