"""Compile, ahead of time, the FlashInfer kernels sglang's FlashInfer backend loads for a set of shapes.

Run by ``build-flashinfer.sh`` with a Python that has the pinned ``flashinfer-python`` and an
``nvcc`` of the GPU host's CUDA major version. For each shape (KV dtype, head dim) it builds
the modules sglang's ``FlashInferAttnBackend`` asks for: the FA2 batch prefill (ragged and
paged, also what decode runs on tensor cores), the FA3 (SM 9.0) batch prefill that the prefill
wrappers pick on Hopper, and the batch decode, plus the cascade module (``merge_state``) and the
norm module (sgl_kernel's RMSNorm calls FlashInfer's whenever FlashInfer imports). Each module
is written where FlashInfer looks for an AOT build (``<out>/aot/<name>/<name>.so``), and the names of the template files the module generators
read from ``flashinfer/data/csrc`` at run time are written to ``<out>/csrc-used.txt``: with an
AOT build the generators still render their sources before loading, so those templates must
travel with it, while the headers a compiler needs do not.

    python3 scripts/gpu-host/flashinfer_aot.py --out DIR [--shapes bf16:128,bf16:64]
    python3 scripts/gpu-host/flashinfer_aot.py --check .gpu-flashinfer/site.tar.xz   # what build-flashinfer.sh ends with

``--check`` runs, without a GPU and with no compiler on PATH, what the host will: the unpacked
part imports (sglang's FlashInfer backend included) with none of FlashInfer's optional packages,
every built module loads from the AOT build (an empty stand-in for the driver library lets the
loader resolve it), and a module that was not built fails with its name (the bundle's
``sitecustomize.py``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

PINNED = "0.7.2"
DEFAULT_SHAPES = "bf16:128,bf16:64"  # the Qwen3 shapes, and the context-sensitive test model's


def _dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def specs(shapes: list[tuple[str, int]]):
    """(spec, built) for every module: the built ones load from the AOT build; the others are only
    rendered at run time (the FA2 prefill's independent-stride module, built if a layout needs it)."""
    import torch
    from flashinfer.jit.attention.modules import (
        _gen_batch_prefill_independent_paged_module,
        _gen_batch_prefill_primary_module,
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )
    from flashinfer.jit.cascade import gen_cascade_module
    from flashinfer.jit.norm import gen_norm_module

    for dtype_name, head_dim in shapes:
        dtype = _dtype(dtype_name)
        # The arguments FlashInfer's wrappers pass: index type int32, no positional encoding,
        # no sliding window, no soft cap, no fp16 QK reduction.
        prefill = ("fa2", dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False, False)
        yield _gen_batch_prefill_primary_module(*prefill), True
        yield _gen_batch_prefill_independent_paged_module(*prefill), False
        # On SM 9.0 the prefill wrappers' "auto" backend picks FlashInfer's FA3 kernels.
        yield gen_batch_prefill_module("fa3", *prefill[1:]), True
        yield gen_batch_decode_module(dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False), True
    yield gen_cascade_module(), True
    # sgl_kernel's RMSNorm calls FlashInfer's whenever FlashInfer imports, whatever the attention backend.
    yield gen_norm_module(), True


class _CsrcReads:
    """Records which files under ``flashinfer/data/csrc`` are opened (any way: an audit hook)."""

    def __init__(self, csrc: pathlib.Path):
        self.csrc = str(csrc.resolve()) + "/"
        self.read: set[str] = set()
        self.active = False
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.active and event == "open" and isinstance(args[0], (str, pathlib.Path)):
            path = str(pathlib.Path(args[0]).resolve())
            if path.startswith(self.csrc):
                self.read.add(path[len(self.csrc):])

    def __enter__(self):
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False


# Packages FlashInfer imports only when present; the host has none of them.
OPTIONAL = ("cutlass", "nvidia_cutlass_dsl", "cudnn", "cuda", "cutile_cache", "cuda_tile", "nccl4py", "nccl_extensions")

_CHECK = """
import sys, torch
for name in {optional!r}:
    sys.modules[name] = None  # absent, as on the host
import flashinfer
assert flashinfer.__file__.startswith({site!r}), flashinfer.__file__
import sglang.srt.layers.attention.flashinfer_backend
from flashinfer.cascade import get_cascade_module
from flashinfer.decode import get_batch_decode_module
from flashinfer.prefill import get_batch_prefill_module
from flashinfer.norm import get_norm_module
get_cascade_module()
get_norm_module()
loaded = 2
for dtype_name, head_dim in {shapes!r}:
    dtype = getattr(torch, {{"bf16": "bfloat16", "fp16": "float16"}}[dtype_name])
    for backend in ("fa2", "fa3"):
        get_batch_prefill_module(backend, dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False, False)
    get_batch_decode_module(dtype, dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False)
    loaded += 3
try:
    get_batch_decode_module(torch.float16, torch.float16, torch.float16, torch.int32, 96, 96, 0, False, False)
    raise SystemExit("a module that was not built loaded")
except Exception as exc:
    assert "Module: batch_decode_with_kv_cache_dtype_q_f16" in str(exc), str(exc)
print("CHECKED", loaded, "modules")
"""


def check(archive: pathlib.Path, shapes: list[tuple[str, int]]) -> int:
    with tempfile.TemporaryDirectory(prefix="flashinfer-check-") as tmp:
        site, stubs = pathlib.Path(tmp, "site"), pathlib.Path(tmp, "stubs")
        stubs.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(site)
        (stubs / "stub.c").write_text("void edgeacc_cuda_stub(void) {}\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stubs / "libcuda.so.1"),
                        str(stubs / "stub.c")], check=True)
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        here = pathlib.Path(__file__).resolve().parent  # the bundle's sitecustomize.py
        env = {**os.environ, "PYTHONPATH": f"{site}:{here}", "PATH": "/usr/bin:/bin", "FLASHINFER_DISABLE_JIT": "1",
               "FLASHINFER_CUDA_ARCH_LIST": "9.0a", "FLASHINFER_WORKSPACE_BASE": str(pathlib.Path(tmp, "ws")),
               "LD_LIBRARY_PATH": f"{cuda_home}/lib64:{stubs}"}
        env.pop("CUDA_HOME", None)
        code = _CHECK.format(optional=OPTIONAL, site=str(site), shapes=shapes)
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        print(proc.stdout.strip() or proc.stderr[-3000:])
        return proc.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="where the modules and csrc-used.txt are written")
    parser.add_argument("--check", help="check a built site.tar.xz instead of building")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated DTYPE:HEAD_DIM (bf16, fp16)")
    args = parser.parse_args(argv)
    shapes = [(d, int(h)) for d, h in (s.split(":") for s in args.shapes.split(","))]
    if args.check:
        return check(pathlib.Path(args.check), shapes)
    if not args.out:
        parser.error("--out or --check")
    import flashinfer
    from flashinfer.jit import env as jit_env

    if flashinfer.__version__ != PINNED:
        print(f"flashinfer {flashinfer.__version__} found, {PINNED} wanted: the module names must match the host's",
              file=sys.stderr)
        return 1
    out = pathlib.Path(args.out)
    (out / "aot").mkdir(parents=True, exist_ok=True)
    with _CsrcReads(jit_env.FLASHINFER_CSRC_DIR) as reads:
        every = list(specs(shapes))
    csrc = str(jit_env.FLASHINFER_CSRC_DIR.resolve()) + "/"
    for spec, _ in every:  # sources a spec names in csrc, in case a generator checks they exist
        reads.read.update(str(p)[len(csrc):] for p in map(pathlib.Path, spec.sources) if str(p).startswith(csrc))
    built = [spec for spec, build in every if build]
    for spec in built:
        print(f"== building {spec.name}", flush=True)
        spec.build()
        target = out / "aot" / spec.name / f"{spec.name}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, target)
    (out / "csrc-used.txt").write_text("".join(f"{name}\n" for name in sorted(reads.read)))
    print(f"== {len(built)} modules in {out / 'aot'}; {len(reads.read)} templates read from csrc")
    return 0


if __name__ == "__main__":
    sys.exit(main())
