"""A KV pool carved out of one allocation, for the tests and benchmarks of ``edge_acc.tensor_share``.

The server shares the KV pool upstream allocates; the proofs and the latency
benchmark build their own, as views of a single allocation, so that an export
is one CUDA IPC handle (or one shared-memory object) and every byte can be
checked on the other side. Torch and the standard library only: the GPU proofs
and benchmarks import it as ``tests.segment_pool``.
"""

from __future__ import annotations

import logging
from typing import Mapping, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

# Page-aligned views keep every per-layer buffer suitably aligned for vector loads
# and for any dtype view; the waste is at most 4 KiB per view.
SEGMENT_VIEW_ALIGNMENT = 4096


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


def allocate_single_segment(
    specs: Mapping[str, tuple[Sequence[int], torch.dtype]],
    device: torch.device | str,
    *,
    zero: bool = True,
) -> dict[str, torch.Tensor]:
    """Allocate ``specs`` (name -> (shape, dtype)) as views into ONE allocation.

    One allocation is one CUDA IPC handle (or one shared-memory object), so the
    importer opens a single mapping for the whole pool instead of one per layer.
    Views are 4 KiB aligned. On the CPU the backing storage is put in shared
    memory before the views are carved, so exporting it later copies nothing.
    """
    layout: list[tuple[str, int, tuple[int, ...], torch.dtype]] = []
    end = 0
    for name, (shape, dtype) in specs.items():
        dims = tuple(int(d) for d in shape)
        layout.append((name, end, dims, dtype))
        end += -(-_nbytes(dims, dtype) // SEGMENT_VIEW_ALIGNMENT) * SEGMENT_VIEW_ALIGNMENT
    device = torch.device(device)
    make = torch.zeros if zero else torch.empty
    base = make(max(end, 1), dtype=torch.uint8, device=device)
    if device.type == "cpu":
        base.untyped_storage()._share_fd_cpu_()
    views: dict[str, torch.Tensor] = {}
    for name, start, dims, dtype in layout:
        views[name] = base[start : start + _nbytes(dims, dtype)].view(dtype).view(dims)
    logger.info("Allocated %d views in one %.2f GiB segment on %s", len(views), end / 2**30, device)
    return views


def kv_pool_layer_specs(
    num_layers: int,
    num_tokens: int,
    head_num: int,
    head_dim: int,
    dtype: torch.dtype,
    v_head_dim: Optional[int] = None,
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Specs for an MHA KV pool shaped like SGLang's: ``k.{layer}`` / ``v.{layer}``,
    each ``[num_tokens, head_num, head_dim]``; feed them to :func:`allocate_single_segment`."""
    v_dim = head_dim if v_head_dim is None else v_head_dim
    specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for layer in range(num_layers):
        specs[f"k.{layer}"] = ((num_tokens, head_num, head_dim), dtype)
    for layer in range(num_layers):
        specs[f"v.{layer}"] = ((num_tokens, head_num, v_dim), dtype)
    return specs


def layer_views(tensors: Mapping[str, torch.Tensor], prefix: str) -> list[torch.Tensor]:
    """``[tensors[f"{prefix}.0"], tensors[f"{prefix}.1"], ...]``: a pool's per-layer list."""
    views: list[torch.Tensor] = []
    while f"{prefix}.{len(views)}" in tensors:
        views.append(tensors[f"{prefix}.{len(views)}"])
    return views
