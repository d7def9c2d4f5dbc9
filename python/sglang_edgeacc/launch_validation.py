"""Refuse, at argument-parsing time, the launches EdgeAcc cannot serve.

Each rule names the flag the user typed and what to do instead; the error is
raised before any model, device or process is touched. What an accepted launch
then sets up in the launcher's environment is :mod:`sglang_edgeacc.launch_environment`.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

from sglang_edgeacc.flags import EdgeAccFlags

logger = logging.getLogger(__name__)


class EdgeAccConfigError(SystemExit):
    """A launch EdgeAcc refuses; exits non-zero with the message on stderr."""

    def __init__(self, message: str):
        super().__init__(f"sglang-edgeacc: error: {message}")


@dataclass(frozen=True)
class Rule:
    flag: str
    broken: Callable[[argparse.Namespace], bool]
    why_and_fix: str


# Combinations that contradict the design (one decode side owns all state and
# schedules; one prefill side per GPU executes what it is sent).
_DESIGN_RULES: tuple[Rule, ...] = (
    Rule("--nnodes", lambda a: a.nnodes > 1,
         "the prefill and decode sides share memory through CUDA IPC, which does not cross hosts. "
         "Run one server per node (use --dp with a router), or drop --enable-edge-acc."),
    Rule("--pp-size", lambda a: a.pp_size > 1,
         "pipeline parallelism is not supported with EdgeAcc. Use --tp (and --dp), or drop --enable-edge-acc."),
    Rule("--disaggregation-mode", lambda a: a.disaggregation_mode in ("prefill", "decode"),
         "EdgeAcc already splits prefill and decode inside each GPU; it cannot also be one role of a "
         "cross-node PD deployment. Drop --disaggregation-mode or --enable-edge-acc."),
    Rule("--enable-pdmux", lambda a: a.enable_pdmux,
         "PD-multiplexing splits SMs inside one process; EdgeAcc splits them between two processes. "
         "Choose one of --enable-pdmux and --enable-edge-acc."),
    Rule("--speculative-algorithm", lambda a: a.speculative_algorithm is not None,
         "speculative decoding is not supported with EdgeAcc: the prefill side has no draft model. "
         "Drop --speculative-algorithm or --enable-edge-acc."),
    Rule("--enable-mixed-chunk", lambda a: a.enable_mixed_chunk,
         "with EdgeAcc every prefill runs on the prefill side, so there is nothing to mix into decode "
         "batches. Drop --enable-mixed-chunk."),
    Rule("--enable-memory-saver", lambda a: a.enable_memory_saver,
         "memory-saver allocations cannot be exported through CUDA IPC to the prefill side. "
         "Drop --enable-memory-saver or --enable-edge-acc."),
    Rule("--is-embedding", lambda a: bool(getattr(a, "is_embedding", False)),
         "an embedding or reward model only runs prefill, so there is no decode to protect. "
         "Drop --enable-edge-acc."),
    Rule("--enable-lora", lambda a: bool(a.enable_lora) or bool(getattr(a, "lora_paths", None)),
         "LoRA adapters are not shared with the prefill side yet. Drop the LoRA flags or --enable-edge-acc."),
    Rule("--enable-hierarchical-cache", lambda a: bool(getattr(a, "enable_hierarchical_cache", False)),
         "a prefix loaded back from host memory is written on the decode side's load stream, and the forward "
         "waits for it layer by layer through events of that process; the prefill side's forward, in another "
         "process, would read the prefix before it lands. Drop --enable-hierarchical-cache or --enable-edge-acc."),
)


# Attention backends EdgeAcc cannot run, by why. The rest are checked at start instead: every holder
# of the request table must be the decode side's (``edge_acc_server.table_readers``).
MLA_ATTENTION_BACKENDS = frozenset({"flashmla", "trtllm_mla", "cutedsl_mla", "dsa", "nsa", "dsv4"})
OTHER_ACCELERATOR_BACKENDS = frozenset({"aiter", "wave", "ascend", "intel_amx", "intel_xpu"})
ATTENTION_BACKEND_FLAGS = (("--attention-backend", "attention_backend"),
                           ("--prefill-attention-backend", "prefill_attention_backend"),
                           ("--decode-attention-backend", "decode_attention_backend"))


def _attention_backend_rules() -> tuple[Rule, ...]:
    rules = []
    for flag, attr in ATTENTION_BACKEND_FLAGS:
        rules.append(Rule(
            flag, lambda a, attr=attr: getattr(a, attr, None) in MLA_ATTENTION_BACKENDS,
            "that backend serves models with a latent (MLA) KV cache, and EdgeAcc shares MHA-style K/V "
            "buffers between its two sides only. Serve the model without --enable-edge-acc."))
        rules.append(Rule(
            flag, lambda a, attr=attr: getattr(a, attr, None) in OTHER_ACCELERATOR_BACKENDS,
            "that backend runs on AMD, Intel or Ascend hardware, and EdgeAcc's two sides share memory "
            "through CUDA IPC and split the SMs with CUDA MPS, on NVIDIA GPUs only. Drop --enable-edge-acc "
            "(on Ascend, `sglang-edgeacc doctor` checks the launch)."))
    return tuple(rules)


EDGE_ACC_RULES: tuple[Rule, ...] = (*_DESIGN_RULES, *_attention_backend_rules())


def _check_percent(flag: str, value: int) -> Optional[str]:
    if 1 <= value <= 100:
        return None
    return f"{flag} {value} is outside 1..100: give the share of the GPU's SMs that side may use, e.g. {flag} 80."


def validate_launch(flags: EdgeAccFlags, args: argparse.Namespace) -> None:
    for flag, value in (
        ("--edge-acc-prefill-sm-percent", flags.edge_acc_prefill_sm_percent),
        ("--edge-acc-decode-sm-percent", flags.edge_acc_decode_sm_percent),
    ):
        problem = _check_percent(flag, value)
        if problem:
            raise EdgeAccConfigError(problem)
    if not flags.edge_acc_itl_slo_ms > 0:
        raise EdgeAccConfigError(
            f"--edge-acc-itl-slo-ms {flags.edge_acc_itl_slo_ms} must be a positive number of milliseconds.")
    if not flags.enable_edge_acc:
        return
    for rule in EDGE_ACC_RULES:
        if rule.broken(args):
            value = getattr(args, rule.flag.lstrip("-").replace("-", "_"), None)
            shown = f"{rule.flag} {value}" if isinstance(value, str) else rule.flag
            raise EdgeAccConfigError(f"--enable-edge-acc with {shown}: {rule.why_and_fix}")


def on_cpu_platform(args: argparse.Namespace) -> bool:
    """Whether this launch runs on the CPU, where no SM split or CUDA graph applies."""
    from sglang_edgeacc.platform import is_selected

    return is_selected() or getattr(args, "device", None) == "cpu" or os.environ.get("SGLANG_USE_CPU_ENGINE") == "1"


def _prefill_graph_backend_asked(args: argparse.Namespace) -> Optional[str]:
    """The prefill CUDA graph backend the user chose, by flag or in --cuda-graph-config; None if left default.

    Upstream's argparse type (``parse_cuda_graph_config_arg``) has already turned
    ``--cuda-graph-config`` into a dict of phase settings.
    """
    chosen = getattr(args, "cuda_graph_backend_prefill", None)
    raw = getattr(args, "cuda_graph_config", None)
    if isinstance(raw, dict) and isinstance(raw.get("prefill"), dict) and raw["prefill"].get("backend"):
        chosen = raw["prefill"]["backend"]
    return None if chosen is None else str(chosen)


def keep_prefill_graphs_inside_green_contexts(flags: EdgeAccFlags, args: argparse.Namespace) -> None:
    """Before upstream resolves its CUDA graph config: no prefill graphs where a green context confines prefill.

    A CUDA graph's kernels run on the SMs of the stream it was *captured* on, not the
    stream it is replayed on (H200: a decode graph captured outside a 16-SM green context
    and replayed on it ran at whole-GPU speed, 13.9 ms against 50 ms).
    Upstream does not capture its prefill graphs on the prefill side's green-context
    stream, so they would escape the split. The prefill side therefore runs eager
    under ``--edge-acc-sm-partition green-context``: the default graph is turned
    off here, an explicit one is refused.
    """
    if not flags.enable_edge_acc or flags.edge_acc_sm_partition != "green-context":
        return
    if on_cpu_platform(args):
        return
    asked = _prefill_graph_backend_asked(args)
    if asked is not None and asked != "disabled":
        raise EdgeAccConfigError(
            f"--enable-edge-acc --edge-acc-sm-partition {flags.edge_acc_sm_partition} with prefill CUDA graphs "
            f"(--cuda-graph-backend-prefill {asked}): a CUDA graph runs on the SMs of the stream it was captured "
            f"on, so graphs captured outside the prefill side's green context would escape it. "
            f"Use --cuda-graph-backend-prefill disabled, or --edge-acc-sm-partition mps to keep prefill graphs."
        )
    if not getattr(args, "disable_prefill_cuda_graph", False):
        args.disable_prefill_cuda_graph = True
        logger.info(
            "[edgeacc] --edge-acc-sm-partition %s: prefill CUDA graphs off (green contexts confine only work "
            "launched on their streams; a graph keeps the SMs of the stream it was captured on)",
            flags.edge_acc_sm_partition,
        )
