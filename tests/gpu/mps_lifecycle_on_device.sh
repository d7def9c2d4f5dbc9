#!/usr/bin/env bash
# MPS lifecycle on a real NVIDIA GPU through `sglang-edgeacc mps`, from the repository root:
#
#   bash tests/gpu/mps_lifecycle_on_device.sh      # needs torch with CUDA, no sglang
#
# Private pipe/log directories under /tmp, so a daemon the host runs is not touched.
# Steps: record the driver's facts (nvidia-smi header, the daemon's --help, the
# client's answer when no daemon runs); status (none); start; start again (no-op);
# three torch clients (25% and 60% of GPU 0, 50% of GPU 1) report
# multi_processor_count while `status` lists them; stop; no nvidia-cuda-mps
# process left. Then a daemon started by hand: `stop` refuses it, `stop --force`
# stops it. Results go to $OUT (default /tmp/mps-lifecycle-out); the last line
# says PASS or FAIL.
set -uo pipefail

OUT="${OUT:-/tmp/mps-lifecycle-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}"
work="$(mktemp -d /tmp/edgeacc-mps-XXXXXX)"
export CUDA_MPS_PIPE_DIRECTORY="$work/pipe" CUDA_MPS_LOG_DIRECTORY="$work/log"
failures=()

note() { printf '%s\n' "$*" | tee -a "$OUT/result.txt"; }
check() { # check NAME CONDITION-EXIT-CODE
  if [[ "$2" == 0 ]]; then note "ok   $1"; else
    note "FAIL $1"
    failures+=("$1")
  fi
}
check_eq() { # check_eq NAME WANT GOT
  if [[ "$2" == "$3" ]]; then check "$1" 0; else check "$1 (got $3)" 1; fi
}
cli() { timeout 120 "$PY" -m sglang_edgeacc.cli mps "$@"; }
quit_daemon() { echo quit | timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1 || true; }
trap 'quit_daemon' EXIT

: >"$OUT/result.txt"
{
  echo "== nvidia-smi"
  timeout 30 nvidia-smi 2>&1 | head -15
  echo "== which"
  command -v nvidia-cuda-mps-control
  echo "== nvidia-cuda-mps-control --help (rc follows)"
  timeout 10 nvidia-cuda-mps-control --help </dev/null 2>&1
  echo "rc=$?"
  echo "== client with no daemon: echo get_server_list | nvidia-cuda-mps-control (rc follows)"
  echo get_server_list | timeout 10 nvidia-cuda-mps-control 2>&1
  echo "rc=$?"
  echo "== torch"
  "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())' 2>&1
  echo "== nvidia-cuda-mps processes before"
  pgrep -af nvidia-cuda-mps || echo none
} >"$OUT/facts.txt" 2>&1
cat "$OUT/facts.txt"

cli status >"$OUT/status-before.txt" 2>&1
check_eq "status before start exits 3 (no daemon)" 3 $?

cli start >"$OUT/start.txt" 2>&1
rc=$?
cat "$OUT/start.txt"
check "start exits 0" "$rc"
grep -q '^started' "$OUT/start.txt"
check "start says started" $?
cli start >"$OUT/start-again.txt" 2>&1
grep -q '^already-running' "$OUT/start-again.txt"
check "second start is a no-op (already-running)" $?
cp "$CUDA_MPS_PIPE_DIRECTORY/sglang-edgeacc-mps.json" "$OUT/state-file.json" 2>/dev/null

cat >"$work/client.py" <<'EOF'
import json, os, sys, time, torch
name = sys.argv[1]
sms = torch.cuda.get_device_properties(0).multi_processor_count
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
open(os.path.join(sys.argv[2], name + ".ready"), "w").close()
t0 = time.time(); n = 0
while time.time() - t0 < 6:
    a @ a; n += 1
