"""Pack a decode side's prefill ``ScheduleBatch`` into bytes for its prefill side, and unpack it there.

A ``ScheduleBatch`` points at the decode side's process-local machinery (pools,
allocator, radix tree, model config, the tokenizer every request holds). Those
are not sent: the packer replaces each with a reference by role, and the
unpacker binds the reference to the prefill side's own object -- whose pools map
the very same memory, and whose tokenizer was loaded from the same files. A
request's grammar travels as the vocab mask it filled (:mod:`grammar_mask`), a
custom logit processor as the serialized form its request brought (sglang
deserializes it into an object of a class a user may have defined inside a
function, which pickle cannot name), and the reference to its request that
sglang puts into the request's ``custom_params`` as a reference to the request
unpacked with it. Every tensor travels as its own elements only, never the whole storage it may
be a view of (an allocator's free list, a pool-sized buffer), and as the bytes of those elements
with its dtype and shape rather than through torch's own reduction (a nested pickle per tensor). The
batch's device tensors travel together, as one block of host bytes read back with one wait for the
device, and come back as views of one device buffer, copied in one transfer that nothing waits for on
the host (:class:`CopyStreamPlacement`): a copy per tensor waited for the device once per tensor, on
both sides.
Everything else (requests, sampling parameters) is pickled as is, so a message grows with the
batch, not with the tokenizer or the pool. All of this is decided in the
pickler's ``reducer_override``, which pickle does not call for ints, strings and
plain containers: plain data (the token ids a retracted request brings back,
the batch's length lists) is written at C speed, not through a Python call per item.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import weakref
from dataclasses import dataclass
from typing import Any, Optional

import torch

# Reference tags for process-local objects.
REQ_TO_TOKEN_POOL = "req_to_token_pool"
KV_POOL = "token_to_kv_pool"
KV_ALLOCATOR = "token_to_kv_pool_allocator"
MODEL_CONFIG = "model_config"
TOKENIZER = "tokenizer"
LOCAL_ONLY = "local_only"  # decode-side bookkeeping the forward never reads (radix nodes, caches)
BACK_REFERENCE = "back_reference"  # a weak reference back to the batch; re-pointed after loading
LEFT_OUT = "left_out"  # a part the decode side could not send; its request fails (see PrefillBatchNotSendable)
REQUEST_REFERENCE = "request_reference"  # the "__req__" entry of custom_params; re-pointed after loading
# Objects from these modules are the decode side's bookkeeping (radix nodes,
# caches, Prometheus collectors with their locks); the forward never reads them.
LOCAL_ONLY_MODULES = ("sglang.srt.mem_cache.", "sglang.srt.observability.", "prometheus_client.")


def _local_types() -> dict[type, str]:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.allocator import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import KVCache, ReqToTokenPool

    return {
        ReqToTokenPool: REQ_TO_TOKEN_POOL,
        KVCache: KV_POOL,
        BaseTokenToKVPoolAllocator: KV_ALLOCATOR,
        ModelConfig: MODEL_CONFIG,
    }


@dataclass(frozen=True)
class LocalObjects:
    """The prefill side's own objects that stand in for the decode side's."""

    req_to_token_pool: Any
    token_to_kv_pool: Any
    token_to_kv_pool_allocator: Any
    model_config: Any
    tokenizer: Any = None


def _device_tensor(index: int) -> torch.Tensor:
    """Stands for the batch's ``index``-th device tensor in a message; :func:`unpack_prefill_batch` binds it."""
    raise pickle.UnpicklingError("a prefill batch message refers to its device tensors: unpack it with "
                                 "unpack_prefill_batch")


def _travels_on_the_device(obj: torch.Tensor) -> bool:
    return obj.is_cuda and not obj.requires_grad


# Each device tensor starts this far into the block: every dtype's alignment, and that of vector loads.
_DEVICE_ALIGNMENT = 256


