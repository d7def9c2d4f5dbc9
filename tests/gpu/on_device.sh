#!/usr/bin/env bash
# The real-server GPU runs in one device call, under a private MPS control daemon that is always stopped.
#
#   source .gpu-bundle/env.sh && OUT=/tmp/out bash tests/gpu/on_device.sh STEP [STEP ...]
#
# Steps (run in order, each under its own time limit; scripts run as modules from the repository root):
#   suite[:FAMILIES]              tests.gpu.server_suite (FAMILIES comma-separated, default all); SUITE_ARMS=a,b
#                                 runs only those arms beside plain; SUITE_ONE_AT_A_TIME=1 starts each server once
#                                 the one before is healthy and reports what each wrote to a shared inductor cache
#   bench:ARMS[:WORKLOADS]        benchmarks.serving_vs_upstream, ARMS/WORKLOADS comma-separated; an arm
#                                 BASE+LABEL runs the build scripts/gpu-host/ab-source.sh exported to .ab/LABEL;
#                                 BENCH_LAYOUT="--tp 2" (say) adds a layout to every arm; BENCH_GPU_SHARE=1 adds
#                                 --gpu-share (each EdgeAcc side's TFLOP/s and GB/s from its work counters);
#                                 BENCH_SHAPE=32b serves Qwen3-32B's shape instead of Qwen3-8B's; BENCH_COLD=1
#                                 leaves out the warm-up through every decode batch size (--cold);
#                                 BENCH_ITL_TARGETS=50,75,100 runs each EdgeAcc arm's workloads once per
#                                 inter-token target on its one warm server (--itl-targets); an arm that
#                                 would not end inside STEP_LIMIT_S (its start, 100-160 s on an H100, and its
#                                 workloads) is not started, and the step says so
#   mps-priority                  benchmarks.latency_physics, prefill side at normal and below-normal priority;
#                                 KERNEL_PROFILE_STEPS=N adds each arm's decode kernel time and gaps (kernel_timeline);
#                                 DECODE_STREAM_PRIORITIES=default,high also replays decode on a high-priority stream
#   context-memory                benchmarks.context_memory, a plain process and an MPS client: what a process's
#                                 CUDA context costs before it allocates anything
#   faults[:CASES]                tests.gpu.faults (CASES comma-separated, default kill,aborts,pressure,bad,soak;
#                                 empty-unpatched on request; FAULTS_SOAK_S, default 300)
#   start-failure                 tests/cpu/test_server_start.py in the real server on the GPU (EDGEACC_TEST_PLATFORM=cuda)
#   codec                         tests.gpu.test_batch_codec_gpu: the next batch unpacks while a forward runs
#   graph-copy                    tests.gpu.test_graph_input_copy_gpu: with EdgeAcc no graph-input copy compiles a
#                                 kernel (upstream's small copy, the control, compiles; whether anew for misaligned sources is reported)
#   bg+STEP                       STEP in the background, beside the steps after it (waited for at the end)
#
# EdgeAcc servers are MPS clients of the daemon (EDGEACC_SUITE_MPS_PIPE names its pipe directory);
# plain sglang servers are not. Results: $OUT/*.json, $OUT/summary.txt, all logs in $OUT/logs.tgz
# (the device tool returns at most 8 files).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/edgeacc-out}
mkdir -p "$OUT"
WORK=/tmp/edgeacc-device-work
mkdir -p "$WORK/logs"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
STEP_LIMIT_S=${STEP_LIMIT_S:-560}
# Python packages the host image lacks, carried as wheels in .whl/ (bench_serving imports `datasets`;
# --enable-metrics needs prometheus_client).
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/edgeacc-extra-site .whl/*.whl \
    && export PYTHONPATH=/tmp/edgeacc-extra-site:$PYTHONPATH
fi

MPS_ROOT=/tmp/edgeacc-mps-$$
export EDGEACC_SUITE_MPS_PIPE=$MPS_ROOT/pipe EDGEACC_SUITE_MPS_LOG=$MPS_ROOT/log
mkdir -p "$EDGEACC_SUITE_MPS_PIPE" "$EDGEACC_SUITE_MPS_LOG"

stopped=0
finish() {
  [ "$stopped" = 1 ] && return 0
  stopped=1
  # Servers are started in their own sessions by the harness, which stops them; anything left goes now.
  pkill -9 -f "sglang.launch_server" 2>/dev/null
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$EDGEACC_SUITE_MPS_PIPE timeout 30 nvidia-cuda-mps-control >/dev/null 2>&1
  sleep 2
  if pgrep -f nvidia-cuda-mps >/dev/null 2>&1; then
    echo "MPS: still running after quit: $(pgrep -af nvidia-cuda-mps | tr '\n' ';')" | tee -a "$SUMMARY"
  else
    echo "MPS: stopped, no nvidia-cuda-mps process left" | tee -a "$SUMMARY"
  fi
  cp "$EDGEACC_SUITE_MPS_LOG/control.log" "$WORK/logs/mps_control.log" 2>/dev/null
  tar czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null
}
trap finish EXIT INT TERM

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv
  python3 -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "sms", torch.cuda.get_device_properties(0).multi_processor_count)'
} >"$WORK/logs/env.txt" 2>&1

CUDA_MPS_PIPE_DIRECTORY=$EDGEACC_SUITE_MPS_PIPE CUDA_MPS_LOG_DIRECTORY=$EDGEACC_SUITE_MPS_LOG nvidia-cuda-mps-control -d
sleep 1
if [ -e "$EDGEACC_SUITE_MPS_PIPE/control" ]; then
  echo "MPS: daemon up" | tee -a "$SUMMARY"
else
  echo "MPS: daemon did NOT start" | tee -a "$SUMMARY"
fi

run_step() {  # name, limit, command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 15 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
  tail -n 40 "$WORK/logs/$name.log" >>"$SUMMARY"
}

run_one() {  # index, kind, a, b
  local i=$1 kind=$2 a=$3 b=$4
  case $kind in
    suite)
      run_step "suite$i" "$STEP_LIMIT_S" python3 -m tests.gpu.server_suite --out "$OUT/suite$i.json" \
        --workdir "$WORK/models$i" ${a:+--families "$a"} ${SUITE_ARMS:+--arms "$SUITE_ARMS"} \
        ${SUITE_ONE_AT_A_TIME:+--one-at-a-time} ;;
    bench)
      run_step "bench$i" "$STEP_LIMIT_S" python3 -m benchmarks.serving_vs_upstream --out "$OUT/bench$i.json" \
        --workdir "$WORK/models$i" --arms "$a" ${b:+--workloads "$b"} ${BENCH_LAYOUT:+--layout="$BENCH_LAYOUT"} \
        ${BENCH_GPU_SHARE:+--gpu-share} ${BENCH_COLD:+--cold} --shape "${BENCH_SHAPE:-8b}" \
        ${BENCH_ITL_TARGETS:+--itl-targets "$BENCH_ITL_TARGETS"} --time-limit-s "$((STEP_LIMIT_S - 30))" ;;
    faults)
      run_step "faults$i" "$STEP_LIMIT_S" python3 -m tests.gpu.faults --out "$OUT/faults$i.json" \
        --workdir "$WORK/models$i" ${a:+--cases "$a"} --soak-s "${FAULTS_SOAK_S:-300}" ;;
    start-failure)
      run_step "start_failure$i" "$STEP_LIMIT_S" env EDGEACC_TEST_PLATFORM=cuda python3 -m pytest -p no:cacheprovider \
        -q -rA tests/cpu/test_server_start.py ;;
    graph-copy)
      run_step "graph_copy$i" 120 python3 -m tests.gpu.test_graph_input_copy_gpu
      cp "$WORK/logs/graph_copy$i.log" "$OUT/graph_copy$i.txt" 2>/dev/null ;;
    codec)
      run_step "codec$i" 120 python3 -m tests.gpu.test_batch_codec_gpu
      cp "$WORK/logs/codec$i.log" "$OUT/codec$i.txt" 2>/dev/null ;;
    mps-priority)
      run_step "mps_priority$i" "${MPS_PRIORITY_LIMIT_S:-150}" env CUDA_MPS_PIPE_DIRECTORY="$EDGEACC_SUITE_MPS_PIPE" \
        CUDA_MPS_LOG_DIRECTORY="$EDGEACC_SUITE_MPS_LOG" PYTHONPATH=python python3 -m benchmarks.latency_physics \
        --device cuda:0 --chunks 2048 --no-graphed-chunks --mps-shares 80,100 \
        --prefill-priorities normal,below-normal --seconds 4 --out "$WORK/logs" \
        ${KERNEL_PROFILE_STEPS:+--kernel-profile-steps "$KERNEL_PROFILE_STEPS"} \
        ${DECODE_STREAM_PRIORITIES:+--decode-stream-priorities "$DECODE_STREAM_PRIORITIES"}
      cp "$WORK/logs/latency_physics.json" "$OUT/mps_priority$i.json" 2>/dev/null ;;
    context-memory)
      run_step "context_memory${i}_plain" 120 python3 -m benchmarks.context_memory --out "$OUT/context_memory${i}_plain.json"
      run_step "context_memory${i}_mps" 120 env CUDA_MPS_PIPE_DIRECTORY="$EDGEACC_SUITE_MPS_PIPE" \
        CUDA_MPS_LOG_DIRECTORY="$EDGEACC_SUITE_MPS_LOG" python3 -m benchmarks.context_memory \
        --out "$OUT/context_memory${i}_mps.json" ;;
    *) echo "unknown step $kind" | tee -a "$SUMMARY" ;;
  esac
}

i=0
background=()
for step in "$@"; do
  i=$((i + 1))
  bg=0
  [[ $step == bg+* ]] && { bg=1; step=${step#bg+}; }
  IFS=: read -r kind a b <<<"$step"
  if [ "$bg" = 1 ]; then
    run_one "$i" "$kind" "$a" "$b" &
    background+=($!)
  else
    run_one "$i" "$kind" "$a" "$b"
  fi
done
for pid in "${background[@]}"; do wait "$pid"; done
# Suite, benchmark and fault logs live beside their JSON; keep them in the tarball, not as separate files
# (every step's JSON names its own log folder: <kind><i>.json writes <kind>_logs, moved here once all ended).
for d in "$OUT"/suite_logs "$OUT"/bench_logs "$OUT"/faults_logs; do
  [ -d "$d" ] && { mkdir -p "$WORK/logs/$(basename "$d")"; mv "$d"/* "$WORK/logs/$(basename "$d")/" 2>/dev/null; rmdir "$d"; }
done
cat "$SUMMARY"
