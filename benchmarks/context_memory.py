"""What a second process on the GPU costs before it allocates anything: its CUDA context.

The EdgeAcc prefill side maps its weights and KV cache from the decode side, yet the driver
reports a few GB for it. This probe starts a fresh process and reads, after each stage, the
memory the driver charges to it (nvidia-smi's per-process figure, which also lists MPS clients)
next to what torch's allocator reserves:

1. the CUDA context alone (one byte allocated);
2. after a bf16 matmul (cuBLAS handle and workspace);
3. after a Triton kernel (its module loaded);
4. after ``import sglang.srt.model_executor.model_runner`` and a forward-sized activation,
   freed again (what the allocator keeps cached).

    python3 -m benchmarks.context_memory [--out FILE]     # from the repository root

``on_device.sh context-memory`` runs it twice, the second time with ``CUDA_MPS_PIPE_DIRECTORY``
pointing at its MPS daemon, since EdgeAcc's sides are MPS clients.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from tests.harness import gpu_memory_by_pid


def stage(name: str, rows: list) -> None:
    import torch

    torch.cuda.synchronize()
    time.sleep(0.5)  # the driver's per-process figure lags a little
    rows.append({"stage": name, "driver_mib": gpu_memory_by_pid().get(os.getpid()),
                 "allocator_reserved_mib": round(torch.cuda.memory_reserved() / 2**20, 1)})
    print(json.dumps(rows[-1]), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    rows: list = []
    torch.zeros(1, device="cuda")
    stage("context", rows)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    stage("cublas", rows)
    import triton
    import triton.language as tl

    @triton.jit
    def _double(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    x = torch.ones(1 << 20, device="cuda")
    _double[(x.numel() // 1024,)](x, x.numel(), BLOCK=1024)
    stage("triton", rows)
    try:
        import sglang.srt.model_executor.model_runner  # noqa: F401  (its import loads kernel libraries)
    except Exception as exc:  # noqa: BLE001 - the probe still reports the stages before
        print(f"sglang import failed: {exc}", flush=True)
    stage("sglang_imported", rows)
    act = torch.empty(8192, 24576, device="cuda", dtype=torch.bfloat16)  # one prefill MLP activation
    del act
    stage("activation_freed", rows)
    torch.cuda.empty_cache()
    stage("cache_emptied", rows)
    result = {"mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")), "torch": torch.__version__, "rows": rows}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
