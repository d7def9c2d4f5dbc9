"""The decode side's loop keeps upstream's overlap order.

The real-server tests (test_edge_acc_server.py) show that outputs are
upstream's with the overlap schedule on and off; they cannot see *when* a
result is processed. Here the loop of :class:`DecodeSideScheduler` runs against a
recording stand-in for the rest of the scheduler, and the order of launches,
result processing and delayed sampling is checked against the rules upstream's
``event_loop_overlap`` follows.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from sglang_edgeacc.edge_acc_server.decode_pacing import RECENT_STEPS, DecodePacer
from sglang_edgeacc.edge_acc_server.decode_side import DecodeSideScheduler
from sglang_edgeacc.edge_acc_server.decode_step_times import DecodeStepClock
from sglang_edgeacc.edge_acc_server.long_gaps import LongGapLog
from sglang_edgeacc.edge_acc_server.metrics import EdgeAccStats


class _DecodeBatch:
    def __init__(self, step: int):
        self.step = step
        self.forward_mode = SimpleNamespace(is_decode=lambda: True)
        self.reqs = [SimpleNamespace()]  # one running request

    def copy(self):
        return _DecodeBatch(self.step)


class _RecordingLink:
    """The prefill side's link, never busy: only its stop is recorded."""

    busy = False
    full = False
    replies_taken_alone = True
    depth = 1
    inflight_batches: list = []

    def __init__(self, events):
        self._events = events

    def check_alive(self):
        pass

    def wait_readable(self, timeout_ms, also=()):
        return False

    def stop(self):
        self._events.append(("stop", 0))


class _RecordingDecodeSide(DecodeSideScheduler):
    """The decode loop with everything around it replaced by a recorder."""

    def __init__(self, overlap: bool, steps: int):
        self.enable_overlap = overlap
        self.steps = steps
        self.events: list[tuple[str, int]] = []
        self.queue_sizes_at_scheduling: list[int] = []
        self.result_queue = deque()
        self._edge_unmerged = deque()
        self.gracefully_exit = False
        self._engine_paused = False
        self.prefill_link = _RecordingLink(self.events)
        self.decode_clock = DecodeStepClock()
        self.long_gaps = LongGapLog(itl_slo_ms=50.0, log_prefix=lambda: "[edgeacc decode tp0]")
        self.decode_pacer = DecodePacer(itl_slo_ms=50.0)
        self.require_mlp_sync = False
        self.enable_priority_preemption = False
        self.server_args = SimpleNamespace()  # EdgeAcc's default flags
        self.chunked_req = None
        self.waiting_queue = []
        self.running_batch = SimpleNamespace(batch_size=lambda: 1)
        self.edge_acc_stats = EdgeAccStats()  # the real one, without Prometheus: it records nothing
        self.last_batch = None
        self._next = 1

    # the scheduler around the loop
    def ingest_requests(self):
        pass

    def _edge_request_sockets(self):
        return ()

    def _edge_collect_prefill(self):
        pass

    def _edge_dispatch_prefill(self):
        pass

    def _edge_log_prefix(self):
        return "[edgeacc decode tp0]"

    def on_idle(self):
        pass

    def _apply_war_barrier(self):
        pass

    def _edge_next_decode_batch(self):
        self.queue_sizes_at_scheduling.append(len(self.result_queue))
        if self._next > self.steps:
            self.gracefully_exit = True
            return None
        batch = _DecodeBatch(self._next)
        self._next += 1
        return batch

    def run_batch(self, batch):
        self.events.append(("run", batch.step))
        return SimpleNamespace(step=batch.step)

    def process_batch_result(self, batch, result):
        assert batch.step == result.step
        self.events.append(("process", batch.step))

    def launch_batch_sample_if_needed(self, result, batch):
        if result is not None:
            self.events.append(("sample", batch.step))


def _at(events, what, step):
    return events.index((what, step))


def test_overlap_launches_the_next_step_before_processing_the_previous():
    side = _RecordingDecodeSide(overlap=True, steps=5)
    side.event_loop_edge_acc_decode()
    ev = side.events
    assert [s for what, s in ev if what == "process"] == [1, 2, 3, 4, 5], ev
    for step in range(2, 6):
        assert _at(ev, "run", step) < _at(ev, "process", step - 1), ev  # pipelined
        # A delayed (grammar) sample waits for the previous result, which advanced the grammar.
        assert _at(ev, "process", step - 1) < _at(ev, "sample", step), ev
    assert ev[-1] == ("stop", 0)
    # update_running_batch sees at most the one pending result (_reqs_finishing_inflight asserts it).
    assert max(side.queue_sizes_at_scheduling) == 1
    assert side.enable_skip_finishing_decode is True
    assert not side.result_queue