torch.cuda.synchronize()
json.dump({"name": name, "pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
           "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "sms": sms, "pid": os.getpid(), "matmuls": n},
          open(os.path.join(sys.argv[2], name + ".json"), "w"))
print(name, "pct", os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "sms", sms, "matmuls in 6s", n)
EOF
full_sms="$("$PY" -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2>/dev/null)"
note "full device SMs seen by a 100% client: $full_sms"
CUDA_VISIBLE_DEVICES=0 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25 timeout 120 "$PY" "$work/client.py" gpu0-25 "$OUT" >"$OUT/client-gpu0-25.txt" 2>&1 &
c1=$!
CUDA_VISIBLE_DEVICES=0 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60 timeout 120 "$PY" "$work/client.py" gpu0-60 "$OUT" >"$OUT/client-gpu0-60.txt" 2>&1 &
c2=$!
CUDA_VISIBLE_DEVICES=1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout 120 "$PY" "$work/client.py" gpu1-50 "$OUT" >"$OUT/client-gpu1-50.txt" 2>&1 &
c3=$!
for _ in $(seq 1 300); do
  [[ -e "$OUT/gpu0-25.ready" && -e "$OUT/gpu0-60.ready" && -e "$OUT/gpu1-50.ready" ]] && break
  sleep 0.2
done
cli status >"$OUT/status-during.txt" 2>&1
cli status --json >"$OUT/status-during.json" 2>&1
cat "$OUT/status-during.txt"
wait "$c1" "$c2" "$c3"
cat "$OUT"/client-*.txt
"$PY" - "$OUT" "$full_sms" "$c1" "$c2" "$c3" >"$OUT/client-check.txt" 2>&1 <<'EOF'
import json, math, sys
out, full = sys.argv[1], int(sys.argv[2])
rows = {n: json.load(open(f"{out}/{n}.json")) for n in ("gpu0-25", "gpu0-60", "gpu1-50")}
status = json.load(open(f"{out}/status-during.json"))
served = sorted(c for s in status["servers"] for c in s["clients"])
print("status clients:", served, "servers:", [s["pid"] for s in status["servers"]])
ok = True
for name, r in rows.items():
    pct = int(r["pct"])
    expect = math.ceil(full * pct / 100)
    good = abs(r["sms"] - expect) <= 2 and r["sms"] < full
    ok &= good
    print(f"{name}: {r['sms']} SMs (expected about {expect} of {full}) {'ok' if good else 'BAD'}")
listed = sum(1 for r in rows.values() if r["pid"] in served)
print(f"clients listed by status: {listed} of 3")
ok &= listed >= 2
sys.exit(0 if ok else 1)
EOF
rc=$?
cat "$OUT/client-check.txt"
check "clients see their SM share and status lists them" "$rc"

cli stop >"$OUT/stop.txt" 2>&1
rc=$?
cat "$OUT/stop.txt"
check "stop exits 0" "$rc"
for _ in $(seq 1 50); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.2; done
pgrep -af nvidia-cuda-mps >"$OUT/pgrep-after-stop.txt"
check_eq "pgrep -f nvidia-cuda-mps finds nothing after stop" 0 "$(wc -l <"$OUT/pgrep-after-stop.txt")"

# A daemon this tool did not start: refused, then stopped with --force.
env CUDA_MPS_ENABLE_PER_CTX_DEVICE_MULTIPROCESSOR_PARTITIONING=1 timeout 20 nvidia-cuda-mps-control -d
for _ in $(seq 1 50); do echo get_server_list | timeout 5 nvidia-cuda-mps-control >/dev/null 2>&1 && break; sleep 0.1; done
cli stop >"$OUT/stop-foreign.txt" 2>&1
rc=$?
cat "$OUT/stop-foreign.txt"
check_eq "stop refuses a daemon it did not start (rc 1)" 1 "$rc"
cli stop --force >"$OUT/stop-force.txt" 2>&1
check "stop --force stops it" $?
for _ in $(seq 1 50); do pgrep -f nvidia-cuda-mps >/dev/null || break; sleep 0.2; done
pgrep -af nvidia-cuda-mps >"$OUT/pgrep-end.txt"
check_eq "no nvidia-cuda-mps process at the end" 0 "$(wc -l <"$OUT/pgrep-end.txt")"
cp -r "$CUDA_MPS_LOG_DIRECTORY" "$OUT/mps-log" 2>/dev/null

if ((${#failures[@]})); then note "FAIL (${#failures[@]} checks)"; exit 1; fi
note "PASS"
