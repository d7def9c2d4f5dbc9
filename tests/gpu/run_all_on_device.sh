#!/usr/bin/env bash
# Every GPU proof of EdgeAcc's torch-only mechanisms, in one call on a 2-GPU machine:
#   A (in parallel)  pytest tests/gpu on GPU 1 (IPC share, ordering, MPS/green-context split)
#                    benchmarks.latency_physics on GPU 0
#   B                the 2-GPU DP-attention collective test (pytest wrapper), under MPS
#   C                the idle-skip hang demonstration, after MPS is stopped
# A private MPS control daemon runs for A and B; it is always stopped (trap) before returning.
# Logs and results go to $OUT (at most 8 files come back from the device tool).
#
#   OUT=/tmp/edgeacc-out bash tests/gpu/run_all_on_device.sh
#   SKIP_DP=1 ...   only phase A;  BENCH_ARGS="..." extra benchmark arguments
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/edgeacc-out}
mkdir -p "$OUT"
export PYTHONPATH=python PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Never NVLink multicast on this host (see the device notes); children inherit these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

MPS_ROOT=/tmp/edgeacc-mps-$$
export CUDA_MPS_PIPE_DIRECTORY=$MPS_ROOT/pipe CUDA_MPS_LOG_DIRECTORY=$MPS_ROOT/log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"

mps_stopped=0
stop_mps() {
  [ "$mps_stopped" = 1 ] && return 0
  mps_stopped=1
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_ROOT/pipe timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 2
  if pgrep -f nvidia-cuda-mps >/dev/null 2>&1; then
    echo "MPS: processes still present after quit: $(pgrep -af nvidia-cuda-mps | tr '\n' ';')" | tee -a "$SUMMARY"
  else
    echo "MPS: stopped, no nvidia-cuda-mps process left" | tee -a "$SUMMARY"
  fi
  { echo "--- MPS control log (tail)"; tail -n 30 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null; } >>"$OUT/env.txt"
}
trap stop_mps EXIT INT TERM

phase_rc() { echo "$1 rc=$2 ($3 s)" | tee -a "$SUMMARY"; }

{
  date -u
  nvidia-smi
  nvidia-smi topo -m
  nvidia-smi -q | grep -iE "compute mode|product name" | sort | uniq -c
  $PY -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count()); print([torch.cuda.get_device_properties(i).multi_processor_count for i in range(torch.cuda.device_count())])'
  $PY -c 'import transformers; print("transformers", transformers.__version__)' 2>&1
  $PY -m pytest --version 2>&1
  command -v nvidia-cuda-mps-control
} >"$OUT/env.txt" 2>&1

CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1 nvidia-cuda-mps-control -d
sleep 1
if [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then
  export EDGEACC_EXPECT_MPS=1
  echo "MPS: control daemon up in $CUDA_MPS_PIPE_DIRECTORY" | tee -a "$SUMMARY"
else
  echo "MPS: control daemon did NOT start; MPS tests will fail" | tee -a "$SUMMARY"
fi

have_pytest=0
$PY -m pytest --version >/dev/null 2>&1 && have_pytest=1
PYTEST=($PY -m pytest --noconftest -p no:cacheprovider -q -rA -s)

# --- A: single-GPU proofs on GPU 1, benchmark on GPU 0, at the same time.
t0=$SECONDS
(
  export CUDA_VISIBLE_DEVICES=1
  if [ $have_pytest = 1 ]; then
    timeout -k 10 330 "${PYTEST[@]}" tests/gpu/test_ipc_share_gpu.py tests/gpu/test_ordering_gpu.py tests/gpu/test_mps_split_gpu.py
  else
    echo "pytest missing: running the proofs as scripts"
    timeout -k 10 160 $PY -m tests.gpu.test_ipc_share_gpu && timeout -k 10 160 $PY -m tests.gpu.test_ordering_gpu
  fi
) >"$OUT/pytest_single_gpu.log" 2>&1 &
pid_tests=$!
(
  export CUDA_VISIBLE_DEVICES=0
  timeout -k 10 360 $PY -m benchmarks.latency_physics --device cuda:0 --out "$OUT" ${BENCH_ARGS:-}
) >"$OUT/latency_physics.log" 2>&1 &
pid_bench=$!
wait $pid_tests; rc_tests=$?
phase_rc "A.pytest_single_gpu(GPU1)" $rc_tests $((SECONDS - t0))
wait $pid_bench; rc_bench=$?
phase_rc "A.latency_physics(GPU0)" $rc_bench $((SECONDS - t0))

if [ "${SKIP_DP:-0}" = 1 ]; then
  echo "B, C skipped (SKIP_DP=1)" | tee -a "$SUMMARY"
  stop_mps
  cat "$SUMMARY"
  tail -n 40 "$OUT/latency_physics.log"
  grep -hE "^(FAILED|ERROR|PASSED|SKIPPED)" "$OUT/pytest_single_gpu.log" | cut -c1-300
  exit 0
fi

# --- B: 4 processes on 2 GPUs under MPS, 2000 steps of DP-attention collectives.
t0=$SECONDS
if [ $have_pytest = 1 ]; then
  timeout -k 10 200 "${PYTEST[@]}" tests/gpu/test_dp_attention_collectives_gpu.py >"$OUT/dp_collectives.log" 2>&1
else
  timeout -k 10 200 $PY -m tests.gpu.dp_attention_collectives --steps 2000 >"$OUT/dp_collectives.log" 2>&1
fi
phase_rc "B.dp_collectives(2 GPUs, MPS)" $? $((SECONDS - t0))

# --- C: the bug, shown without MPS (killing hung MPS clients could upset the shared server).
stop_mps
t0=$SECONDS
env -u CUDA_MPS_PIPE_DIRECTORY -u CUDA_MPS_LOG_DIRECTORY -u EDGEACC_EXPECT_MPS \
  timeout -k 10 120 $PY -m tests.gpu.dp_attention_collectives --idle-skips --no-mps --steps 400 --timeout 45 \
  >"$OUT/dp_idle_skip_demo.log" 2>&1
phase_rc "C.dp_idle_skip_demo(expect reproduced, rc 0)" $? $((SECONDS - t0))

echo "=== results"
grep -hE "passed|failed|error" "$OUT/pytest_single_gpu.log" "$OUT/dp_collectives.log" | tail -n 40
grep -hE "^(FAILED|ERROR|PASSED|SKIPPED)" "$OUT/pytest_single_gpu.log" "$OUT/dp_collectives.log" | cut -c1-300
grep -h "REPORT" "$OUT/pytest_single_gpu.log" | cut -c1-1500
tail -n 25 "$OUT/latency_physics.log"
grep -hE "REPRODUCED|did NOT|hung_ranks|failed_ranks|corrupt_ranks" "$OUT/dp_idle_skip_demo.log"
cat "$SUMMARY"
