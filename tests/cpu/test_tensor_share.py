"""tensor_share on the CPU platform: real spawned processes, shared-memory files, every byte checked."""

from __future__ import annotations

import gc
import io
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from sglang_edgeacc.edge_acc.tensor_bundle import SharedTensors, SharedTensorsError
from sglang_edgeacc.edge_acc.tensor_export import (
    AllocatorNotShareableError,
    export_tensors,
    module_tensors,
    refuse_unshareable_cuda_allocator,
)
from sglang_edgeacc.edge_acc.tensor_import import bind_into_module, import_tensors
from tests.segment_pool import allocate_single_segment, kv_pool_layer_specs, layer_views

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"
TIMEOUT_S = 120

LAYERS, TOKENS, HEADS, HEAD_DIM = 4, 513, 2, 24


def pattern(numel: int, salt: int, dtype: torch.dtype) -> torch.Tensor:
    """A deterministic, position-dependent filling that both processes can recompute."""
    idx = torch.arange(numel, dtype=torch.int64)
    values = (idx * 2654435761 + salt * 97) % 251 - 125
    return values.to(dtype)


def fill_pool(pool: dict[str, torch.Tensor], salt: int) -> None:
    for i, (name, view) in enumerate(sorted(pool.items())):
        view.copy_(pattern(view.numel(), salt + i, view.dtype).view(view.shape))


def pool_mismatches(pool: dict[str, torch.Tensor], salt: int) -> list[str]:
    bad = []
    for i, (name, view) in enumerate(sorted(pool.items())):
        expected = pattern(view.numel(), salt + i, view.dtype).view(view.shape)
        # Compare the raw bytes: equality of bf16 values could hide a byte difference of -0/+0.
        if not torch.equal(view.view(torch.uint8), expected.contiguous().view(torch.uint8)):
            bad.append(name)
    return bad


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.LayerNorm(48), torch.nn.Linear(48, 8))


def _child(conn, salt_in: int, salt_out: int) -> None:
    bundle: SharedTensors = pickle.loads(conn.recv_bytes())
    imported = import_tensors(bundle)
    pool = {k: v for k, v in imported.tensors.items() if k.startswith(("k.", "v.", "req_to_token"))}
    seen_bad = pool_mismatches(pool, salt_in)
    fill_pool(pool, salt_out)
    with torch.device("meta"):
        model = tiny_model()
    weights = {k: v for k, v in imported.tensors.items() if k not in pool}
    bind_into_module(model, weights)
    out = model(torch.linspace(-1, 1, 24 * 3).view(3, 24))
    del model, pool, weights
    imported.release()
    # A plain pickle copies the result by value (torch's queue pickling would share it).
    conn.send_bytes(pickle.dumps((seen_bad, out.detach())))
    conn.close()


def _owner_objects():
    specs = kv_pool_layer_specs(LAYERS, TOKENS, HEADS, HEAD_DIM, torch.bfloat16)
    specs["req_to_token"] = ((9, 77), torch.int32)
    pool = allocate_single_segment(specs, "cpu")
    fill_pool(pool, salt=1)
    model = tiny_model()
    return pool, model


def _owner(conn) -> None:
    pool, model = _owner_objects()
    conn.send_bytes(pickle.dumps(export_tensors({**module_tensors(model), **pool})))
    conn.recv()  # serve until killed


