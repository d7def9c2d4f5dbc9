"""The pieces of upstream's scheduler that the decode side repeats (``edge_acc_server/upstream_mirror.py``)
leave behind what upstream's own methods leave behind.

Two worlds are built alike from real sglang objects: pools, allocator, radix
tree, future map, prefill batches made by ``ScheduleBatch.init_new`` and
``prepare_for_extend``, and a ``Scheduler`` made with ``Scheduler.__new__``
holding what the compared code reads. Upstream's method runs in one world and
the mirror in the other; then everything each left behind (the scheduler's
attributes, every field of the batches and of the result, the requests, the
tree, the req_to_token rows, the future map's relayed tokens) is turned into
plain values and compared. Stubs stand only for the model forward, for
``update_running_batch`` and ``get_new_batch_prefill`` (called by both paths
alike, never repeated), for the DP MLP sync's collective, and for the profiler
and metrics hooks the mirror leaves out.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
import time
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang_edgeacc.edge_acc_server import upstream_mirror
from sglang_edgeacc.tiny_model import model_dir

PROMPT = 5  # tokens of every prompt here
HELPERS = ("_relay_forward_payload", "update_cache_from_scheduler", "_copy_auxiliary_output_to_cpu",
           "stash_chunked_request")


@pytest.fixture(scope="module", autouse=True)
def runtime_context():
    """Upstream's config bags for a CPU launch of the tiny model, active only while these tests run."""
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(model_dir()), load_format="dummy", device="cpu")
    with use_context(create_context(args, role="scheduler")):
        yield args


# ----------------------------------------------------------------------------- the worlds
class _Worker:
    """The model forward: what the prefill side's reply carries, one token per request."""

    def __init__(self):
        self.seen_input_ids = None

    def forward_batch_generation(self, batch, **kwargs):
        from sglang.srt.managers.utils import GenerationBatchResult

        self.seen_input_ids = batch.input_ids.clone()
        return GenerationBatchResult(logits_output=None, next_token_ids=_sampled(batch), can_run_cuda_graph=False)


def _sampled(batch) -> torch.Tensor:
    return torch.tensor([70 + int(r.rid[1:]) for r in batch.reqs], dtype=torch.int64)


def _recording_sync_adapter(calls: list):
    from sglang.srt.managers.scheduler_components.dp_attn import SchedulerDPAttnAdapter

    class RecordingSync(SchedulerDPAttnAdapter):
        """Upstream's adapter; only the gather across DP ranks is replaced (it is a collective)."""

        def prepare_mlp_sync_batch(self, local_batch):
            calls.append(local_batch)
            return local_batch

    return RecordingSync


