"""Every change sglang-edgeacc makes to upstream sglang, one module per area.

Each module defines ``PATCH``, a :class:`~sglang_edgeacc.patches._base.Patch`
that lists the upstream symbols it touches; :func:`install_all` verifies all of
them against the installed sglang before installing any, so a mismatch stops
the load naming the patch and the symbol. ``sglang-edgeacc patches`` prints the
same verification.

Patch table (target / why / how / when it can be removed)
=========================================================

One row per module of ``PATCH_MODULES`` (a test checks that every row exists).

* ``server_args`` — target: ``ServerArgs.add_cli_args`` and
  ``ServerArgs.from_cli_args`` (``sglang.srt.server_args``), both AROUND hooks
  through ``HookRegistry``. Why: ``ServerArgs`` is a sealed msgspec record, so
  EdgeAcc's flags cannot be new fields, and a launch EdgeAcc cannot serve must
  be refused before any model or device is touched. How: adds the "EdgeAcc
  (sglang-edgeacc)" argument group to upstream's parser (so ``launch_server``,
  ``sglang serve`` and ``--help`` all see the flags), then after upstream built
  the record validates the flags (``launch_validation``), attaches an
  ``EdgeAccFlags`` as the non-field attribute ``_edge_acc`` (carried to every
  child by sglang's pickling) and, with ``--enable-edge-acc``, prepares the
  launch environment (``launch_environment``). Before upstream builds the record, with
  ``--edge-acc-sm-partition green-context|adaptive`` on CUDA, it sets
  ``disable_prefill_cuda_graph`` (an explicit prefill graph backend is refused):
  a CUDA graph keeps the SMs of the stream it was captured on, so upstream's
  prefill graphs would escape the prefill side's green context. Removable when
  upstream lets a plugin declare extra server arguments and validate them.
* ``cpu_platform`` — target: the module constants ``forward_batch_info._is_cpu``
  and ``parallel_state._is_cpu``, ``dp_attention.memcpy`` (REPLACE) and
  ``TorchNativeAttnBackend``; installed only with ``SGLANG_PLATFORM=edgeacc_cpu``.
  Why: upstream ties "am I on the CPU" to its sgl-kernel CPU engine, not to the
  active platform, so on an out-of-tree CPU platform DP attention takes CUDA
  paths (pinned memory, a PrivateUse1-only all-gather op, a Triton copy
  kernel). How: rebinds the constants to True, replaces ``memcpy`` with
  upstream's own ``memcpy_cpu``, and gives the torch native backend the padding
  length its CUDA-graph path would use. Removable when upstream derives these
  from the platform (``get_platform()``) instead of ``SGLANG_USE_CPU_ENGINE``.
* ``edge_acc`` — target: ``sglang.srt.managers.scheduler.Scheduler`` (class
  REPLACE, by the scheduler class of the process's side); on the prefill side
  only, ``KVCacheConfigurator._resolve_memory_pool_config``,
  ``model_loader.loader.get_model_loader``,
  ``MHATokenToKVPool._create_buffers_normal`` and ``ReqToTokenPool.__init__``
  (AROUND); plus the scheduler,
  worker, loader and pool symbols the EdgeAcc scheduler calls, checked for
  their signatures. Installed only in processes of a launch with
  ``--enable-edge-acc`` (``SGLANG_EDGEACC=1``). Why: upstream has no intra-GPU
  prefill/decode split; each GPU needs a decode side that owns all memory state
  and a prefill side that only executes, without a second copy of weights or
  KV. How: each side is a subclass of upstream's scheduler, and a process
  gets the one of its side, known from its environment when the plugin loads
  (``edge_acc_server.roles``): ``DecodeSideScheduler`` (``decode_side``) or
  ``PrefillSideScheduler`` (``prefill_side``), with what both share in
  ``EdgeAccSchedulerBase``; the AROUND hooks are registered in prefill sides
  only and read what was mapped from its one owner
  (``shared_state.prefill_shared_state()``). The prefill side takes its decode
  side's pool sizes, builds its model on the meta device and binds the decode side's
  weights (``SharedWeightsLoader``), and builds its KV pool on the decode
  side's buffers with upstream's ``_assign_post_capture_tensors``. Its
  request-to-token pool takes the decode side's table as it is built: upstream
  hands the table to the KV index translator when the pool is built and to the
  attention backends and CUDA graphs after, and each keeps the tensor it was
  given, so a table swapped in later would leave them reading a private, empty
  one (the prefill side checks every reader at start). Upstream's
  ``run_event_loop`` still runs (schedule stream, WAR barrier, accounting); the
  two loops it dispatches to, ``event_loop_overlap`` and ``event_loop_normal``,
  are the EdgeAcc loops of the side. Request grammars cross to the prefill side
  as the vocab mask the decode side filled. The decode side's weight-updater
  component is wrapped (``init_weight_updater``, before the request dispatcher
  binds it) to check that updates stay in the memory the prefill side maps. The
  prefill side closes upstream's load-snapshot writer (``init_ipc_channels``) and
  removes its ``/dev/shm/sglang_loads_*`` file: it has an instance id of its own,
  nobody reads its load, and upstream never unlinks the file. In
  ``init_all_cuda_graphs`` each side turns off the CUDA graph phase it never
  runs (decode side: prefill graphs; prefill side: decode graphs) through
  upstream's resolved-config override, for its own process only, and the
  decode side spawns its prefill side there, before capturing, so the two
  captures overlap (after capture instead when upstream resizes the KV pool
  after capture or still loads weights during it). Removable
  when upstream ships intra-GPU P/D disaggregation (or a scheduler extension
  point that carries it).
* ``npu_preflight`` — target: resolution step ``handle_npu_backends``
  (``sglang.srt.arg_groups.platform_hook``) through ``register_resolution_hook``.
  Why: Ascend launches with DeepEP hang at "Capturing batches" or die in
  ``aclnnDispatchNormalA2`` when HCCL_BUFFSIZE is too small, ant-moving is set on
  the A2 two-node path, or NEXTN/EAGLE runs on a checkpoint without (matching)
  MTP weights. How: with ``--device npu`` only, runs the ``sglang-edgeacc doctor``
  checks before the built-in step, stops the launch on a failing check (unless
  ``--edge-acc-skip-preflight``) and exports ``DEEPEP_HCCL_BUFFSIZE`` when no
  buffer is set. Removable when upstream validates DeepEP's buffer and the MTP
  layer at argument resolution.
* ``request_validation`` — target: ``TokenizerManager._validate_one_request``
  (``sglang.srt.managers.tokenizer_manager``), a BEFORE hook through
  ``HookRegistry``; installed in every launch, with and without
  ``--enable-edge-acc`` (it changes request handling, not argument resolution).
  Why: a prompt of zero tokens (``{"text": ""}`` with a tokenizer that adds no
  BOS, ``""`` in a batch of texts, ``[]`` in a batch of ``input_ids``) passes
  upstream's checks, and its forward has no last position to take logits from:
  alone, it kills the scheduler (the prefill side with EdgeAcc) with an
  ``IndexError`` in the logits processor and every later request fails (seen
  on the CPU platform and on an H200, docs/testing.md); next
  to other prompts, it is answered from another prompt's logits. How: before
  upstream's checks, raises a ``ValueError`` (``EmptyPromptError``) for empty
  token ids outside a session: the kind of error upstream raises for a prompt
  longer than the context, which the HTTP routes answer with a 400 and its
  message. So in both modes a crash (or a wrong answer) becomes a 400; no
  request upstream serves correctly is refused. A session's request is left to
  upstream, whose history may supply the prompt. Removable when upstream
  refuses empty prompts after tokenization: ``tests/cpu/test_bad_input.py``
  serves the same request with the patch switched off and sees the server exit.
"""

from __future__ import annotations

import importlib
import logging

from sglang_edgeacc.patches._base import Patch, PatchMismatch, verify

logger = logging.getLogger(__name__)

PATCH_MODULES: tuple[str, ...] = (
    "sglang_edgeacc.patches.server_args",
    "sglang_edgeacc.patches.cpu_platform",
    "sglang_edgeacc.patches.edge_acc",
    "sglang_edgeacc.patches.npu_preflight",
    "sglang_edgeacc.patches.request_validation",
)

_installed = False


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]


def install_all() -> None:
    """Verify every patch, then install those that apply to this process. Idempotent."""
    global _installed
    if _installed:
        return
    patches = all_patches()
    for patch in patches:
        verify(patch)
    for patch in patches:
        if patch.applies():
            patch.install()
    _installed = True


__all__ = ["Patch", "PatchMismatch", "all_patches", "install_all"]
