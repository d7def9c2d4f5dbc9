"""Preflight checks of a multi-node launch's environment: the A2 two-node HCCL settings and the socket interfaces."""

from __future__ import annotations

import re
from typing import Optional

from sglang_edgeacc.ascend.dispatch_plan import DispatchPlan
from sglang_edgeacc.ascend.launch_settings import LaunchSettings
from sglang_edgeacc.ascend.preflight_report import FAIL, PASS, CheckResult


def _shown(value: Optional[str]) -> str:
    return "not set" if value is None else repr(value)


def check_a2_two_node_env(s: LaunchSettings, env, plan: DispatchPlan, hardware: str) -> list[CheckResult]:
    two_node_a2 = hardware == "a2" and (plan.layered or s.nnodes > 1)
    ids = ("hccl-intra-pcie", "hccl-intra-roce", "hccl-op-expansion-mode")
    if not two_node_a2:
        return [CheckResult(i, PASS, "not a multi-node A2 launch") for i in ids]
    out = []
    pcie = env.get("HCCL_INTRA_PCIE_ENABLE")
    out.append(
        CheckResult(ids[0], PASS, "HCCL_INTRA_PCIE_ENABLE=1")
        if (pcie or "").strip() == "1"
        else CheckResult(
            ids[0], FAIL,
            f"HCCL_INTRA_PCIE_ENABLE={_shown(pcie)}: the A2 two-node DeepEP kernels need 1 "
            "(intra-server traffic over PCIe, the layered path)",
            "export HCCL_INTRA_PCIE_ENABLE=1",
        )
    )
    roce = env.get("HCCL_INTRA_ROCE_ENABLE")
    out.append(
        CheckResult(ids[1], PASS, "HCCL_INTRA_ROCE_ENABLE=0")
        if (roce or "").strip() == "0"
        else CheckResult(
            ids[1], FAIL,
            f"HCCL_INTRA_ROCE_ENABLE={_shown(roce)}: the A2 two-node DeepEP kernels need 0",
            "export HCCL_INTRA_ROCE_ENABLE=0",
        )
    )
    mode = env.get("HCCL_OP_EXPANSION_MODE")
    out.append(
        CheckResult(
            ids[2], FAIL,
            "HCCL_OP_EXPANSION_MODE=AIV is not supported by DeepEP on A2 (unknown operator errors)",
            "unset HCCL_OP_EXPANSION_MODE",
        )
        if (mode or "").strip().upper() == "AIV"
        else CheckResult(ids[2], PASS, f"HCCL_OP_EXPANSION_MODE={mode}" if mode else "HCCL_OP_EXPANSION_MODE not set")
    )
    return out


_LOOPBACK = re.compile(r"^=?lo\d*$")


def check_ifnames(s: LaunchSettings, env) -> list[CheckResult]:
    out = []
    for var in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        cid = var.lower().replace("_", "-")
        if s.nnodes <= 1:
            out.append(CheckResult(cid, PASS, "single node"))
            continue
        value = (env.get(var) or "").strip()
        fix = f"export {var}=<the NIC that reaches {s.dist_init_addr or 'the other node'}, e.g. eth0>"
        if not value:
            out.append(CheckResult(
                cid, FAIL,
                f"{var} is not set on a {s.nnodes}-node launch: the rendezvous may bind the wrong interface",
                fix,
            ))
        elif any(_LOOPBACK.match(part.strip()) for part in value.split(",")):
            out.append(CheckResult(
                cid, FAIL, f"{var}={value} names the loopback interface; the other node cannot reach it", fix
            ))
        else:
            out.append(CheckResult(cid, PASS, f"{var}={value}"))
    return out