class World:
    def __init__(self, runtime_args, *, require_mlp_sync: bool = False, decode_returns: str = "batch"):
        from sglang.srt.beam_search.coordinator import BeamCoordinator
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.overlap_utils import FutureMap
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import NgramEmbeddingManager
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.kv = MHATokenToKVPool(size=128, page_size=1, dtype=torch.float32, head_num=1, head_dim=4, layer_num=1,
                                   device="cpu", enable_memory_saver=False)
        self.allocator = TokenToKVPoolAllocator(128, torch.float32, "cpu", self.kv, need_sort=False)
        self.req_pool = ReqToTokenPool(size=16, max_context_len=32, device="cpu", enable_memory_saver=False)
        self.tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                               token_to_kv_pool_allocator=self.allocator, page_size=1))
        self.model_config = ModelConfig.from_server_args(runtime_args)
        self.future_map = FutureMap(torch.device("cpu"), SpeculativeAlgorithm.NONE, self.req_pool)
        self.future_map.output_tokens_buf.fill_(-1)  # allocated uninitialised: compared below
        self.worker = _Worker()
        self.decode_calls: list = []
        self.sync_calls: list = []
        self.reqs: list = []
        self.decode_returns = decode_returns
        spec = SpeculativeAlgorithm.NONE
        s = Scheduler.__new__(Scheduler)
        self.scheduler = s
        s.__dict__.update(
            # run_batch
            scheduler_stage_metrics=None, forward_ct=41, _sched_idled=True, processed_tokens_counter=1000,
            metrics_reporter=SimpleNamespace(record_scheduler_active=lambda event_ns: None),
            profiler_manager=SimpleNamespace(_profile_batch_predicate=lambda batch: None),
            scripted_scheduler_hook=None, forward_sleep_time=None, disaggregation_mode=DisaggregationMode.NULL,
            is_generation=True, enable_overlap=False, enable_pdmux=False, spec_algorithm=spec,
            future_map=self.future_map, model_worker=self.worker, tp_worker=self.worker,
            enable_unified_cache_external_linker=False, attn_dp_enabled=False,
            beam_coordinator=BeamCoordinator(
                model_config=self.model_config, spec_algorithm=spec, dllm_enabled=False, max_req_len=32,
                req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.allocator, tree_cache=self.tree,
                future_map=self.future_map),
            # get_next_batch_to_run
            _pending_chunked_abort_req=None, enable_hierarchical_cache=False, enable_lmcache=False,
            enable_hicache_storage=False, dllm_config=None, enable_hisparse=False,
            _prefill_decode_interval_remaining=0, prefill_decode_interval=0, prefill_decode_interval_min_bs=0,
            require_mlp_sync=require_mlp_sync, tree_cache=self.tree, chunked_req=None,
            ngram_embedding_manager=NgramEmbeddingManager(enabled=False, table=None, n=0),
            running_batch=None, last_batch=None,
            update_running_batch=self._update_running_batch,
            get_new_batch_prefill=self._no_new_prefill,
        )
        # Upstream's helpers that both paths call, recorded: one that does nothing for this
        # batch (no auxiliary output; the base class's cache hook) must still be called.
        self.helper_calls: list = []
        for helper in HELPERS:
            setattr(s, helper, self._recorded(helper, getattr(Scheduler, helper).__get__(s)))
        s.dp_attn_adapter = _recording_sync_adapter(self.sync_calls)(
            model_runner=None, req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.allocator,
            tree_cache=self.tree, offload_tags=set(), model_config=self.model_config, enable_overlap=False,
            spec_algorithm=spec, get_require_mlp_sync=lambda: s.require_mlp_sync)
        self.names = {id(getattr(self, k)): k for k in ("kv", "allocator", "req_pool", "tree", "model_config",
                                                         "future_map", "worker", "scheduler")}
        self.names.update({id(getattr(s, k)): k for k in ("beam_coordinator", "dp_attn_adapter",
                                                          "ngram_embedding_manager")})

    def _recorded(self, name, method):
        def call(*args):
            self.helper_calls.append((name, [self.names.get(id(a), getattr(a, "rid", type(a).__name__))
                                             for a in args]))
            return method(*args)

        return call

    # what both paths call alike and the mirror does not repeat
    def _update_running_batch(self, batch):
        self.decode_calls.append([r.rid for r in batch.reqs])
        if self.decode_returns == "emptied":  # as upstream's does when every request is finishing
            batch.filter_batch(keep_indices=[])
        return None if self.decode_returns == "none" else batch

    def _no_new_prefill(self, running_batch):
        from sglang.srt.managers.scheduler import NextBatchPlan

        return NextBatchPlan(batch_to_run=None, running_batch=running_batch)

    # ------------------------------------------------------------------ batches
    def req(self, index: int, *, logprob: bool = False, done: bool = False, chunk_end: int | None = None):
        """Request ``r<index>``, admitted: prefix matched in the tree, ``chunk_end`` tokens of it this round."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        prompt = array("q", [1 + index, 2, 3, 4 + index, 5])
        req = Req(f"r{index}", "", prompt, SamplingParams(max_new_tokens=4), return_logprob=logprob,
                  vocab_size=self.model_config.vocab_size)
        if logprob:
            req.logprob_start_len = 1
        req.init_next_round_input(self.tree)
        req.extend_end = len(req.full_untruncated_fill_ids) if chunk_end is None else chunk_end
        req.done_after_prefill = done
        self.reqs.append(req)
        return req

    def prefill_batch(self, reqs, chunked_req=None):
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        batch = ScheduleBatch.init_new(reqs, self.req_pool, self.allocator, self.tree, self.model_config,
                                       False, self.scheduler.spec_algorithm, chunked_req=chunked_req)
        batch.prepare_for_extend()
        return batch

    def decoded(self, batch):
        """``batch`` after its prefill result: requests hold their first token (a stand-in for
        process_batch_result, which both paths run alike); those marked so are finished."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH

        for req, token in zip(batch.reqs, _sampled(batch).tolist()):
            if req is batch.chunked_req:
                continue
            req.output_ids.append(token)
            if req.done_after_prefill:
                req.finished_reason = FINISH_LENGTH(length=1)
        return batch

    def name(self, obj, name: str):
        self.names[id(obj)] = name
        return obj

    # ------------------------------------------------------------------ what is left behind
    def state(self, **extra) -> dict:
        s = self.scheduler
        out = {
            "scheduler": _plain(vars(s), self.names, depth=1),
            "running_batch": _plain(s.running_batch, self.names, depth=1, top=True),
            "reqs": {r.rid: _plain(r, self.names, depth=1, top=True) for r in self.reqs},
            "req_to_token": self.req_pool.req_to_token.tolist(),
            "relayed_tokens": self.future_map.output_tokens_buf.tolist(),
            "tree": (self.tree.evictable_size_, self.tree.protected_size_, _tree(self.tree.root_node)),
            "free_slots": self.allocator.available_size(),
            "decode_calls": self.decode_calls,
            "helper_calls": self.helper_calls,
            "synced": [None if b is None else self.names.get(id(b), "another") for b in self.sync_calls],
        }
        for key, value in extra.items():
            out[key] = _plain(value, self.names, depth=1, top=True)
        return out