def test_without_overlap_each_result_is_processed_in_its_step():
    side = _RecordingDecodeSide(overlap=False, steps=4)
    side.event_loop_edge_acc_decode()
    ev = side.events
    for step in range(1, 4):
        assert _at(ev, "process", step) < _at(ev, "run", step + 1), ev
    assert max(side.queue_sizes_at_scheduling) == 0
    assert side.enable_skip_finishing_decode is False


@pytest.mark.parametrize("overlap", [True, False])
def test_a_failing_step_still_stops_the_prefill_side(overlap):
    side = _RecordingDecodeSide(overlap=overlap, steps=3)

    def fail(batch):
        raise RuntimeError("forward failed")

    side.run_batch = fail
    with pytest.raises(RuntimeError, match="forward failed"):
        side.event_loop_edge_acc_decode()
    assert side.events[-1] == ("stop", 0)


def test_a_prefill_in_flight_keeps_the_decode_side_busy(monkeypatch):
    """/flush_cache and health checks ask is_fully_idle; in-flight requests are in no queue but hold slots."""
    from sglang.srt.managers.scheduler import Scheduler

    from sglang_edgeacc.edge_acc_server.prefill_link import PrefillLink

    # Upstream's answer, with nothing queued or running.
    monkeypatch.setattr(Scheduler, "is_fully_idle", lambda self, for_health_check=False, ignore_waiting=False: True)
    side = DecodeSideScheduler.__new__(DecodeSideScheduler)
    # As the decode side's constructor builds it: unstarted, and asked before it starts.
    side.prefill_link = PrefillLink(server_args=None, decode_port_args=None, log_prefix=lambda: "[edgeacc decode tp0]")
    side._edge_unmerged = deque()
    assert side.is_fully_idle() is True
    side.prefill_link._inflight.append(object())
    assert side.is_fully_idle() is False
    side.prefill_link._inflight.clear()
    assert side.is_fully_idle(ignore_waiting=True) is True
    # A batch whose result went out during a decode step, not yet merged into the running batch.
    side._edge_unmerged.append(object())
    assert side.is_fully_idle() is False


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _BusyLink(_RecordingLink):
    """A prefill side always busy; its reply arrives during the wait before step ``reply_before_step``,
    and a request on one of the sockets the wait also watches before step ``request_before_step``."""

    busy = True
    replies_taken_alone = True

    def __init__(self, events, clock, side, reply_before_step, request_before_step=0):
        super().__init__(events)
        self._clock, self._side, self._reply_before = clock, side, reply_before_step
        self._request_before = request_before_step

    def wait_readable(self, timeout_ms, also=()):
        for what, before, watched in (("reply", self._reply_before, True),
                                      ("request", self._request_before, bool(also))):
            if watched and self._side._next == before and (what, before) not in self._events:
                self._clock.now += timeout_ms / 2000  # halfway through the wait
                self._events.append((what, before))
                return True
        self._clock.now += timeout_ms / 1000
        self._events.append(("waited", round(timeout_ms)))
        return False


def _paced_side(prefill_busy: bool, reply_before_step: int = 0, request_before_step: int = 0,
                step_ms=lambda step: 10, itl_slo_ms: float = 50.0):
    clock = _Clock()
    side = _RecordingDecodeSide(overlap=True, steps=4)
    side.decode_pacer = DecodePacer(itl_slo_ms=itl_slo_ms, clock=clock)
    side.prefill_link = _BusyLink(side.events, clock, side, reply_before_step, request_before_step)
    side.prefill_link.busy = prefill_busy
    # No prompt queues behind the batch in flight: a lone prompt's prefill is paced for too.
    side.waiting_queue = []
    collected = []
    side._edge_collect_prefill = lambda: collected.append(side._next)
    run, process = side.run_batch, side.process_batch_result
    side.result_times = {}

    def timed_run(batch):
        clock.now += step_ms(batch.step) / 1000  # the step's time on the device, until its result is read
        return run(batch)

    def timed_process(batch, result):
        side.result_times[batch.step] = clock.now
        return process(batch, result)

    side.run_batch, side.process_batch_result = timed_run, timed_process
    return side, collected


