"""The HCCL buffer (HCCL_BUFFSIZE, in MB) that DeepEP on Ascend needs.

The numbers are the ones the sgl-kernel-npu DeepEP kernels check, not the
formula in the public docs: the docs count ``hidden_size`` in elements where the
kernels count bytes (bf16, 2 bytes), and they ignore the 512-byte alignment of
every token slot, which at 8192 tokens is ~64 MB more than their 20 MB padding.
Sources (sgl-kernel-npu, tag 20260821):

* normal dispatch, one HCCS domain (A3 any size, A2 up to 8 ranks):
  ``ops*/op_host/cam_moe_dispatch_normal_tiling.cc`` (tiling check, fails with
  "HCCL_BUFFSIZE is too SMALL" and surfaces as ``aclnn... failed``);
* normal dispatch, A2 two nodes (layered, ``aclnnDispatchNormalA2``): the tiling
  has no buffer check, the combine kernel asserts a minimum
  (``ops2/op_kernel/moe_distribute_combine_a2_layered.h``);
* low-latency dispatch: ``moe_distribute_dispatch_v2_tiling`` (A3, A2 one node),
  the A2 non-layered kernel assert and the A2 layered kernel assert.

The inputs (model shape, ant-moving) are in :mod:`.dispatch_inputs`; the
buffer a launch sets, and what automatic sizing exports, in
:mod:`.buffer_setting`. Only the standard library and :mod:`.dispatch_inputs`
are imported, so this runs anywhere (the CLI, the preflight inside the
launcher, a laptop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from sglang_edgeacc.ascend.dispatch_inputs import DEFAULT_ANT_MOVING, AntMoving, ModelShape

Hardware = Literal["a2", "a3"]
DispatchMode = Literal["normal", "low_latency"]
HARDWARE_CHOICES: tuple[str, ...] = ("a2", "a3")

MB = 1024 * 1024

# An A2 server holds 8 NPUs in one HCCS domain; more ranks mean the layered
# (RDMA between servers) kernels. A3 superpods keep one domain for any size.
A2_RANKS_PER_NODE = 8
A3_RANKS_PER_NODE = 16  # 8 cards x 2 dies; each die is one rank

# Normal dispatch, per-token slot (cam_moe_dispatch_normal_tiling.cc).
# The dispatch slot is sized for a bf16 token even when the payload is int8.
NORMAL_DISPATCH_OUT_DTYPE_BYTES = 2
# 32 B of quantisation scale plus the (rank, token, expert) int32 triple.
TOKEN_EXTRA_INFO_BYTES = 44
# Window offsets (ops/op_host/tiling_args.h for A3, ops2/... for A2).
A3_COMBINE_STATE_WIN_OFFSET = 4 * MB
A3_NOTIFY_DISPATCH_WIN_OFFSET = 102 * MB
A2_COMBINE_STATE_WIN_OFFSET = 8 * MB
A2_NOTIFY_DISPATCH_WIN_OFFSET = 404 * MB
A2_STATE_SLOTS = 4 * 2 * MB  # Moe::STATE_SIZE * 4
DOUBLE_DATA_BUFFER = 2

# A2 layered (two-node) kernels.
A2_INTERNODE_MAX_TOKENS_PER_RANK = 4096  # BS_UPPER_BOUND in dispatch_normal_a2_tiling.cpp
A2_LAYERED_IPC_DATA_OFFSET = 4 * MB
A2_LAYERED_RDMA_DATA_SIZE = 800 * MB
A2_LAYERED_NOTIFY_DATA_SIZE = 400 * MB
A2_LAYERED_TOKEN_INFO_INTS = 4  # expert id, weight, scale, arrival flag per top-k entry
A2_LAYERED_LL_MAX_TOKENS_PER_RANK = 512  # MAX_BATCH_SIZE_A2
A2_NONLAYERED_LL_STATE = 2 * MB

# Low-latency (sglang layers/moe/token_dispatcher/deepep.py).
LL_DEFAULT_MAX_DISPATCH_TOKENS_PER_RANK = 128
LL_MAX_DISPATCH_TOKENS_PER_RANK = 1024


class UnsupportedDispatch(ValueError):
    """The requested dispatch path does not exist in the kernels (e.g. ant-moving on A2 two nodes)."""


def align_up(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def bytes_to_mb(value: int) -> int:
    """Smallest whole MB value of HCCL_BUFFSIZE that holds ``value`` bytes."""
    return -(-value // MB)


@dataclass(frozen=True)
class Term:
    """One addend of a requirement: what it is, how it is computed, and its size."""

    name: str
    formula: str
    bytes: int

    @property
    def mb(self) -> float:
        return self.bytes / MB


@dataclass(frozen=True)
class Requirement:
    """The smallest HCCL_BUFFSIZE one dispatch path accepts, and how it is made up."""

    hardware: str
    mode: str
    path: str  # which kernel check this is
    tokens_per_rank: int
    terms: tuple[Term, ...]

    @property
    def required_bytes(self) -> int:
        return sum(t.bytes for t in self.terms)

    @property
    def required_mb(self) -> int:
        return bytes_to_mb(self.required_bytes)

    def to_dict(self) -> dict:
        return {
            "hardware": self.hardware,
            "mode": self.mode,
            "path": self.path,
            "tokens_per_rank": self.tokens_per_rank,
            "required_mb": self.required_mb,
            "required_bytes": self.required_bytes,
            "terms": [{"name": t.name, "formula": t.formula, "bytes": t.bytes, "mb": round(t.mb, 3)}
                      for t in self.terms],
        }


def is_layered(hardware: str, ranks: int) -> bool:
    """True when DeepEP takes the A2 multi-server (layered, RDMA) kernels."""
    # deep_ep.cpp: num_rdma_ranks = num_ranks / 8 on Ascend910B; > 1 means internode.
    return hardware == "a2" and ranks > A2_RANKS_PER_NODE


def default_ranks(hardware: str, nodes: int) -> int:
    return nodes * (A2_RANKS_PER_NODE if hardware == "a2" else A3_RANKS_PER_NODE)


def _check_common(hardware: str, ranks: int, tokens_per_rank: int) -> None:
    if hardware not in HARDWARE_CHOICES:
        raise ValueError(f"hardware must be one of {HARDWARE_CHOICES}, got {hardware!r}")
    if ranks <= 0:
        raise ValueError(f"ranks must be positive, got {ranks}")
    if tokens_per_rank <= 0:
        raise ValueError(f"tokens per rank must be positive, got {tokens_per_rank}")


def _normal_slot_bytes(hidden_size: int, rounds: int) -> tuple[int, int]:
    dispatch = align_up(align_up(hidden_size * NORMAL_DISPATCH_OUT_DTYPE_BYTES, 32) + TOKEN_EXTRA_INFO_BYTES, 512)
    # The combine keeps a second slot per token while ant-moving runs several rounds.
    combine = align_up(hidden_size * 2, 512) * (2 if rounds > 1 else 1)
    return dispatch, combine


def normal_requirement(
    hardware: str,
    shape: ModelShape,
    ranks: int,
    tokens_per_rank: int,
    ant_moving: Optional[AntMoving] = None,
) -> Requirement:
    """HCCL_BUFFSIZE for normal (prefill) dispatch of ``tokens_per_rank`` tokens from each rank.

    ``ant_moving`` None means the variables are unset (one round of up to 8192
    tokens). ``tokens_per_rank`` is the most tokens any rank sends in one
    dispatch (``real_max_bs`` in deep_ep.cpp), not a request length.
    """
    _check_common(hardware, ranks, tokens_per_rank)
    h, k = shape.hidden_size, shape.topk
    if is_layered(hardware, ranks):
        if ant_moving is not None:
            raise UnsupportedDispatch(
                "ant-moving (DEEPEP_NORMAL_LONG_SEQ_*) is not supported by the A2 two-node "
                "(layered, aclnnDispatchNormalA2) normal dispatch; unset both variables"
            )
        servers = ranks // A2_RANKS_PER_NODE
        per_token = h * 2 + A2_LAYERED_TOKEN_INFO_INTS * k * 4
        return Requirement(
            hardware,
            "normal",
            "A2 layered normal combine kernel minimum (moe_distribute_combine_a2_layered.h)",
            tokens_per_rank,
            (
                Term(
                    "token payload",
                    f"servers({servers}) x tokens({tokens_per_rank}) x (h({h})*2 + 4*k({k})*4)",
                    servers * tokens_per_rank * per_token,
                ),
                Term("IPC data offset", "4 MB", A2_LAYERED_IPC_DATA_OFFSET),
                Term("RDMA data", "800 MB", A2_LAYERED_RDMA_DATA_SIZE),
                Term("notify data", "400 MB", A2_LAYERED_NOTIFY_DATA_SIZE),
            ),
        )

    ant = ant_moving or DEFAULT_ANT_MOVING
    max_bs = min(ant.per_round_tokens, tokens_per_rank)
    dispatch_slot, combine_slot = _normal_slot_bytes(h, ant.rounds)
    payload = Term(
        "token slots",
        f"maxBs({max_bs}) x k({k}) x (dispatch slot {dispatch_slot} B + combine slot {combine_slot} B)",
        max_bs * k * (dispatch_slot + combine_slot),
    )
    if hardware == "a3":
        state = Term("combine state window", "4 MB", A3_COMBINE_STATE_WIN_OFFSET)
        notify = Term("notify dispatch window", "102 MB", A3_NOTIFY_DISPATCH_WIN_OFFSET)
    else:
        state = Term("combine state window", "8 MB", A2_COMBINE_STATE_WIN_OFFSET)
        notify = Term("notify dispatch window", "404 MB", A2_NOTIFY_DISPATCH_WIN_OFFSET)
    half = payload.bytes + state.bytes + notify.bytes
    terms = [
        payload,
        state,
        notify,
        Term("double data buffer (second ping-pong half)", "x2", half * (DOUBLE_DATA_BUFFER - 1)),
    ]
    if hardware == "a2":
        terms.append(Term("state slots", "4 x 2 MB", A2_STATE_SLOTS))
    return Requirement(
        hardware,
        "normal",
        f"{hardware.upper()} normal dispatch tiling check (cam_moe_dispatch_normal_tiling.cc)",
        tokens_per_rank,
        tuple(terms),
    )


def low_latency_requirement(
    hardware: str,
    shape: ModelShape,
    ranks: int,
    max_dispatch_tokens_per_rank: int,
    int8_dispatch: bool = False,
) -> Requirement:
    """HCCL_BUFFSIZE for low-latency (decode) dispatch.

    ``max_dispatch_tokens_per_rank`` is SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK:
    the kernels size the window for it, whatever a given step sends.
    """
    _check_common(hardware, ranks, max_dispatch_tokens_per_rank)
    h, k, bs = shape.hidden_size, shape.topk, max_dispatch_tokens_per_rank
    experts = shape.num_experts
    if is_layered(hardware, ranks):
        k_aligned = align_up(k, 8)
        per_token = h * 2 + A2_LAYERED_TOKEN_INFO_INTS * k_aligned * 4
        return Requirement(
            hardware,
            "low_latency",
            "A2 layered low-latency kernel minimum (moe_distribute_dispatch_v2_layered.h)",
            bs,
            (
                Term(
                    "token payload",
                    f"experts({experts}) x bs({bs}) x (h({h})*2 + 4*align8(k)({k_aligned})*4)",
                    experts * bs * per_token,
                ),
                Term("IPC data offset", "4 MB", A2_LAYERED_IPC_DATA_OFFSET),
                Term("RDMA data", "800 MB", A2_LAYERED_RDMA_DATA_SIZE),
            ),
        )

    # A2's ops2 build always sizes dispatch slots for bf16; A3 shrinks them for int8.
    dtype_bytes = 1 if (int8_dispatch and hardware == "a3") else 2
    dispatch_slot = align_up(align_up(h * dtype_bytes, 32) + TOKEN_EXTRA_INFO_BYTES, 512)
    combine_slot = align_up(h * 2, 512)
    dispatch = Term(
        "dispatch slots",
        f"bs({bs}) x slot({dispatch_slot} B) x experts({experts})",
        bs * dispatch_slot * experts,
    )
    combine = Term(
        "combine slots",
        f"bs({bs}) x slot({combine_slot} B) x (k({k}) + shared({shape.shared_expert_num}))",
        bs * combine_slot * (k + shape.shared_expert_num),
    )
    tiling_terms = (
        dispatch,
        combine,
        Term("double data buffer (second ping-pong half)", "x2",
             (dispatch.bytes + combine.bytes) * (DOUBLE_DATA_BUFFER - 1)),
    )
    tiling = Requirement(
        hardware,
        "low_latency",
        f"{hardware.upper()} low-latency tiling check (moe_distribute_dispatch_v2_tiling)",
        bs,
        tiling_terms,
    )
    if hardware == "a3":
        return tiling
    # The A2 one-server kernel asserts its own minimum too; the larger one binds.
    local_experts = max(1, experts // ranks)
    kernel_payload = bs * ranks * min(local_experts, k) * h * 2
    kernel = Requirement(
        hardware,
        "low_latency",
        "A2 low-latency kernel assert (moe_distribute_dispatch_v2.h)",
        bs,
        (
            Term(
                "token payload",
                f"bs({bs}) x ranks({ranks}) x min(local experts {local_experts}, k {k}) x h({h}) x 2",
                kernel_payload,
            ),
            Term("state", "2 MB", A2_NONLAYERED_LL_STATE),
            Term("double data buffer", "x2", kernel_payload + A2_NONLAYERED_LL_STATE),
        ),
    )
    return max(tiling, kernel, key=lambda r: r.required_bytes)
