# shellcheck shell=bash
# Sourced on the GPU host after .gpu-bundle/env.sh: joins the parts build-fa3.sh wrote, once, into the unpacked
# bundle's sgl_kernel/flash_ops.abi3.so. Says what is missing instead while parts are still to come.
_a=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_lib="$GPU_SITE/sgl_kernel/flash_ops.abi3.so"
_have=$(find "$_a" -maxdepth 1 -name 'flash_ops.xz.part*' | wc -l)
if [ -f "$_lib" ] && [ "$(cat "$_lib.sha256" 2>/dev/null)" = "$(cat "$_a/flash_ops.sha256")" ]; then
  :
elif [ "$_have" -lt "$(cat "$_a/parts")" ]; then
  echo "fa3-env.sh: $_have of $(cat "$_a/parts") parts of flash_ops are here; carry the rest first" >&2
else
  cat "$_a"/flash_ops.xz.part* | xz -d -T0 > "$_lib.tmp"
  if [ "$(sha256sum "$_lib.tmp" | cut -d' ' -f1)" = "$(cat "$_a/flash_ops.sha256")" ]; then
    mv "$_lib.tmp" "$_lib" && cp "$_a/flash_ops.sha256" "$_lib.sha256"
  else
    rm -f "$_lib.tmp"; echo "fa3-env.sh: the joined flash_ops does not match its checksum" >&2
  fi
fi
unset _a _lib _have
