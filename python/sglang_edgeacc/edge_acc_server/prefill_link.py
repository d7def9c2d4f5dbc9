"""The decode side's link to its prefill side: the child process, the channel, the fence, the batch in flight.

One owner for everything the decode side keeps about its prefill side, built
with the decode side's scheduler, whose first act starts the prefill side's
process (``prestart``: it imports sglang meanwhile); given its start once the
decode side's pools exist and before it captures its CUDA graphs (``spawn``),
and waited for at the end of the decode side's start (``wait_ready``). The scheduler decides what to send and what to do
with a reply; this component only moves batches across and keeps the rules of
the link: at most ``depth`` batches in flight, replies answer the batches in the
order sent, and the ranks of an attention-TP group take a reply in the same step.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing as mp
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang_edgeacc.edge_acc.ordering import WriteFence
from sglang_edgeacc.edge_acc.sm_partition import SideSplit, environment_for_child, mps_priority_env, side_split
from sglang_edgeacc.edge_acc_server import roles
from sglang_edgeacc.edge_acc_server.channel import PeerLost, PendingSend, SideChannel, new_endpoint
from sglang_edgeacc.edge_acc_server.child_failure import PrefillSideFailed, fail_on_prefill_side_sigquit
from sglang_edgeacc.edge_acc_server.group_consensus import all_ranks_agree
from sglang_edgeacc.edge_acc_server.messages import (
    FreezeGarbageCollector,
    PrefillReady,
    PrefillResult,
    PrefillWork,
    Shutdown,
)
from sglang_edgeacc.edge_acc_server.port_plan import prefill_side_port_args
from sglang_edgeacc.edge_acc_server.prefill_process import PrefillStart, run_prefill_side
from sglang_edgeacc.edge_acc_server.shared_state import export_model_runner_state
from sglang_edgeacc.flags import get_flags

logger = logging.getLogger(__name__)

PREFILL_START_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class InflightPrefill:
    seq: int
    batch: object  # ScheduleBatch
    sent_at: float
    scheduled_at: float  # when the decode side began scheduling it (time.monotonic)


@dataclass(frozen=True)
class SpawnRanks:
    gpu_id: int
    tp_rank: int
    pp_rank: int
    dp_rank: Optional[int]


def spawn_ranks() -> SpawnRanks:
    """This decode side's ranks, which its prefill side takes as its own."""
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


