"""The pieces of upstream's scheduler methods that the decode side runs itself.

The decode side cannot call ``Scheduler.run_batch`` or
``Scheduler.get_next_batch_to_run`` whole: its prefill forward runs in another
process, and it schedules prefill and decode batches at different points of its
loop. What it still needs of those methods is kept here, one small function per
piece, each naming the upstream function it follows (at the pinned
``sglang==0.5.23``) and what it leaves out. Each function calls upstream's own
helpers; only the glue between them is repeated.

``tests/cpu/test_upstream_mirror.py`` runs upstream's method and the piece here on
the same kind of real objects and compares what each leaves behind, so a pin
bump that changes upstream's side of one of them fails there.
"""

from __future__ import annotations

import time


def before_forward(scheduler, batch) -> None:
    """``sglang.srt.managers.scheduler.Scheduler.run_batch``: its bookkeeping before the forward.

    Counts the batch as a forward of this scheduler (``forward_ct``, the batch's
    ``forward_iter``, ``launch_ts``, ``after_idle_gap`` from ``_sched_idled``),
    adds its prompt tokens to ``processed_tokens_counter`` (the HRRN policy reads
    it) and materializes its ``input_ids`` with ``resolve_forward_inputs``, as
    the non-overlap branch does right before ``forward_batch_generation``.

    Left out, because the forward runs in the prefill side and not here: the
    scheduler-active mark of ``metrics_reporter``, the profiler's per-batch step,
    the scripted-runtime test hook and ``/slow_down``'s sleep (the decode steps'
    own ``run_batch`` keeps all four); the overlap branch's stream handling (a
    fence replaces it: ``PrefillLink.signal_inputs``). Split prefill (only with
    ``--enable-pdmux``) and PD disaggregation are refused with EdgeAcc, so their
    branches are left out too.
    """
    from sglang.srt.managers.overlap_utils import resolve_forward_inputs

    scheduler.forward_ct += 1
    batch.forward_iter = scheduler.forward_ct
    batch.launch_ts = time.monotonic()
    batch.after_idle_gap = scheduler._sched_idled
    scheduler._sched_idled = False
    if batch.extend_num_tokens:
        scheduler.processed_tokens_counter += batch.extend_num_tokens
    resolve_forward_inputs(batch, scheduler.future_map)


def after_forward(scheduler, batch, result) -> None:
    """``sglang.srt.managers.scheduler.Scheduler.run_batch``: its non-overlap, non-speculative
    branch after ``forward_batch_generation``, with ``result`` built from the prefill side's reply.

    Relays the sampled tokens through the future map (``_relay_forward_payload``),
    drops ``input_ids``, calls ``update_cache_from_scheduler`` and
    ``_copy_auxiliary_output_to_cpu``, and keeps on the result the two per-request
    lists that result processing reads after the batch has changed
    (``extend_input_len_per_req``, ``extend_logprob_start_len_per_req``).

    Left out: the ``has_sampled_token_ids`` test before the relay and the
    ``forward_mode.is_extend()`` test before ``extend_input_len_per_req``: a reply
    always carries sampled tokens, of an extend batch. The unified-cache external
    linker's load check and the elastic-EP rank report after the forward: neither
    runs beside EdgeAcc's own loop.
    """
    scheduler._relay_forward_payload(batch, batch.req_pool_indices, result)
    batch.input_ids = None
    scheduler.update_cache_from_scheduler(batch, result)
    scheduler._copy_auxiliary_output_to_cpu(batch, result)
    keep = batch.return_logprob or batch.return_hidden_states
    result.extend_input_len_per_req = list(batch.extend_lens) if keep else None
    result.extend_logprob_start_len_per_req = batch.extend_logprob_start_lens if batch.return_logprob else None


def merge_prefilled(scheduler, batch) -> None:
    """``sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run``: the merge of a
    finished prefill batch (upstream's ``last_batch``) into the running batch.

    The request being chunked is kept out of the merge and, when this chunk
    computed new KV, checkpointed with ``stash_chunked_request``; the batch's own
    ``chunked_req`` is kept out too; finished requests are dropped
    (``filter_batch``), and what is left joins the running batch (or becomes it).

    This side's rule, not upstream's: the running batch's ``batch_is_full`` is
    cleared after every merge that adds requests, where upstream clears it only
    when filtering dropped a request of the prefill batch, empty or not. The test
    pins both rules. It is an admission policy: under KV pressure upstream, once
    a batch filled the pool's reservation, admits nothing more until a running
    request leaves, while this side tries again after each batch it merged and
    admits what the reservation (upstream's own, shrinking as running requests
    generate) lets in; a try that admits nothing sets the flag until a request
    leaves, as upstream's does (docs/architecture.md, "Admission under KV pressure").

    Left out: the dLLM staging queue, HiSparse's own prefill-to-decode hand-off
    and the ``last_batch is not running_batch`` guard for a running batch that DP
    attention converted to extend (this side never converts one, see
    :func:`next_decode_batch`). Upstream runs the merge at the start of its next
    scheduling step; this side runs it as soon as the prefill result is
    processed, which is the same point relative to the next
    ``get_new_batch_prefill``.
    """
    exclude = []
    chunked = scheduler.chunked_req
    if chunked is not None:
        exclude.append(chunked)
        if chunked.extend_end > chunked.prefix_len:
            scheduler.stash_chunked_request(chunked)
    if batch.chunked_req is not None:
        exclude.append(batch.chunked_req)
    batch.filter_batch(reqs_to_exclude=exclude)
    if batch.is_empty():
        return
    if scheduler.running_batch.is_empty():
        scheduler.running_batch = batch
    else:
        scheduler.running_batch.merge_batch(batch)
    scheduler.running_batch.batch_is_full = False


def next_decode_batch(scheduler):
    """``sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run``: its decode part.

    Drops the running batch's finished requests (every step, clearing
    ``batch_is_full`` when one left), gets the decode batch from
    ``update_running_batch`` unless the running batch is empty or prefill-only,
    and hands it to DP attention's MLP sync, which gives an idle rank an IDLE
    batch so that every rank of the group enters the same collective.

    Left out: the prefill part (``_should_defer_prefill``, ``get_new_batch_prefill``
    and the speculative DP pre-sync): this side schedules prefill batches apart,
    in its hand-off, which also runs ``process_pending_chunked_abort`` (only while no
    prefill batch is in flight). Not run on this side at all: ``_process_hicache_events``
    (hierarchical-cache events). After the MLP sync:
    ``maybe_convert_decode_to_extend`` (it converts only when a peer rank runs an
    extend in the same step, and decode sides never do), the prefill-decode
    interval (``_arm_prefill_decode_interval``; nothing here defers a prefill), the
    n-gram embedding tables (``ngram_embedding_manager.prepare_for_forward``) and
    the tracing timestamp (``set_schedule_time_batch``).
    """
    running = scheduler.running_batch
    before = running.batch_size()
    running.filter_batch()
    if running.batch_size() < before:
        running.batch_is_full = False
    batch = None
    if not running.is_empty() and not running.is_prefill_only:
        decode = scheduler.update_running_batch(running)
        batch = decode if decode is not None and not decode.is_empty() else None
    return scheduler.dp_attn_adapter.maybe_prepare_mlp_sync_batch(batch, need_sync=scheduler.require_mlp_sync)