def _gaps_ms(side) -> list[float]:
    times = [side.result_times[step] for step in sorted(side.result_times)]
    return [round((later - earlier) * 1000, 3) for earlier, later in zip(times, times[1:])]


def test_decode_results_are_spaced_while_the_prefill_side_has_a_batch():
    side, _ = _paced_side(prefill_busy=True)
    side.event_loop_edge_acc_decode()
    ev = side.events
    # 45 ms between results (0.9 of the 50 ms target): each 10 ms step waits 35 ms after the last result.
    for step in range(2, 5):
        # The previous step's tokens go out before the wait, not after it.
        assert _at(ev, "process", step - 1) < _at(ev, "run", step), ev
        assert ev[_at(ev, "run", step) - 1] == ("waited", 35), ev
    assert _gaps_ms(side) == [45.0, 45.0, 45.0]
    assert [s for what, s in ev if what == "process"] == [1, 2, 3, 4], ev


@pytest.mark.parametrize("waiting", ["none", "queued", "second batch in flight", "rest of a chunked prompt"])
def test_the_gap_widens_to_the_target_only_while_prompts_wait_behind_the_prefill_batch(waiting):
    side, _ = _paced_side(prefill_busy=True, itl_slo_ms=100.0)
    if waiting == "queued":
        side.waiting_queue = [SimpleNamespace()]
    elif waiting == "second batch in flight":
        side.prefill_link.inflight_batches = [SimpleNamespace(), SimpleNamespace()]
    elif waiting == "rest of a chunked prompt":
        side.chunked_req = SimpleNamespace()
    side.event_loop_edge_acc_decode()
    # Prompts waiting: 0.9 of the 100 ms target. None: 0.9 of the calm target (50 ms).
    expected = 45.0 if waiting == "none" else 90.0
    assert _gaps_ms(side) == [expected] * 3


def test_the_gap_follows_the_queue_from_one_step_to_the_next():
    side, _ = _paced_side(prefill_busy=True, itl_slo_ms=100.0)
    ingest = side.ingest_requests

    def ingest_requests():  # a prompt queues before step 3 and is scheduled before step 4
        side.waiting_queue = [SimpleNamespace()] if side._next == 3 else []
        ingest()

    side.ingest_requests = ingest_requests
    side.event_loop_edge_acc_decode()
    assert _gaps_ms(side) == [45.0, 90.0, 45.0]


def test_the_calm_gap_is_never_wider_than_the_target():
    pacer = DecodePacer(itl_slo_ms=30.0)
    assert pacer.aim_s(prompts_waiting=True) == pacer.aim_s(prompts_waiting=False) == pytest.approx(0.027)
    pacer.retarget(100.0)
    assert (pacer.aim_s(True), pacer.aim_s(False)) == (pytest.approx(0.090), pytest.approx(0.045))


def test_a_longer_step_beside_a_prefill_starts_sooner_so_the_gap_stays_at_the_aim():
    # Steps beside a prefill take 10 ms, then 30 ms (say, a larger batch or a heavier prefill beside them).
    side, _ = _paced_side(prefill_busy=True, step_ms=lambda step: 10 if step < 3 else 30)
    side.event_loop_edge_acc_decode()
    ev = side.events
    # The first 30 ms step was not foreseen: its gap is the aim plus the 20 ms it took longer. The one
    # after it starts 20 ms sooner (15 ms after the last result), and its tokens come 45 ms after.
    assert _gaps_ms(side) == [45.0, 65.0, 45.0]
    assert ev[_at(ev, "run", 4) - 1] == ("waited", 15), ev


