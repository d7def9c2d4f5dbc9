"""The Ascend (NPU) path: DeepEP's HCCL buffer model and the launch preflight.

* :mod:`.hccl_budget` — the HCCL buffer DeepEP (sgl-kernel-npu) needs, as the
  kernels compute it (standard library only; no torch, no sglang).
* :mod:`.budget_cli` — ``sglang-edgeacc hccl-budget``.
* :mod:`.launch_settings`, :mod:`.checkpoint`, :mod:`.preflight_checks` — what a
  launch command, its environment and its checkpoint say, and the checks over them.
* :mod:`.doctor` — ``sglang-edgeacc doctor -- <launch_server arguments>``.

The same checks run at server start with ``--device npu`` through
:mod:`sglang_edgeacc.patches.npu_preflight`.
"""
