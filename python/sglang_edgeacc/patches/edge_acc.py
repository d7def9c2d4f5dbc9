"""Patch ``edge_acc``: the scheduler of an EdgeAcc launch (decode side and prefill side).

Installed only in processes of a launch with ``--enable-edge-acc`` (the
launcher exports ``SGLANG_EDGEACC=1`` once it has parsed the flags, and sglang
spawns its schedulers with that environment): upstream's ``Scheduler`` is
REPLACEd by :class:`EdgeAccScheduler`, and on the prefill side the KV pool
sizing step returns the decode side's sizes instead of profiling free memory.
Every other launch never loads this patch.
"""

from __future__ import annotations

from sglang_edgeacc.edge_acc_server.roles import edge_acc_enabled
from sglang_edgeacc.patches._base import Patch, Target

SCHEDULER = "sglang.srt.managers.scheduler"
CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"


def _around_resolve_memory_pool_config(original, self, pre_model_load_memory):
    from sglang_edgeacc.edge_acc_server.prefill_side import pending_memory_pool_config
    from sglang_edgeacc.edge_acc_server.roles import is_prefill_side

    decode_config = pending_memory_pool_config() if is_prefill_side() else None
    if decode_config is None or self.is_draft_worker:
        return original(self, pre_model_load_memory)
    # Same sizes as the decode side: the prefill side maps the decode side's
    # buffers into pools of exactly this shape.
    return decode_config


def _install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_edgeacc.edge_acc_server.scheduler import EdgeAccScheduler

    HookRegistry.register(f"{SCHEDULER}.Scheduler", EdgeAccScheduler, HookType.REPLACE)
    HookRegistry.register(
        f"{CONFIGURATOR}._resolve_memory_pool_config", _around_resolve_memory_pool_config, HookType.AROUND
    )


PATCH = Patch(
    name="edge_acc",
    summary="EdgeAcc decode/prefill sides as sglang schedulers; prefill side sized like its decode side",
    targets=(
        Target(f"{SCHEDULER}.Scheduler"),
        Target(f"{SCHEDULER}.Scheduler.init_memory_pools", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.init_model_worker", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.run_event_loop", params=("self",)),
        Target(f"{SCHEDULER}.Scheduler.get_new_batch_prefill", params=("self", "running_batch")),
        Target(f"{SCHEDULER}.Scheduler.update_running_batch", params=("self", "batch")),
        Target(f"{SCHEDULER}.Scheduler.run_batch", params=("self", "batch", "pp_proxy_tensors")),
        Target(f"{SCHEDULER}.Scheduler.process_batch_result", params=("self", "batch", "result")),
        Target(f"{SCHEDULER}.Scheduler._relay_forward_payload", params=("self", "batch", "future_indices", "batch_result")),
        Target(f"{SCHEDULER}.Scheduler._copy_auxiliary_output_to_cpu", params=("self", "batch", "result")),
        Target(f"{SCHEDULER}.Scheduler.stash_chunked_request", params=("self", "req")),
        Target(f"{SCHEDULER}.Scheduler.update_cache_from_scheduler", params=("self", "schedule_batch", "batch_result")),
        Target(f"{SCHEDULER}.run_scheduler_process"),
        Target("sglang.srt.managers.overlap_utils.resolve_forward_inputs", params=("batch", "future_map")),
        Target("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation"),
        Target("sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._assign_post_capture_tensors", params=("self", "tensors")),
        Target(f"{CONFIGURATOR}._resolve_memory_pool_config", params=("self", "pre_model_load_memory")),
        Target("sglang.srt.server_args.PortArgs"),
    ),
    install=_install,
    applies=edge_acc_enabled,
)
