"""What an sglang launch command says, as far as the Ascend preflight needs it.

Two ways in, one record out (:class:`LaunchSettings`):

* :func:`settings_from_server_args` reads a real sglang ``ServerArgs`` record by
  attribute (duck-typed, so this module never imports sglang). The launcher hook
  and the doctor (when sglang is importable) go this way, so both see exactly
  what sglang parsed.
* :func:`parse_tolerant` is an argparse over only the flags the checks need,
  ignoring everything else. The doctor uses it when sglang is not importable (a
  login node, a laptop) and when sglang's own parser rejects the command — the
  rejection is then reported as a failing check and the other checks still run.
  It accepts the spellings of older releases too (``--cuda-graph-bs``,
  ``--cuda-graph-max-bs``, ``--dp-size N --enable-dp-attention``), because the
  commands people bring to it were written for those.

Reading is kept free of defaults that depend on the device: the few the checks
need (chunked prefill size, decode CUDA-graph batch sizes) are filled in by
:mod:`.dispatch_plan`, which says in its messages when it assumed one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Optional, Sequence


@dataclass(frozen=True)
class LaunchSettings:
    model_path: str
    device: Optional[str] = None
    tp_size: int = 1
    dp_size: int = 1
    attn_dp_size: int = 1  # attention data-parallel groups (DP attention), 1 when off
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    moe_a2a_backend: str = "none"
    deepep_mode: str = "auto"
    deepep_dispatcher_output_dtype: str = "auto"
    ep_num_redundant_experts: int = 0
    chunked_prefill_size: Optional[int] = None
    max_prefill_tokens: int = 16384
    max_running_requests: Optional[int] = None
    cuda_graph_bs: tuple[int, ...] = ()
    cuda_graph_max_bs: Optional[int] = None
    disable_cuda_graph: bool = False
    speculative_algorithm: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_draft_model_path: Optional[str] = None
    speculative_draft_model_quantization: Optional[str] = None
    quantization: Optional[str] = None
    disaggregation_mode: str = "null"
    skip_preflight: bool = False
    # How the command was read: "sglang" (its real parser) or "tolerant".
    parsed_by: str = field(default="sglang", compare=False)

    @property
    def uses_deepep(self) -> bool:
        return self.moe_a2a_backend == "deepep"

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm) and self.speculative_algorithm.upper() not in ("NONE",)


def _int_or(value, default: Optional[int]) -> Optional[int]:
    return default if value is None else int(value)


def _attn_dp(dp_size: int, attn_dp_size: Optional[int], enable_dp_attention: bool) -> int:
    # sglang 0.5.23 spells DP attention `--attn-dp-size N`; older releases (and
    # the deprecated spelling it still accepts) say `--dp-size N --enable-dp-attention`.
    if attn_dp_size and attn_dp_size > 1:
        return attn_dp_size
    return dp_size if enable_dp_attention else 1


def settings_from_server_args(server_args, skip_preflight: bool = False,
                              model_path: Optional[str] = None) -> LaunchSettings:
    """Read a ServerArgs record (the raw values the user gave, as the fields hold them)."""
    get = lambda name, default=None: getattr(server_args, name, default)  # noqa: E731
    dp_size = int(get("dp_size", 1) or 1)
    # --cuda-graph-config (0.5.23) carries the same decode settings as the flat flags;
    # mid-resolution it is where handle_cuda_graph_config has folded them.
    decode_cfg = getattr(get("cuda_graph_config"), "decode", None)
    graph_bs = get("cuda_graph_bs_decode") or get("cuda_graph_bs") or getattr(decode_cfg, "bs", None) or ()
    graph_max_bs = get("cuda_graph_max_bs_decode", get("cuda_graph_max_bs")) or getattr(decode_cfg, "max_bs", None)
    disabled_backend = "disabled" in (get("cuda_graph_backend_decode"), getattr(decode_cfg, "backend", None))
    return LaunchSettings(
        model_path=str(model_path or get("model_path")),
        device=get("device"),
        tp_size=int(get("tp_size", 1) or 1),
        dp_size=dp_size,
        attn_dp_size=_attn_dp(dp_size, get("attn_dp_size"), bool(get("enable_dp_attention", False))),
        nnodes=int(get("nnodes", 1) or 1),
        node_rank=int(get("node_rank", 0) or 0),
        dist_init_addr=get("dist_init_addr"),
        moe_a2a_backend=str(get("moe_a2a_backend", "none") or "none"),
        deepep_mode=str(get("deepep_mode", "auto") or "auto"),
        deepep_dispatcher_output_dtype=str(get("deepep_dispatcher_output_dtype", "auto") or "auto"),
        ep_num_redundant_experts=int(get("ep_num_redundant_experts", 0) or 0),
        chunked_prefill_size=_int_or(get("chunked_prefill_size"), None),
        max_prefill_tokens=int(get("max_prefill_tokens", 16384) or 16384),
        max_running_requests=_int_or(get("max_running_requests"), None),
        cuda_graph_bs=tuple(int(b) for b in graph_bs),
        cuda_graph_max_bs=_int_or(graph_max_bs, None),
        disable_cuda_graph=bool(get("disable_cuda_graph", False))
        or bool(get("disable_decode_cuda_graph", False))
        or disabled_backend,
        speculative_algorithm=get("speculative_algorithm"),
        speculative_num_steps=_int_or(get("speculative_num_steps"), None),
        speculative_eagle_topk=_int_or(get("speculative_eagle_topk"), None),
        speculative_num_draft_tokens=_int_or(get("speculative_num_draft_tokens"), None),
        speculative_draft_model_path=get("speculative_draft_model_path"),
        speculative_draft_model_quantization=get("speculative_draft_model_quantization"),
        quantization=get("quantization"),
        disaggregation_mode=str(get("disaggregation_mode", "null") or "null"),
        skip_preflight=skip_preflight,
        parsed_by="sglang",
    )


def _tolerant_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an abbreviation we do not know must not be read as one we do.
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path")
    p.add_argument("--device")
    p.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--attn-dp-size", dest="attn_dp_size", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr")
    p.add_argument("--moe-a2a-backend", default="none")
    p.add_argument("--deepep-mode", default="auto")
    p.add_argument("--deepep-dispatcher-output-dtype", default="auto")
    p.add_argument("--ep-num-redundant-experts", type=int, default=0)
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--cuda-graph-bs", "--cuda-graph-bs-decode", dest="cuda_graph_bs", type=int, nargs="+")
    p.add_argument("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-decode-cuda-graph", action="store_true")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    p.add_argument("--speculative-draft-model-quantization")
    p.add_argument("--quantization")
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--edge-acc-skip-preflight", action="store_true")
    return p


class LaunchArgumentsError(ValueError):
    """The launch command cannot be read at all (e.g. no --model-path)."""


def parse_tolerant(argv: Sequence[str]) -> LaunchSettings:
    """Read the flags the checks need from ``argv``; unknown flags are ignored."""
    try:
        ns, _unknown = _tolerant_parser().parse_known_args(list(argv))
    except SystemExit:
        # argparse already printed why (e.g. `--tp abc`); say which command it was.
        raise LaunchArgumentsError("cannot read the launch arguments (see the message above)") from None
    if not ns.model_path:
        raise LaunchArgumentsError(
            "the launch arguments have no --model-path; pass the exact launch_server arguments after `--`")
    return LaunchSettings(
        model_path=ns.model_path,
        device=ns.device,
        tp_size=ns.tp_size,
        dp_size=ns.dp_size,
        attn_dp_size=_attn_dp(ns.dp_size, ns.attn_dp_size, ns.enable_dp_attention),
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        moe_a2a_backend=ns.moe_a2a_backend,
        deepep_mode=ns.deepep_mode,
        deepep_dispatcher_output_dtype=ns.deepep_dispatcher_output_dtype,
        ep_num_redundant_experts=ns.ep_num_redundant_experts,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        max_running_requests=ns.max_running_requests,
        cuda_graph_bs=tuple(ns.cuda_graph_bs or ()),
        cuda_graph_max_bs=ns.cuda_graph_max_bs,
        disable_cuda_graph=ns.disable_cuda_graph or ns.disable_decode_cuda_graph,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_draft_model_quantization=ns.speculative_draft_model_quantization,
        quantization=ns.quantization,
        disaggregation_mode=ns.disaggregation_mode,
        skip_preflight=ns.edge_acc_skip_preflight,
        parsed_by="tolerant",
    )
