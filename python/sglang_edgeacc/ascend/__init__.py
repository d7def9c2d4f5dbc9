"""The Ascend (NPU) path: DeepEP's HCCL buffer model and the launch preflight.

* :mod:`.hccl_budget` — the HCCL buffer DeepEP (sgl-kernel-npu) needs, as the
  kernels compute it (standard library only; no torch, no sglang).
* :mod:`.budget_cli` — ``sglang-edgeacc hccl-budget``.
* :mod:`.launch_settings`, :mod:`.checkpoint`, :mod:`.preflight_checks` — what a
  launch command, its environment and its checkpoint say, and the checks over them.
* :mod:`.dispatch_plan` — the tokens per rank each DeepEP dispatch mode carries
  for a launch, and the HCCL buffer that takes.
* :mod:`.preflight_report` — the per-check results and the report they make.
* :mod:`.doctor` — ``sglang-edgeacc doctor -- <launch_server arguments>``.

The same checks run at server start with ``--device npu`` through
:mod:`sglang_edgeacc.patches.npu_preflight`.
"""
