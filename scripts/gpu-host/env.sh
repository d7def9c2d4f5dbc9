# shellcheck shell=bash
# Sourced at the start of each command on the GPU host (bash, in the project root): unpacks the bundle
# once per machine and puts it, and the project's python/ folder, on PYTHONPATH.
_b=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GPU_SITE=${GPU_SITE:-/tmp/gpu-site}
if [ ! -f "$GPU_SITE/.unpacked" ] || [ "$_b/site.tar.xz" -nt "$GPU_SITE/.unpacked" ]; then
  rm -rf "$GPU_SITE" && mkdir -p "$GPU_SITE" && tar xJf "$_b/site.tar.xz" -C "$GPU_SITE" && touch "$GPU_SITE/.unpacked"
fi
PYTHONPATH="$GPU_SITE:$(dirname "$_b")/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The bundle has the radix tree's Python core only.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python
# NVLink multicast stays off on these hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset _b
