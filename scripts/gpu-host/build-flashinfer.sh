#!/usr/bin/env bash
# Builds .gpu-flashinfer/: FlashInfer for the offline GPU host of build-bundle.sh, its kernels compiled here.
#
#   scripts/gpu-host/build-flashinfer.sh     # from the project root, after pip install -e '.[test]'
#
# The host has no nvcc of its own to JIT-compile FlashInfer's kernels, and flashinfer-python's wheel with
# what it imports is far over what one transfer to it takes. So, on a machine with PyPI and an nvcc of the
# host's CUDA major version (13, as its torch 2.11 cu130):
#   * scripts/gpu-host/flashinfer_aot.py compiles, for SM 9.0a, the modules sglang's FlashInfer backend loads
#     for the shapes in FLASHINFER_SHAPES (default bf16:128,bf16:64: the Qwen3 shapes and the suite's
#     context-sensitive model at head dim 64), with the flashinfer of the project's venv (the pin's version);
#   * the wheels of flashinfer-python, einops and nvidia-ml-py for Python 3.12 (apache-tvm-ffi is in the
#     bundle already) are unpacked without
#     FlashInfer's compiler inputs (CUTLASS, CCCL and its own headers, the kernel sources), keeping only the
#     templates its module generators still read at run time, and the compiled modules are put where FlashInfer
#     loads an ahead-of-time build (flashinfer/data/aot/<module>/<module>.so);
#   * what FlashInfer imports only when present (CuTe DSL, cuDNN frontend, cuda-python, cuda-tile, NCCL
#     extensions) stays out: its FA2 attention needs none of them.
# On the host, after .gpu-bundle/env.sh, `source .gpu-flashinfer/env.sh` puts it on PYTHONPATH and sets
# FLASHINFER_DISABLE_JIT=1, so a kernel that was not built fails at once instead of looking for a compiler, and
# the bundle's sitecustomize.py adds the module's name to the error: add its shape to FLASHINFER_SHAPES (or its
# generator to flashinfer_aot.py) and build again.
# The script ends by checking the part as the host will load it, without a GPU (flashinfer_aot.py --check).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proj=$(pwd)
[ -f "$proj/pyproject.toml" ] && [ -f "$proj/scripts/gpu-host/env.sh" ] || { echo "run from the project root"; exit 1; }
py=${PYTHON:-$proj/.venv/bin/python}
[ -x "$py" ] || py=python3
cuda_home=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda_home/bin/nvcc" ] || { echo "no nvcc in $cuda_home/bin (set CUDA_HOME): FlashInfer's kernels are compiled here"; exit 1; }
work=${TMPDIR:-/tmp}/gpu-flashinfer-build; rm -rf "$work"; mkdir -p "$work/whl" "$work/site" "$work/aot" "$work/stubs"
# Compiled modules are kept between builds: adding one compiles that one only.
ws=${TMPDIR:-/tmp}/gpu-flashinfer-ws
# The modules link against the driver library, which a machine without a GPU lacks: an empty stub of that
# name satisfies the linker, and on the host the driver's own libcuda.so.1 resolves the symbols at load.
if [ ! -e "$cuda_home/lib64/stubs/libcuda.so" ]; then
  echo 'void edgeacc_cuda_stub(void) {}' > "$work/stubs/stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stubs/libcuda.so" "$work/stubs/stub.c"
fi
# The FA3 kernels include CUTLASS utilities that want cuRAND's device headers, and the norm kernels include
# cuBLASLt's; a toolkit of the compiler alone borrows those headers (those files only) from the venv's CUDA wheels.
extra_cuda=""
if [ ! -e "$cuda_home/include/curand_kernel.h" ] || [ ! -e "$cuda_home/include/cublasLt.h" ]; then
  wheel_include=$("$py" -c 'import nvidia, pathlib; print(next(p.parent for d in nvidia.__path__ for p in pathlib.Path(d).glob("*/include/cublasLt.h")))' 2>/dev/null) \
    || { echo "no cuRAND/cuBLASLt headers in $cuda_home/include or the venv's nvidia wheels: FlashInfer's kernels need them"; exit 1; }
  mkdir -p "$work/borrowed"; ln -s "$wheel_include"/curand*.h "$wheel_include"/cublas*.h "$work/borrowed/"
  extra_cuda="-isystem $work/borrowed"
fi
echo "== compiling FlashInfer's kernels for SM 9.0a ($("$cuda_home/bin/nvcc" --version | grep -o 'release [0-9.]*'))"
CUDA_HOME=$cuda_home FLASHINFER_EXTRA_LDFLAGS="-L$work/stubs" FLASHINFER_EXTRA_CUDAFLAGS="$extra_cuda" FLASHINFER_CUDA_ARCH_LIST=9.0a \
  FLASHINFER_WORKSPACE_BASE="$ws" MAX_JOBS=${MAX_JOBS:-$(nproc)} \
  "$py" "$here/flashinfer_aot.py" --out "$work/aot" --shapes "${FLASHINFER_SHAPES:-bf16:128,bf16:64}"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
echo "== downloading wheels for Python 3.12 (the GPU host's)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$work/whl" flashinfer-python==0.7.2 einops==0.8.2 nvidia-ml-py==13.615.71
echo "== unpacking"
for w in "$work"/whl/*.whl; do
  case $w in
    */flashinfer_python-*) unzip -q -o "$w" -d "$work/site" -x 'flashinfer/data/*' build_backend.py build_utils.py ;;
    *) unzip -q -o "$w" -d "$work/site" ;;
  esac
done
fi_whl=$(ls "$work"/whl/flashinfer_python-*.whl)
sed 's|^|flashinfer/data/csrc/|' "$work/aot/csrc-used.txt" | xargs unzip -q -o -d "$work/site" "$fi_whl"
mkdir -p "$work/site/flashinfer/data/aot"
cp -r "$work"/aot/aot/. "$work/site/flashinfer/data/aot/"
rm -f "$work/site/example.py"  # nvidia-ml-py's, at the top level
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$proj/.gpu-flashinfer"
(cd "$work/site" && tar cf - . | xz -T0 -9 > "$proj/.gpu-flashinfer/site.tar.xz")
cp "$here/flashinfer-env.sh" "$proj/.gpu-flashinfer/env.sh"
ls "$work/site/flashinfer/data/aot" > "$proj/.gpu-flashinfer/modules.txt"
rm -rf "$work"
echo "== checking it as the host will load it (no GPU, no compiler)"
CUDA_HOME=$cuda_home "$py" "$here/flashinfer_aot.py" --check "$proj/.gpu-flashinfer/site.tar.xz" \
  --shapes "${FLASHINFER_SHAPES:-bf16:128,bf16:64}"
du -sh "$proj/.gpu-flashinfer"
echo "== done: on the GPU host, begin each command with: source .gpu-bundle/env.sh && source .gpu-flashinfer/env.sh &&"
