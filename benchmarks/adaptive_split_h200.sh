#!/usr/bin/env bash
# Issue 7 on one lent H200: the one-process arms without MPS, then the two-process arms
# under a private MPS daemon (started here, always quit on exit). Results under $OUT.
# Every step has its own timeout (defaults sum to 530 s, under the device tool's 540 s call).
#   ONE_ARGS="..." TWO_ARGS="..." [ONE_B_ARGS="..."] bash benchmarks/adaptive_split_h200.sh
set -u
OUT=${OUT:?set OUT}
# The device tool brings back only a few files: pack everything but gpu.txt into one archive.
bundle() { (cd "$OUT" && tar czf /tmp/adaptive_results.tgz --exclude=gpu.txt . && mv /tmp/adaptive_results.tgz results.tgz \
  && find . -mindepth 1 ! -name results.tgz ! -name gpu.txt -delete); }
export PYTHONPATH=python CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c 'import torch,sys; print(torch.__version__, torch.version.cuda, sys.version.split()[0])' >> "$OUT/gpu.txt"
if [ -n "${ONE_ARGS:-}" ]; then
  timeout ${ONE_TIMEOUT:-380} python3 benchmarks/adaptive_split.py $ONE_ARGS --out "$OUT/one" > "$OUT/one.log" 2>&1; echo "one rc=$?" >> "$OUT/gpu.txt"
fi
if [ -n "${ONE_B_ARGS:-}" ]; then
  timeout ${ONE_B_TIMEOUT:-150} python3 benchmarks/adaptive_split.py $ONE_B_ARGS --out "$OUT/one_b" > "$OUT/one_b.log" 2>&1; echo "one_b rc=$?" >> "$OUT/gpu.txt"
fi
if [ -n "${GPU_TEST:-}" ]; then
  timeout ${GPU_TEST_TIMEOUT:-50} python3 -m pytest -q -s -m gpu ${GPU_TESTS:-tests/gpu/test_adaptive_split_gpu.py} > "$OUT/gpu_test.log" 2>&1; echo "gpu_test rc=$?" >> "$OUT/gpu.txt"
fi
if [ -n "${TWO_ARGS:-}" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p /tmp/mps_pipe /tmp/mps_log
  trap 'echo quit | nvidia-cuda-mps-control; sleep 1; cat /tmp/mps_log/*.log > "$OUT/mps.log" 2>/dev/null; bundle' EXIT
  nvidia-cuda-mps-control -d && echo "mps daemon started" >> "$OUT/gpu.txt"
  timeout ${TWO_TIMEOUT:-100} python3 benchmarks/adaptive_split.py --two-process-only $TWO_ARGS --out "$OUT/two" > "$OUT/two.log" 2>&1; echo "two rc=$?" >> "$OUT/gpu.txt"
fi
[ -n "${TWO_ARGS:-}" ] || bundle
