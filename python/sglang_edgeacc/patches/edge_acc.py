"""Patch ``edge_acc``: the scheduler of an EdgeAcc launch (decode side and prefill side).

Installed only in processes of a launch with ``--enable-edge-acc`` (``SGLANG_EDGEACC=1``):
upstream's ``Scheduler`` is REPLACEd by the class of the process's side
(``edge_acc_server.roles``):
:class:`~sglang_edgeacc.edge_acc_server.decode_side.DecodeSideScheduler` or
:class:`~sglang_edgeacc.edge_acc_server.prefill_side.PrefillSideScheduler`.
On the prefill side only, four AROUND hooks build its pools and model on the decode
side's memory: the pool sizes, the meta-device loader, the KV buffers and the
request-to-token table. They read what was mapped from its one owner,
``shared_state.prefill_shared_state()``. A fifth marks its log lines as the
prefill side's (``configure_logger``).
Why it exists, and when it can be removed: the patch table in ``sglang_edgeacc/patches/__init__.py``.
"""

from __future__ import annotations

from sglang_edgeacc.edge_acc_server.roles import edge_acc_enabled, is_prefill_side
from sglang_edgeacc.patches._base import Patch, Target

SCHEDULER = "sglang.srt.managers.scheduler"
CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
LOADER = "sglang.srt.model_loader.loader"
KV_POOL = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool"
REQ_TO_TOKEN_POOL = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"


def _around_resolve_memory_pool_config(original, self, pre_model_load_memory):
    from sglang_edgeacc.edge_acc_server.shared_state import prefill_shared_state

    shared = prefill_shared_state()
    if shared is None or self.is_draft_worker:
        return original(self, pre_model_load_memory)
    # Same sizes as the decode side: the prefill side maps the decode side's
    # buffers into pools of exactly this shape.
    return shared.memory_pool_config


def _around_get_model_loader(original, load_config, model_config=None):
    from sglang_edgeacc.edge_acc_server.shared_state import prefill_shared_state

    shared = prefill_shared_state()
    if shared is None:
        return original(load_config, model_config)
    from sglang_edgeacc.edge_acc_server.shared_weights_loader import SharedWeightsLoader

    return SharedWeightsLoader(load_config, shared.weights())


def _around_create_kv_buffers(original, self):
    from sglang_edgeacc.edge_acc_server.shared_state import prefill_shared_state

    shared = prefill_shared_state()
    if shared is None:
        return original(self)
    # The decode side's buffers, in upstream's own k-then-v order: no allocation.
    self._assign_post_capture_tensors(shared.kv_buffers())


def _around_req_to_token_pool_init(original, self, *args, **kwargs):
    from sglang_edgeacc.edge_acc_server.shared_state import prefill_shared_state

    original(self, *args, **kwargs)
    state = prefill_shared_state()
    if state is None:
        return
    shared = state.req_to_token()
    private = self.req_to_token
    if shared.shape != private.shape or shared.dtype != private.dtype:
        raise RuntimeError(
            f"EdgeAcc: the prefill side's req_to_token {tuple(private.shape)} {private.dtype} does not match the "
            f"decode side's {tuple(shared.shape)} {shared.dtype}; both sides must size their pools alike"
        )
    # Before anything captures the table (the KV index translator, attention
    # backends, CUDA graphs): they must all read the rows the decode side writes.
    self.req_to_token = shared


# Added to upstream's per-process log prefix (" DP0 TP1" or "") in a prefill side.
PREFILL_LOG_MARK = " edgeacc-prefill"


def _around_configure_logger(original, server_args, prefix=""):
    # Every line this process logs after upstream configured it carries the mark,
    # upstream's own lines included, not only those EdgeAcc prefixes itself.
    return original(server_args, prefix=f"{prefix}{PREFILL_LOG_MARK}")


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # Each process is one side for its whole life (roles: the environment it was
    # spawned with), so it gets the scheduler class of that side only, and only a
    # prefill side builds its model and pools around its decode side's memory.
    if not is_prefill_side():
        from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler

        HookRegistry.register(f"{SCHEDULER}.Scheduler", DecodeSideScheduler, HookType.REPLACE)
        return
    from sglang_edgeacc.edge_acc_server.prefill_side import PrefillSideScheduler

    HookRegistry.register(f"{SCHEDULER}.Scheduler", PrefillSideScheduler, HookType.REPLACE)
    HookRegistry.register(
        f"{CONFIGURATOR}._resolve_memory_pool_config", _around_resolve_memory_pool_config, HookType.AROUND
    )
    HookRegistry.register(f"{LOADER}.get_model_loader", _around_get_model_loader, HookType.AROUND)
    HookRegistry.register(f"{KV_POOL}._create_buffers_normal", _around_create_kv_buffers, HookType.AROUND)
    HookRegistry.register(f"{REQ_TO_TOKEN_POOL}.__init__", _around_req_to_token_pool_init, HookType.AROUND)
    HookRegistry.register(f"{SCHEDULER}.configure_logger", _around_configure_logger, HookType.AROUND)


