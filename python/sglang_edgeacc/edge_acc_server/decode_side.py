"""The decode side: upstream's scheduler, with every prefill forward handed to the prefill side.

Scheduling is upstream's own (``get_new_batch_prefill`` admits, matches
prefixes, chunks and allocates; ``update_running_batch`` decodes and retracts).
What changes is the loop: a prefill batch is sent to the prefill side instead
of being run here, and decode steps go on while it runs (pipelined as in
upstream's overlap loop when the overlap schedule is on). Up to two prefill
batches are in flight: the next one is scheduled and sent while the prefill
side runs the current one, as upstream's overlap schedule launches its next
prefill before the current one's result is processed. Each result is processed
exactly as upstream processes a prefill it ran itself, then merged into the
running batch. Everything about the prefill side itself (its process, the
channel, the fence, the batches in flight) is the
:class:`~sglang_edgeacc.edge_acc_server.prefill_link.PrefillLink`'s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from typing import Optional

import torch
from sglang.srt.runtime_context import get_device, get_model, get_parallel

from sglang_edgeacc.edge_acc_server import pacing_target, roles, upstream_mirror
from sglang_edgeacc.edge_acc_server.batch_codec import PrefillBatchNotSendable, UnsendablePart, pack_prefill_batch
from sglang_edgeacc.edge_acc_server.decode_pacing import DecodePacer
from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStepClock, GcTimer
from sglang_edgeacc.edge_acc_server.graph_phases import skip_unused_graph_phase
from sglang_edgeacc.edge_acc_server.long_gaps import LongGapLog
from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats
from sglang_edgeacc.edge_acc_server.prefill_link import InflightPrefill, PrefillLink
from sglang_edgeacc.edge_acc_server.messages import PrefillResult
from sglang_edgeacc.edge_acc_server.scheduler import EdgeAccSchedulerBase
from sglang_edgeacc.edge_acc_server.server_info import (
    decode_side_split,
    edge_acc_entry,
    gather_pairs,
    pacing_entry,
    pacing_said,
    startup_line,
)
from sglang_edgeacc.flags import get_flags

logger = logging.getLogger(__name__)

# While a prefill is in flight and there is nothing to decode, wait on the
# channel (and the request sockets) rather than spin.
IDLE_WAIT_MS = 5


def prefill_batches_in_flight(requested: int, *, replies_taken_alone: bool, mlp_sync: bool,
                              priority_preemption: bool) -> tuple[int, str]:
    """How many prefill batches the decode side may have in flight, and why not more when fewer than asked.

    A second batch is scheduled while the first one's requests are in no queue and no
    running batch; the scheduling sees them as upstream's overlap schedule sees its
    prefill in flight (:meth:`DecodeSideScheduler._edge_admission_counts_inflight`). Where
    that view is not enough, one batch at a time: the ranks of a group take replies in
    lockstep (a second batch would need their agreement on every dispatch too), and
    priority preemption may evict a running request by index from the batch the view
    extends. The prefill side runs every batch on one stream, the green-context one too,
    so a batch never overtakes the KV writes of the one before it.
    """
    if requested <= 1:
        return 1, "--edge-acc-prefill-batches-in-flight 1"
    if not replies_taken_alone or mlp_sync:
        return 1, "the ranks of the group take prefill replies together"
    if priority_preemption:
        return 1, "--enable-priority-scheduling preempts running requests while scheduling"
    return requested, ""


def fail_unsendable_requests(reqs, parts: tuple[UnsendablePart, ...], log_prefix: str) -> list:
    """Mark the requests that hold ``parts`` to finish with a 400 naming the part; returns them.

    A part of the batch itself (no request holds it) fails every request of the batch.
    """
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    batch_wide = [p for p in parts if p.req_index is None]
    failed = []
    for index, req in enumerate(reqs):
        own = [p for p in parts if p.req_index == index] + batch_wide
        if not own:
            continue
        where = ", ".join(f"{p.path} ({p.type_name})" for p in own)
        logger.error("%s request %s cannot be handed to the prefill side, failing it: cannot pickle %s",
                     log_prefix, req.rid, where)
        req.to_finish = FINISH_ABORT(
            f"EdgeAcc cannot hand this request to its prefill side: {where} cannot be pickled "
            "(the prefill side is another process). Send the request without it, or serve without "
            "--enable-edge-acc.", HTTPStatus.BAD_REQUEST, "BadRequestError")
        failed.append(req)
    return failed


def prefill_start_after_capture(*, pool_resized_after_capture: bool, weights_load_during_capture: bool,
                                torch_compile: bool) -> Optional[str]:
    """Why the prefill side starts only after the decode side captured its graphs (None: it starts before).

    It starts before where it can: its own start (mapping, capturing its prefill graphs) then overlaps
    this side's capture. Not where what it maps is not final until upstream's capture is over, nor
    under torch.compile, where upstream times kernel configs on the device while it captures: a
    prefill side capturing on the same GPU changes those timings, and a config chosen otherwise
    can round otherwise. The cost: the prefill side's own start no longer overlaps the capture.
    """
    if pool_resized_after_capture:
        return "upstream resizes the KV pool after its capture"
    if weights_load_during_capture:
        return "upstream still loads weights while it captures"
    if torch_compile:
        return "--enable-torch-compile times kernel configs on the GPU during the capture, alone"
    return None


def prefill_path_parts(inflight: InflightPrefill, reply: PrefillResult, taken_at: float,
                       processed_at: float) -> dict[str, float]:
    """Seconds a prefill batch spent in each part of its way, from scheduling until its result is processed."""
    parts = {"schedule": inflight.sent_at - inflight.scheduled_at, "result": processed_at - taken_at}
    times = reply.times
    if times is not None:
        parts.update(to_prefill_side=times.taken_at - inflight.sent_at, unpack=times.launched_at - times.taken_at,
                     forward=times.done_at - times.launched_at, to_decode_side=taken_at - times.done_at)
    return parts


def to_device_unwaited(host: torch.Tensor, device) -> torch.Tensor:
    """``host`` on ``device``, queued on the current stream without waiting for it.

    A copy from pageable memory waits for everything queued on the stream before it; a copy from
    pinned memory is queued behind it (torch keeps the pinned buffer until the copy has run).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)  # the host tensor itself where the device is the CPU


