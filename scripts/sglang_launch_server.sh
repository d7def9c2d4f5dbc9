#!/usr/bin/env bash
# shellcheck disable=SC2329  # cleanup/on_signal and what they call run from traps
# Start an SGLang server (with the sglang-edgeacc plugin installed) from
# environment variables, the way container platforms configure a service.
#
#   MODEL_PATH             required; Hugging Face id or local directory   --model-path
#   SERVED_MODEL_NAME      optional                                        --served-model-name
#   SERVER_HOST            default 0.0.0.0                                 --host
#   SERVER_PORT            default 30000                                   --port
#   TENSOR_PARALLEL_SIZE   optional, positive integer                      --tp-size
#   DATA_PARALLEL_SIZE     optional, positive integer                      --dp-size
#   ENABLE_EDGE_ACC        True/true/1 (False/false/0/empty: off)          --enable-edge-acc
#   ENABLE_SEMI_PD_DISAGG  same as ENABLE_EDGE_ACC (the older name)        --enable-edge-acc
#   ENABLE_DP_ATTENTION    True/true/1                                     --enable-dp-attention
#   TRUST_REMOTE_CODE      True/true/1                                     --trust-remote-code
#   SERVER_ARGS            any other flags, split like a shell would split them
#                          (quotes and backslashes are honoured, nothing is expanded)
#   PYTHON                 interpreter, default python3
#   SGLANG_EDGEACC_MPS_TIMEOUT  seconds for each MPS step (default 15; read by sglang-edgeacc mps)
#   SERVER_STOP_TIMEOUT    seconds the server gets to stop after SIGTERM/SIGINT before
#                          its process group is killed (default 60)
#   CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY
#                          MPS directories (default /tmp/nvidia-mps, /tmp/nvidia-log);
#                          exported to the server so its processes find the daemon
#
# MPS: when EdgeAcc is on and SERVER_ARGS does not choose time-slicing
# (--edge-acc-sm-partition none), the script runs
# `sglang-edgeacc mps start` (as "$PYTHON -m sglang_edgeacc.cli mps start", so
# the same installation as the server) with CUDA_VISIBLE_DEVICES unset, so the
# daemon sees every GPU; the server then gets the caller's CUDA_VISIBLE_DEVICES
# back, unchanged (unset stays unset). A daemon that already answers is used
# as it is and left running on exit; a daemon this script started is stopped
# on exit (`sglang-edgeacc mps stop`).
#
# Signals: the server runs in its own process group (job control on) so that
# it gets SIGINT with its default handler (a background child of a
# non-interactive shell would ignore it). SIGTERM and SIGINT to the script are
# forwarded to the server; after SERVER_STOP_TIMEOUT seconds the server's
# process group is killed. On exit, any process left in that group is stopped
# too, then MPS. The script exits with the server's exit status.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
SERVER_STOP_TIMEOUT="${SERVER_STOP_TIMEOUT:-60}"

log() { printf '[sglang_launch_server] %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 2
}

# is_true VALUE NAME: the accepted spellings of a boolean environment variable.
is_true() {
  case "${1:-}" in
    True | true | TRUE | 1 | yes | Yes | YES | on | On | ON) return 0 ;;
    "" | False | false | FALSE | 0 | no | No | NO | off | Off | OFF) return 1 ;;
    *) die "$2 must be True/true/1 or False/false/0, got '$1'" ;;
  esac
}

require_positive_int() {
  [[ "$1" =~ ^[1-9][0-9]*$ ]] || die "$2 must be a positive integer, got '$1'"
}

# ------------------------------------------------------------------ flags

[[ -n "${MODEL_PATH:-}" ]] || die "MODEL_PATH is not set (a Hugging Face id or a local directory, e.g. MODEL_PATH=Qwen/Qwen3-32B)"

server_args=(-m sglang.launch_server --model-path "$MODEL_PATH")
if [[ -n "${SERVED_MODEL_NAME:-}" ]]; then
  server_args+=(--served-model-name "$SERVED_MODEL_NAME")
fi
server_args+=(--host "${SERVER_HOST:-0.0.0.0}")
require_positive_int "${SERVER_PORT:-30000}" SERVER_PORT
server_args+=(--port "${SERVER_PORT:-30000}")
if [[ -n "${TENSOR_PARALLEL_SIZE:-}" ]]; then
  require_positive_int "$TENSOR_PARALLEL_SIZE" TENSOR_PARALLEL_SIZE
  server_args+=(--tp-size "$TENSOR_PARALLEL_SIZE")
fi
if [[ -n "${DATA_PARALLEL_SIZE:-}" ]]; then
  require_positive_int "$DATA_PARALLEL_SIZE" DATA_PARALLEL_SIZE
  server_args+=(--dp-size "$DATA_PARALLEL_SIZE")
fi
if is_true "${TRUST_REMOTE_CODE:-}" TRUST_REMOTE_CODE; then
  server_args+=(--trust-remote-code)
fi
if is_true "${ENABLE_DP_ATTENTION:-}" ENABLE_DP_ATTENTION; then
  server_args+=(--enable-dp-attention)
fi

edge_acc=0
if is_true "${ENABLE_EDGE_ACC:-}" ENABLE_EDGE_ACC; then edge_acc=1; fi
if is_true "${ENABLE_SEMI_PD_DISAGG:-}" ENABLE_SEMI_PD_DISAGG; then edge_acc=1; fi

