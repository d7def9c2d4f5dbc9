"""Zero-copy sharing of named tensors between EdgeAcc's two processes on one GPU.

The decode side owns the weights, the KV pool and ``req_to_token``; the prefill
side imports them. This module and the three it names at the end are the
whole mechanism, with torch and the standard library only.

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

Where the code is
-----------------
:mod:`.tensor_bundle` is the picklable bundle both sides agree on,
:mod:`.tensor_export` the owner's side (with the allocator check),
:mod:`.tensor_import` the importer's side. Their public names are importable
from here too, for the launcher and the prefill side.
"""

from __future__ import annotations

from sglang_edgeacc.edge_acc.tensor_bundle import SharedTensors, SharedTensorsError, SharedTensorSpec
from sglang_edgeacc.edge_acc.tensor_export import (
    AllocatorNotShareableError,
    export_tensors,
    module_tensors,
    refuse_unshareable_cuda_allocator,
)
from sglang_edgeacc.edge_acc.tensor_import import ImportedTensors, bind_into_module, import_tensors

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
