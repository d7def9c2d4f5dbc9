# shellcheck shell=bash
# Sourced on the GPU host after .gpu-bundle/env.sh: unpacks FlashInfer (build-flashinfer.sh) once per machine
# and puts it on PYTHONPATH, its kernels loaded from the ahead-of-time build only.
_f=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export GPU_FLASHINFER_SITE=${GPU_FLASHINFER_SITE:-/tmp/gpu-flashinfer-site}
if [ ! -f "$GPU_FLASHINFER_SITE/.unpacked" ] || [ "$_f/site.tar.xz" -nt "$GPU_FLASHINFER_SITE/.unpacked" ]; then
  rm -rf "$GPU_FLASHINFER_SITE" && mkdir -p "$GPU_FLASHINFER_SITE" \
    && tar xJf "$_f/site.tar.xz" -C "$GPU_FLASHINFER_SITE" && touch "$GPU_FLASHINFER_SITE/.unpacked"
fi
export PYTHONPATH="$GPU_FLASHINFER_SITE${PYTHONPATH:+:$PYTHONPATH}"
# A kernel that was not built ahead of time fails naming its module; there is no compiler to JIT it.
export FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/flashinfer-ws}
unset _f
