"""How many tokens each rank dispatches through DeepEP for a launch, and the HCCL buffer that takes.

The checks in :mod:`.dispatch_checks` compare these numbers with the limits of
the kernels, so they are derived the way sglang 0.5.23 schedules the tokens:

* normal (prefill) dispatch: one prefill batch of a DP rank holds at most
  ``min(chunked_prefill_size / attn_dp_size, max_prefill_tokens)`` tokens
  (``max_prefill_tokens`` alone when chunking is off), and sglang scatters it
  over the ``tp_size / attn_dp_size`` ranks of its attention-TP group before the
  dispatch (the same division upstream's DeepEP-v2 budget check makes);
* low-latency (decode) dispatch: the largest decode CUDA graph of a DP rank,
  ``max(cuda graph batch sizes) x speculative draft tokens`` (capped by
  ``max_running_requests / attn_dp_size``), must fit under
  ``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``, and the kernels size
  their window for that value.

Where a flag is not given, sglang's NPU default is assumed and the derivation
text says so. Nothing here imports sglang or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from sglang_edgeacc.ascend import hccl_budget as hb
from sglang_edgeacc.ascend.dispatch_inputs import AntMoving, ModelShape
from sglang_edgeacc.ascend.launch_settings import LaunchSettings

ANT_ROUND = "DEEPEP_NORMAL_LONG_SEQ_ROUND"
ANT_TOKENS = "DEEPEP_NORMAL_LONG_SEQ_PER_ROUND_TOKENS"
LL_TOKENS_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"

# sglang's NPU defaults when the flags are not given (hardware_backend/npu/utils.py,
# for 64 GB parts: 910B1-B3 and A3; 32 GB 910B4 gets 4096 / 16-64, smaller, so these
# are the conservative choice).
NPU_DEFAULT_CHUNKED_PREFILL = 8192
NPU_DEFAULT_GRAPH_MAX_BS_SMALL_TP = 64
NPU_DEFAULT_GRAPH_MAX_BS = 256
# sglang's default speculative setting for DeepSeek NEXTN (3 steps, top-k 1, 4 draft tokens).
DEFAULT_DRAFT_TOKENS = 4


def dispatch_modes(deepep_mode: str) -> tuple[str, ...]:
    """The dispatch kinds a ``--deepep-mode`` value uses; ``auto`` uses both on one communicator."""
    if deepep_mode == "normal":
        return ("normal",)
    if deepep_mode == "low_latency":
        return ("low_latency",)
    return ("normal", "low_latency")


def env_truthy(value: Optional[str]) -> bool:
    """Whether an environment value switches a feature on, in the spellings sglang accepts."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DispatchPlan:
    ranks: int
    layered: bool
    modes: tuple[str, ...]
    prefill_tokens_per_rank: int
    prefill_derivation: str
    ll_max_dispatch_tokens: int
    ll_max_dispatch_tokens_raw: Optional[str]
    graph_tokens_per_rank: Optional[int]  # None when no decode graph bounds the batch
    graph_derivation: str
    int8_dispatch: bool


