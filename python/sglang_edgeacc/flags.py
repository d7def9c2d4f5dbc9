"""EdgeAcc's command-line flags and the typed view every process reads them through.

``ServerArgs`` is a sealed msgspec record: new fields cannot be added. The flags
are therefore parsed next to upstream's (see ``patches.server_args``) and kept
on the record as the non-field attribute ``_edge_acc``, which sglang's own
pickling carries to every spawned child. The value is an :class:`EdgeAccFlags`,
a frozen dataclass, so no process can change what the launcher decided.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Optional

from sglang_edgeacc.edge_acc.sm_partition import MPS_PRIORITIES, SM_PARTITION_MODES

ATTR = "_edge_acc"

# Retired flags and values: refused while parsing, each with what to do instead.
RETIRED_ADAPTIVE = (
    "--edge-acc-sm-partition adaptive was retired: the default split (mps) paces decode steps to "
    "--edge-acc-itl-slo-ms so the prefill side gets the GPU in decode's slack; drop the flag or pass mps"
)
RETIRED_TTFT_SLO = (
    "--edge-acc-ttft-slo-ms was retired with the adaptive split it steered: drop it; decode pacing "
    "follows --edge-acc-itl-slo-ms"
)


@dataclass(frozen=True)
class EdgeAccFlags:
    enable_edge_acc: bool = False
    edge_acc_prefill_sm_percent: int = 100
    edge_acc_decode_sm_percent: int = 100
    edge_acc_sm_partition: str = "mps"
    edge_acc_prefill_mps_priority: str = "below-normal"
    edge_acc_skip_preflight: bool = False
    edge_acc_itl_slo_ms: float = 50.0
    edge_acc_decode_pacing: str = "on"
    edge_acc_prefill_batches_in_flight: int = 2

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> "EdgeAccFlags":
        return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)})


def _sm_partition(value: str) -> str:
    """``--edge-acc-sm-partition``'s type: the retired mode is refused by name, the rest go to ``choices``."""
    if value == "adaptive":
        raise argparse.ArgumentTypeError(RETIRED_ADAPTIVE)
    return value


class _RetiredFlag(argparse.Action):
    """A flag that no longer exists: parsing stops with ``message``, whatever value follows it."""

    def __init__(self, option_strings, dest, message: str, **kwargs):
        self.message = message
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                         **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.message)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("EdgeAcc (sglang-edgeacc)")
    group.add_argument(
        "--enable-edge-acc",
        "--enable-semi-pd-disagg",
        dest="enable_edge_acc",
        action="store_true",
        help="Intra-GPU prefill/decode disaggregation: run a prefill side and a decode side "
        "per GPU, sharing weights and KV cache through CUDA IPC.",
    )
    group.add_argument(
        "--edge-acc-prefill-sm-percent",
        type=int,
        default=EdgeAccFlags.edge_acc_prefill_sm_percent,
        metavar="PCT",
        help="Share of the GPU's SMs the prefill side may use (1-100).",
    )
    group.add_argument(
        "--edge-acc-decode-sm-percent",
        type=int,
        default=EdgeAccFlags.edge_acc_decode_sm_percent,
        metavar="PCT",
        help="Share of the GPU's SMs the decode side may use (1-100).",
    )
    group.add_argument(
        "--edge-acc-sm-partition",
        type=_sm_partition,
        choices=SM_PARTITION_MODES,
        default=EdgeAccFlags.edge_acc_sm_partition,
        help="How the SMs are split between the two sides: mps (CUDA MPS thread percentages, the "
        "prefill side at --edge-acc-prefill-mps-priority, decode steps paced by --edge-acc-decode-pacing), "
        "green-context (a fixed share of SMs for the prefill side), or none (time-sliced).",
    )
    group.add_argument(
        "--edge-acc-prefill-mps-priority",
        choices=MPS_PRIORITIES,
        default=EdgeAccFlags.edge_acc_prefill_mps_priority,
        help="MPS client priority of the prefill side (the decode side is always normal): at below-normal "
        "the prefill side takes the SMs decode steps leave idle and yields them when a decode step waits.",
    )
    group.add_argument(
        "--edge-acc-itl-slo-ms",
        type=float,
        default=EdgeAccFlags.edge_acc_itl_slo_ms,
        metavar="MS",
        help="Inter-token latency target of decode pacing: while the prefill side has a batch, each "
        "decode step waits as long as its tokens can still come 0.9 of it after the last ones, given how "
        "long recent steps beside a prefill took, and the prefill side has the whole GPU meanwhile "
        "(--edge-acc-decode-pacing). While no prompt waits behind the prefill batch in flight the gap "
        "aims at 0.9 of 50 ms at most.",
    )
    group.add_argument(
        "--edge-acc-decode-pacing",
        choices=("on", "off"),
        default=EdgeAccFlags.edge_acc_decode_pacing,
        help="on: while the prefill side has a batch, a decode step that has slack against "
        "--edge-acc-itl-slo-ms waits, and the prefill side runs alone in the gap (first token sooner, "
        "inter-token gaps up to 0.9 of the target); off: decode steps always run back to back.",
    )
    group.add_argument("--edge-acc-ttft-slo-ms", action=_RetiredFlag, message=RETIRED_TTFT_SLO)
    group.add_argument(
        "--edge-acc-prefill-batches-in-flight",
        type=int,
        choices=(1, 2),
        default=EdgeAccFlags.edge_acc_prefill_batches_in_flight,
        help="Prefill batches the decode side may have handed over at once. At 2 the next batch is "
        "scheduled and handed over while the prefill side runs the current one (as upstream's overlap "
        "schedule schedules its next prefill), so a prompt does not wait in the queue for the batch "
        "before it to come back. Multi-rank groups and priority preemption use 1.",
    )
    group.add_argument(
        "--edge-acc-skip-preflight",
        action="store_true",
        help="Start even when the Ascend preflight (sglang-edgeacc doctor) finds a failing check.",
    )


def get_flags(server_args) -> EdgeAccFlags:
    """The EdgeAcc flags of a ServerArgs record (defaults when it was built without our parser)."""
    value: Optional[EdgeAccFlags] = getattr(server_args, "__dict__", {}).get(ATTR)
    return value if value is not None else EdgeAccFlags()


def attach_flags(server_args, flags: EdgeAccFlags) -> None:
    # Underscore non-field names are allowed on a sealed record and survive its pickling.
    setattr(server_args, ATTR, flags)
