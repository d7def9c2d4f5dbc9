"""benchmarks/gpu_share.py: each EdgeAcc side's share of the GPU from the server's work counters.

The arithmetic is checked against Qwen3-8B's published shape; a real EdgeAcc server's
counters against one request of known size, read as the benchmark reads them.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import requests

from benchmarks import gpu_share
from tests.harness import SHARED_EDGE_ACC_LAUNCH

QWEN3_8B = {"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "intermediate_size": 12288, "vocab_size": 151936}


def test_costs_of_the_qwen3_8b_shape():
    costs = gpu_share.ModelCosts.from_config(QWEN3_8B)
    # 8.19 B parameters, of which the embedding and the untied lm_head are 0.62 B each.
    linear = costs.linear_flops_per_token / 2
    assert abs(linear - 6.946e9) < 0.01e9
    assert abs(costs.weight_bytes / 2 - (linear + 151936 * 4096)) < 1
    assert costs.kv_bytes_per_token == 36 * 2 * 8 * 128 * 2
    assert costs.attention_flops_per_pair == 4 * 36 * 32 * 128


def test_shares_turn_counter_deltas_into_rates():
    costs = gpu_share.ModelCosts(linear_flops_per_token=1e9, attention_flops_per_pair=1e3,
                                 weight_bytes=1e9, kv_bytes_per_token=1e5)
    before = {"prefill_tokens": 100, "prefill_attention_pairs": 0, "prefill_forward_seconds": 1.0,
              "decode_steps.yes": 10, "decode_step_seconds.yes": 1.0}
    after = {"prefill_tokens": 100 + 4e5, "prefill_attention_pairs": 1e9, "prefill_forward_seconds": 3.0,
             "decode_steps.yes": 110, "decode_step_seconds.yes": 3.0, "decode_step_requests.yes": 6400,
             "decode_context_tokens.yes": 1e7,
             "decode_steps.no": 50, "decode_step_seconds.no": 0.5, "decode_step_requests.no": 50,
             "decode_context_tokens.no": 0}
    out = gpu_share.shares(before, after, costs, duration_s=4.0, tflops_ceiling=1000, gbps_ceiling=1000)
    # (4e5 tokens x 1 GFLOP + 1e9 pairs x 1 kFLOP) in 2 s
    assert out["prefill"]["tflops"] == pytest.approx((4e14 + 1e12) / 2 / 1e12)
    assert out["prefill"]["busy_share"] == pytest.approx(0.5)
    yes = out["decode_beside_prefill_yes"]
    assert yes["steps"] == 100 and yes["step_ms"] == pytest.approx(20.0) and yes["batch"] == pytest.approx(64)
    # 100 steps x 1 GB of weights + 1e7 tokens x 100 kB of KV, in 2 s
    assert yes["gbps"] == pytest.approx((100e9 + 1e12) / 2 / 1e9)
    assert out["decode_beside_prefill_no"]["gbps"] == pytest.approx(50e9 / 0.5 / 1e9)
    assert "prefill" not in gpu_share.shares(after, after, costs, duration_s=1.0)


@pytest.mark.server
def test_a_real_servers_counters_add_up_for_one_request(cpu_servers):
    """The counters count one request's work exactly, and the benchmark's reading of them works."""
    server = cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH)
    prompt = [random.Random(7 + len(__file__)).randrange(5, 400) for _ in range(300)]
    max_new = 12
    before = gpu_share.scrape(server.url)
    reply = requests.post(f"{server.url}/generate", timeout=120, json={
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}).json()
    assert len(reply["output_ids"]) == max_new
    time.sleep(1.0)  # the multiprocess collector reads what the scheduler wrote
    after = gpu_share.scrape(server.url)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in set(before) | set(after)}

    cached = reply["meta_info"].get("cached_tokens", 0)
    new = len(prompt) - cached
    assert delta["prefill_tokens"] == new
    assert delta["prefill_attention_pairs"] == new * cached + new * (new + 1) // 2
    assert delta["prefill_forward_seconds"] > 0
    # The first token comes from the prefill side; the first decode step after it is not timed
    # (the loop idled while the prefill ran), the others are, each attending to its whole sequence.
    timed = list(range(3, max_new + 1))  # the output token each timed step produced

    def decode(name):
        return sum(delta.get(f"{name}.{b}", 0.0) for b in ("yes", "no"))

    assert decode("decode_steps") == len(timed)
    assert decode("decode_step_requests") == len(timed)
    assert decode("decode_context_tokens") == sum(len(prompt) + j - 1 for j in timed)
    assert decode("decode_step_seconds") > 0

    model = json.loads((Path(server.model_path or _tiny_model()) / "config.json").read_text())
    out = gpu_share.shares(before, after, gpu_share.ModelCosts.from_config(model), duration_s=1.0)
    assert out["prefill"]["tflops"] > 0 and out["prefill"]["tokens"] == new
    assert any(out[k]["gbps"] > 0 for k in out if k.startswith("decode_"))


def _tiny_model() -> str:
    from sglang_edgeacc.tiny_model import model_dir

    return str(model_dir())