# Read from the clock (a batch's launch, a request's arrival): compared for presence only.
TIMES = {"launch_ts", "scheduler_recv_time"}


def _plain(value, names, depth, top=False):
    """``value`` as plain data: world objects by name, tensors by value, requests by rid and state."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.radix_cache import TreeNode

    if not top and id(value) in names:
        return names[id(value)]
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, enum.Enum):
        return repr(value)
    if isinstance(value, array):
        return ("array", value.tolist())
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_plain(v, names, depth) for v in value]
        return (type(value).__name__, sorted(map(repr, items)) if isinstance(value, (set, frozenset)) else items)
    if isinstance(value, dict):
        return {k: ("<time>" if k in TIMES and v is not None else _plain(v, names, depth))
                for k, v in value.items()}
    if isinstance(value, TreeNode):  # ids and times come from process-wide counters and the clock
        return ("TreeNode", _plain(value.key, names, 0), _plain(value.value, names, 0), value.lock_ref)
    if isinstance(value, Req) and not top:
        return ("req", value.rid, _plain(value, names, depth, top=True) if depth >= 0 else None)
    if inspect.isroutine(value):
        return ("callable", getattr(value, "__qualname__", type(value).__name__))
    fields = getattr(value, "__dict__", None)
    if fields is None and hasattr(type(value), "__slots__"):
        fields = {k: getattr(value, k) for k in type(value).__slots__ if hasattr(value, k)}
    if fields is None or depth < 0:
        return type(value).__name__
    return (type(value).__name__, _plain(dict(fields), names, depth - 1))


def _tree(node):
    children = sorted((_tree(child) for child in node.children.values()), key=repr)
    return (node.key.token_ids.tolist(), _plain(node.value, {}, 0), node.lock_ref, children)


def _upstream_run_batch(world, batch):
    return world.scheduler.run_batch(batch)


def _mirror_run_batch(world, batch):
    """The decode side's hand-off: the mirror before the forward, the prefill side's forward, the mirror after."""
    from sglang.srt.managers.utils import GenerationBatchResult

    upstream_mirror.before_forward(world.scheduler, batch)
    # What the prefill side receives (the batch as packed), and what its reply becomes.
    world.worker.seen_input_ids = batch.input_ids.clone()
    result = GenerationBatchResult(logits_output=None, next_token_ids=_sampled(batch), can_run_cuda_graph=False)
    upstream_mirror.after_forward(world.scheduler, batch, result)
    return result


def _diff(a: dict, b: dict, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only {'upstream' if key in a else 'mirror'} has it")
            else:
                out.extend(_diff(a[key], b[key], f"{path}.{key}"))
        return out
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: upstream {a!r}, mirror {b!r}"]


# ----------------------------------------------------------------------------- run_batch
@pytest.mark.parametrize("logprob", [False, True], ids=["plain", "logprob"])
@pytest.mark.parametrize("idled", [True, False], ids=["after_idle", "busy"])
def test_the_bookkeeping_around_a_prefill_forward_is_run_batchs(runtime_context, logprob, idled):
    states = []
    for run in (_upstream_run_batch, _mirror_run_batch):
        world = World(runtime_context)
        world.scheduler._sched_idled = idled
        batch = world.name(world.prefill_batch([world.req(0, logprob=logprob), world.req(1), world.req(2)]),
                           "prefill")
        started = time.monotonic()
        result = run(world, batch)
        assert started <= batch.launch_ts <= time.monotonic()
        states.append(world.state(batch=batch, result=result, forward_input=world.worker.seen_input_ids))
    upstream, mirror = states
    assert upstream["scheduler"]  # something was compared
    assert not _diff(upstream, mirror), "\n".join(_diff(upstream, mirror))
    # What the comparison covers here, for a reader: the counters moved and the tokens were relayed.
    sched = upstream["scheduler"]
    assert sched["forward_ct"] == 42 and sched["processed_tokens_counter"] == 1000 + 3 * PROMPT
    assert sched["_sched_idled"] is False
    assert [t for t in upstream["relayed_tokens"] if t != -1] == [70, 71, 72]
    assert [name for name, _ in upstream["helper_calls"]] == list(HELPERS[:3])


# ----------------------------------------------------------------------------- get_next_batch_to_run
SCENARIOS = {
    # name: (running requests (index, finished), prefill requests (index, finished), chunked index or None)
    # The chunked request is the scheduler's as well as the batch's, except in the last one.
    "into_running": ([(0, False), (1, False)], [(2, False), (3, False)], None),
    "into_empty": ([], [(2, False), (3, False)], None),
    "finished_on_both_sides": ([(0, True), (1, False)], [(2, True), (3, False)], None),
    "with_a_chunk": ([(0, False)], [(2, False)], 4),
    "all_finished_at_prefill": ([(0, False)], [(2, True), (3, True)], None),
    "only_a_chunk": ([], [], 4),
    "a_chunk_the_scheduler_no_longer_tracks": ([(0, False)], [(2, False)], 4),
}
UNTRACKED = {"a_chunk_the_scheduler_no_longer_tracks"}


def _scenario_world(runtime_context, scenario, *, batch_is_full=False, prefill_only=False, **options):
    running_specs, prefill_specs, chunked = SCENARIOS[scenario]
    world = World(runtime_context, **options)
    s = world.scheduler
    if running_specs:
        running = world.decoded(world.prefill_batch([world.req(i, done=d) for i, d in running_specs]))
    else:
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        running = ScheduleBatch(reqs=[], batch_is_full=False)
    running.batch_is_full = batch_is_full
    running.is_prefill_only = prefill_only
    s.running_batch = world.name(running, "running")
    reqs = [world.req(i, done=d) for i, d in prefill_specs]
    chunked_req = None
    if chunked is not None:
        chunked_req = world.req(chunked, chunk_end=2)  # 2 of its 5 tokens this round
        reqs.append(chunked_req)
        s.chunked_req = None if scenario in UNTRACKED else chunked_req
    prefill = world.name(world.decoded(world.prefill_batch(reqs, chunked_req=chunked_req)), "prefill")
    prefill.is_prefill_only = prefill_only
    return world, prefill


def _upstream_schedule(world, prefill):
    s = world.scheduler
    plan = s.get_next_batch_to_run(s.running_batch, prefill)
    s.running_batch = plan.running_batch
    return plan.batch_to_run


def _mirror_schedule(world, prefill):
    if prefill is not None:
        upstream_mirror.merge_prefilled(world.scheduler, prefill)
    return upstream_mirror.next_decode_batch(world.scheduler)


def _compare_schedule(runtime_context, scenario, *, merge=True, **options):
    states = []
    for schedule in (_upstream_schedule, _mirror_schedule):
        world, prefill = _scenario_world(runtime_context, scenario, **options)
        chosen = schedule(world, prefill if merge else None)
        states.append(world.state(prefill=prefill, chosen=chosen,
                                  chosen_is=world.names.get(id(chosen), None if chosen is None else "another")))
    return states


def _without_full_flag(state):
    state = dict(state)
    for key in ("running_batch", "prefill", "chosen"):
        if isinstance(state[key], tuple):
            name, fields = state[key]
            state[key] = (name, {k: v for k, v in fields.items() if k != "batch_is_full"})
    return state


def _full_flag(state, key="running_batch"):
    return state[key][1]["batch_is_full"] if isinstance(state[key], tuple) else None


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("mlp_sync", [False, True], ids=["no_sync", "dp_sync"])
def test_merging_a_prefill_and_taking_the_decode_batch_is_get_next_batch_to_runs(runtime_context, scenario,
                                                                                 mlp_sync):
    upstream, mirror = _compare_schedule(runtime_context, scenario, require_mlp_sync=mlp_sync)
    diff = _diff(_without_full_flag(upstream), _without_full_flag(mirror))
    assert not diff, "\n".join(diff)
    running_specs, prefill_specs, chunked = SCENARIOS[scenario]
    # What the comparison covers here, for a reader.
    kept = [f"r{i}" for i, done in running_specs + prefill_specs if not done]
    assert upstream["decode_calls"] == ([kept] if kept else [])
    # The chunk the scheduler tracks was checkpointed into the tree.
    assert [call for call, _ in upstream["helper_calls"]] == (
        ["stash_chunked_request"] if chunked is not None and scenario not in UNTRACKED else [])


def test_a_prefill_only_running_batch_is_not_decoded_alike(runtime_context):
    upstream, mirror = _compare_schedule(runtime_context, "into_running", prefill_only=True)
    diff = _diff(_without_full_flag(upstream), _without_full_flag(mirror))
    assert not diff, "\n".join(diff)
    assert upstream["decode_calls"] == [] and upstream["chosen"] is None


@pytest.mark.parametrize("declines", ["none", "emptied"])
def test_update_running_batch_declining_to_decode_is_handled_alike(runtime_context, declines):
    for mlp_sync in (False, True):
        upstream, mirror = _compare_schedule(runtime_context, "into_running", require_mlp_sync=mlp_sync,
                                             decode_returns=declines)
        diff = _diff(_without_full_flag(upstream), _without_full_flag(mirror))
        assert not diff, "\n".join(diff)
        assert upstream["chosen"] is None


@pytest.mark.parametrize("scenario", ["into_running", "finished_on_both_sides", "into_empty"])
@pytest.mark.parametrize("full", [False, True], ids=["not_full", "full"])
def test_a_decode_step_without_a_prefill_to_merge_is_get_next_batch_to_runs(runtime_context, scenario, full):
    """Most steps: no prefill finished since the last one. Nothing is left out of this comparison."""
    upstream, mirror = _compare_schedule(runtime_context, scenario, merge=False, batch_is_full=full)
    diff = _diff(upstream, mirror)
    assert not diff, "\n".join(diff)
    running_specs = SCENARIOS[scenario][0]
    # A request that left the running batch reopens admission.
    assert _full_flag(upstream) == (full and not any(done for _, done in running_specs))


@pytest.mark.parametrize("scenario", ["into_running", "finished_on_both_sides", "all_finished_at_prefill",
                                      "with_a_chunk"])
@pytest.mark.parametrize("full", [False, True], ids=["not_full", "full"])
def test_batch_is_full_after_a_merge_follows_each_sides_documented_rule(runtime_context, scenario, full):
    """The one difference upstream_mirror.merge_prefilled documents, pinned on both sides."""
    upstream, mirror = _compare_schedule(runtime_context, scenario, batch_is_full=full)
    running_specs, prefill_specs, _ = SCENARIOS[scenario]
    running_lost = any(done for _, done in running_specs)
    prefill_lost = any(done for _, done in prefill_specs) or SCENARIOS[scenario][2] is not None
    prefill_kept = any(not done for _, done in prefill_specs)
    # Upstream: cleared when a request left the prefill batch or the running batch.
    assert _full_flag(upstream) == (full and not (prefill_lost or running_lost))
    # This side: cleared after any merge that adds requests, or when the running batch lost one.
    assert _full_flag(mirror) == (full and not (prefill_kept or running_lost))


# ----------------------------------------------------------------------------- the docstrings
def test_each_mirror_names_an_upstream_function_that_exists_at_the_pinned_version():
    import sglang

    import sglang_edgeacc

    assert sglang.__version__ == sglang_edgeacc.SGLANG_PIN
    pieces = [upstream_mirror.before_forward, upstream_mirror.after_forward, upstream_mirror.merge_prefilled,
              upstream_mirror.next_decode_batch]
    for piece in pieces:
        named = re.match(r"``(sglang(?:\.\w+)+)``", piece.__doc__)
        assert named, piece.__name__
        module_path, _, qualname = named.group(1).partition(".Scheduler.")
        module = importlib.import_module(module_path)
        assert callable(getattr(module.Scheduler, qualname)), named.group(1)
        assert "Left out" in piece.__doc__, piece.__name__

