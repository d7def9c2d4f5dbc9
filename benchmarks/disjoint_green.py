"""Two green contexts on disjoint SMs, cut from one split of the device, for a co-partition.

``torch.cuda.green_contexts.GreenContext`` makes one context of N SMs and drops the
rest of its split, so two of them (prefill and decode) start from the same SMs and
overlap. A co-partition confines *both* sides: the decode side to a small group, the
prefill side to the SMs left over, so a long prefill can neither be interrupted by
decode's kernels nor sit on the SMs decode needs. That is the only split that
reached chunked prefill's top throughput on the H200 (measured with a standalone benchmark now in git history).

The CUDA driver's green-context API (12.4+) is called through ``ctypes`` on
``libcuda``: one ``cuDevSmResourceSplitByCount`` gives the group and its remainder,
each becomes a green context with one stream, wrapped as a torch ``ExternalStream``.
Only torch and the standard library are imported, so the device can run this from
the repository without sglang.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_edgeacc.edge_acc.sm_partition import GreenContextStream, SmPartitionError

logger = logging.getLogger(__name__)

_CU_DEV_RESOURCE_TYPE_SM = 1
_CU_GREEN_CTX_DEFAULT_STREAM = 0x1
_CU_STREAM_NON_BLOCKING = 0x1


class _CUdevResource(ctypes.Structure):
    """cuda.h's ``CUdevResource`` (ABI version 1): a type tag, 92 bytes of padding, a 48-byte union."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("_internal_padding", ctypes.c_ubyte * 92),
        ("sm_count", ctypes.c_uint),
        ("min_sm_partition_size", ctypes.c_uint),
        ("sm_coscheduled_alignment", ctypes.c_uint),
        ("_rest_of_union", ctypes.c_ubyte * 36),
    ]


assert ctypes.sizeof(_CUdevResource) == 144

_driver_lock = threading.Lock()
_driver: Optional[ctypes.CDLL] = None


def _libcuda() -> ctypes.CDLL:
    global _driver
    with _driver_lock:
        if _driver is None:
            try:
                _driver = ctypes.CDLL("libcuda.so.1")
            except OSError as exc:
                raise SmPartitionError(f"co-partition: cannot load the CUDA driver library libcuda.so.1 ({exc})") from exc
            if not hasattr(_driver, "cuDevSmResourceSplitByCount"):
                raise SmPartitionError(
                    "co-partition: this CUDA driver has no green-context API (cuDevSmResourceSplitByCount, "
                    "driver 12.4+ needed)"
                )
        return _driver


def _check(result: int, call: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        lib = _libcuda()
        lib.cuGetErrorName(result, ctypes.byref(name))
        raise SmPartitionError(f"co-partition: {call} failed: CUresult {result} ({(name.value or b'?').decode()})")


class _GreenContextHandle:
    """Owns one driver green context and its stream; destroyed when the handle is collected."""

    def __init__(self, lib: ctypes.CDLL, resource: _CUdevResource, device: ctypes.c_int, priority: int):
        self._lib = lib
        self.ctx = ctypes.c_void_p()
        self.stream = ctypes.c_void_p()
        desc = ctypes.c_void_p()
        _check(lib.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(resource), 1), "cuDevResourceGenerateDesc")
        _check(lib.cuGreenCtxCreate(ctypes.byref(self.ctx), desc, device, _CU_GREEN_CTX_DEFAULT_STREAM),
               "cuGreenCtxCreate")
        _check(lib.cuGreenCtxStreamCreate(ctypes.byref(self.stream), self.ctx, _CU_STREAM_NON_BLOCKING,
                                          ctypes.c_int(priority)), "cuGreenCtxStreamCreate")

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is None:
            return
        destroy_stream = getattr(lib, "cuStreamDestroy_v2", None) or lib.cuStreamDestroy
        if self.stream.value:
            destroy_stream(self.stream)
        if self.ctx.value:
            lib.cuGreenCtxDestroy(self.ctx)


@dataclass(frozen=True)
class DisjointGreenStreams:
    """``group``: a green context of about the SMs asked for; ``remainder``: one on every other SM."""

    group: GreenContextStream
    remainder: GreenContextStream


def _driver_priority(lib: ctypes.CDLL, torch_priority: int) -> int:
    """Clamp to the current context's range (lower is greater), as ``torch.cuda.Stream`` does."""
    least, greatest = ctypes.c_int(), ctypes.c_int()
    _check(lib.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)), "cuCtxGetStreamPriorityRange")
    return max(greatest.value, min(least.value, torch_priority))


def disjoint_green_streams(
    group_sms: int,
    device_index: int = 0,
    *,
    group_priority: int = 0,
    remainder_priority: int = 0,
    role: str = "decode",
    tp_rank: int = 0,
) -> DisjointGreenStreams:
    """Split the device's SMs once into a group of ``group_sms`` and the remainder; a stream on each.

    The driver rounds ``group_sms`` up to its granularity (8 SMs on Hopper); the
    streams' ``num_sms`` say what was made. Raises :class:`SmPartitionError` naming
    the call that failed (an MPS client with a thread percentage cannot make green
    contexts).
    """
    if not torch.cuda.is_available():
        raise SmPartitionError("co-partition: needs CUDA")
    # The green contexts retain the device's primary context; make sure torch created it.
    torch.zeros(1, device=torch.device("cuda", device_index))
    lib = _libcuda()
    device = ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(device), device_index), "cuDeviceGet")
    whole = _CUdevResource()
    _check(lib.cuDeviceGetDevResource(device, ctypes.byref(whole), _CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    if not 0 < group_sms < whole.sm_count:
        raise SmPartitionError(f"co-partition: group of {group_sms} SMs must be between 1 and {whole.sm_count - 1}")
    group, remainder = _CUdevResource(), _CUdevResource()
    groups = ctypes.c_uint(1)
    _check(
        lib.cuDevSmResourceSplitByCount(ctypes.byref(group), ctypes.byref(groups), ctypes.byref(whole),
                                        ctypes.byref(remainder), 0, group_sms),
        f"cuDevSmResourceSplitByCount({group_sms} SMs)",
    )
    if groups.value != 1 or remainder.sm_count == 0:
        raise SmPartitionError(
            f"co-partition: splitting {whole.sm_count} SMs at {group_sms} left no remainder ({groups.value} groups)"
        )
    handles = [
        _GreenContextHandle(lib, group, device, _driver_priority(lib, group_priority)),
        _GreenContextHandle(lib, remainder, device, _driver_priority(lib, remainder_priority)),
    ]
    streams = [torch.cuda.ExternalStream(h.stream.value, device=torch.device("cuda", device_index)) for h in handles]
    total = whole.sm_count
    result = DisjointGreenStreams(
        group=GreenContextStream(stream=streams[0], num_sms=group.sm_count, total_sms=total, context=handles[0]),
        remainder=GreenContextStream(stream=streams[1], num_sms=remainder.sm_count, total_sms=total, context=handles[1]),
    )
    logger.info(
        "[edgeacc %s tp%d] co-partition: %d SMs and the other %d of %d on disjoint green contexts (cuda:%d)",
        role, tp_rank, group.sm_count, remainder.sm_count, total, device_index,
    )
    return result


__all__ = ["DisjointGreenStreams", "disjoint_green_streams"]