class PrefillLink:
    def __init__(self, server_args, decode_port_args, log_prefix: Callable[[], str]):
        self._server_args = server_args
        self._decode_port_args = decode_port_args
        self._log_prefix = log_prefix
        self.ranks: Optional[SpawnRanks] = None
        self.split: Optional[SideSplit] = None  # the prefill side's SM split, once spawned
        self.prefill_pid: Optional[int] = None  # once it reported ready
        self._channel: Optional[SideChannel] = None
        self._proc = None  # multiprocessing.Process of the prefill side
        self._fence: Optional[WriteFence] = None
        self._agree_group = None
        self._seq = 0
        self._ready_pipe = None  # the spawned prefill side's start-up report, until wait_ready reads it
        self._start_pipe = None  # to the started process, until spawn sends it its start
        self._handover: Optional[PendingSend] = None  # the shared state on its way, until wait_ready joins it
        self._device = None
        self._inflight: deque[InflightPrefill] = deque()
        # Batches the decode side may have sent and not merged yet; the decode side sets it once
        # it knows whether its schedule allows a second one (``decode_side.prefill_batches_in_flight``).
        self.depth = 1

    @property
    def busy(self) -> bool:
        """A batch was sent and its result is not merged yet (its requests hold slots)."""
        return bool(self._inflight)

    @property
    def full(self) -> bool:
        """As many batches in flight as the link takes: the next one waits for a reply."""
        return len(self._inflight) >= self.depth

    @property
    def inflight_batches(self) -> list:
        """The batches sent and not merged yet, oldest first."""
        return [entry.batch for entry in self._inflight]

    # ----------------------------------------------------------------- start
    def prestart(self, device_type: str) -> None:
        """Start the prefill side's process now, with its environment; :meth:`spawn` gives it its start.

        Called first thing in the decode side's scheduler: the process imports sglang
        while this side loads its weights and allocates its pools
        (:mod:`~sglang_edgeacc.edge_acc_server.prefill_process`).
        """
        flags = get_flags(self._server_args)
        endpoint = new_endpoint()
        self._channel = SideChannel(endpoint, bind=True)
        self.split = side_split(roles.PREFILL, flags.edge_acc_prefill_sm_percent, flags.edge_acc_sm_partition,
                                device_type=device_type)
        env = {
            roles.ROLE_ENV: roles.PREFILL,
            roles.CHANNEL_ENV: endpoint,
            roles.DECODE_PID_ENV: str(os.getpid()),
            **self.split.env,
            **mps_priority_env(roles.PREFILL, flags.edge_acc_prefill_mps_priority, flags.edge_acc_sm_partition,
                               device_type=device_type),
        }
        ctx = mp.get_context("spawn")
        ready_reader, ready_writer = ctx.Pipe(duplex=False)
        start_reader, start_writer = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=run_prefill_side, args=(start_reader, ready_writer), name="edgeacc-prefill")
        with environment_for_child(env):
            self._proc.start()
        ready_writer.close()
        start_reader.close()
        logger.info("%s prefill side's process started (pid %d); it imports sglang while this side loads",
                    self._log_prefix(), self._proc.pid)
        self._ready_pipe = ready_reader
        self._start_pipe = start_writer
        # Ahead of multiprocessing's own exit handler, which joins the process: one still waiting
        # for its start would otherwise keep this side from exiting.
        atexit.register(self._close_start_pipe)

    def spawn(self, model_runner, tp_group, tp_cpu_group, agree_group) -> None:
        """Give the prefill side its start and hand it the shared state; :meth:`wait_ready` waits for it.

        Needs the model runner's weights and pools, not its CUDA graphs: sent before
        the decode side captures, the prefill side's start (mapping, its own graphs)
        runs while this side captures. ``tp_group`` picks the prefill sides' ports once
        for the whole TP group; ``agree_group`` is the group whose ranks take a reply
        in the same step.
        """
        from sglang.srt.utils.common import broadcast_pyobj

        ranks = spawn_ranks()
        self.ranks = ranks
        self._agree_group = agree_group

        # The prefill sides of this TP group form a TP group of their own: they
        # need one set of ports, chosen once and shared by every decode rank.
        port_args = [prefill_side_port_args(self._decode_port_args)] if tp_group.rank == tp_group.ranks[0] else None
        if tp_group.world_size > 1:
            port_args = broadcast_pyobj(port_args, tp_group.rank, tp_cpu_group, src=tp_group.ranks[0])
        port_args = port_args[0]

        self.split.log(self._log_prefix())  # printed here, on the decode side, so under its prefix
        fail_on_prefill_side_sigquit(self._log_prefix())
        logger.info("%s giving the prefill side its start", self._log_prefix())
        try:
            self._start_pipe.send(PrefillStart(self._server_args, port_args, ranks.gpu_id, ranks.tp_rank,
                                               ranks.pp_rank, ranks.dp_rank))
        except OSError:  # a broken pipe: it exited
            raise PeerLost(f"the prefill side exited with code {self._proc.exitcode} during start") from None
        finally:
            self._close_start_pipe()

        self._device = model_runner.device
        # Exported here (CUDA IPC handles are taken before this side starts capturing),
        # sent from a thread: the child connects only once upstream's scheduler runs in
        # it, which takes long enough to matter when this side could be capturing meanwhile.
        self._handover = self._channel.send_in_background(
            export_model_runner_state(model_runner), peer_alive=self._proc.is_alive,
            timeout_s=PREFILL_START_TIMEOUT_S)

    def _close_start_pipe(self) -> None:
        pipe, self._start_pipe = self._start_pipe, None
        if pipe is not None:
            pipe.close()

    def wait_ready(self) -> None:
        """Block until the spawned prefill side reports ready (it fails the start if it exits first)."""
        reader, alive = self._ready_pipe, self._proc.is_alive
        self._ready_pipe = None
        handover, self._handover = self._handover, None
        try:
            handover.wait()
        except PrefillSideFailed:
            raise  # its signal came during the wait: its own traceback is logged, not an exit code
        except PeerLost:
            raise PeerLost(f"the prefill side exited with code {self._proc.exitcode} during start") from None
        deadline = time.monotonic() + PREFILL_START_TIMEOUT_S
        while not reader.poll(1.0):
            if not alive():
                raise PeerLost(f"the prefill side exited with code {self._proc.exitcode} during start")
            if time.monotonic() > deadline:
                raise TimeoutError("the prefill side did not start within the time limit")
        info = reader.recv()
        if info.get("status") != "ready":
            raise RuntimeError(f"the prefill side failed to start: {info}")
        ready = self._channel.recv(timeout_s=PREFILL_START_TIMEOUT_S, peer_alive=alive, what="PrefillReady")
        assert isinstance(ready, PrefillReady), type(ready)
        self._fence = WriteFence(self._device)
        self.prefill_pid = ready.pid
        logger.info("%s prefill side pid %d is ready", self._log_prefix(), ready.pid)

    # ----------------------------------------------------------------- running
    def check_alive(self) -> None:
        if not self._proc.is_alive():
            raise PeerLost(
                f"{self._log_prefix()} the prefill side (pid {self._proc.pid}) exited "
                f"with code {self._proc.exitcode}; shutting the server down"
            )

    def signal_inputs(self, forward_stream):
        """A fence the prefill side waits on before its forward.

        It covers the batch's slots and req_to_token rows, written on the schedule
        stream, and every decode step already launched on the forward stream: a slot
        this batch reuses may have been freed by a request that step still writes
        KV for (upstream's own order keeps that write before the next forward of the
        same stream; the prefill side runs on another stream, in another process).
        """
        current = torch.cuda.current_stream() if torch.cuda.is_available() else None
        if forward_stream is None or current is None or self._fence.mode != "event":
            return self._fence.signal()
        forward_stream.wait_stream(current)
        return self._fence.signal(forward_stream)

    def send(self, batch, packed: bytes, written, scheduled_at: float) -> None:
        """Hand one prefill batch over."""
        assert not self.full, f"at most {self.depth} prefill batches in flight"
        self._seq += 1
        self._channel.send(PrefillWork(seq=self._seq, batch=packed, written=written))
        self._inflight.append(InflightPrefill(seq=self._seq, batch=batch, sent_at=time.monotonic(),
                                              scheduled_at=scheduled_at))

    def freeze_gc(self, gc_threshold) -> None:
        """Have the prefill side freeze its garbage collector (it takes the message between batches)."""
        threshold = None if gc_threshold is None else tuple(gc_threshold)
        self._channel.send(FreezeGarbageCollector(gc_threshold=threshold), peer_alive=self._proc.is_alive)

    def poll(self) -> Optional[tuple[InflightPrefill, PrefillResult]]:
        """The oldest batch in flight and its result, once every rank of the group has it; else None.

        The ranks of an attention-TP group run one decode forward together, so
        they must merge a finished prefill in the same step; replies reach them
        at different times, so they agree on the slowest.
        """
        if not self._inflight:
            return None
        if not all_ranks_agree(self._channel.wait_readable(0), self._agree_group):
            return None
        reply = self._channel.recv(timeout_s=None, peer_alive=self._proc.is_alive, what="a prefill result")
        assert isinstance(reply, PrefillResult), type(reply)
        inflight = self._inflight.popleft()
        if reply.error is not None:
            raise RuntimeError(f"{self._log_prefix()} the prefill side failed:\n{reply.error}")
        if reply.seq != inflight.seq:
            raise RuntimeError(f"prefill reply {reply.seq} does not answer batch {inflight.seq}")
        return inflight, reply

    def wait_readable(self, timeout_ms: int, also=()) -> bool:
        """Whether a reply (or a message on one of the sockets ``also``) is waiting within ``timeout_ms``."""
        return self._channel.wait_readable(timeout_ms, also)

    @property
    def replies_taken_alone(self) -> bool:
        """Whether this rank takes a reply without the other ranks of its group (a group of one).

        Otherwise :meth:`poll` is a collective, and no rank may poll on its own schedule.
        """
        import torch.distributed as dist

        return self._agree_group is None or dist.get_world_size(group=self._agree_group) == 1

    # ----------------------------------------------------------------- stop
    def stop(self) -> None:
        """Ask the prefill side to release its mappings and exit before this side does."""
        proc = self._proc
        if proc is None or not proc.is_alive():
            return
        try:
            self._channel.send(Shutdown())
        except Exception:  # the channel may already be gone at interpreter exit
            pass
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