def test_the_pacer_predicts_a_step_from_the_longest_recent_one_beside_a_prefill():
    clock = _Clock()
    pacer = DecodePacer(itl_slo_ms=50.0, clock=clock)

    def step(seconds, beside=True, decode=True):
        pacer.launched()
        clock.now += seconds
        pacer.result(decode, beside)

    step(0.008, beside=False)
    assert pacer.predicted_step_s() == pytest.approx(0.008)  # nothing beside a prefill yet: the last step
    step(0.030)
    step(0.020)
    step(0.005, beside=False)  # a step alone says nothing of one beside a prefill
    assert pacer.predicted_step_s() == pytest.approx(0.030)
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == pytest.approx(0.045 - 0.030)
    assert pacer.next_step(prefill_busy=False, prompts_waiting=False).wait_s == 0
    step(0.040, decode=False)  # an idle batch's result is no decode result: the wait still counts from the last
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == 0
    pacer.idle()  # no step ran: the next one has nothing to be spaced from
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == 0
    for _ in range(RECENT_STEPS):
        step(0.010)
    assert pacer.predicted_step_s() == pytest.approx(0.010)  # the 30 ms step is out of the window


def test_a_new_target_aims_the_next_step_and_keeps_what_recent_steps_took():
    clock = _Clock()
    pacer = DecodePacer(itl_slo_ms=50.0, clock=clock)
    pacer.launched()
    clock.now += 0.020
    pacer.result(True, True)  # a 20 ms step beside a prefill
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == pytest.approx(0.045 - 0.020)
    pacer.retarget(100.0)
    assert pacer.aimed_gap_s == pytest.approx(0.090)
    assert pacer.next_step(prefill_busy=True, prompts_waiting=True).wait_s == pytest.approx(0.090 - 0.020)
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == pytest.approx(0.045 - 0.020)
    pacer.retarget(20.0)  # an aim of 18 ms, below what steps take: none waits (the overlap schedule)
    assert not pacer.paces(prefill_busy=True, prompts_waiting=False) and pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == 0


def test_requests_whose_first_tokens_went_out_during_a_step_get_their_second_within_the_aim():
    clock = _Clock()
    pacer = DecodePacer(itl_slo_ms=50.0, clock=clock)
    pacer.launched()  # a step beside a prefill, 30 ms
    clock.now = 0.005
    pacer.first_tokens()  # a reply's first tokens go out while that step is on the device
    clock.now = 0.030
    pacer.result(decode_step=True, beside_prefill=True)
    # The next step carries those requests too: counted from their first tokens, not from this result,
    # it is already due (latest start 5 + 45 - 30 = 20 ms), where counted from the result it would wait 15.
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == 0
    pacer.launched()
    clock.now = 0.060
    pacer.result(decode_step=True, beside_prefill=True)
    # With them served, the next wait counts from the last result again.
    assert pacer.next_step(prefill_busy=True, prompts_waiting=False).wait_s == pytest.approx(0.060 + 0.045 - 0.030 - 0.060)


def test_a_pause_that_drops_a_queued_result_leaves_the_pacer_nothing_to_pair_it_with():
    side, _ = _paced_side(prefill_busy=False)
    paused = []

    def ingest_requests():
        if side._next == 3 and not paused:  # step 2 launched, its result still queued (overlap)
            paused.append(True)
            side.result_queue.clear()  # what upstream's retracting pause does with it
            side._engine_paused = True
        elif side._engine_paused:  # continued, with a prefill batch in flight from now on
            side._engine_paused = False
            side.prefill_link.busy = True

    side.ingest_requests = ingest_requests
    side._record_scheduler_state_for_paused_engine = lambda: None
    side.event_loop_edge_acc_decode()
    ev = side.events
    # A pause is no gap: step 3 waits for nothing before it. Its 10 ms are paired with its own launch (not
    # with step 2's, whose result the pause dropped), so step 4 waits the 35 ms that aim its tokens 45 ms after.
    assert ev[_at(ev, "run", 3) - 1][0] != "waited", ev
    assert ev[_at(ev, "run", 4) - 1] == ("waited", 35), ev


def test_with_the_prefill_side_idle_decode_steps_run_back_to_back():
    side, _ = _paced_side(prefill_busy=False)
    side.event_loop_edge_acc_decode()
    ev = side.events
    assert not [e for e in ev[:_at(ev, "run", 4)] if e[0] == "waited"], ev


def test_steps_that_leave_no_slack_beside_a_prefill_keep_the_overlap_schedule():
    # Steps of 50 ms beside a prefill: no wait could keep a gap at 45 ms.
    side, _ = _paced_side(prefill_busy=True, step_ms=lambda step: 50)
    side.event_loop_edge_acc_decode()
    ev = side.events
    assert not [e for e in ev if e[0] == "waited"][:-1], ev
    # Once a step has been timed the next is launched before the last result is processed, as unpaced.
    assert _at(ev, "run", 4) < _at(ev, "process", 3), ev


