"""Zero-copy sharing of named tensors between EdgeAcc's two processes on one GPU.

The decode side owns the weights, the KV pool and ``req_to_token``; the prefill
side imports them. This module is the whole mechanism, with torch and the
standard library only.

Owner (decode side)::

    bundle = export_tensors({**module_tensors(model), **kv_buffers, "req_to_token": r2t})
    send(pickle.dumps(bundle))            # any channel: mp.Queue, zmq send_pyobj, a pipe
    ...                                   # keep ``model``, ``kv_buffers`` and ``r2t`` alive

Importer (prefill side)::

    imported = import_tensors(pickle.loads(received))
    bind_into_module(meta_model, imported.tensors)   # model built on the meta device
    ...
    imported.release()                    # before the owner goes away

How each platform shares memory
-------------------------------
* CUDA: torch's own reduction (``torch.multiprocessing.reductions.reduce_tensor``).
  Its rebuild arguments are plain bytes/ints, so the bundle pickles with the
  ordinary :mod:`pickle` over any channel. The importer maps the owner's
  ``cudaMalloc`` segment with ``cudaIpcOpenMemHandle`` (torch caches one mapping
  per segment and process), so importing costs no device memory for the data.
  The expandable-segments allocator and the ``cudaMallocAsync`` backend are
  refused at export (:class:`AllocatorNotShareableError`): legacy CUDA IPC cannot
  export their memory portably.
* CPU: shared memory that has no name. Each storage moves once into a POSIX
  shared-memory object that torch unlinks as soon as it is created (its
  ``file_descriptor`` strategy, called explicitly: a copy at export unless the
  storage already lives there); the owner's process keeps the only file
  descriptor. The bundle carries the owner's pid and descriptor number, and the
  importer opens ``/proc/<owner pid>/fd/<n>``, which reopens that same object,
  and maps it. The kernel frees the memory when the last process that maps it
  exits, however it exits: SIGKILL of every process included, nothing is left
  in ``/dev/shm``. (torch's ``file_system`` strategy names a ``/dev/shm/torch_*``
  file per storage, which only its ``torch_shm_manager`` daemon removes at the end;
  when the daemon is killed with the server's process tree, as upstream's
  ``kill_process_tree`` does on any child failure, every file stays behind.)
  No ``multiprocessing`` resource sharer or authkey is needed, so a bundle works
  across spawned processes and across a plain pickle over a socket or pipe alike,
  on Linux, for processes of the same user.
  The owner's tensor objects keep working: torch swaps the storage in place.
  Do not also pass an exported CPU tensor through torch.multiprocessing's pickling
  (``mp.Queue``, ``Process`` arguments) under the ``file_system`` strategy: that
  moves its storage again, to a named file, and closes the bundle's descriptor
  (the importer then gets a :class:`SharedTensorsError` saying so). Under the
  default ``file_descriptor`` strategy torch reuses the descriptor, which is fine.

One bundle per importing process
--------------------------------
On CUDA, torch counts every export of a storage as one consumer reference, which
the importer gives back when it releases. Export a fresh bundle for each process
that imports it (cheap: handles, no data). A bundle imported by two processes
miscounts, and torch warns at the owner's exit ("Producer process has been
terminated before all shared CUDA tensors released"). Seen on the H200 and fixed
in the benchmark by exporting per importer. CPU bundles may be imported any number
of times.

Lifetime (both platforms)
-------------------------
The owner must keep every exported tensor alive until every importer has called
:meth:`ImportedTensors.release` (or exited). Freeing first is undefined on CUDA
(torch parks the block in its IPC limbo and warns "Producer process has been
terminated before all shared CUDA tensors released"). On the CPU a mapping made
stays valid, but an import after the owner freed the tensor or exited fails: the
descriptor the bundle names is gone. For server-lifetime pools that means:
allocate once in the decode side, never free, and stop the prefill side before
the decode side.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from torch.multiprocessing.reductions import reduce_tensor

logger = logging.getLogger(__name__)

ALLOC_CONF_VARIABLES: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class AllocatorNotShareableError(RuntimeError):
    """The CUDA caching allocator is configured so that its memory cannot be IPC-shared."""


class SharedTensorsError(RuntimeError):
    """A bundle cannot be exported, imported or bound as asked."""


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


__all__ = [
    "AllocatorNotShareableError",
    "ImportedTensors",
    "SharedTensorSpec",
    "SharedTensors",
    "SharedTensorsError",
    "bind_into_module",
    "export_tensors",
    "import_tensors",
    "module_tensors",
    "refuse_unshareable_cuda_allocator",
]
