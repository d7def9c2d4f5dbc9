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
  ``--edge-acc-sm-partition green-context`` on CUDA, it sets
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
  ``MHATokenToKVPool._create_buffers_normal``, ``ReqToTokenPool.__init__``
  and the scheduler module's ``configure_logger`` (AROUND); plus the scheduler,
  worker, loader and pool symbols the EdgeAcc scheduler calls or overrides
  (``Scheduler.get_internal_state``, ``set_internal_state`` and ``handle_freeze_gc``, which also freezes the prefill side's
  garbage collector, included), checked for their signatures. Installed only in processes of a launch with
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
  one (the prefill side checks every reader at start, attention backends
  nested in a hybrid, two-batch-overlap or multiplexed backend included: FA3
  keeps the table itself, FlashInfer and Triton the pool). Upstream's
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
  after capture or still loads weights during it). The prefill side's
  ``configure_logger`` hook appends `` edgeacc-prefill`` to the log prefix
  upstream computed for the process (`` DP0 TP1``, or none): upstream gives a
  prefill side the same prefix as its decode side, so their lines could not be
  told apart. The decode side adds an ``edge_acc`` entry to its answer to
  upstream's internal-state query (``get_internal_state``; ``/get_server_info``
  lists one answer per DP rank under ``internal_states``): EdgeAcc on, the SM
  split in effect on each side, and the pids of both sides of every rank of
  its attention-TP group, gathered once at start; it also takes the key
  ``edge_acc_itl_slo_ms`` of upstream's internal-state update (``set_internal_state``,
  ``/set_internal_state``): decode pacing's target, moved while the server runs, and the
  rest of the request to upstream (all keys accepted, or none). An abort looks where upstream
  keeps its in-flight batches (``_collect_inflight_batches``: the running and
  the last batch); the decode side adds the batch at its prefill side, whose
  requests then finish with the abort when its result is processed, as
  upstream's own prefill batch's do, and it runs upstream's
  ``process_pending_chunked_abort`` between prefill batches (never while a
  chunk of the aborted request is still being written). Removable
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
  Why: four kinds of request pass upstream's checks and then raise in the
  scheduler (the prefill side with EdgeAcc), which takes the server down and
  fails every later request: a prompt of zero tokens (``{"text": ""}`` with a
  tokenizer that adds no BOS, ``""`` in a batch of texts, ``[]`` in a batch of
  ``input_ids``; ``IndexError`` in the logits processor, seen on the CPU
  platform and on an H200, docs/testing.md; next to other prompts it is
  answered from another prompt's logits), a prompt token id outside
  ``[0, vocab_size)`` (``IndexError`` in the embedding on the CPU, a device-side
  assert on a GPU), ``top_logprobs_num`` (``top_logprobs`` / ``logprobs`` of
  the OpenAI routes) above the vocabulary size (``torch.topk`` out of range),
  and ``logprob_start_len`` below -1 with ``return_logprob`` (an assertion in
  the logprob result processor); a ``stop_regex`` that does not compile, which
  upstream's parser answers with a bare 500 ("Internal Server Error"), is
  refused with the parser's message as well. How: before upstream's checks, raises a
  ``ValueError`` subclass naming the field and the fix: the kind of error
  upstream raises for a prompt longer than the context, which the HTTP routes
  answer with a 400 and its message. No request upstream serves is refused: a
  session's empty prompt is left to upstream (its history may supply it), a
  multimodal request's ids are not range-checked (they may hold its processor's
  placeholders), and the largest valid values pass
  (``tests/cpu/test_bad_input.py``). Removable when upstream refuses these
  after tokenization: ``tests/cpu/test_bad_input.py`` serves an empty prompt
  with the patch switched off and sees the server exit.
* ``start_failure`` — target: ``http_server.launch_server`` (BEFORE),
  ``uvicorn.lifespan.on.LifespanOn.shutdown`` (BEFORE),
  ``http_server._wait_and_warmup`` (AROUND) and
  ``http_server._setup_and_run_http_server`` (BEFORE); launcher process only,
  every launch, with and without ``--enable-edge-acc`` (not with
  ``SGLANG_RUST_SERVER`` or on ``--node-rank`` > 0). Why: a failure during the
  start hung upstream's launcher or let it wait for minutes, its schedulers
  holding memory (and on a GPU the card): an HTTP port uvicorn cannot bind ends
  in a lifespan shutdown that joins the warmup thread, which polls the port for
  12 minutes (seen for more than 5, plain and EdgeAcc); a scheduler killed
  during start under ``--dp`` left the data-parallel controller waiting for its
  "ready" for good; a detokenizer that dies is noticed only once every
  scheduler is ready; a process whose parent died escapes the tree kill. How:
  a thread of the launcher (``server_start.start_guard``) follows every
  descendant until the warmup is done; when a server process ends, or uvicorn
  stops, before that, it logs the cause (which process and how it ended; for
  a port, which one and what to change), SIGKILLs every process the launcher
  started and exits with status 1, within a second or two. With
  ``--tokenizer-worker-num`` > 1 it hands over to upstream's subprocess
  watchdog when the HTTP server starts. Removable when upstream's launcher
  watches all its processes during the start and stops uvicorn's lifespan
  without waiting for the warmup: ``tests/cpu/test_server_start.py``.