def _prefill_tokens(s: LaunchSettings) -> tuple[int, str]:
    chunked = s.chunked_prefill_size
    note = ""
    if chunked is None:
        chunked = NPU_DEFAULT_CHUNKED_PREFILL
        note = " (sglang's NPU default, assumed)"
    attn_dp = max(1, s.attn_dp_size)
    if chunked > 0:
        per_dp_chunk = chunked // attn_dp
        batch = min(per_dp_chunk, s.max_prefill_tokens)
        dp_part = f" / attn-dp {attn_dp}" if attn_dp > 1 else ""
        how = f"min(chunked prefill {chunked}{note}{dp_part}, max prefill tokens {s.max_prefill_tokens})"
    else:
        batch = s.max_prefill_tokens
        how = f"max prefill tokens {s.max_prefill_tokens} (chunked prefill off)"
    scatter = max(1, s.tp_size // attn_dp)
    tokens = -(-batch // scatter)
    return tokens, f"{how} = {batch} tokens per DP rank, scattered over {scatter} attention-TP ranks -> {tokens}"


def _draft_tokens(s: LaunchSettings) -> tuple[int, str]:
    if not s.speculative:
        return 1, "1 token per request"
    if s.speculative_num_draft_tokens:
        return s.speculative_num_draft_tokens, f"{s.speculative_num_draft_tokens} draft tokens"
    if s.speculative_num_steps and (s.speculative_eagle_topk or 1) == 1:
        n = s.speculative_num_steps + 1
        return n, f"{n} draft tokens (steps + 1)"
    return DEFAULT_DRAFT_TOKENS, f"{DEFAULT_DRAFT_TOKENS} draft tokens (sglang's DeepSeek default, assumed)"


def _graph_tokens(s: LaunchSettings) -> tuple[Optional[int], str]:
    attn_dp = max(1, s.attn_dp_size)
    draft, draft_how = _draft_tokens(s)
    cap = max(1, s.max_running_requests // attn_dp) if s.max_running_requests else None
    if s.disable_cuda_graph:
        if cap is None:
            return None, "no decode CUDA graph and no --max-running-requests bound the decode batch"
        return cap * draft, f"max running requests per DP rank {cap} x {draft_how}"
    if s.cuda_graph_bs:
        bs, how = max(s.cuda_graph_bs), f"max CUDA-graph batch size {max(s.cuda_graph_bs)}"
    elif s.cuda_graph_max_bs:
        bs, how = s.cuda_graph_max_bs, f"CUDA-graph max batch size {s.cuda_graph_max_bs}"
    else:
        bs = NPU_DEFAULT_GRAPH_MAX_BS_SMALL_TP if s.tp_size < 4 else NPU_DEFAULT_GRAPH_MAX_BS
        how = f"CUDA-graph max batch size {bs} (sglang's NPU default, assumed)"
    if cap is not None and cap < bs:
        bs, how = cap, f"max running requests per DP rank {cap}"
    return bs * draft, f"{how} x {draft_how} = {bs * draft}"


def plan_dispatch(s: LaunchSettings, env: Mapping[str, str], hardware: str) -> DispatchPlan:
    ranks = max(1, s.tp_size)
    modes = dispatch_modes(s.deepep_mode)
    # A PD prefill instance never decodes and a decode instance never prefills, whatever auto would allow.
    if s.disaggregation_mode == "prefill":
        modes = tuple(m for m in modes if m == "normal") or modes
    elif s.disaggregation_mode == "decode":
        modes = tuple(m for m in modes if m == "low_latency") or modes
    prefill, prefill_how = _prefill_tokens(s)
    raw = env.get(LL_TOKENS_ENV)
    try:
        ll = int(raw) if raw else hb.LL_DEFAULT_MAX_DISPATCH_TOKENS_PER_RANK
    except ValueError:
        ll = hb.LL_DEFAULT_MAX_DISPATCH_TOKENS_PER_RANK
    graph, graph_how = _graph_tokens(s)
    quantized_output = s.deepep_dispatcher_output_dtype in ("int8", "fp8")
    int8 = quantized_output and not env_truthy(env.get("SGLANG_DEEPEP_BF16_DISPATCH"))
    return DispatchPlan(
        ranks=ranks,
        layered=hb.is_layered(hardware, ranks),
        modes=modes,
        prefill_tokens_per_rank=prefill,
        prefill_derivation=prefill_how,
        ll_max_dispatch_tokens=ll,
        ll_max_dispatch_tokens_raw=raw,
        graph_tokens_per_rank=graph,
        graph_derivation=graph_how,
        int8_dispatch=int8,
    )


def read_ant_moving(env: Mapping[str, str]) -> tuple[Optional[AntMoving], list[str]]:
    """(values, problems reading them). None with no problem means both unset."""
    r_raw, t_raw = env.get(ANT_ROUND), env.get(ANT_TOKENS)
    if not r_raw and not t_raw:
        return None, []
    if bool(r_raw) != bool(t_raw):
        missing = ANT_TOKENS if r_raw else ANT_ROUND
        return None, [
            f"only one of {ANT_ROUND}/{ANT_TOKENS} is set ({missing} is not); "
            "deep_ep.cpp asserts they are set together"
        ]
    try:
        return AntMoving(int(r_raw), int(t_raw)), []
    except ValueError:
        return None, [f"{ANT_ROUND}={r_raw!r} and {ANT_TOKENS}={t_raw!r} must be integers"]


def buffer_requirements(
    plan: DispatchPlan, hardware: str, shape: ModelShape, ant: Optional[AntMoving]
) -> dict[str, hb.Requirement]:
    """The HCCL buffer each dispatch mode of the plan needs, keyed by mode."""
    out = {}
    if "normal" in plan.modes:
        # The layered path has no ant-moving (its own check fails for that); size it as without.
        out["normal"] = hb.normal_requirement(
            hardware, shape, plan.ranks, plan.prefill_tokens_per_rank, None if plan.layered else ant
        )
    if "low_latency" in plan.modes:
        out["low_latency"] = hb.low_latency_requirement(
            hardware, shape, plan.ranks, max(1, plan.ll_max_dispatch_tokens), plan.int8_dispatch
        )
    return out
