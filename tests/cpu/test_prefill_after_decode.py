"""When a prefill batch waits for the decode step still on the device (``decode_side.decode_steps_gave_kv_back``).

Built from real sglang objects: pools, allocator and radix tree, requests admitted by
``ScheduleBatch.init_new`` and ``prepare_for_extend``, a decode step's batch as the overlap
schedule keeps it (``ScheduleBatch.copy``), and upstream's own release paths (a finished
request's ``release_kv_cache`` with the tree's checkpoint, a retraction's without).
"""

from __future__ import annotations

from array import array

import pytest
import torch

from sglang_edgeacc.edge_acc_server.decode_side import decode_steps_gave_kv_back
from sglang_edgeacc.tiny_model import model_dir


@pytest.fixture(scope="module", autouse=True)
def runtime_context():
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(model_dir()), load_format="dummy", device="cpu")
    with use_context(create_context(args, role="scheduler")):
        yield args


class _Pools:
    def __init__(self, runtime_args):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache

        kv = MHATokenToKVPool(size=128, page_size=1, dtype=torch.float32, head_num=1, head_dim=4, layer_num=1,
                              device="cpu", enable_memory_saver=False)
        self.allocator = TokenToKVPoolAllocator(128, torch.float32, "cpu", kv, need_sort=False)
        self.req_pool = ReqToTokenPool(size=8, max_context_len=32, device="cpu", enable_memory_saver=False)
        self.tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                               token_to_kv_pool_allocator=self.allocator, page_size=1))
        self.model_config = ModelConfig.from_server_args(runtime_args)

    def running(self, count: int):
        """``count`` requests past their prefill, each with its first token: a running batch."""
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        reqs = []
        for index in range(count):
            req = Req(f"r{index}", "", array("q", [1 + index, 2, 3, 4]), SamplingParams(max_new_tokens=8),
                      vocab_size=self.model_config.vocab_size)
            req.init_next_round_input(self.tree)
            req.extend_end = len(req.full_untruncated_fill_ids)  # the whole prompt in this round
            reqs.append(req)
        batch = ScheduleBatch.init_new(reqs, self.req_pool, self.allocator, self.tree, self.model_config,
                                       False, SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        for req in reqs:
            req.output_ids.append(70)
        return batch


def test_a_step_whose_requests_all_hold_their_kv_lets_the_prefill_start_beside_it(runtime_context):
    step = _Pools(runtime_context).running(3).copy()
    assert not decode_steps_gave_kv_back([step])
    assert not decode_steps_gave_kv_back([])  # no step on the device (its result was processed)


def test_a_request_that_finished_while_its_step_ran_makes_the_prefill_wait(runtime_context):
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    pools = _Pools(runtime_context)
    batch = pools.running(3)
    step = batch.copy()  # launched; the result before it finishes r1
    finished = batch.reqs[1]
    finished.finished_reason = FINISH_LENGTH(length=1)
    free_before = pools.allocator.available_size() + pools.tree.evictable_size()
    release_kv_cache(finished, pools.tree, checkpoint=True)
    assert pools.req_pool.available_size() == 8 - 2  # its row can be the next prefill's
    assert pools.allocator.available_size() + pools.tree.evictable_size() >= free_before
    assert decode_steps_gave_kv_back([step])
    # The next step leaves it out; once the step it was in is processed, nothing waits.
    batch.filter_batch(keep_indices=[0, 2])
    assert not decode_steps_gave_kv_back([batch.copy()])


def test_a_request_retracted_while_its_step_ran_makes_the_prefill_wait(runtime_context):
    from sglang.srt.mem_cache.common import release_kv_cache

    pools = _Pools(runtime_context)
    batch = pools.running(2)
    step = batch.copy()
    available = pools.allocator.available_size()
    release_kv_cache(batch.reqs[0], pools.tree, checkpoint=False)  # what a retraction does with its KV
    assert pools.allocator.available_size() > available
    assert decode_steps_gave_kv_back([step])