* ``http_port`` — target: ``http_server.launch_server`` (AROUND),
  ``uvicorn.server.Server.startup`` (AROUND), and (BEFORE)
  ``uvicorn.config.Config.bind_socket``, ``http_server._run_granian_server``,
  ``http_server._reserve_reuseport_socket``; launcher process only, every
  launch (not with ``SGLANG_RUST_SERVER`` or on ``--node-rank`` > 0). Why:
  upstream binds the HTTP port only when uvicorn starts, after the whole start;
  meanwhile any ``bind(0)`` or outgoing connection may get it from the
  kernel's ephemeral range, the server's own gloo listeners included (about
  18 per scheduler process; seen with ``--tp 4 --dp 2 --enable-dp-attention
  --enable-edge-acc``, which took port 39341). How: the launcher listens on
  the port first (``server_start.port_hold``), which keeps every other bind and
  connection off it; a port in use ends the launch at once with the port and
  the fix; uvicorn then serves on the held sockets (no close and rebind, no
  window). HTTP servers that bind by themselves (tokenizer workers, HTTP/2,
  SO_REUSEPORT workers) get the port released just before. Removable when
  upstream binds its HTTP listener before it spawns the schedulers.
* ``shm_reclaim`` — target: ``engine._set_envs_and_config`` (BEFORE), the
  launcher's first step after logging is configured and before anything is
  spawned (every launch, ``Engine`` included). Why: a server killed whole (``kill
  -9`` of its process group, a container stop, the OOM killer) leaves its
  message-queue buffers (``sgl_shm_mq_*``, 24 MiB each), load-snapshot file and
  ``sem.mp-*`` semaphores in ``/dev/shm`` (Python's resource tracker, which
  would remove them, dies with it); a host restarting servers all day fills it.
  How: removes this user's entries of those families whose creating pid is gone
  that no process maps or holds open and that are a minute old (a ``/dev/shm``
  shared across containers may hold a starting server's fresh entries;
  ``server_start.shm_reclaim``), and logs how much it freed. Removable when upstream names its semaphores and
  segments so that its own start-up sweep can tell a live server's from a dead
  one's and runs it outside CI.
* ``decode_warmup`` — target: ``sglang.srt.entrypoints.warmup.warmup`` (the
  decorator that names a warm-up for ``--warmups``), used as upstream's own
  warm-ups use it; ``execute_warmups`` and ``TokenizerManager.get_internal_state``,
  ``generate_request`` and ``flush_cache`` are checked for their signatures; launcher process
  only. Why: a server's first decode step at a batch size it has not run stalls
  once for 100-200 ms inside the step's launch (seen on an H100, plain sglang
  and EdgeAcc alike), which a user's first burst sees as its worst inter-token
  gap. How: registers ``edge_acc_decode_batch_sizes``
  (``server_start.decode_warmup``), and the ``server_args`` patch adds it to an
  EdgeAcc launch's ``--warmups`` (not with ``--skip-server-warmup`` nor with
  several tokenizer workers). It asks each DP rank for its decode graph sizes
  (upstream's internal state), then sends one batched request whose i-th of n
  prompts is answered with i + 1 tokens, so the decode batch passes through every
  size from n down to one before the server listens, and flushes the prefix cache
  after it (``flush_cache``), so no prompt of a user finds the warm-up's.
  Removable when upstream warms its decode batch sizes at start.
* ``graph_input_copy`` — target: ``sglang.kernels.ops.memory.small_copy.try_small_copy``
  (REPLACE through ``HookRegistry``), called at run time by upstream's CUDA-graph input copy
  (``cuda_graph_buffer_registry._grouped_foreach_copy_`` and ``runner_utils.buffers``), both
  checked; installed only in processes of a launch with ``--enable-edge-acc``. Why: it launches
  a Triton kernel that Triton compiles once per specialization of its arguments (for pointers, by
  Triton's default, whether each is 16-byte aligned); a batch whose inputs specialize it anew
  compiles a kernel (``ptxas``) inside the decode step's launch. On an H100 the kernel compiled on
  its first call (1.6 s) and again, 154 ms, for sources one element off alignment; with the patch
  no call compiled (``tests/gpu/test_graph_input_copy_gpu.py``). Seen on an H100 in the decode
  loop's stack during a gap: 118 ms without a decode result at 16 running requests, a batch size
  the warm-up had run, every running request's worst gap (a stop of 172 ms at 16 in an earlier run,
  in the same part of the loop, is most likely the same; its stack was not taken); plain sglang
  takes the same path. How: the replacement declines every copy, so the callers take their own
  fallback, torch's foreach copy grouped by dtype pair (no kernel compiled at run time; a launch or
  two more per step). With it, the serving benchmark's 4 requests/s workload, where the stall had
  struck, ran on an H100 with no gap over 60 ms at the default target. Removable when upstream's
  small copy no longer specializes on pointer alignment, or compiles its variants at start.
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
    # start_failure before http_port: HookRegistry wraps in registration order, so the
    # port is held before the start guard runs (a taken port ends the launch at once).
    "sglang_edgeacc.patches.start_failure",
    "sglang_edgeacc.patches.http_port",
    "sglang_edgeacc.patches.shm_reclaim",
    "sglang_edgeacc.patches.decode_warmup",
    "sglang_edgeacc.patches.graph_input_copy",
)

_installed = False


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]


def install_all() -> None:
    """Verify every patch, then install those that apply to this process. Idempotent."""
    global _installed
    if _installed:
        return
    patches = [patch for patch in all_patches() if patch.belongs_here()]
    for patch in patches:
        verify(patch)
    for patch in patches:
        if patch.applies():
            patch.install()
    _installed = True


__all__ = ["Patch", "PatchMismatch", "all_patches", "install_all"]
