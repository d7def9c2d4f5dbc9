"""The decode side: upstream's scheduler, with every prefill forward handed to the prefill side.

Scheduling is upstream's own (``get_new_batch_prefill`` admits, matches
prefixes, chunks and allocates; ``update_running_batch`` decodes and retracts).
What changes is the loop: a prefill batch is sent to the prefill side instead
of being run here, and decode steps go on while it runs (pipelined as in
upstream's overlap loop when the overlap schedule is on). One prefill batch is
in flight at a time; its result is processed exactly as upstream processes a
prefill it ran itself, then merged into the running batch.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch

from sglang_edgeacc.edge_acc.ordering import WriteFence
from sglang_edgeacc.edge_acc.sm_partition import child_env, environment_for_child, mps_priority_env
from sglang_edgeacc.edge_acc_server import prefill_side, roles
from sglang_edgeacc.edge_acc_server.batch_codec import pack_prefill_batch
from sglang_edgeacc.edge_acc_server.channel import PeerLost, SideChannel, new_endpoint
from sglang_edgeacc.edge_acc_server.child_failure import fail_on_prefill_side_sigquit
from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree
from sglang_edgeacc.edge_acc_server.messages import PrefillReady, PrefillResult, PrefillWork, Shutdown
from sglang_edgeacc.edge_acc_server.port_plan import prefill_side_port_args
from sglang_edgeacc.edge_acc_server.shared_state import export_model_runner_state
from sglang_edgeacc.flags import get_flags

logger = logging.getLogger(__name__)

PREFILL_START_TIMEOUT_S = 900.0
# While a prefill is in flight and there is nothing to decode, wait on the
# channel rather than spin.
IDLE_WAIT_MS = 5


@dataclass
class InflightPrefill:
    seq: int
    batch: object  # ScheduleBatch
    sent_at: float


@dataclass(frozen=True)
class SpawnRanks:
    gpu_id: int
    tp_rank: int
    pp_rank: int
    dp_rank: Optional[int]


def _spawn_ranks() -> SpawnRanks:
    from sglang.srt.runtime_context import get_device, get_parallel

    parallel = get_parallel()

    def read(name, default=None):
        try:
            return getattr(parallel, name)
        except (AttributeError, RuntimeError, ValueError):
            return default

    return SpawnRanks(
        gpu_id=int(get_device().gpu_id or 0),
        tp_rank=read("tp_rank", 0),
        pp_rank=read("pp_rank", 0),
        dp_rank=read("dp_rank"),
    )


def queued_prompt_tokens(waiting_queue, chunked_req) -> int:
    """Prompt tokens not sent to the prefill side yet: the waiting requests', and the rest
    of the prompt being chunked, which upstream keeps out of the waiting queue."""
    queued = sum(len(req.origin_input_ids) for req in waiting_queue)
    if chunked_req is not None and chunked_req.extend_end is not None:
        queued += max(0, len(chunked_req.origin_input_ids) - chunked_req.extend_end)
    return queued


class DecodeSideMixin:
    # ----------------------------------------------------------------- start-up
    def _edge_decode_start_prefill_side(self) -> None:
        from sglang.srt.managers.scheduler import run_scheduler_process
        from sglang.srt.utils.common import broadcast_pyobj

        if not self.is_generation:
            # Found from the model's architecture (no --is-embedding on the command line).
            raise RuntimeError(
                f"{self._edge_log_prefix()} --enable-edge-acc needs a generation model; this one only embeds "
                "or scores (no decode to protect). Drop --enable-edge-acc."
            )
        flags = get_flags(self.server_args)
        ranks = _spawn_ranks()
        self._edge_ranks = ranks
        runner = self.tp_worker.model_runner

        # The prefill sides of this TP group form a TP group of their own: they
        # need one set of ports, chosen once and shared by every decode rank.
        group = self.tp_group
        port_args = [prefill_side_port_args(self._edge_decode_port_args)] if group.rank == group.ranks[0] else None
        if group.world_size > 1:
            port_args = broadcast_pyobj(port_args, group.rank, self.tp_cpu_group, src=group.ranks[0])
        port_args = port_args[0]

        endpoint = new_endpoint()
        self._edge_channel = SideChannel(endpoint, bind=True)

        device_type = torch.device(runner.device).type
        fail_start = os.environ.get(prefill_side.FAIL_START_DP_RANK_ENV) == str(ranks.dp_rank)
        env = {
            prefill_side.FAIL_START_ENV: "1" if fail_start else "0",
            roles.ROLE_ENV: roles.PREFILL,
            roles.CHANNEL_ENV: endpoint,
            roles.DECODE_PID_ENV: str(os.getpid()),
            **child_env(roles.PREFILL, flags.edge_acc_prefill_sm_percent, flags.edge_acc_sm_partition,
                        tp_rank=ranks.tp_rank, device_type=device_type),
            **mps_priority_env(roles.PREFILL, flags.edge_acc_prefill_mps_priority, flags.edge_acc_sm_partition,
                               device_type=device_type),
        }
        ctx = mp.get_context("spawn")
        reader, writer = ctx.Pipe(duplex=False)
        self._edge_prefill_proc = ctx.Process(
            target=run_scheduler_process,
            args=(self.server_args, port_args, ranks.gpu_id, ranks.tp_rank, ranks.pp_rank, ranks.dp_rank, writer),
            name=f"edgeacc-prefill-tp{ranks.tp_rank}",
        )
        fail_on_prefill_side_sigquit(self._edge_log_prefix())
        logger.info("%s starting the prefill side", self._edge_log_prefix())
        with environment_for_child(env):
            self._edge_prefill_proc.start()
        writer.close()

        alive = self._edge_prefill_proc.is_alive
        self._edge_channel.send(export_model_runner_state(runner), peer_alive=alive, timeout_s=PREFILL_START_TIMEOUT_S)
        deadline = time.monotonic() + PREFILL_START_TIMEOUT_S
        while not reader.poll(1.0):
            if not alive():
                raise PeerLost(f"the prefill side exited with code {self._edge_prefill_proc.exitcode} during start")
            if time.monotonic() > deadline:
                raise TimeoutError("the prefill side did not start within the time limit")
        info = reader.recv()
        if info.get("status") != "ready":
            raise RuntimeError(f"the prefill side failed to start: {info}")
        ready = self._edge_channel.recv(timeout_s=PREFILL_START_TIMEOUT_S, peer_alive=alive, what="PrefillReady")
        assert isinstance(ready, PrefillReady), type(ready)
        self._edge_write_fence = WriteFence(runner.device)
        self._edge_seq = 0
        self._edge_inflight: Optional[InflightPrefill] = None
        # Only the adaptive split reads these; bounded, since decoding can go on
        # for a long time between two prefill batches.
        self._edge_adaptive = flags.edge_acc_sm_partition == "adaptive"
        self._edge_decode_steps: deque[float] = deque(maxlen=256)
        self._edge_last_decode_done: Optional[float] = None
        logger.info("%s prefill side pid %d is ready", self._edge_log_prefix(), ready.pid)

    def init_weight_updater(self) -> None:
        super().init_weight_updater()
        if self.edge_acc_role == roles.DECODE:
            from sglang_edgeacc.edge_acc_server.weight_update_guard import GuardedWeightUpdater

            # Before init_request_dispatcher binds the update handlers.
            runner = self.tp_worker.model_runner
            self.weight_updater = GuardedWeightUpdater(self.weight_updater, lambda: runner.model,
                                                       self._edge_log_prefix())

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
        logger.info("%s decode loop, overlap schedule %s", self._edge_log_prefix(), "on" if overlap else "off")
        try:
            while not self.gracefully_exit:
                self.ingest_requests()
                if self._engine_paused:
                    self._record_scheduler_state_for_paused_engine()
                    continue
                self._edge_check_prefill_side()
                self.edge_acc_stats.record_queues(len(self.waiting_queue), self.running_batch.batch_size())
                self._edge_collect_prefill()
                if self._edge_inflight is None:
                    self._edge_dispatch_prefill()

                batch = self._edge_next_decode_batch()
                self.cur_batch_for_debug = batch
                result = None
                if batch is not None:
                    result = self.run_batch(batch)
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
                    self._edge_last_decode_done = None
                    if self._edge_inflight is not None:
                        self._edge_channel.wait_readable(IDLE_WAIT_MS)
                    elif self.last_batch is None:
                        self._sched_idled = True
                        self.on_idle()
                self.last_batch = batch
        finally:
            self._edge_stop_prefill_side()

    def _edge_process_decode_result(self, batch, result) -> None:
        self.process_batch_result(batch, result)
        if not self._edge_adaptive:
            return
        # The adaptive split is driven by inter-token latency: the time between
        # two consecutive decode results, whatever the loop did in between.
        now = time.perf_counter()
        if not batch.forward_mode.is_decode():
            self._edge_last_decode_done = None
            return
        # Only steps that ran next to a prefill batch say anything about its partition;
        # the policy would file steps of an idle prefill side under the split in use.
        if self._edge_last_decode_done is not None and self._edge_inflight is not None:
            self._edge_decode_steps.append((now - self._edge_last_decode_done) * 1e3)
        self._edge_last_decode_done = now

    def is_fully_idle(self, for_health_check=False, ignore_waiting=False) -> bool:
        # The requests of an in-flight prefill batch are in no queue and no
        # running batch, but they hold slots: flushing the cache or reporting
        # the engine idle now would free memory the prefill side is writing.
        if getattr(self, "_edge_inflight", None) is not None:
            return False
        return super().is_fully_idle(for_health_check=for_health_check, ignore_waiting=ignore_waiting)

    def _edge_check_prefill_side(self) -> None:
        if not self._edge_prefill_proc.is_alive():
            raise PeerLost(
                f"{self._edge_log_prefix()} the prefill side (pid {self._edge_prefill_proc.pid}) exited "
                f"with code {self._edge_prefill_proc.exitcode}; shutting the server down"
            )

    def _edge_dispatch_prefill(self) -> None:
        from sglang.srt.managers.overlap_utils import resolve_forward_inputs

        plan = self.get_new_batch_prefill(self.running_batch)
        self.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if batch is None:
            return
        # What run_batch does before a forward, minus the forward.
        self.forward_ct += 1
        batch.forward_iter = self.forward_ct
        batch.launch_ts = time.monotonic()
        batch.after_idle_gap = self._sched_idled
        self._sched_idled = False
        if batch.extend_num_tokens:
            self.processed_tokens_counter += batch.extend_num_tokens
        resolve_forward_inputs(batch, self.future_map)
        written = self._edge_signal_prefill_inputs()
        self._edge_seq += 1
        load = {}
        if self._edge_adaptive:
            # What the policy needs: the ITL just seen, the queue, and the decode
            # load this batch will run next to (it moves the split before that load bites).
            running = self.running_batch.reqs
            load = dict(
                decode_step_ms=tuple(self._edge_decode_steps),
                queued_tokens=queued_prompt_tokens(self.waiting_queue, self.chunked_req),
                decode_batch_size=len(running),
                decode_context_tokens=sum(len(req.origin_input_ids) + len(req.output_ids) for req in running),
            )
            self._edge_decode_steps.clear()
        packed = pack_prefill_batch(batch, tokenizer=self.tokenizer)
        self._edge_channel.send(PrefillWork(seq=self._edge_seq, batch=packed, written=written, **load))
        self.edge_acc_stats.record_message(len(packed))
        self._edge_inflight = InflightPrefill(seq=self._edge_seq, batch=batch, sent_at=time.monotonic())

    def _edge_signal_prefill_inputs(self):
        """A fence the prefill side waits on before its forward.

        It covers the batch's slots and req_to_token rows, written on the schedule
        stream, and every decode step already launched on the forward stream: a slot
        this batch reuses may have been freed by a request that step still writes
        KV for (upstream's own order keeps that write before the next forward of the
        same stream; the prefill side runs on another stream, in another process).
        """
        forward = getattr(self, "forward_stream", None)
        current = torch.cuda.current_stream() if torch.cuda.is_available() else None
        if forward is None or current is None or self._edge_write_fence.mode != "event":
            return self._edge_write_fence.signal()
        forward.wait_stream(current)
        return self._edge_write_fence.signal(forward)

    def _edge_collect_prefill(self) -> None:
        if self._edge_inflight is None:
            return
        if not self._edge_all_ranks_ready(self._edge_channel.wait_readable(0)):
            return
        reply = self._edge_channel.recv(
            timeout_s=None, peer_alive=self._edge_prefill_proc.is_alive, what="a prefill result"
        )
        assert isinstance(reply, PrefillResult), type(reply)
        inflight, self._edge_inflight = self._edge_inflight, None
        if reply.error is not None:
            raise RuntimeError(f"{self._edge_log_prefix()} the prefill side failed:\n{reply.error}")
        if reply.seq != inflight.seq:
            raise RuntimeError(f"prefill reply {reply.seq} does not answer batch {inflight.seq}")
        self._edge_finish_prefill(inflight, reply)

    def _edge_all_ranks_ready(self, ready: bool) -> bool:
        """True once every rank that shares this batch has its prefill result.

        The ranks of an attention-TP group run one decode forward together, so
        they must merge a finished prefill in the same step; replies reach them
        at different times, so they agree on the slowest.
        """
        return all_ranks_agree(ready, self.attn_tp_cpu_group)

    def _edge_finish_prefill(self, inflight: InflightPrefill, reply: PrefillResult) -> None:
        from sglang.srt.managers.utils import GenerationBatchResult

        batch = inflight.batch
        device = self.tp_worker.model_runner.device
        result = GenerationBatchResult(
            logits_output=reply.logits_output,
            next_token_ids=torch.tensor(reply.next_token_ids, dtype=torch.int64, device=device),
            can_run_cuda_graph=False,
        )
        # What run_batch does after a forward.
        self._relay_forward_payload(batch, batch.req_pool_indices, result)
        batch.input_ids = None
        self.update_cache_from_scheduler(batch, result)
        self._copy_auxiliary_output_to_cpu(batch, result)
        keep = batch.return_logprob or batch.return_hidden_states
        result.extend_input_len_per_req = list(batch.extend_lens) if keep else None
        result.extend_logprob_start_len_per_req = batch.extend_logprob_start_lens if batch.return_logprob else None
        self.process_batch_result(batch, result)
        self._edge_merge_prefilled(batch)
        self.edge_acc_stats.record_handoff(time.monotonic() - inflight.sent_at, reply.forward_ms, batch.batch_size())

    def _edge_merge_prefilled(self, batch) -> None:
        """Upstream's merge of a finished prefill into the running batch (get_next_batch_to_run)."""
        exclude = []
        if self.chunked_req is not None:
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self.stash_chunked_request(self.chunked_req)
        if batch.chunked_req is not None:
            exclude.append(batch.chunked_req)
        batch.filter_batch(reqs_to_exclude=exclude)
        if batch.is_empty():
            return
        if self.running_batch.is_empty():
            self.running_batch = batch
        else:
            self.running_batch.merge_batch(batch)
        self.running_batch.batch_is_full = False

    def _edge_next_decode_batch(self):
        running = self.running_batch
        before = running.batch_size()
        running.filter_batch()
        if running.batch_size() < before:
            running.batch_is_full = False
        batch = None
        if not running.is_empty() and not running.is_prefill_only:
            decode = self.update_running_batch(running)
            batch = decode if decode is not None and not decode.is_empty() else None
        # DP attention: every decode side of the group enters the same collective
        # each step; an idle one contributes an IDLE batch.
        return self.dp_attn_adapter.maybe_prepare_mlp_sync_batch(batch, need_sync=self.require_mlp_sync)

    def _edge_stop_prefill_side(self) -> None:
        proc = getattr(self, "_edge_prefill_proc", None)
        if proc is None or not proc.is_alive():
            return
        try:
            self._edge_channel.send(Shutdown())
        except Exception:  # the channel may already be gone at interpreter exit
            pass
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
