#!/usr/bin/env bash
# Builds .gpu-fa3/: FA3 (sgl_kernel's flash_ops) for the offline GPU host of build-bundle.sh, in parts.
#
#   scripts/gpu-host/build-fa3.sh     # from the project root, on a machine with PyPI
#
# --attention-backend fa3 runs sgl_kernel's flash_ops library. The bundle leaves it out: sglang-kernel 0.4.10's
# is built against torch 2.14 (its sm90 common_ops needs symbols torch 2.11 lacks, see build-bundle.sh), and the
# library is 1.1 GB. sglang-kernel 0.4.5's flash_ops, whose sm90 common_ops the bundle already runs on torch 2.11,
# needs only two torch symbols beyond those (c10::SymbolicShapeMeta::init_is_channels_last_contiguous and its 3d
# form, both older than torch 2.11), and registers the same `fwd` schema as 0.4.10's, whose Python layer the
# bundle has (`from sgl_kernel import flash_ops`): it is the one taken. Compressed, it is still several times what one
# transfer to the host takes: it is written as parts of FA3_PART_MB (default 60) under .gpu-fa3/, to be carried
# one per call while the host stays warm (what a call left in the checkout stays for the next one).
# On the host, once every part is there, `source .gpu-fa3/env.sh` (after .gpu-bundle/env.sh) joins them and
# puts flash_ops into the unpacked bundle's sgl_kernel.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proj=$(pwd)
[ -f "$proj/pyproject.toml" ] && [ -f "$proj/scripts/gpu-host/env.sh" ] || { echo "run from the project root"; exit 1; }
work=${TMPDIR:-/tmp}/gpu-fa3-build; rm -rf "$work"; mkdir -p "$work"
echo "== downloading sglang-kernel 0.4.5"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d "$work" sglang-kernel==0.4.5
unzip -q -o -j "$work"/sglang_kernel-0.4.5-*.whl 'sgl_kernel/flash_ops.abi3.so' -d "$work"
echo "== compressing $(du -h "$work/flash_ops.abi3.so" | cut -f1) of flash_ops"
rm -rf "$proj/.gpu-fa3"; mkdir -p "$proj/.gpu-fa3"
sha256sum "$work/flash_ops.abi3.so" | cut -d' ' -f1 > "$proj/.gpu-fa3/flash_ops.sha256"
xz -T0 -6 -c "$work/flash_ops.abi3.so" | split -b "${FA3_PART_MB:-60}M" -d -a 2 - "$proj/.gpu-fa3/flash_ops.xz.part"
find "$proj/.gpu-fa3" -maxdepth 1 -name 'flash_ops.xz.part*' | wc -l > "$proj/.gpu-fa3/parts"
cp "$here/fa3-env.sh" "$proj/.gpu-fa3/env.sh"
rm -rf "$work"
du -sh "$proj"/.gpu-fa3/*
echo "== done: carry .gpu-fa3 one part per call (.gpu-fa3/flash_ops.xz.partNN, with env.sh, parts and"
echo "   flash_ops.sha256 in the first), then: source .gpu-bundle/env.sh && source .gpu-fa3/env.sh &&"