def _metrics_enabled() -> bool:
    from sglang.srt.runtime_context import get_observability

    return bool(get_observability().enable_metrics)


class DecodeSideScheduler(EdgeAccSchedulerBase):
    def __init__(self, server_args, port_args, *args, **kwargs):
        self.edge_acc_stats = EdgeAccStats()
        # Built before upstream's construction, which may already ask is_fully_idle. The prefill
        # side's process starts now and imports sglang while this side loads; it is given its
        # start once the pools exist, before this side captures its graphs.
        self.prefill_link = PrefillLink(server_args, port_args, log_prefix=self._edge_log_prefix)
        self.prefill_link.prestart(torch.device(get_device().device).type)
        flags = get_flags(server_args)
        # The one measure of inter-token time; each step feeds the metrics and the long-gap log.
        self.decode_clock = DecodeStepClock(gc_timer=GcTimer())
        self.long_gaps = LongGapLog(flags.edge_acc_itl_slo_ms, self._edge_log_prefix, stacks=True)
        self.decode_pacer = DecodePacer(flags.edge_acc_itl_slo_ms if flags.edge_acc_decode_pacing == "on" else 0.0)
        self._edge_spawn_after_capture = False
        # Prefill batches whose first tokens went out while a decode step ran, merged at the top of the loop.
        self._edge_unmerged: deque = deque()
        self._edge_server_info = {"enabled": True}  # completed once the prefill side is ready
        super().__init__(server_args, port_args, *args, **kwargs)
        if _metrics_enabled():
            self.edge_acc_stats.enable_prometheus(
                {"tp_rank": str(self.prefill_link.ranks.tp_rank)},
                flags.edge_acc_prefill_sm_percent, flags.edge_acc_decode_sm_percent,
            )

    # ----------------------------------------------------------------- start-up
    def init_all_cuda_graphs(self):
        if not self.is_generation:
            # Found from the model's architecture (no --is-embedding on the command line).
            raise RuntimeError(
                f"{self._edge_log_prefix()} --enable-edge-acc needs a generation model; this one only embeds "
                "or scores (no decode to protect). Drop --enable-edge-acc."
            )
        skip_unused_graph_phase(roles.DECODE, self._edge_log_prefix())
        runner = self.tp_worker.model_runner
        why_later = prefill_start_after_capture(
            pool_resized_after_capture=bool(runner.token_to_kv_pool.post_capture_active),
            weights_load_during_capture=bool(get_model().is_startup_weight_load_overlap),
            torch_compile=bool(self.server_args.enable_torch_compile))
        self._edge_spawn_after_capture = why_later is not None
        if why_later is None:
            self._edge_spawn_prefill_side()
        else:
            logger.info("%s the prefill side starts once this side's graphs are captured: %s",
                        self._edge_log_prefix(), why_later)
        super().init_all_cuda_graphs()

    def _edge_spawn_prefill_side(self) -> None:
        parallel = get_parallel()
        self.prefill_link.spawn(self.tp_worker.model_runner, parallel.tp_group, parallel.tp_group.cpu_group,
                                agree_group=parallel.attn_tp_group.cpu_group)

    def init_model_worker(self):
        super().init_model_worker()
        if self._edge_spawn_after_capture:
            self._edge_spawn_prefill_side()
        self.prefill_link.wait_ready()
        self._edge_describe_sides()

    def _edge_describe_sides(self) -> None:
        """What /get_server_info reports of this group, said once in the startup log too.

        Every rank of the attention-TP group gathers the group's pids here, at the same
        point of its start: whichever rank answers the internal-state query knows them all.
        """
        import torch.distributed as dist

        link = self.prefill_link
        flags = get_flags(self.server_args)
        device_type = torch.device(self.tp_worker.model_runner.device).type
        group = get_parallel().attn_tp_group.cpu_group
        pairs = gather_pairs({"tp_rank": link.ranks.tp_rank, "decode_pid": os.getpid(),
                              "prefill_pid": link.prefill_pid}, group)
        self._edge_server_info = edge_acc_entry(
            flags.edge_acc_sm_partition, link.split, decode_side_split(flags.edge_acc_sm_partition, device_type),
            pacing_entry(flags.edge_acc_itl_slo_ms, self.decode_pacer), pairs, link.ranks.dp_rank)
        if len(pairs) == 1 or dist.get_rank(group=group) == 0:
            logger.info("%s %s", self._edge_log_prefix(), startup_line(self._edge_server_info))

    def get_internal_state(self, recv_req):
        reply = super().get_internal_state(recv_req)
        reply.internal_state["edge_acc"] = self._edge_server_info
        return reply

    def set_internal_state(self, recv_req):
        """Upstream's update, and ``edge_acc_itl_slo_ms`` (``pacing_target``): all keys accepted, or none."""
        import msgspec
        from sglang.srt.managers.io_struct import SetInternalStateReqOutput

        target, rest = pacing_target.split_request(recv_req.server_args)
        if target is None:
            return super().set_internal_state(recv_req)
        why_not = pacing_target.refusal(target, get_flags(self.server_args).edge_acc_decode_pacing == "on")
        if why_not is not None:
            logger.warning("%s %s", self._edge_log_prefix(), why_not)
            return SetInternalStateReqOutput(updated=False)
        if rest:
            reply = super().set_internal_state(msgspec.structs.replace(recv_req, server_args=rest))
            if not reply.updated:
                return reply
        self._edge_retarget(float(target))
        return SetInternalStateReqOutput(updated=True)

    def _edge_retarget(self, itl_slo_ms: float) -> None:
        before = self._edge_server_info.get("decode_pacing", {}).get("itl_slo_ms")
        self.decode_pacer.retarget(itl_slo_ms)
        self.long_gaps.retarget(itl_slo_ms)
        pacing = pacing_entry(itl_slo_ms, self.decode_pacer)
        self._edge_server_info["decode_pacing"] = pacing
        logger.info("%s inter-token target %s -> %g ms (/set_internal_state): %s", self._edge_log_prefix(),
                    "?" if before is None else f"{before:g}", itl_slo_ms, pacing_said(pacing, "target"))

    def init_weight_updater(self) -> None:
        super().init_weight_updater()
        from sglang_edgeacc.edge_acc_server.weight_update_guard import GuardedWeightUpdater

        # Before init_request_dispatcher binds the update handlers.
        runner = self.tp_worker.model_runner
        self.weight_updater = GuardedWeightUpdater(self.weight_updater, lambda: runner.model,
                                                   self._edge_log_prefix(), settle=self._edge_settle_prefill)

    def handle_freeze_gc(self, recv_req):
        # Upstream freezes every process of the server after its warmup (and on /freeze_gc); the
        # prefill side is one more, which upstream does not know of.
        reply = super().handle_freeze_gc(recv_req)
        self.prefill_link.freeze_gc(recv_req.gc_threshold)
        return reply

    def pause_generation(self, recv_req):
        if recv_req.mode == "retract":
            # Retraction frees the KV of every request upstream finds and recomputes it after the pause,
            # under new weights if they change meanwhile. The batch at the prefill side is in none of the
            # places upstream looks: merged first, its requests are retracted with the others, and no slot
            # its forward still writes is freed.
            self._edge_settle_prefill("pause_generation")
        return super().pause_generation(recv_req)

    def _edge_settle_prefill(self, why: str) -> None:
        """Wait for the batch at the prefill side, if any, and merge its result as the loop would.

        Every rank of the attention-TP group handles the same control request at the same
        point and has the same batch in flight, so they poll (a collective) in step.
        """
        if not self.prefill_link.busy:
            return
        logger.info("%s %s: waiting for the prefill batch in flight", self._edge_log_prefix(), why)
        while self.prefill_link.busy:
            self.prefill_link.check_alive()
            self._edge_collect_prefill()
            if self.prefill_link.busy:
                self.prefill_link.wait_readable(IDLE_WAIT_MS)

    def _edge_event_loop(self) -> None:
        self.event_loop_edge_acc_decode()

    # ----------------------------------------------------------------- the loop
    def event_loop_edge_acc_decode(self) -> None:
        """Decode steps go on while the prefill side runs; with overlap on, as upstream's overlap loop.

        With the overlap schedule (upstream's default) a decode step is launched
        before the previous step's result is processed, so the CPU work of one
        step (result processing, the prefill hand-off, scheduling) runs while the
        device computes the next: upstream's ``event_loop_overlap`` order, with
        the prefill forward replaced by the hand-off. ``--disable-overlap-schedule``
        processes each result in its own step, as ``event_loop_normal`` does.
        """
        overlap = self.enable_overlap
        # As event_loop_overlap: update_running_batch leaves out the requests
        # that the one pending result finishes by length.
        self.enable_skip_finishing_decode = overlap
        self._edge_choose_depth()
        # A rank that takes prefill replies and steps without the others of its group may go
        # round its loop early (for a reply, a request); elsewhere an extra pass could enter a
        # collective the other ranks do not.
        self._edge_steps_alone = self.prefill_link.replies_taken_alone and not self.require_mlp_sync
        self._edge_wake_sockets = self._edge_request_sockets() if self._edge_steps_alone else ()
        logger.info("%s decode loop, overlap schedule %s", self._edge_log_prefix(), "on" if overlap else "off")
        try:
            while not self.gracefully_exit:
                # Before anything else reads the queues: an abort must find these requests running.
                self._edge_merge_unmerged()
                self.ingest_requests()
                if self._engine_paused:
                    self._record_scheduler_state_for_paused_engine()
                    # A pause is no gap between tokens; a retracting one drops the queued result unprocessed.
                    self.decode_clock.idle()
                    self.long_gaps.idle()
                    self.decode_pacer.idle()
                    continue
                self.decode_clock.mark("requests")
                self.prefill_link.check_alive()
                self.edge_acc_stats.record_queues(len(self.waiting_queue), self.running_batch.batch_size())
                self._edge_collect_prefill()
                if not self.prefill_link.full:
                    self._edge_dispatch_prefill()
                self.decode_clock.mark("prefill hand-off")
                paced = self._edge_pace()
                self.decode_clock.mark("pacing")
                if not paced:
                    continue  # a prefill reply came during the wait: hand over the next batch first

                batch = self._edge_next_decode_batch()
                self.decode_clock.mark("decode batch")
                self.cur_batch_for_debug = batch
                result = None
                if batch is not None:
                    self.decode_pacer.launched()
                    result = self.run_batch(batch)
                    self.decode_clock.mark("decode launch")
                    if overlap:
                        # Result processing writes nothing this forward still reads.
                        self._apply_war_barrier()
                        self.result_queue.append((batch.copy(), result))
                    else:
                        self._edge_process_decode_result(batch, result)
                # The previous step's result, while this step runs on the device.
                while len(self.result_queue) > (1 if batch is not None else 0):
                    self._edge_process_decode_result(*self.result_queue.popleft())
                # Grammar batches sample after the previous result advanced their grammars.
                self.launch_batch_sample_if_needed(result, batch)

                if batch is None:
                    self.decode_pacer.idle()
                    self.decode_clock.idle()
                    self.long_gaps.idle()
                    if self.prefill_link.busy:
                        self.prefill_link.wait_readable(IDLE_WAIT_MS, also=self._edge_wake_sockets)
                    elif self.last_batch is None:
                        self._sched_idled = True
                        self.on_idle()
                self.last_batch = batch
        finally:
            self.long_gaps.idle()
            self.prefill_link.stop()

    def _edge_choose_depth(self) -> None:
        """Once the scheduler is complete (priority preemption is decided late in its construction)."""
        flags = get_flags(self.server_args)
        asked = flags.edge_acc_prefill_batches_in_flight
        depth, why_not_more = prefill_batches_in_flight(
            asked, replies_taken_alone=self.prefill_link.replies_taken_alone, mlp_sync=self.require_mlp_sync,
            priority_preemption=bool(self.enable_priority_preemption))
        self.prefill_link.depth = depth
        logger.info("%s prefill batches in flight: up to %d%s", self._edge_log_prefix(), depth,
                    f" ({why_not_more})" if depth < asked else "")

    def _edge_request_sockets(self) -> tuple:
        """The sockets upstream receives requests on, where a request ends the loop's waits.

        None where upstream receives only every few passes (``--scheduler-recv-interval``: a
        request left unread would end every wait at once), or from something that is not a
        ZeroMQ socket (the embedded Rust server's ring). Asked only where this rank steps alone.
        """
        import zmq

        if self.recv_skipper is not None:
            return ()
        candidates = (self.recv_from_tokenizer, self.ipc_channels.recv_from_rpc)
        return tuple(socket for socket in candidates if isinstance(socket, zmq.Socket))

    def _edge_pace(self) -> bool:
        """Wait before the next decode step while the prefill side has a batch (``decode_pacing``).

        Returns False when a prefill reply or a new request ended the wait, so the loop
        takes the reply or admits the request and hands over the next batch before this
        step (the wait goes on after it, from the same last step). A wait ends early only
        where this rank steps alone; elsewhere it runs out (the decode forward after it
        brings the ranks together).
        """
        if not self.decode_pacer.paces(self.prefill_link.busy, self._edge_prompts_waiting()):
            return True
        # The wait counts from the last step's result, so its tokens go out first. Under the
        # overlap schedule upstream's last_batch is the batch whose result is still queued
        # (a retracting pause takes it from the queue): with its result out, there is none.
        while self.result_queue:
            self._edge_process_decode_result(*self.result_queue.popleft())
        self.last_batch = None
        if self._edge_unmerged:
            return False  # a reply taken meanwhile: merged, and the next batch handed over, before this step
        wait_s = self.decode_pacer.next_step(self.prefill_link.busy, self._edge_prompts_waiting()).wait_s
        if wait_s <= 0:
            return True
        if self._edge_steps_alone:
            return not self.prefill_link.wait_readable(max(1, round(wait_s * 1000)), also=self._edge_wake_sockets)
        time.sleep(wait_s)
        return True

    def _edge_prompts_waiting(self) -> bool:
        """Whether a prompt waits behind the prefill batch in flight: queued, in a second batch in
        flight, or the rest of a chunked prompt (the pacer widens the gap for them)."""
        return bool(self.waiting_queue) or len(self.prefill_link.inflight_batches) > 1 \
            or self.chunked_req is not None

    def _edge_process_decode_result(self, batch, result) -> None:
        beside_prefill = self.prefill_link.busy
        self._edge_take_reply_during_step(result)
        self.process_batch_result(batch, result)
        self.decode_pacer.result(batch.forward_mode.is_decode(), beside_prefill)
        step = self.decode_clock.result(batch.forward_mode.is_decode(), beside_prefill=beside_prefill)
        if batch.forward_mode.is_decode():
            # The batch's size, as the step ran it: a stall at the first step of a size is a one-time cost.
            self.long_gaps.gap(step, requests=len(batch.reqs))
        else:
            self.long_gaps.idle()
        if step is None:
            return
        if self.edge_acc_stats.enabled:
            # Each request attended to its whole sequence but the token this step appended.
            context = sum(len(req.origin_input_ids) + len(req.output_ids) - 1 for req in batch.reqs)
            self.edge_acc_stats.record_decode_step(step, len(batch.reqs), context)

    def _edge_take_reply_during_step(self, result) -> None:
        """While a decode step's tokens are still on the device, send out the first tokens of a prefill reply.

        Otherwise a reply that comes during the step waits for it, and the first
        tokens of its requests with it. The reply's result is processed here (its
        tokens stream, its finished requests leave) and its merge into the running
        batch waits for the top of the loop: the batch launched in this pass is the
        running batch itself, and its delayed (grammar) sampling still reads it. One
        reply per step, so a reply is merged before the next one is processed, as in
        the loop. Only where this rank steps alone (elsewhere taking one is a collective).
        """
        done = getattr(result, "copy_done", None)
        if done is None or not self._edge_steps_alone or self._edge_unmerged:
            return
        while self.prefill_link.busy and not done.query():
            finished = self.prefill_link.poll()
            if finished is not None:
                self._edge_unmerged.append(self._edge_process_prefill(*finished))
                return

    def _collect_inflight_batches(self):
        # Upstream's own prefill batch stays reachable as last_batch while it runs; here the
        # batch at the prefill side is in neither, and an abort must still reach its requests
        # (they then finish when its result is processed, as upstream's do).
        batches = super()._collect_inflight_batches()
        batches.extend(self.prefill_link.inflight_batches)
        return batches

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False) -> bool:
        # The requests of an in-flight prefill batch are in no queue and no
        # running batch, but they hold slots: flushing the cache or reporting
        # the engine idle now would free memory the prefill side is writing. So
        # do those of a batch processed but not yet merged.
        if self.prefill_link.busy or self._edge_unmerged:
            return False
        return super().is_fully_idle(for_health_check=for_health_check, ignore_waiting=ignore_waiting)

    def _edge_dispatch_prefill(self) -> None:
        if self.prefill_link.busy:
            if self._pending_chunked_abort_req is not None:
                # The abort frees the chunked request's slots, which a chunk in flight still
                # writes: it waits until nothing is in flight, and so does the next batch.
                return
            self._edge_checkpoint_chunk_in_flight()
        else:
            self.process_pending_chunked_abort()
        scheduled_at = time.monotonic()
        with self._edge_admission_counts_inflight():
            plan = self.get_new_batch_prefill(self.running_batch)
        self.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch is None:
            return
        upstream_mirror.before_forward(self, batch)
        written = self.prefill_link.signal_inputs(self.forward_stream)
        packed = self._edge_pack(batch)
        self.prefill_link.send(batch, packed, written, scheduled_at)
        self.edge_acc_stats.record_message(len(packed))

    def _edge_checkpoint_chunk_in_flight(self) -> None:
        """Before the next chunk of a request is scheduled while its previous chunk is in flight.

        Upstream checkpoints a chunk into the prefix cache at the start of the next
        scheduling step, also under its overlap schedule while that chunk still runs
        (``get_next_batch_to_run``); the next chunk starts where the checkpoint ends. The
        merge of a batch checkpoints the request being chunked too (``merge_prefilled``);
        a chunk checkpointed once is not again (the checkpoint moves ``prefix_len`` to its end).
        """
        chunked = self.chunked_req
        if chunked is not None and chunked.extend_end > chunked.prefix_len:
            self.stash_chunked_request(chunked)

    @contextlib.contextmanager
    def _edge_admission_counts_inflight(self):
        """Admission while batches are in flight sees their requests as running, as upstream's overlap does.

        Upstream merges its prefill in flight into the running batch before it schedules
        the next one, so the next admission reserves decode room for its requests and counts
        them against ``--max-running-requests``. Here they join the running batch only when
        their result is merged; for the admission they are added to its request list (all
        that admission reads of it) and taken out again. A request being chunked is not
        running yet, as upstream keeps it out of the merge.
        """
        batches = self.prefill_link.inflight_batches
        running = self.running_batch
        extra = [req for batch in batches for req in batch.reqs
                 if req is not batch.chunked_req and req is not self.chunked_req and not req.finished()]
        if not extra:
            yield
            return
        own = running.reqs
        running.reqs = own + extra
        try:
            yield
        finally:
            running.reqs = own

    def _edge_pack(self, batch) -> bytes:
        """The batch as the prefill side receives it; a request holding what cannot cross fails alone.

        The parts that cannot be pickled are sent as None and their requests are
        finished with an error when the batch's result comes back (upstream's own
        way to abort a request in a running batch), so their slots are released
        by the usual path and every other request of the batch is served.
        """
        try:
            return pack_prefill_batch(batch, tokenizer=self.tokenizer)
        except PrefillBatchNotSendable as exc:
            fail_unsendable_requests(batch.reqs, exc.parts, self._edge_log_prefix())
            return pack_prefill_batch(batch, tokenizer=self.tokenizer, leave_out=exc.object_ids)

    def _edge_collect_prefill(self) -> None:
        self._edge_merge_unmerged()
        while (finished := self.prefill_link.poll()) is not None:
            upstream_mirror.merge_prefilled(self, self._edge_process_prefill(*finished))

    def _edge_merge_unmerged(self) -> None:
        while self._edge_unmerged:
            upstream_mirror.merge_prefilled(self, self._edge_unmerged.popleft())

    def _edge_process_prefill(self, inflight: InflightPrefill, reply: PrefillResult):
        """Process a prefill batch's result as upstream processes a prefill it ran; returns the batch to merge."""
        from sglang.srt.managers.utils import GenerationBatchResult

        taken_at = time.monotonic()
        batch = inflight.batch
        # Counted before result processing and the merge change the batch.
        tokens = pairs = 0
        if self.edge_acc_stats.enabled:
            tokens = batch.extend_num_tokens or 0
            pairs = sum(e * p + e * (e + 1) // 2 for e, p in zip(batch.extend_lens or (), batch.prefix_lens or ()))
        host_ids = torch.tensor(reply.next_token_ids, dtype=torch.int64)
        result = GenerationBatchResult(
            logits_output=reply.logits_output,
            next_token_ids=to_device_unwaited(host_ids, self.tp_worker.model_runner.device),
            can_run_cuda_graph=False,
        )
        upstream_mirror.after_forward(self, batch, result)
        # The relay above feeds the next decode step from the device copy; result processing reads the
        # tokens on the host, as upstream's overlap schedule hands it a host copy. A device tensor here
        # made processing wait for the schedule stream twice on every first token's path.
        result.next_token_ids = host_ids
        self.process_batch_result(batch, result)
        self.decode_pacer.first_tokens()
        self.edge_acc_stats.record_handoff(taken_at - inflight.sent_at, reply.forward_ms, batch.batch_size(),
                                           tokens=tokens, attention_pairs=pairs,
                                           path=prefill_path_parts(inflight, reply, taken_at, time.monotonic()))
        return batch

    def _edge_next_decode_batch(self):
        return upstream_mirror.next_decode_batch(self)