def test_a_prefill_reply_during_the_wait_is_taken_before_the_next_step():
    side, collected = _paced_side(prefill_busy=True, reply_before_step=3)
    side.event_loop_edge_acc_decode()
    ev = side.events
    # The loop went round once more to take the reply (and hand over the next batch), then waited
    # out the rest of the wait before step 3: its tokens still come 45 ms after step 2's.
    assert collected.count(3) == 2, collected
    assert _at(ev, "reply", 3) < _at(ev, "waited", 17) < _at(ev, "run", 3), ev
    assert _gaps_ms(side)[1] == pytest.approx(45.0, abs=1.0)


@pytest.mark.parametrize("watched", [True, False])
def test_a_request_during_the_wait_is_handed_over_before_the_next_step(watched):
    side, _ = _paced_side(prefill_busy=True, request_before_step=3)
    side._edge_request_sockets = lambda: ("the tokenizer's socket",) if watched else ()
    dispatched = []
    side._edge_dispatch_prefill = lambda: dispatched.append(side._next)
    side.event_loop_edge_acc_decode()
    ev = side.events
    if not watched:  # the control: the request waits in its socket until the step has run
        assert dispatched.count(3) == 1 and ("request", 3) not in ev, (dispatched, ev)
        return
    # The loop went round once more to admit the request and hand it over, then waited out the rest
    # of the wait before step 3.
    assert dispatched.count(3) == 2, dispatched
    assert ev[_at(ev, "request", 3) + 1:_at(ev, "run", 3)] == [("waited", 17)], ev
    assert _gaps_ms(side)[1] == pytest.approx(45.0, abs=1.0)


def test_the_wait_watches_the_sockets_upstream_receives_requests_on():
    import zmq

    context = zmq.Context.instance()
    tokenizer, rpc = context.socket(zmq.PULL), context.socket(zmq.DEALER)
    try:
        side = DecodeSideScheduler.__new__(DecodeSideScheduler)
        side.prefill_link = SimpleNamespace(replies_taken_alone=True)
        side.require_mlp_sync = False
        side.recv_skipper = None
        side.recv_from_tokenizer = tokenizer
        side.ipc_channels = SimpleNamespace(recv_from_rpc=rpc)
        assert side._edge_request_sockets() == (tokenizer, rpc)
        # Not on a rank that receives nothing, nor from the Rust server's ring, nor where upstream
        # receives only every few passes (a request left unread would end every wait at once).
        side.recv_from_tokenizer, side.ipc_channels = object(), SimpleNamespace(recv_from_rpc=None)
        assert side._edge_request_sockets() == ()
        side.recv_from_tokenizer, side.recv_skipper = tokenizer, object()
        assert side._edge_request_sockets() == ()
    finally:
        tokenizer.close(linger=0)
        rpc.close(linger=0)


def test_a_message_on_a_watched_socket_ends_the_channels_wait():
    import time

    import zmq

    from sglang_edgeacc.edge_acc_server.channel import SideChannel, new_endpoint

    context = zmq.Context.instance()
    endpoint = f"inproc://edgeacc-requests-{id(context)}"
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    channel = SideChannel(new_endpoint(), bind=True)
    try:
        pull.bind(endpoint)
        push.connect(endpoint)
        start = time.monotonic()
        assert channel.wait_readable(200, also=(pull,)) is False  # nothing anywhere: the whole wait
        assert time.monotonic() - start >= 0.15
        push.send(b"a request")
        start = time.monotonic()
        assert channel.wait_readable(2000, also=(pull,)) is True
        assert time.monotonic() - start < 1.0
        assert channel.wait_readable(0) is False  # the channel itself still has nothing
    finally:
        for socket in (pull, push):
            socket.close(linger=0)
        channel.close()