@dataclass(frozen=True)
class _DeviceLayout:
    """Where each device tensor of a message lies in its block of bytes."""

    device: str
    tensors: tuple[tuple[torch.dtype, tuple[int, ...], int], ...]  # dtype, shape, offset


def _gather_device_tensors(tensors: list[torch.Tensor]) -> tuple[Optional[_DeviceLayout], bytearray]:
    """The tensors' elements in one block of host bytes; the host waits for the device once, not per tensor."""
    if not tensors:
        return None, bytearray()
    devices = {str(t.device) for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"a prefill batch's device tensors are on more than one device: {sorted(devices)}")
    entries, offset = [], 0
    for t in tensors:
        entries.append((t.dtype, tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // _DEVICE_ALIGNMENT) * _DEVICE_ALIGNMENT
    on_gpu = tensors[0].is_cuda
    block = torch.empty(offset, dtype=torch.uint8, pin_memory=on_gpu)
    for t, (dtype, shape, start) in zip(tensors, entries):
        if t.numel():
            _view(block, dtype, shape, start).copy_(t, non_blocking=on_gpu)
    if on_gpu:
        torch.cuda.current_stream(tensors[0].device).synchronize()
    return _DeviceLayout(devices.pop(), tuple(entries)), bytearray(block.numpy())


def _view(block: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], start: int) -> torch.Tensor:
    return block[start:start + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)


def _device_views(layout: Optional[_DeviceLayout], data: bytearray,
                  placement: Optional["CopyStreamPlacement"]) -> list[torch.Tensor]:
    if layout is None:
        return []
    host = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    block = placement.place(host, layout.device) if placement is not None else host.to(layout.device)
    return [_view(block, dtype, shape, start) for dtype, shape, start in layout.tensors]


class CopyStreamPlacement:
    """Copies a message's block of device tensors to the device on a copy stream of its own.

    A copy from pageable memory on the current stream waits for everything queued there,
    so on a side that still runs the batch before, unpacking the next one would wait for
    that whole forward. Here the block goes from pinned memory on a stream of its own, and
    the stream the forward reads it on (``forward_stream``; the stream current at unpacking
    if None) waits for the copy on the device, not the host: the next batch is ready to
    launch behind the running one at once. The buffer is marked as used on that stream:
    its memory comes from the copy stream's pool, and the allocator must not give it to
    the next message while a forward queued on another stream may still read it.
    """

    def __init__(self, device: torch.device, forward_stream: Optional[torch.cuda.Stream] = None):
        self._stream = torch.cuda.Stream(device)
        self._forward_stream = forward_stream

    def place(self, host: torch.Tensor, device: str) -> torch.Tensor:
        target = torch.device(device)
        pinned = host.pin_memory()
        with torch.cuda.stream(self._stream):
            # torch keeps the pinned block until this copy has run.
            block = pinned.to(target, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._stream)
        reader = self._forward_stream or torch.cuda.current_stream(target)
        reader.wait_event(copied)
        block.record_stream(reader)
        return block


def _host_tensor(data: bytearray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A host tensor of a message, rebuilt on its elements' bytes (pickle returns a bytearray as one:
    writable, so the tensor needs no copy of its own)."""
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)


def _as_bytes(tensor: torch.Tensor) -> bytearray:
    """The tensor's own elements in order, only those of a view (not the larger storage it may be part of)."""
    return bytearray(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor with a storage of its own elements (a view of a larger storage would pickle all of it)."""
    storage_bytes = tensor.untyped_storage().nbytes()
    if tensor.is_contiguous() and storage_bytes == tensor.numel() * tensor.element_size():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _plain_host_tensor(obj) -> bool:
    """A tensor that travels as its elements' bytes: dense, on the host, outside autograd."""
    return (type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided
            and not obj.is_quantized and not obj.requires_grad and not obj.is_conj() and not obj.is_neg())


@dataclass(frozen=True)
class _RequestReference:
    """Stands in for a weak proxy of the batch's request ``index`` until the batch is unpacked."""

    index: int


def processor_from_str(serialized: str):
    """A custom logit processor rebuilt from the form its request brought, as sglang builds it."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    return CustomLogitProcessor.from_str(serialized)


@dataclass(frozen=True)
class _BatchParts:
    """What the pickler sends in a form of its own, found in the batch before the dump."""

    grammar_masks: dict
    local_objects: dict[int, str]
    # id(processor class) -> the serialized processor its requests brought
    processor_sources: dict[int, str]
    # id(weak proxy of a request) -> the request's index in the batch
    request_references: dict[int, int]
    left_out: frozenset[int] = frozenset()


def _processor_sources(batch) -> dict[int, str]:
    info = getattr(batch, "sampling_info", None)
    if not getattr(info, "has_custom_logit_processor", False):
        return {}
    from sglang.srt.sampling.custom_logit_processor import _cache_from_str

    sources = {}
    for req in batch.reqs:
        serialized = getattr(req, "custom_logit_processor", None)
        if serialized:
            # sglang makes each processor as an instance of the class this cache holds.
            sources[id(_cache_from_str(serialized))] = serialized
    return sources


def _custom_params(req) -> Optional[dict]:
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return params if isinstance(params, dict) else None


def _request_references(batch) -> dict[int, int]:
    references = {}
    for index, req in enumerate(getattr(batch, "reqs", None) or ()):
        params = _custom_params(req)
        if params is not None and type(params.get("__req__")) is weakref.ProxyType:
            references[id(params["__req__"])] = index
    return references


def _local_object(tag: str):
    """Stands for a process-local object in a message; :func:`unpack_prefill_batch` binds it to its own."""
    raise pickle.UnpicklingError(f"a prefill batch message refers to the unpacking process's {tag}: "
                                 "unpack it with unpack_prefill_batch")


class _BatchPickler(pickle.Pickler):
    # No persistent_id: pickle calls it for every object, each int of a list included, where
    # reducer_override is not called for ints, strings and plain containers.

    def __init__(self, file, local_types: dict[type, str], parts: Optional[_BatchParts] = None):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._local_types = local_types
        self._parts = parts or _BatchParts({}, {}, {}, {})
        self._compacted: list[torch.Tensor] = []  # alive until the dump ends: pickle memoizes by id
        self.device_tensors: list[torch.Tensor] = []

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and type(obj) is torch.Tensor:
            if _travels_on_the_device(obj):
                # Its elements join the message's block once the dump is done (pickle memoizes the
                # tensor, so one shared by two fields is one entry and stays shared).
                self.device_tensors.append(obj)
                return _device_tensor, (len(self.device_tensors) - 1,)
            if _plain_host_tensor(obj):
                # Its bytes, not torch's own reduction: that one builds a storage class and a nested
                # pickle per tensor, most of the time a batch takes to pack and unpack.
                return _host_tensor, (_as_bytes(obj), obj.dtype, tuple(obj.shape))
            compact = _compact(obj)  # any other tensor: torch's reduction, of its own elements only
            if compact is obj:
                return NotImplemented
            self._compacted.append(compact)
            return compact.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        tag = self._local_tag(obj)
        if tag is not None:
            return _local_object, (tag,)
        parts = self._parts
        if parts.processor_sources:
            source = parts.processor_sources.get(id(type(obj)))
            if source is not None:
                return processor_from_str, (source,)
        if parts.request_references and type(obj) is weakref.ProxyType:
            index = parts.request_references.get(id(obj))
            if index is not None:
                return _RequestReference, (index,)
        # A request's grammar is native decode-side state: it travels as the mask it filled.
        stand_in = parts.grammar_masks.get(id(obj)) if parts.grammar_masks else None
        return NotImplemented if stand_in is None else stand_in.__reduce__()

    def _local_tag(self, obj) -> Optional[str]:
        if isinstance(obj, (str, bytes, int, float, list, tuple, dict)):
            return None  # their subclasses (enums, named tuples) are data, whatever module defines them
        parts = self._parts
        if parts.left_out and id(obj) in parts.left_out:
            return LEFT_OUT
        tag = parts.local_objects.get(id(obj))
        if tag is not None:
            return tag
        if isinstance(obj, weakref.ReferenceType):
            return BACK_REFERENCE
        for cls, tag in self._local_types.items():
            if isinstance(obj, cls):
                return tag
        module = type(obj).__module__ or ""
        if module.startswith(LOCAL_ONLY_MODULES) or isinstance(obj, (torch.cuda.Event, torch.cuda.Stream)):
            return LOCAL_ONLY
        return None


class _LeavingOutPickler(_BatchPickler):
    """Leaves out parts that may be ints, strings or plain containers too, which reducer_override never sees.

    Only for a batch some of whose requests fail anyway (:class:`PrefillBatchNotSendable`).
    """

    def persistent_id(self, obj):
        return LEFT_OUT if id(obj) in self._parts.left_out else None


class _BatchUnpickler(pickle.Unpickler):
    def __init__(self, file, local: LocalObjects, device_tensors: list[torch.Tensor]):
        super().__init__(file)
        self._local = local
        self._device_tensors = device_tensors

    def find_class(self, module, name):
        if module == __name__ and name == _local_object.__name__:
            return self._bind
        if module == __name__ and name == _device_tensor.__name__:
            return self._device_tensors.__getitem__
        return super().find_class(module, name)

    def persistent_load(self, tag):
        return self._bind(tag)

    def _bind(self, tag: str):
        if tag in (LOCAL_ONLY, BACK_REFERENCE, LEFT_OUT):
            return None
        return getattr(self._local, tag)


@dataclass(frozen=True)
class UnsendablePart:
    """One object of a prefill batch that cannot cross to the prefill side."""

    path: str  # where it is, e.g. "batch.reqs[2].sampling_params.custom_params['x']"
    type_name: str
    req_index: Optional[int]  # the request that holds it; None for a part of the batch itself


class PrefillBatchNotSendable(TypeError):
    """A prefill batch holds objects that cannot be pickled; ``parts`` says which and whose."""

    def __init__(self, cause: Exception, parts: tuple[UnsendablePart, ...], objects: tuple[object, ...]):
        where = ", ".join(f"{p.path} ({p.type_name})" for p in parts) or "unknown"
        super().__init__(f"EdgeAcc cannot send this prefill batch: {cause}; unpicklable: {where}")
        self.parts = parts
        self._objects = objects  # the parts themselves, for leaving them out of a second try

    @property
    def object_ids(self) -> frozenset[int]:
        return frozenset(id(obj) for obj in self._objects)


def _batch_parts(batch, tokenizer, leave_out: frozenset[int] = frozenset()) -> _BatchParts:
    from sglang_edgeacc.edge_acc_server.grammar_mask import prefilled_grammar_masks

    return _BatchParts(
        grammar_masks=prefilled_grammar_masks(batch),
        local_objects={id(tokenizer): TOKENIZER} if tokenizer is not None else {},
        processor_sources=_processor_sources(batch),
        request_references=_request_references(batch),
        left_out=leave_out,
    )


def _dump(obj, parts: _BatchParts, pickler_class: Optional[type] = None) -> bytes:
    """The message: the layout of the device tensors' block, the block, and the pickled batch."""
    buffer = io.BytesIO()
    pickler_class = pickler_class or (_LeavingOutPickler if parts.left_out else _BatchPickler)
    pickler = pickler_class(buffer, _local_types(), parts)
    pickler.dump(obj)
    layout, block = _gather_device_tensors(pickler.device_tensors)
    return pickle.dumps((layout, block, buffer.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)


def pack_prefill_batch(batch, tokenizer=None, leave_out: frozenset[int] = frozenset()) -> bytes:
    """``batch`` as bytes; ``tokenizer`` (the scheduler's, which every request holds) travels as a reference.

    ``leave_out``: ids of objects sent as None (parts a :class:`PrefillBatchNotSendable`
    named, whose requests the caller fails). Raises :class:`PrefillBatchNotSendable`.
    """
    parts = _batch_parts(batch, tokenizer, leave_out)
    try:
        return _dump(batch, parts)
    except Exception as exc:
        found = unsendable_parts(batch, parts)
        raise PrefillBatchNotSendable(exc, tuple(p for p, _ in found), tuple(o for _, o in found)) from exc


def _sendable(obj, parts: _BatchParts) -> bool:
    try:
        _dump(obj, parts)
        return True
    except Exception:
        return False


def unsendable_parts(batch, parts: Optional[_BatchParts] = None) -> list[tuple[UnsendablePart, object]]:
    """The smallest objects of ``batch`` that fail to pickle, each with the request that holds it.

    Each request is tried alone, then the batch with its requests taken as sent:
    a part found under a request fails that request only.
    """
    parts = parts or _batch_parts(batch, None)
    found = []
    reqs = list(getattr(batch, "reqs", None) or ())
    for index, req in enumerate(reqs):
        if not _sendable(req, parts):
            found += [(UnsendablePart(path, type(obj).__name__, index), obj)
                      for path, obj in _unpicklable_leaves(req, f"batch.reqs[{index}]", parts)]
    if found:
        parts = dataclasses.replace(parts, left_out=parts.left_out | {id(obj) for _, obj in found})
    if not _sendable(batch, parts):
        found += [(UnsendablePart(path, type(obj).__name__, None), obj)
                  for path, obj in _unpicklable_leaves(batch, "batch", parts, skip=set(map(id, reqs)))]
    return found


def _children(obj, path: str) -> list[tuple[str, object]]:
    if isinstance(obj, (list, tuple)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        return [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    names = list(getattr(obj, "__dict__", {})) + list(getattr(obj, "__slots__", ()))
    return [(f"{path}.{name}", getattr(obj, name, None)) for name in names]


def _unpicklable_leaves(obj, path: str, parts: _BatchParts, skip: Optional[set[int]] = None,
                        depth: int = 0) -> list[tuple[str, object]]:
    """(path, object) of the innermost objects under ``obj`` that do not pickle (``obj`` itself if none is smaller)."""
    skip = set() if skip is None else skip
    leaves = []
    for child_path, child in _children(obj, path) if depth < 6 else ():
        if id(child) in skip or child is None:
            continue
        skip.add(id(child))
        if not _sendable(child, parts):
            leaves += _unpicklable_leaves(child, child_path, parts, skip, depth + 1)
    return leaves or [(path, obj)]


def unpack_prefill_batch(data: bytes, local: LocalObjects, placement: Optional[CopyStreamPlacement] = None):
    """The batch ``data`` holds, bound to ``local``; its device tensors copied through ``placement`` if given."""
    layout, block, body = pickle.loads(data)
    batch = _BatchUnpickler(io.BytesIO(body), local, _device_views(layout, block, placement)).load()
    orchestrator = getattr(batch.sampling_info, "penalizer_orchestrator", None)
    if orchestrator is not None and hasattr(orchestrator, "_batch_ref"):
        # The penalizers reach their batch through this reference.
        orchestrator._batch_ref = weakref.ref(batch)
    reqs = getattr(batch, "reqs", None) or ()
    for req in reqs:
        params = _custom_params(req)
        if params is not None and isinstance(params.get("__req__"), _RequestReference):
            # As sglang does: a weak proxy, so the request still dies by refcount.
            params["__req__"] = weakref.proxy(reqs[params["__req__"].index])
    return batch
