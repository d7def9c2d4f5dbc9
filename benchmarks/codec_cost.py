"""What packing a prefill batch on the decode side and unpacking it on the prefill side costs the host.

Both run on every prefill batch's way to its first token (the parts `schedule` and `unpack` of
``sglang_edgeacc_prefill_path_seconds``). The batch is real: requests admitted against a radix
tree, ``ScheduleBatch.init_new`` and ``prepare_for_extend`` over real pools, on the CPU. The
control packs the same batch with torch's own reduction of its host tensors (a nested pickle and a
storage class per tensor), which the codec replaced with the tensors' bytes; the ratio is printed.

    python3 -m benchmarks.codec_cost [--requests 2] [--tokens 2048] [--repeat 50]   # from the repository root
"""

from __future__ import annotations

import argparse
import io
import json
import time
from array import array

import torch


def real_prefill_batch(requests: int, tokens: int):
    """A prefill batch of ``requests`` prompts of ``tokens`` tokens, built as the scheduler builds one."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.runtime_context import get_context
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    size = requests * tokens + 1024
    kv = MHATokenToKVPool(size=size, page_size=1, dtype=torch.float32, head_num=1, head_dim=4, layer_num=1,
                          device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size, torch.float32, "cpu", kv, need_sort=False)
    req_pool = ReqToTokenPool(size=requests + 4, max_context_len=tokens + 512, device="cpu",
                              enable_memory_saver=False)
    tree = RadixCache(CacheInitParams(disable=False, req_to_token_pool=req_pool,
                                      token_to_kv_pool_allocator=allocator, page_size=1))
    model_config = ModelConfig.from_server_args(get_context().server_args)
    reqs = []
    for i in range(requests):
        params = SamplingParams(max_new_tokens=256)
        params.normalize(None)
        req = Req(f"r{i}", "", array("q", [(7 * j + i) % 400 for j in range(tokens)]), params,
                  vocab_size=model_config.vocab_size)
        req.init_next_round_input(tree)
        req.extend_end = len(req.full_untruncated_fill_ids)
        reqs.append(req)
    batch = ScheduleBatch.init_new(reqs, req_pool, allocator, tree, model_config, False, SpeculativeAlgorithm.NONE)
    batch.prepare_for_extend()
    local = dict(req_to_token_pool=req_pool, token_to_kv_pool=kv, token_to_kv_pool_allocator=allocator,
                 model_config=model_config)
    return batch, local


def _torch_reduction_pack(batch) -> bytes:
    """The control: the codec's pickler, host tensors left to torch's own reduction."""
    from sglang_edgeacc.edge_acc_server import batch_codec

    class TorchReduction(batch_codec._BatchPickler):
        def reducer_override(self, obj):
            if batch_codec._plain_host_tensor(obj):
                return NotImplemented
            return super().reducer_override(obj)

    return batch_codec._dump(batch, batch_codec._batch_parts(batch, None), TorchReduction)


def _ms(action, repeat: int) -> float:
    action()  # imports and caches
    start = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - start) * 1e3 / repeat


def measure(requests: int, tokens: int, repeat: int) -> dict:
    from sglang_edgeacc.edge_acc_server.batch_codec import LocalObjects, pack_prefill_batch, unpack_prefill_batch

    batch, local_fields = real_prefill_batch(requests, tokens)
    local = LocalObjects(**local_fields)
    message, control = pack_prefill_batch(batch), _torch_reduction_pack(batch)
    result = {
        "requests": requests, "tokens": tokens, "message_bytes": len(message),
        "pack_ms": _ms(lambda: pack_prefill_batch(batch), repeat),
        "unpack_ms": _ms(lambda: unpack_prefill_batch(message, local), repeat),
        "control_pack_ms": _ms(lambda: _torch_reduction_pack(batch), repeat),
        "control_unpack_ms": _ms(lambda: unpack_prefill_batch(control, local), repeat),
    }
    result["pack_vs_control"] = result["pack_ms"] / result["control_pack_ms"]
    result["unpack_vs_control"] = result["unpack_ms"] / result["control_unpack_ms"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    from sglang.srt.runtime_context import create_context, use_context
    from sglang.srt.server_args import ServerArgs

    from sglang_edgeacc.tiny_model import model_dir

    server_args = ServerArgs(model_path=str(model_dir()), load_format="dummy", device="cpu")
    with use_context(create_context(server_args, role="scheduler")):
        result = measure(args.requests, args.tokens, args.repeat)
    print(json.dumps(result, indent=1))
    print(f"pack {result['pack_ms']:.2f} ms ({result['pack_vs_control']:.2f}x of torch's reduction), "
          f"unpack {result['unpack_ms']:.2f} ms ({result['unpack_vs_control']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