def test_a_retracting_pause_right_after_a_reply_taken_during_the_wait():
    """Upstream's retracting pause takes the last step's result from the queue whenever there is a last
    batch; after a reply ended a pacing wait that result has already gone out. Upstream's own pause runs
    here, on the recorded loop, in the pass that took the reply."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import PauseGenerationReqInput

    side, _ = _paced_side(prefill_busy=True, reply_before_step=3)
    # What upstream's retracting pause reads and writes of a scheduler with nothing running.
    side.running_batch = SimpleNamespace(batch_size=lambda: 0, reqs=[], batch_is_full=False)
    side.disaggregation_mode = DisaggregationMode.NULL
    side.enable_overlap_mlx = False
    side._pause_started_at = None
    side.decode_offload_manager = None
    side.metrics_reporter = SimpleNamespace(last_gen_throughput=0.0, current_scheduler_metrics_enabled=False)
    side.kv_events_publisher = SimpleNamespace(publish_kv_events=lambda: None)
    paused = []

    def collect():  # the reply that ended the wait is merged when the loop (or the pause) takes it
        if ("reply", 3) in side.events:
            side.prefill_link.busy = False

    def ingest_requests():
        if ("reply", 3) in side.events and not paused:
            paused.append(len(side.result_queue))
            side.pause_generation(PauseGenerationReqInput(mode="retract"))
            side._engine_paused = False  # continued at once

    side.ingest_requests = ingest_requests
    side._edge_collect_prefill = collect
    side.event_loop_edge_acc_decode()
    assert paused == [0], paused  # the pause came with the last step's result already processed
    assert [s for what, s in side.events if what == "process"] == [1, 2, 3, 4], side.events


def test_a_second_batch_in_flight_only_where_the_schedule_allows_it():
    from sglang_edgeacc.edge_acc_server.decode_side import prefill_batches_in_flight

    alone = dict(replies_taken_alone=True, mlp_sync=False, priority_preemption=False)
    assert prefill_batches_in_flight(2, **alone) == (2, "")
    depth, why = prefill_batches_in_flight(1, **alone)
    assert depth == 1 and "--edge-acc-prefill-batches-in-flight 1" in why
    for change, named in ((dict(replies_taken_alone=False), "ranks of the group"),
                          (dict(mlp_sync=True), "ranks of the group"),
                          (dict(priority_preemption=True), "--enable-priority-scheduling")):
        depth, why = prefill_batches_in_flight(2, **{**alone, **change})
        assert depth == 1 and named in why, (change, why)


def test_the_loop_hands_a_batch_over_while_one_is_in_flight_until_the_link_is_full():
    side = _RecordingDecodeSide(overlap=True, steps=3)
    dispatched = []
    side._edge_dispatch_prefill = lambda: dispatched.append(side._next)
    side.decode_pacer = DecodePacer(itl_slo_ms=0.0)
    side.prefill_link.busy = True  # a batch is at the prefill side, a second one fits
    side.event_loop_edge_acc_decode()
    assert dispatched == [1, 2, 3, 4]  # every pass, the last one (nothing left to decode) too
    side = _RecordingDecodeSide(overlap=True, steps=3)
    dispatched = []
    side._edge_dispatch_prefill = lambda: dispatched.append(side._next)
    side.decode_pacer = DecodePacer(itl_slo_ms=0.0)
    side.prefill_link.busy = side.prefill_link.full = True
    side.event_loop_edge_acc_decode()
    assert dispatched == []


class _TokensOnDevice:
    """A decode step's ``copy_done``: its tokens reach the host after ``pending`` more queries."""

    def __init__(self, pending: int):
        self.pending = pending

    def query(self):
        if self.pending:
            self.pending -= 1
            return False
        return True


class _ReplyingLink(_RecordingLink):
    """A prefill side with a batch whose reply comes while decode step ``reply_during`` runs."""

    busy = True

    def __init__(self, events, reply_during: int):
        super().__init__(events)
        self.reply_during = reply_during
        self.arrived = False
        self.replies_taken_alone = True

    def poll(self):
        if not self.arrived or not self.busy:
            return None
        self.busy = False
        return "inflight", "reply"


