#!/usr/bin/env bash
# Builds the bundle that lets the real sglang 0.5.23 server (and this project's plugin) run on an
# offline NVIDIA GPU host whose image has Python 3.12, torch 2.11 (cu130), triton 3.6, transformers and
# numpy, but neither sglang nor its server stack, and whose torch differs from sglang's pin (2.14.1).
#
#   scripts/gpu-host/build-bundle.sh     # from the project root, on a machine with PyPI
#
# It writes .gpu-bundle/ (about 42 MB: the server stack as one archive, and env.sh) and .whl/ (the
# wheels the serving benchmark adds at run time; tests/gpu/on_device.sh installs them). Both are
# git-ignored. Copy them to the GPU host with the checkout and begin each command there with
#   source .gpu-bundle/env.sh &&
# What differs from a production GPU host (keep it in mind when you read a result):
#   * torch 2.11 (the image's) instead of the pinned 2.14.1;
#   * sglang-kernel: the 0.4.10 Python layer over the 0.4.5 SM90 op library (0.4.10's library needs a
#     torch 2.14 symbol; the two define the same op schemas, apart from two ops no dense model uses);
#   * no flashinfer, FA3 (sgl_kernel.flash_ops), CuTe DSL, DeepGEMM, DeepEP: serve with
#     --attention-backend triton --sampling-backend pytorch;
#   * the radix tree's Python core (the Rust core is built against torch 2.14's dtype codes);
#   * sitecustomize.py: the SM100-only dual GEMM is declined without importing cutlass.
# Every arm of a comparison (upstream and EdgeAcc) runs on the same bundle, so their ratios are fair.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
proj=$(pwd)
[ -f "$proj/pyproject.toml" ] && [ -f "$proj/scripts/gpu-host/env.sh" ] || { echo "run from the project root"; exit 1; }
work=${TMPDIR:-/tmp}/gpu-bundle-build; rm -rf "$work"; mkdir -p "$work/whl" "$work/site"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$1" "${@:2}"; }
echo "== downloading wheels for Python 3.12 (the GPU host's)"
dl "$work/whl" -r "$here/requirements-host.txt"
dl "$work/k0410" sglang-kernel==0.4.10
dl "$work/k045" sglang-kernel==0.4.5
# Imported by upstream's bench_serving (datasets), by --enable-metrics (prometheus_client), and pytest for
# the start-failure step of tests/gpu/on_device.sh.
mkdir -p "$proj/.whl"
dl "$proj/.whl" datasets==5.2.0 multiprocess==0.70.19 prometheus_client==0.26.0 \
  pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pytest-timeout==2.4.0
echo "== unpacking"
for w in "$work"/whl/*.whl; do
  case $w in
    */sglang-0.5.23-*) unzip -q -o "$w" -d "$work/site" -x 'sglang/srt/rust_extensions/_bench*' \
        'sglang/srt/rust_extensions/_grpc*' 'sglang/srt/rust_extensions/_server*' 'sglang/srt/rust_extensions/_multimodal*' ;;
    *) unzip -q -o "$w" -d "$work/site" ;;
  esac
done
unzip -q -o "$work"/k0410/*.whl -d "$work/site" -x 'sgl_kernel/flash_ops*' 'sgl_kernel/flashmla_ops*' \
    'sgl_kernel/infllm_ops*' 'sgl_kernel/sm100/*'
unzip -q -o -j "$work"/k045/*.whl 'sgl_kernel/sm90/common_ops.abi3.so' -d "$work/site/sgl_kernel/sm90"
unzip -q -o -j "$work"/k045/*.whl 'sgl_kernel/spatial_ops.abi3.so' -d "$work/site/sgl_kernel"
cp "$here/sitecustomize.py" "$work/site/"
# The project's own entry points (plugin, platform, CLI), read from its pyproject, so that
# sglang finds the plugin with the project on PYTHONPATH instead of pip-installed.
python3 - "$proj/pyproject.toml" "$work/site" <<'PY'
import sys, tomllib, pathlib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
d = pathlib.Path(sys.argv[2]) / f"{p['name'].replace('-', '_')}-{p['version']}.dist-info"
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {p['name']}\nVersion: {p['version']}\n")
groups = dict(p.get("entry-points", {}))
if p.get("scripts"):
    groups["console_scripts"] = p["scripts"]
(d / "entry_points.txt").write_text("".join(
    f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items()))
PY
find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$proj/.gpu-bundle"
(cd "$work/site" && tar cf - . | xz -T0 -6 > "$proj/.gpu-bundle/site.tar.xz")
cp "$here/env.sh" "$proj/.gpu-bundle/env.sh"
rm -rf "$work"
du -sh "$proj/.gpu-bundle" "$proj/.whl"
echo "== done: on the GPU host, begin each command with: source .gpu-bundle/env.sh &&"