def test_cpu_shared_memory_has_no_name_and_outlives_its_killed_owner():
    """Nothing is named in /dev/shm, so a SIGKILLed owner leaves nothing there; the importer's mapping lives on."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_owner, args=(child_conn,))
    proc.start()
    try:
        assert parent_conn.poll(TIMEOUT_S), "owner did not send its bundle"
        bundle = pickle.loads(parent_conn.recv_bytes())
        assert bundle.owner_pid == proc.pid
        imported = import_tensors(bundle)
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"torch_{proc.pid}_")] == []
        pool = {k: v for k, v in imported.tensors.items() if k.startswith(("k.", "v.", "req_to_token"))}
        # The views of the pool's one segment are views of one mapping here too.
        assert len({v.untyped_storage().data_ptr() for v in pool.values()}) == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(TIMEOUT_S)
        assert proc.exitcode == -signal.SIGKILL
        assert pool_mismatches(pool, 1) == [], "the owner's bytes are still mapped after its death"
        with pytest.raises(SharedTensorsError, match="is gone"):
            import_tensors(bundle)
        del pool
        imported.release()
    finally:
        if proc.is_alive():
            proc.kill()


def test_import_refuses_a_descriptor_number_that_now_names_another_file():
    other = os.open(os.devnull, os.O_RDONLY)
    x = torch.arange(64, dtype=torch.int32)
    bundle = export_tensors({"x": x})
    fd = bundle.specs[0].rebuild_args[1]
    del x
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the storage went, and its descriptor with it
    try:
        os.dup2(other, fd)
        with pytest.raises(SharedTensorsError, match="now names another file"):
            import_tensors(bundle)
    finally:
        os.close(fd)
        os.close(other)


def test_file_system_pickling_of_an_exported_tensor_is_named_on_import():
    from multiprocessing.reduction import ForkingPickler

    x = torch.arange(64, dtype=torch.int32)
    bundle = export_tensors({"x": x})
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        ForkingPickler(io.BytesIO()).dump(x)  # moves the storage to a named file
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)
    assert torch.equal(x, torch.arange(64, dtype=torch.int32))
    with pytest.raises(SharedTensorsError, match="file_system strategy"):
        import_tensors(bundle)


def test_spawned_child_reads_and_writes_the_owners_pool_and_weights():
    pool, model = _owner_objects()
    bundle = export_tensors({**module_tensors(model), **pool})
    pool_segments = {s.segment_key for s in bundle.specs if s.name in pool}
    assert len(pool_segments) == 1, "the KV pool and req_to_token must be one shared segment"

    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child_conn, 1, 5))
    proc.start()
    try:
        # A plain pickle, as a zmq or socket channel would carry it.
        parent_conn.send_bytes(pickle.dumps(bundle))
        assert parent_conn.poll(TIMEOUT_S), "child did not answer"
        seen_bad, child_out = pickle.loads(parent_conn.recv_bytes())
    finally:
        proc.join(TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert seen_bad == [], f"child saw wrong bytes in {seen_bad}"
    # The child's writes are visible here, in every byte of every view: the memory is one.
    assert pool_mismatches(pool, 5) == []
    assert pool_mismatches(pool, 1) != []
    expected = model(torch.linspace(-1, 1, 24 * 3).view(3, 24))
    assert torch.equal(child_out, expected)
    assert len(layer_views(pool, "k")) == LAYERS and len(layer_views(pool, "v")) == LAYERS


def test_bundle_crosses_a_plain_pipe_to_an_unrelated_process():
    """No multiprocessing context, no authkey: a fresh interpreter reads the pickle from stdin."""
    pool, _ = _owner_objects()
    bundle = export_tensors(pool)
    code = textwrap.dedent(
        """
        import pickle, sys, torch
        from sglang_edgeacc.edge_acc.tensor_import import import_tensors
        imported = import_tensors(pickle.loads(sys.stdin.buffer.read()))
        total = 0
        for name, view in imported.tensors.items():
            total += int(view.view(torch.uint8).to(torch.int64).sum())
            view.view(torch.uint8).fill_(0xAB)
        imported.release()
        print(total)
        """
    )
    expected_sum = sum(int(v.view(torch.uint8).to(torch.int64).sum()) for v in pool.values())
    path = os.pathsep.join(p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH")) if p)  # this checkout's package
    result = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(bundle), capture_output=True, timeout=TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stderr.decode()
    assert int(result.stdout.decode().split()[-1]) == expected_sum
    for view in pool.values():
        assert bool((view.view(torch.uint8) == 0xAB).all())


def test_export_moves_plain_cpu_tensors_into_shared_memory_in_place():
    model = tiny_model()
    before = {k: v.clone() for k, v in module_tensors(model).items()}
    export_tensors(module_tensors(model))
    for name, tensor in module_tensors(model).items():
        assert tensor.is_shared(), name
        assert torch.equal(tensor, before[name]), name


def test_release_makes_the_import_unusable_and_is_idempotent():
    pool, _ = _owner_objects()
    imported = import_tensors(export_tensors(pool))
    assert len(imported) == len(pool) and "req_to_token" in imported
    imported.release()
    imported.release()
    assert imported.released
    with pytest.raises(SharedTensorsError, match="released"):
        imported["req_to_token"]


def test_bind_into_module_names_what_is_missing():
    with torch.device("meta"):
        model = tiny_model()
    tensors = module_tensors(tiny_model())
    tensors.pop("3.bias")
    with pytest.raises(SharedTensorsError, match=r"3\.bias"):
        bind_into_module(model, tensors)


def test_bind_into_module_refuses_unknown_names():
    with torch.device("meta"):
        model = tiny_model()
    tensors = dict(module_tensors(tiny_model()))
    tensors["9.weight"] = torch.zeros(1)
    with pytest.raises(SharedTensorsError, match=r"9\.weight"):
        bind_into_module(model, tensors)


@pytest.mark.parametrize("var", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_expandable_segments_refused_with_the_variable_and_the_fix(var):
    env = {var: "max_split_size_mb:128,expandable_segments:True"}
    with pytest.raises(AllocatorNotShareableError) as err:
        refuse_unshareable_cuda_allocator(env)
    assert var in str(err.value) and "expandable_segments:True" in str(err.value)
    refuse_unshareable_cuda_allocator({var: "expandable_segments:False"})
    with pytest.raises(AllocatorNotShareableError, match="cudaMallocAsync"):
        refuse_unshareable_cuda_allocator({var: "backend:cudaMallocAsync"})


def test_expandable_segments_does_not_concern_cpu_exports(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    bundle = export_tensors({"x": torch.arange(10)})
    assert bundle.names() == ["x"]


def test_single_segment_views_are_aligned_and_disjoint():
    specs = {"a": ((3, 5), torch.float16), "b": ((7,), torch.int64), "c": ((2, 2, 2), torch.bfloat16)}
    views = allocate_single_segment(specs, "cpu")
    base = views["a"].untyped_storage().data_ptr()
    spans = []
    for name, view in views.items():
        assert view.untyped_storage().data_ptr() == base, name
        start = view.data_ptr() - base
        assert start % 4096 == 0
        spans.append((start, start + view.numel() * view.element_size()))
        assert bool((view == 0).all())
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert export_tensors(views).segment_count() == 1


def test_export_rejects_non_tensors():
    with pytest.raises(SharedTensorsError, match="'x'"):
        export_tensors({"x": [1, 2, 3]})  # type: ignore[dict-item]