def _side_with_a_reply_during_a_step(monkeypatch, mid_step: bool):
    from sglang_edgeacc.edge_acc_server import upstream_mirror

    side = _RecordingDecodeSide(overlap=True, steps=4)
    side.decode_pacer = DecodePacer(itl_slo_ms=0.0)
    link = side.prefill_link = _ReplyingLink(side.events, reply_during=2)
    link.replies_taken_alone = mid_step
    # The real collection, with the real processing order around it.
    side._edge_collect_prefill = lambda: DecodeSideScheduler._edge_collect_prefill(side)
    side.ingest_requests = lambda: side.events.append(("ingest", side._next))
    side._edge_process_prefill = lambda inflight, reply: side.events.append(("first tokens", side._next)) or "batch"
    monkeypatch.setattr(upstream_mirror, "merge_prefilled", lambda scheduler, batch: side.events.append(
        ("merge", side._next)))
    run = side.run_batch

    def run_batch(batch):
        if batch.step == link.reply_during + 1:
            link.arrived = True  # while step 2 is still on the device, behind which step 3 is launched
        result = run(batch)
        result.copy_done = _TokensOnDevice(pending=2)
        return result

    side.run_batch = run_batch
    return side


@pytest.mark.parametrize("mid_step", [True, False])
def test_a_reply_that_comes_during_a_decode_step_streams_before_the_steps_tokens(monkeypatch, mid_step):
    side = _side_with_a_reply_during_a_step(monkeypatch, mid_step)
    side.event_loop_edge_acc_decode()
    ev = side.events
    first = _at(ev, "first tokens", 4)
    if not mid_step:  # the control: the reply waits for step 2's tokens, then for the top of the loop
        assert _at(ev, "process", 2) < _at(ev, "sample", 3) < first < _at(ev, "run", 4), ev
        assert ev[first + 1] == ("merge", 4), ev
        return
    # Taken while step 2 still ran: its first tokens go out before step 2's.
    assert _at(ev, "run", 3) < first < _at(ev, "process", 2), ev
    # Merged at the top of the next pass: after step 3's delayed sampling read the running batch, and
    # before anything else of that pass (an abort then finds its requests running).
    assert _at(ev, "sample", 3) < _at(ev, "merge", 4) < _at(ev, "ingest", 4) < _at(ev, "run", 4), ev
    assert [e for e in ev if e[0] in ("first tokens", "merge")] == [("first tokens", 4), ("merge", 4)], ev
    assert [s for what, s in ev if what == "process"] == [1, 2, 3, 4], ev


def test_a_reply_taken_while_the_pacing_wait_drains_the_last_step_joins_the_next_step(monkeypatch):
    side = _side_with_a_reply_during_a_step(monkeypatch, mid_step=True)
    clock = _Clock()
    side.decode_pacer = DecodePacer(itl_slo_ms=50.0, clock=clock)
    link = side.prefill_link
    link.wait_readable = lambda timeout_ms, also=(): side.events.append(("waited", round(timeout_ms))) or False
    side._edge_dispatch_prefill = lambda: side.events.append(("dispatch", side._next))
    run = side.run_batch

    def run_batch(batch):
        clock.now += 0.010
        result = run(batch)
        if batch.step == 2:  # the reply comes while step 2 is on the device, before step 3 is launched
            arrive = result.copy_done.query

            def query():
                link.arrived = True
                return arrive()

            result.copy_done.query = query
        return result

    side.run_batch = run_batch
    side.event_loop_edge_acc_decode()
    ev = side.events
    # Taken while the wait before step 3 drained step 2; the loop goes round to merge it and hand over the
    # next batch, so its requests decode in step 3.
    assert _at(ev, "first tokens", 3) < _at(ev, "process", 2) < _at(ev, "merge", 3) < _at(ev, "run", 3), ev
    assert _at(ev, "merge", 3) < ev.index(("dispatch", 3), _at(ev, "merge", 3)) < _at(ev, "run", 3), ev


@pytest.mark.parametrize("change", ["replies_taken_together", "mlp_sync"])
def test_where_the_ranks_step_together_no_wait_ends_early(change):
    side, _ = _paced_side(prefill_busy=True, reply_before_step=3, request_before_step=2)
    if change == "replies_taken_together":
        side.prefill_link.replies_taken_alone = False
    else:
        side.require_mlp_sync = True
    side._edge_request_sockets = lambda: ("the tokenizer's socket",)
    side.event_loop_edge_acc_decode()
    assert side._edge_wake_sockets == ()
    # Every pacing wait ran out as a sleep: no reply or request ended one (the 5 ms idle wait after the
    # last step watches the prefill link only).
    assert not [e for e in side.events if e[0] in ("reply", "request")], side.events
    assert [e for e in side.events if e[0] == "waited"] == [("waited", 5)], side.events
    assert [s for what, s in side.events if what == "process"] == [1, 2, 3, 4], side.events
