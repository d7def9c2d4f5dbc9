"""The owner's side of tensor sharing: check the allocator, export named tensors as a bundle.

The decode side owns the weights, the KV pool and ``req_to_token`` and exports
them with :func:`export_tensors`; :mod:`.tensor_share` tells how each platform
shares the memory and how long the owner must keep it.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

import torch
from torch.multiprocessing.reductions import reduce_tensor

from sglang_edgeacc.edge_acc.tensor_bundle import SharedTensors, SharedTensorsError, SharedTensorSpec

logger = logging.getLogger(__name__)

ALLOC_CONF_VARIABLES: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class AllocatorNotShareableError(RuntimeError):
    """The CUDA caching allocator is configured so that its memory cannot be IPC-shared."""


def _alloc_conf_items(value: str) -> dict[str, str]:
    items: dict[str, str] = {}
    for part in value.split(","):
        if ":" in part:
            key, _, val = part.partition(":")
            items[key.strip().lower()] = val.strip()
    return items


def refuse_unshareable_cuda_allocator(environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise :class:`AllocatorNotShareableError` if the allocator settings block CUDA IPC.

    Call this in the owner before allocating anything that will be exported (the
    settings are read once, at the first CUDA allocation). It looks only at the
    environment variables torch reads, ``PYTORCH_CUDA_ALLOC_CONF`` and
    ``PYTORCH_ALLOC_CONF``.
    """
    env = os.environ if environ is None else environ
    for var in ALLOC_CONF_VARIABLES:
        items = _alloc_conf_items(env.get(var, ""))
        if items.get("expandable_segments", "").lower() in ("true", "1"):
            raise AllocatorNotShareableError(
                f"{var}={env[var]!r} turns on expandable_segments, whose memory EdgeAcc cannot share "
                f"between its prefill and decode processes with CUDA IPC. Fix: remove "
                f"'expandable_segments:True' from {var} (or set expandable_segments:False) for "
                f"--enable-edge-acc."
            )
        if items.get("backend", "").lower() == "cudamallocasync":
            raise AllocatorNotShareableError(
                f"{var}={env[var]!r} selects the cudaMallocAsync backend, whose memory torch cannot "
                f"share with CUDA IPC. Fix: remove 'backend:cudaMallocAsync' from {var} for "
                f"--enable-edge-acc."
            )


def _export_cuda(name: str, tensor: torch.Tensor) -> SharedTensorSpec:
    _rebuild, args = reduce_tensor(tensor.detach())
    # args: (cls, size, stride, offset, storage_cls, dtype, device, handle, ...); see
    # torch.multiprocessing.reductions.rebuild_cuda_tensor. Index 7 is the segment's
    # IPC handle, which names the cudaMalloc allocation the storage sits in.
    return SharedTensorSpec(
        name=name,
        device_type="cuda",
        dtype=tensor.dtype,
        shape=tuple(tensor.shape),
        nbytes=tensor.numel() * tensor.element_size(),
        segment_key=bytes(args[7]),
        rebuild_args=tuple(args),
    )


def _export_cpu(name: str, tensor: torch.Tensor) -> SharedTensorSpec:
    storage = tensor.untyped_storage()
    # Moves the storage into unnamed shared memory once; later calls return the same descriptor.
    fd, storage_bytes = storage._share_fd_cpu_()
    identity = os.fstat(fd)
    return SharedTensorSpec(
        name=name,
        device_type="cpu",
        dtype=tensor.dtype,
        shape=tuple(tensor.shape),
        nbytes=tensor.numel() * tensor.element_size(),
        segment_key=f"{identity.st_dev}:{identity.st_ino}".encode(),
        rebuild_args=(
            os.getpid(),
            int(fd),
            int(storage_bytes),
            (identity.st_dev, identity.st_ino),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
        ),
    )


def export_tensors(tensors: Mapping[str, torch.Tensor]) -> SharedTensors:
    """Export ``tensors`` (name -> tensor, CUDA or CPU) for import in another process.

    Zero copies on CUDA. On the CPU a storage not yet in shared memory is moved
    there once (in place: the owner's tensors stay valid). Views of one storage
    share one segment, so a pool carved out of one allocation is one handle.
    """
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise SharedTensorsError(f"export_tensors: {name!r} is a {type(tensor).__name__}, not a tensor")
    if any(t.is_cuda for t in tensors.values()):
        refuse_unshareable_cuda_allocator()
    specs = []
    for name, tensor in tensors.items():
        if tensor.device.type == "cuda":
            specs.append(_export_cuda(name, tensor))
        elif tensor.device.type == "cpu":
            specs.append(_export_cpu(name, tensor))
        else:
            raise SharedTensorsError(
                f"export_tensors: {name!r} is on {tensor.device}; only cuda and cpu tensors can be shared"
            )
    bundle = SharedTensors(specs=tuple(specs), owner_pid=os.getpid())
    logger.info(
        "Exported %d tensors (%.2f GiB) in %d segment(s) for the other EdgeAcc side",
        len(specs),
        bundle.total_bytes() / 2**30,
        bundle.segment_count(),
    )
    return bundle


def module_tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``module`` by qualified name, tied ones under each name.

    Non-persistent buffers (e.g. rotary ``inv_freq``) are included, so a model built
    on the meta device can be completed from the bundle alone.
    """
    out: dict[str, torch.Tensor] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        out[name] = param.detach()
    for name, buf in module.named_buffers(remove_duplicate=False):
        if buf is not None:
            out[name] = buf
    return out