PATCH = Patch(
    name="edge_acc",
    summary="EdgeAcc decode/prefill sides as sglang schedulers; prefill side sized like its decode side",
    targets=(
        Target(f"{SCHEDULER}.Scheduler"),
        Target(f"{SCHEDULER}.Scheduler.init_ipc_channels", params=("self", "port_args")),
        Target("sglang.srt.managers.load_snapshot.ShmLoadSnapshotWriter.close", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.init_memory_pools", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.init_model_worker", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.run_event_loop", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.event_loop_overlap", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.event_loop_normal", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler._apply_war_barrier", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.launch_batch_sample_if_needed", params=("self", "batch_result", "cur_batch")),
        Target(f"{SCHEDULER}.Scheduler._reqs_finishing_inflight", params=("self", "batch")),
        Target(f"{SCHEDULER}.Scheduler.init_weight_updater", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.init_request_dispatcher", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.is_fully_idle", params=("self", "for_health_check", "ignore_waiting")),
        Target("sglang.srt.sampling.sampling_batch_info.SamplingBatchInfo.update_regex_vocab_mask", params=("self",)),
        Target("sglang.srt.constrained.base_grammar_backend.BaseGrammarObject"),
        Target(f"{SCHEDULER}.Scheduler.get_new_batch_prefill", params=("self", "running_batch")),
        Target(f"{SCHEDULER}.Scheduler.update_running_batch", params=("self", "batch")),
        Target(f"{SCHEDULER}.Scheduler.run_batch", params=("self", "batch", "pp_proxy_tensors")),
        Target(f"{SCHEDULER}.Scheduler.process_batch_result", params=("self", "batch", "result")),
        Target(f"{SCHEDULER}.Scheduler._relay_forward_payload",
               params=("self", "batch", "future_indices", "batch_result")),
        Target(f"{SCHEDULER}.Scheduler._copy_auxiliary_output_to_cpu", params=("self", "batch", "result")),
        Target(f"{SCHEDULER}.Scheduler.stash_chunked_request", params=("self", "req")),
        Target(f"{SCHEDULER}.Scheduler._collect_inflight_batches", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.process_pending_chunked_abort", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.update_cache_from_scheduler", params=("self", "schedule_batch", "batch_result")),
        Target(f"{SCHEDULER}.run_scheduler_process"),
        Target(f"{SCHEDULER}.configure_logger", params=("server_args", "prefix")),
        Target(f"{SCHEDULER}.Scheduler.get_internal_state", params=("self", "recv_req")),
        Target(f"{SCHEDULER}.Scheduler.handle_freeze_gc", params=("self", "recv_req")),
        Target(f"{SCHEDULER}.Scheduler.set_internal_state", params=("self", "recv_req")),
        Target("sglang.srt.managers.io_struct.SetInternalStateReqOutput"),
        Target("sglang.srt.utils.freeze_gc", params=("context", "gc_threshold")),
        Target("sglang.srt.managers.overlap_utils.resolve_forward_inputs", params=("batch", "future_map")),
        Target("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"),
        Target(f"{KV_POOL}._assign_post_capture_tensors", params=("self", "tensors")),
        Target(f"{KV_POOL}._create_buffers_normal", params=("self",)),
        Target(f"{REQ_TO_TOKEN_POOL}.__init__", params=("self", "size", "max_context_len", "device",
                                                        "enable_memory_saver")),
        Target("sglang.srt.model_executor.model_runner.ModelRunner.init_kv_index_translator", params=("self",)),
        Target(f"{LOADER}.get_model_loader", params=("load_config", "model_config")),
        Target(f"{LOADER}.BaseModelLoader"),
        Target(f"{LOADER}._initialize_model", params=("model_config", "load_config", "quant_config")),
        Target(f"{LOADER}._get_quantization_config"),
        Target("sglang.srt.model_loader.utils.set_default_torch_dtype", params=("dtype",)),
        Target(f"{CONFIGURATOR}._resolve_memory_pool_config", params=("self", "pre_model_load_memory")),
        Target("sglang.srt.server_args.PortArgs"),
    ),
    install=_install,
    applies=edge_acc_enabled,
)
