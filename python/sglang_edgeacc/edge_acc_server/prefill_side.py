"""The prefill side: a scheduler that executes the prefill batches its decode side sends.

It is built like any sglang scheduler (model, pools, attention backends, its
own TP group), then points its model and pools at the decode side's memory
(:mod:`shared_state`). Its loop receives a batch whose slots the decode side
already allocated, waits on the decode side's fence, runs the forward (which
writes the batch's KV into the shared pool), samples, synchronises the host
(so the KV is written before the reply leaves) and replies with the first
tokens. It never allocates, frees or schedules.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import time
import traceback
from collections import deque
from typing import Optional

import torch

from sglang_edgeacc.edge_acc.ordering import ReadFence
from sglang_edgeacc.edge_acc.sm_partition import green_context_stream_from_env
from sglang_edgeacc.edge_acc.tensor_share import import_tensors
from sglang_edgeacc.edge_acc_server import roles
from sglang_edgeacc.edge_acc_server.batch_codec import CopyStreamPlacement, LocalObjects, unpack_prefill_batch
from sglang_edgeacc.edge_acc_server.channel import SideChannel
from sglang_edgeacc.edge_acc_server.graph_phases import skip_unused_graph_phase
from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree
from sglang_edgeacc.edge_acc_server.messages import (
    FreezeGarbageCollector,
    PrefillReady,
    PrefillResult,
    PrefillTimes,
    PrefillWork,
    SharedState,
    Shutdown,
)
from sglang_edgeacc.edge_acc_server.scheduler import EdgeAccSchedulerBase
from sglang_edgeacc.edge_acc_server.shared_state import (
    PrefillSharedState,
    prefill_shared_state,
    set_prefill_shared_state,
)

logger = logging.getLogger(__name__)

SHARED_STATE_TIMEOUT_S = 600.0
# When no prefill side of the group has work, each sleeps this long before
# polling again (all of them see the same all-idle gather, so they stay in step).
ALL_IDLE_SLEEP_S = 0.002
PROCESS_TITLE = "sglang::scheduler_edgeacc_prefill"


def _decode_side_alive(decode_pid: int) -> bool:
    return os.getppid() == decode_pid


def _set_process_title(title: str) -> None:
    # Operators (and the tests) tell the two sides apart in ps/top by this.
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def drop_load_snapshot_writer(scheduler) -> None:
    """Close a scheduler's load-snapshot writer and remove the file it writes.

    A prefill side has an instance id of its own (``port_plan``), so upstream's
    writer creates a ``/dev/shm/sglang_loads_*`` file for it that nobody reads: the
    DP controller and the tokenizer read the decode sides' instance. Upstream never
    unlinks these files, so each start would leave one more behind.
    """
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotWriter

    writer, scheduler.load_snapshot_writer = scheduler.load_snapshot_writer, None
    if writer is None:
        return
    writer.close()
    if isinstance(writer, ShmLoadSnapshotWriter):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(writer.path)


class PrefillSideScheduler(EdgeAccSchedulerBase):
    def __init__(self, server_args, port_args, *args, **kwargs):
        _set_process_title(PROCESS_TITLE)
        self._edge_channel: SideChannel | None = None
        # Made once the pools exist (init_memory_pools).
        self._edge_read_fence: ReadFence | None = None
        self._edge_green_stream = None
        self._edge_placement: CopyStreamPlacement | None = None  # where a batch's device tensors are rebuilt
        self._edge_graph_bytes = 0
        self._edge_last_finish = 0.0  # perf_counter when the last reply was built
        self._edge_prefill_connect()
        super().__init__(server_args, port_args, *args, **kwargs)

    # ----------------------------------------------------------------- start-up
    def init_ipc_channels(self, port_args):
        super().init_ipc_channels(port_args)
        drop_load_snapshot_writer(self)

    def init_memory_pools(self):
        super().init_memory_pools()
        # Before attention backends and graphs are built over the pools.
        self._edge_prefill_adopt()

    def init_all_cuda_graphs(self):
        skip_unused_graph_phase(roles.PREFILL, self._edge_log_prefix())
        # Cached blocks are released on both sides of the capture, so the
        # difference is what the captured graphs hold.
        before = release_cached_blocks()
        super().init_all_cuda_graphs()
        self._edge_graph_bytes = max(0, release_cached_blocks() - before)

    def init_model_worker(self):
        super().init_model_worker()
        self._edge_prefill_verify()

    def _edge_event_loop(self) -> None:
        self.event_loop_edge_acc_prefill()

    def _edge_prefill_connect(self) -> None:
        """Before the scheduler is built: receive the decode side's shared state.

        What is mapped here is in place before upstream builds the model and the
        pools, so that the hooks of ``patches.edge_acc`` build them around it.
        """
        decode_pid = roles.decode_side_pid()  # its process dies with it from its first line (prefill_process.py)
        self._edge_channel = SideChannel(os.environ[roles.CHANNEL_ENV], bind=False)
        state = self._edge_channel.recv(
            timeout_s=SHARED_STATE_TIMEOUT_S, peer_alive=lambda: _decode_side_alive(decode_pid), what="shared state"
        )
        assert isinstance(state, SharedState), type(state)
        start = time.perf_counter()
        set_prefill_shared_state(PrefillSharedState(state=state, imported=import_tensors(state.tensors)))
        logger.info(
            "[edgeacc prefill] mapped %.1f MB of weights, KV cache and req_to_token from the decode side "
            "(pid %d) in %.2f s", state.tensors.total_bytes() / 2**20, state.decode_pid, time.perf_counter() - start,
        )

    @property
    def _edge_shared(self) -> PrefillSharedState:
        return prefill_shared_state()

    def _edge_prefill_verify(self) -> None:
        """Once the worker is built: its weights, KV pool and every reader of req_to_token are shared."""
        self._edge_shared.verify(self.tp_worker.model_runner)

    def _edge_prefill_adopt(self) -> None:
        """After the pools exist, before attention backends and graphs: fences, the copy stream and the SM split."""
        runner = self.tp_worker.model_runner
        self._edge_read_fence = ReadFence(runner.device)
        device = runner_gpu(runner)
        if device.type == "cuda":
            # --edge-acc-sm-partition green-context: every prefill forward runs
            # on a stream confined to this side's share of the SMs.
            self._edge_green_stream = green_context_stream_from_env(
                device.index, role="prefill", tp_rank=self._edge_tp_rank()
            )
            green = self._edge_green_stream
            self._edge_placement = CopyStreamPlacement(device, green.stream if green is not None else None)

    def _edge_prefill_local_objects(self) -> LocalObjects:
        runner = self.tp_worker.model_runner
        return LocalObjects(
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            model_config=runner.model_config,
            tokenizer=self.tokenizer,
        )

    def event_loop_edge_acc_prefill(self) -> None:
        local = self._edge_prefill_local_objects()
        shared = self._edge_shared
        decode_pid = shared.decode_pid
        log_own_memory(self._edge_log_prefix(), self._edge_graph_bytes)
        self._edge_channel.send(PrefillReady(pid=os.getpid(), mapped_bytes=shared.mapped_bytes))
        logger.info("%s ready", self._edge_log_prefix())
        peer_alive = lambda: _decode_side_alive(decode_pid)  # noqa: E731
        try:
            if self.require_mlp_sync:
                self._edge_prefill_loop_in_step(local, peer_alive)
            else:
                self._edge_prefill_loop_on_demand(local, peer_alive)
        finally:
            shared.release()

    def _edge_prefill_loop_on_demand(self, local: LocalObjects, peer_alive) -> None:
        """Without DP attention each prefill side runs whenever its decode side sends work.

        A batch that arrives while the previous one still runs on the device is taken and
        launched behind it before the previous one's tokens are read, as upstream's overlap
        schedule launches its next batch. Its device tensors are rebuilt on a copy stream
        of their own (:class:`CopyStreamPlacement`), so unpacking it does not wait for the
        forward on the device. Replies leave in the order the batches came.
        """
        launched: deque[_Launched] = deque()
        while True:
            if launched and launched[0].done():
                head = launched.popleft()
                self._edge_channel.send(self._edge_guarded(head.work, self._edge_finish_prefill, head))
                continue
            room = not launched or (len(launched) < MAX_LAUNCHED and all(e.overlappable for e in launched))
            if room and (not launched or self._edge_channel.wait_readable(0)):
                message = self._edge_channel.recv(timeout_s=None, peer_alive=peer_alive, what="a prefill batch")
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, FreezeGarbageCollector):
                    self._edge_freeze_gc(message)
                    continue
                launched.append(self._edge_guarded(message, self._edge_launch_prefill, message, local,
                                                   taken_at=time.monotonic()))
            elif room:
                self._edge_channel.wait_readable(LAUNCHED_POLL_MS)
            else:
                launched[0].wait()

    def _edge_prefill_loop_in_step(self, local: LocalObjects, peer_alive) -> None:
        """With DP attention every prefill side of the group steps together.

        The model's MLP collectives span the whole group, so each step every
        prefill side gathers the group's token counts (upstream's MLP sync); a
        side without work runs an IDLE batch so the sides with work do not wait
        on it forever. The ranks of one attention-TP group take a batch from
        their decode sides in the same step, or not at all.
        """
        while True:
            ready = all_ranks_agree(self._edge_channel.wait_readable(0), self.attn_tp_cpu_group)
            work = None
            taken_at = 0.0
            if ready:
                message = self._edge_channel.recv(timeout_s=None, peer_alive=peer_alive, what="a prefill batch")
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, FreezeGarbageCollector):
                    # Every rank of the group reads it in the same step (same messages, in order):
                    # a step without work, still joined below.
                    self._edge_freeze_gc(message)
                else:
                    work, taken_at = message, time.monotonic()
            elif not peer_alive():
                raise RuntimeError(f"{self._edge_log_prefix()} the decode side exited")
            batch = None if work is None else self._edge_unpack_work(work, local)
            batch = self._edge_join_group_step(batch)
            if batch is None:
                time.sleep(ALL_IDLE_SLEEP_S)
                continue
            if batch.forward_mode.is_idle():
                # Only this side's share of the group's collectives: nothing
                # to return, and an IDLE batch never reaches the decode side.
                self.tp_worker.forward_batch_generation(batch)
                continue
            self._edge_serve(work, local, batch=batch, taken_at=taken_at)

    def _edge_freeze_gc(self, message: FreezeGarbageCollector) -> None:
        from sglang.srt.utils import freeze_gc

        freeze_gc("EdgeAcc prefill side", message.gc_threshold)
        logger.info("%s garbage collector frozen (%d objects)", self._edge_log_prefix(), gc.get_freeze_count())

    def _edge_join_group_step(self, batch):
        """This side's share of the group's MLP sync: every side enters it each step, an idle one
        without a batch. Returns the batch to run (IDLE for an idle side while others have work),
        or None when no side of the group has work."""
        return self.dp_attn_adapter.prepare_mlp_sync_batch(batch)

    def _edge_unpack_work(self, work: PrefillWork, local: LocalObjects):
        assert isinstance(work, PrefillWork), type(work)
        return unpack_prefill_batch(work.batch, local, self._edge_placement)

    def _edge_serve(self, work: PrefillWork, local: LocalObjects, batch=None, taken_at: float = 0.0) -> None:
        launched = self._edge_guarded(work, self._edge_launch_prefill, work, local, batch, taken_at, overlap=False)
        self._edge_channel.send(self._edge_guarded(work, self._edge_finish_prefill, launched))

    def _edge_guarded(self, work: PrefillWork, step, *args, **kwargs):
        """``step(*args)``; if it raises, the decode side gets the error as the batch's reply first."""
        try:
            return step(*args, **kwargs)
        except Exception:
            self._edge_channel.send(
                PrefillResult(seq=work.seq, next_token_ids=[], logits_output=None,
                              forward_ms=0.0, error=traceback.format_exc())
            )
            raise

    def _edge_launch_prefill(self, work: PrefillWork, local: LocalObjects, batch=None, taken_at: float = 0.0,
                             overlap: bool = True) -> "_Launched":
        """Unpack the batch, wait for the decode side's fence and launch the forward.

        With ``overlap``, a batch whose reply needs only its sampled tokens starts their
        copy to the host behind the forward and returns at once; any other batch is read
        back before this returns (its logprobs and hidden states are copied field by field).
        """
        start = time.perf_counter()
        taken_at = taken_at or time.monotonic()
        if batch is None:
            batch = self._edge_unpack_work(work, local)
        launched_at = time.monotonic()
        stream = self._edge_green_stream.stream if self._edge_green_stream is not None else None
        if stream is not None:
            # The batch's tensors were built on the schedule stream.
            stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if work.written is not None:
                self._edge_read_fence.wait(work.written, stream)
            result = self.tp_worker.forward_batch_generation(batch)
            delayed_sampling = result.delay_sample_func is not None
            if delayed_sampling:
                # With overlap on, the worker defers sampling for grammar batches
                # to the scheduler; here it is due at once.
                result.delay_sample_func()
            tokens_only = not (batch.return_logprob or batch.return_hidden_states or delayed_sampling)
            launched = _Launched(work=work, batch=batch, result=result, start=start, taken_at=taken_at,
                                 launched_at=launched_at)
            if overlap and tokens_only and stream is None and result.next_token_ids.is_cuda:
                # The reply's logits output holds no tensor of a tokens-only batch: built now, it
                # reads nothing the next forward overwrites.
                launched.logits_output = host_logits_output(result.logits_output, False, False)
                launched.copy_tokens_to_host()
            else:
                launched.reply = self._edge_prefill_reply(work, batch, result)
        return launched

    def _edge_finish_prefill(self, launched: "_Launched") -> PrefillResult:
        reply = launched.reply
        if reply is None:
            reply = PrefillResult(seq=launched.work.seq, next_token_ids=launched.host_tokens(),
                                  logits_output=launched.logits_output, forward_ms=0.0)
        # A batch launched behind another starts its own time when the one before it is done, so
        # that forward_ms adds up to the time this side was busy.
        now = time.perf_counter()
        elapsed_ms = (now - max(launched.start, self._edge_last_finish)) * 1e3
        self._edge_last_finish = now
        return dataclasses.replace(reply, forward_ms=elapsed_ms,
                                   times=PrefillTimes(launched.taken_at, launched.launched_at, time.monotonic()))

    def _edge_prefill_reply(self, work: PrefillWork, batch, result) -> PrefillResult:
        """The first tokens and logprobs on the host, read on the stream the forward ran on.

        The device-to-host copies wait for the forward's sampling, and the host for
        the copies: the KV this batch wrote into the shared pool is complete before
        the reply leaves, also when the forward ran on a green-context stream.
        """
        next_token_ids = result.next_token_ids.tolist()
        logits_output = result.logits_output
        if logits_output is not None:
            # Input logprobs copied out of graph storage finish behind an event,
            # which cannot cross processes.
            logits_output.finalize_input_logprobs()
        return PrefillResult(
            seq=work.seq,
            next_token_ids=next_token_ids,
            logits_output=host_logits_output(logits_output, batch.return_logprob, batch.return_hidden_states),
            forward_ms=0.0,
        )


