"""The Ascend (NPU) path: DeepEP's HCCL buffer model and the launch preflight.

* :mod:`.hccl_budget` — the HCCL buffer DeepEP (sgl-kernel-npu) needs, as the
  kernels compute it, from the inputs in :mod:`.dispatch_inputs` (model shape,
  ant-moving); :mod:`.buffer_setting` — the buffer a launch sets, and what
  automatic sizing exports (standard library only; no torch, no sglang).
* :mod:`.budget_cli` — ``sglang-edgeacc hccl-budget``.
* :mod:`.launch_settings`, :mod:`.checkpoint` — what a launch command, its
  environment and its checkpoint say.
* :mod:`.preflight_checks` — runs the checks over them, one module per family:
  :mod:`.setup_checks`, :mod:`.speculative_checks`, :mod:`.dispatch_checks`,
  :mod:`.network_checks`.
* :mod:`.dispatch_plan` — the tokens per rank each DeepEP dispatch mode carries
  for a launch, and the HCCL buffer that takes.
* :mod:`.preflight_report` — the per-check results and the report they make.
* :mod:`.doctor` — ``sglang-edgeacc doctor -- <launch_server arguments>``.

The same checks run at server start with ``--device npu`` through
:mod:`sglang_edgeacc.patches.npu_preflight`.
"""