# SERVER_ARGS: xargs splits like a shell (quotes, backslashes) without expanding anything.
extra_args=()
if [[ -n "${SERVER_ARGS:-}" ]]; then
  printf '%s' "$SERVER_ARGS" | xargs -r printf '' ||
    die "SERVER_ARGS has an unbalanced quote: $SERVER_ARGS"
  mapfile -d '' -t extra_args < <(printf '%s' "$SERVER_ARGS" | xargs -r printf '%s\0')
fi

sm_partition=mps
for ((i = 0; i < ${#extra_args[@]}; i++)); do
  case "${extra_args[i]}" in
    --enable-edge-acc | --enable-semi-pd-disagg) edge_acc=1 ;;
    --edge-acc-sm-partition=*) sm_partition="${extra_args[i]#*=}" ;;
    --edge-acc-sm-partition) sm_partition="${extra_args[i + 1]:-}" ;;
  esac
done

if ((edge_acc)); then
  # Added once, even when SERVER_ARGS repeats it (argparse accepts the repeat anyway).
  server_args+=(--enable-edge-acc)
fi
server_args+=("${extra_args[@]}")

# ------------------------------------------------------------------ MPS

mps_started=0
server_pid=""
watchdog_pid=""

start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
  export CUDA_MPS_LOG_DIRECTORY="${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-log}"
  local had_visible=0 visible="" outcome rc
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    had_visible=1
    visible="$CUDA_VISIBLE_DEVICES"
  fi
  # The daemon must see every GPU; the server gets the caller's selection back below.
  unset CUDA_VISIBLE_DEVICES
  rc=0
  outcome="$("$PYTHON" -m sglang_edgeacc.cli mps start)" || rc=$?
  if ((had_visible)); then export CUDA_VISIBLE_DEVICES="$visible"; fi
  if ((rc != 0)); then
    die "could not start the CUDA MPS daemon (see above); fix that, or put --edge-acc-sm-partition none in SERVER_ARGS"
  fi
  case "$outcome" in
    started*) mps_started=1 ;;
    already-running*) log "using the MPS daemon that already answers on $CUDA_MPS_PIPE_DIRECTORY; it is left running on exit" ;;
    *) die "unexpected answer from 'sglang-edgeacc mps start': $outcome" ;;
  esac
}

stop_mps() {
  if ((mps_started)); then
    mps_started=0
    "$PYTHON" -m sglang_edgeacc.cli mps stop ||
      log "warning: 'sglang-edgeacc mps stop' failed; check with 'sglang-edgeacc mps status'"
  fi
}

# ------------------------------------------------------------------ lifecycle

group_alive() { [[ -n "$server_pid" ]] && kill -0 -- "-$server_pid" 2>/dev/null; }

on_signal() {
  local sig="$1"
  if [[ -z "$server_pid" ]]; then
    exit $((128 + $(kill -l "$sig")))
  fi
  log "received SIG$sig; forwarding it to the server (pid $server_pid)"
  kill -s "$sig" "$server_pid" 2>/dev/null || true
  if [[ -z "$watchdog_pid" ]]; then
    set -m # its own process group, so cleanup can end the sleep with it
    (
      sleep "$SERVER_STOP_TIMEOUT"
      kill -s KILL -- "-$server_pid" 2>/dev/null || true
    ) &
    watchdog_pid=$!
    set +m
  fi
}

cleanup() {
  local rc=$?
  trap - EXIT TERM INT
  if group_alive; then
    # The server is gone or going, but processes of its group remain: stop them too.
    kill -s TERM -- "-$server_pid" 2>/dev/null || true
    local waited=0
    while group_alive && ((waited < SERVER_STOP_TIMEOUT * 10)); do
      sleep 0.1
      waited=$((waited + 1))
    done
    if group_alive; then
      log "processes of the server's group survived SIGTERM for ${SERVER_STOP_TIMEOUT}s; killing them"
      kill -s KILL -- "-$server_pid" 2>/dev/null || true
    fi
  fi
  if [[ -n "$watchdog_pid" ]]; then
    kill -s TERM -- "-$watchdog_pid" 2>/dev/null || true
  fi
  stop_mps
  exit "$rc"
}

trap cleanup EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

require_positive_int "$SERVER_STOP_TIMEOUT" SERVER_STOP_TIMEOUT
if ((edge_acc)); then
  case "$sm_partition" in
    # Two processes' kernels overlap only under MPS, whatever confines them.
    mps | green-context) start_mps ;;
    none) log "EdgeAcc with --edge-acc-sm-partition none: no MPS daemon needed (the sides time-slice)" ;;
    adaptive) die "--edge-acc-sm-partition adaptive was retired: drop the flag or pass mps (the default split paces decode steps to --edge-acc-itl-slo-ms)" ;;
    *) die "--edge-acc-sm-partition must be mps, green-context or none, got '$sm_partition'" ;;
  esac
fi

log "starting: $PYTHON ${server_args[*]}"
set -m # own process group for the server, and SIGINT not ignored in it
"$PYTHON" "${server_args[@]}" &
server_pid=$!
set +m

status=0
while true; do
  wait "$server_pid" && status=0 || status=$?
  # A trapped signal interrupts `wait` (status > 128) while the server still runs.
  if ((status > 128)) && kill -0 "$server_pid" 2>/dev/null; then
    continue
  fi
  break
done
log "server exited with status $status"
exit "$status"
