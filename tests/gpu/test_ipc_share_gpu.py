"""GPU proof (a): weights and a multi-GB KV pool cross from the owner to an importer under MPS.

The owner (this process, decode side) builds a Qwen3-shaped transformers model and a KV
pool allocated as one segment, fills every byte with a recomputable pattern and exports
both with edge_acc.tensor_share. A spawned importer (prefill side) with
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 imports them, binds the weights into the same model
built on the meta device, checks every byte, runs the model and compares the logits with
the owner's, writes a new pattern into the pool, and reports its own GPU allocations. The
owner then checks every byte of the pool again.

    PYTHONPATH=python python3 -m pytest -m gpu tests/gpu/test_ipc_share_gpu.py
    PYTHONPATH=python python3 -m tests.gpu.test_ipc_share_gpu --device cpu --small   # dry run
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import time

import torch

from sglang_edgeacc.edge_acc.sm_partition import child_env, visible_sm_count
from sglang_edgeacc.edge_acc.tensor_export import export_tensors, module_tensors
from sglang_edgeacc.edge_acc.tensor_import import bind_into_module, import_tensors
from tests.gpu.proof_support import (
    Child,
    child_send,
    fill_pattern_,
    mps_daemon_running,
    mps_expected,
    nvidia_smi_compute_apps,
    pattern_mismatched_bytes,
    salt_of,
)
from tests.segment_pool import allocate_single_segment, kv_pool_layer_specs

try:
    import pytest
except ImportError:  # plain-script runs on a machine without pytest
    pytest = None

IMPORTER_PERCENT = 30
TIMEOUT_S = 300
POOL_SALT_OWNER, POOL_SALT_IMPORTER = 11, 23

SIZES = {
    # Qwen3-4B-like: 36 layers, hidden 2560, 8 KV heads of 128: ~8 GB of bf16 weights; an 8 GiB KV pool
    # (58254 tokens x 36 layers x K+V x 8 heads x 128 x 2 bytes).
    "full": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=9728, vocab=151936, pool_tokens=58254),
    "small": dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=256, pool_tokens=300),
}


def qwen3_config(size: dict):
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=size["vocab"],
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        head_dim=size["head_dim"],
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(size: dict, device: str):
    from transformers import Qwen3ForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(qwen3_config(size))
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def pool_specs(size: dict):
    specs = kv_pool_layer_specs(size["layers"], size["pool_tokens"], size["kv_heads"], size["head_dim"], torch.bfloat16)
    specs["req_to_token"] = ((257, 4100), torch.int32)
    return specs


def input_ids(size: dict, device) -> torch.Tensor:
    return (torch.arange(48, device=device).view(1, 48) * 37) % size["vocab"]


def importer_main(conn, bundle_bytes: bytes, size: dict, device: str, buffers: dict, ref_logits: torch.Tensor) -> None:
    report: dict = {"pid": os.getpid()}
    try:
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
            torch.cuda.init()
            report["sms"] = visible_sm_count(torch.device(device).index or 0)
            report["mps_percent_env"] = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        t0 = time.perf_counter()
        imported = import_tensors(pickle.loads(bundle_bytes))
        with torch.device("meta"):
            from transformers import Qwen3ForCausalLM

            model = Qwen3ForCausalLM(qwen3_config(size))
        weights = {k[2:]: v for k, v in imported.tensors.items() if k.startswith("w.")}
        bind_into_module(model, weights)
        model.eval()
        report["import_and_bind_s"] = round(time.perf_counter() - t0, 3)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            report["allocated_after_import"] = torch.cuda.memory_allocated()
            report["reserved_after_import"] = torch.cuda.memory_reserved()
            report["nvidia_smi_after_import"] = nvidia_smi_compute_apps()
        bad = {}
        param_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
        checked = 0
        for name, tensor in weights.items():
            if name in param_names:
                miss = pattern_mismatched_bytes(tensor, salt_of(name))
            else:  # buffers (rotary inv_freq) are computed, not patterned: compare with the owner's copy
                miss = 0 if torch.equal(tensor.cpu(), buffers[name]) else tensor.numel()
            checked += tensor.numel() * tensor.element_size()
            if miss:
                bad[name] = miss
        pool = {k: v for k, v in imported.tensors.items() if not k.startswith("w.")}
        for name, view in pool.items():
            miss = pattern_mismatched_bytes(view, POOL_SALT_OWNER + salt_of(name))
            checked += view.numel() * view.element_size()
            if miss:
                bad[name] = miss
        report["bytes_checked"] = checked
        report["mismatched"] = bad
        with torch.inference_mode():
            logits = model(input_ids(size, device)).logits.float().cpu()
        report["logits_rel_err"] = float((logits - ref_logits).norm() / ref_logits.norm())
        for name, view in pool.items():
            fill_pattern_(view, POOL_SALT_IMPORTER + salt_of(name))
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            report["max_allocated_during_checks"] = torch.cuda.max_memory_allocated()
        del model, weights, pool
        imported.release()
        report["ok"] = True
    except Exception:  # report instead of dying silently; the parent asserts on it
        import traceback

        report["ok"] = False
        report["error"] = traceback.format_exc()
    child_send(conn, report)


def run_ipc_share_proof(device: str, size_name: str) -> dict:
    size = SIZES[size_name]
    t0 = time.perf_counter()
    model = build_model(size, device)
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, p in params.items():
        with torch.no_grad():
            fill_pattern_(p, salt_of(name))
    pool = allocate_single_segment(pool_specs(size), device)
    for name, view in pool.items():
        fill_pattern_(view, POOL_SALT_OWNER + salt_of(name))
    with torch.inference_mode():
        ref_logits = model(input_ids(size, device)).logits.float().cpu()
    shared = {f"w.{k}": v for k, v in module_tensors(model).items()}
    buffers = {k[2:]: v.cpu() for k, v in shared.items() if k[2:] not in params}
    bundle = export_tensors({**shared, **pool})
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    pool_bytes = sum(v.numel() * v.element_size() for v in pool.values())
    setup_s = time.perf_counter() - t0
    env = child_env("prefill", IMPORTER_PERCENT, "mps", device_type=torch.device(device).type)
    child = Child(importer_main, (pickle.dumps(bundle), size, device, buffers, ref_logits), env)
    try:
        report = child.recv(TIMEOUT_S)
    finally:
        exitcode = child.close()
    pool_bad = {n: m for n, v in pool.items() if (m := pattern_mismatched_bytes(v, POOL_SALT_IMPORTER + salt_of(n)))}
    report.update(
        exitcode=exitcode,
        owner_sms=visible_sm_count(torch.device(device).index or 0) if device.startswith("cuda") else 0,
        weight_bytes=weight_bytes,
        pool_bytes=pool_bytes,
        pool_segments=len({s.segment_key for s in bundle.specs if not s.name.startswith("w.")}),
        weight_segments=len({s.segment_key for s in bundle.specs if s.name.startswith("w.")}),
        owner_sees_importer_writes_mismatched=pool_bad,
        owner_setup_s=round(setup_s, 2),
        mps_daemon=mps_daemon_running(),
        nvidia_smi_owner_view=nvidia_smi_compute_apps() if device.startswith("cuda") else "",
    )
    del model, pool
    return report


def check_report(report: dict, device: str) -> None:
    assert report["ok"], report.get("error")
    assert report["exitcode"] == 0
    assert report["mismatched"] == {}, report["mismatched"]
    assert report["owner_sees_importer_writes_mismatched"] == {}
    assert report["bytes_checked"] >= report["weight_bytes"] + report["pool_bytes"]
    assert report["pool_segments"] == 1
    assert report["logits_rel_err"] < 2e-2, report["logits_rel_err"]
    if device.startswith("cuda"):
        limit = 0.10 * report["weight_bytes"]
        assert report["allocated_after_import"] < limit, report
        assert report["reserved_after_import"] < limit, report
        if mps_expected():
            assert report["mps_daemon"]
            assert 0 < report["sms"] < report["owner_sms"], report


if pytest is not None:

    @pytest.mark.gpu
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run through the device tool)")
    def test_weights_and_kv_pool_shared_across_processes_under_mps():
        pytest.importorskip("transformers")
        report = run_ipc_share_proof("cuda:0", os.environ.get("EDGEACC_IPC_PROOF_SIZE", "full"))
        print("IPC_SHARE_REPORT " + json.dumps(report, default=str))
        check_report(report, "cuda:0")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--small", action="store_true")
    a = ap.parse_args()
    rep = run_ipc_share_proof(a.device, "small" if a.small else "full")
    print(json.dumps(rep, indent=2, default=str))
    check_report(rep, a.device)
    print("IPC share proof passed")