# A second batch is launched behind the one on the device, not more: a third would only queue
# on the device, and scheduling it later lets it take the prompts that arrive meanwhile.
MAX_LAUNCHED = 2
# While a launched batch runs and another may come, the channel is watched this long per look.
LAUNCHED_POLL_MS = 1


@dataclasses.dataclass
class _Launched:
    """A prefill batch whose forward is launched: its reply is built, or its tokens are on their way to the host."""

    work: PrefillWork
    batch: object
    result: object
    start: float  # perf_counter when the batch was taken, for forward_ms
    taken_at: float
    launched_at: float
    reply: Optional[PrefillResult] = None  # built at launch when the batch needs more than its tokens
    logits_output: object = None  # the reply's, for a batch whose tokens are still on their way
    _tokens: Optional[torch.Tensor] = None  # pinned host copy of the sampled tokens
    _copied: Optional[torch.cuda.Event] = None

    @property
    def overlappable(self) -> bool:
        """Whether a batch may be launched behind this one before its tokens are read."""
        return self._copied is not None

    def copy_tokens_to_host(self) -> None:
        ids = self.result.next_token_ids
        self._tokens = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        self._tokens.copy_(ids, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def done(self) -> bool:
        return self._copied is None or self._copied.query()

    def wait(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()

    def host_tokens(self) -> list[int]:
        """The sampled tokens, once the forward and the copy behind it are done (the KV is written by then)."""
        self.wait()
        return self._tokens.tolist()


def release_cached_blocks() -> int:
    """Give back the blocks this side's allocator caches unused; returns the bytes it still reserves.

    Called at start-up only, so that what the side reports is what it holds, not
    what start-up left cached; a later batch that needs more allocates again.
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return 0
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def log_own_memory(log_prefix: str, graph_bytes: int) -> None:
    """Operators see a few GB for a process that maps its weights and KV cache; say where they are.

    What the driver reports beyond the allocator is the process's CUDA context and the
    libraries it loaded (docs/benchmarks.md measures both).
    """
    reserved = release_cached_blocks()
    if reserved:
        gib = 2**30
        logger.info("%s GPU memory of its own: %.2f GiB in its allocator (%.2f GiB in live tensors), of which "
                    "%.2f GiB prefill CUDA graphs; weights and KV cache are the decode side's",
                    log_prefix, reserved / gib, torch.cuda.memory_allocated() / gib, graph_bytes / gib)


def runner_gpu(runner) -> torch.device:
    """The model runner's device with its GPU index.

    Upstream keeps ``runner.device`` a bare ``"cuda"`` and the GPU in ``gpu_id``;
    green contexts made from the bare device would all land on GPU 0, whatever
    GPU this rank runs on.
    """
    device = torch.device(runner.device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(runner.gpu_id))
    return device


def host_logits_output(logits_output, return_logprob: bool, return_hidden_states: bool):
    """The part of the logits output the decode side's result processing reads, on the host.

    Tensors move to the host; device-side synchronisation objects (events,
    streams) are process-local and are dropped.
    """
    if logits_output is None:
        return None
    import dataclasses

    moved = {}
    for f in dataclasses.fields(logits_output):
        value = getattr(logits_output, f.name)
        if _is_device_sync_object(value):
            moved[f.name] = None
        elif not (return_logprob or return_hidden_states):
            continue
        elif isinstance(value, torch.Tensor):
            moved[f.name] = value.cpu()
        elif isinstance(value, list):
            moved[f.name] = [v.cpu() if isinstance(v, torch.Tensor) else v for v in value]
    moved["next_token_logits"] = None
    if not return_hidden_states:
        moved["hidden_states"] = None
    return dataclasses.replace(logits_output, **moved)


def _is_device_sync_object(value) -> bool:
    kinds = tuple(t for t in (getattr(torch.cuda, "Event", None), getattr(torch.cuda, "Stream", None),
                              getattr(torch, "Event", None), getattr(torch, "Stream", None)) if isinstance(t, type))
    return isinstance(value, kinds)
