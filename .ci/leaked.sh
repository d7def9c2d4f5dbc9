#!/usr/bin/env bash
# Usage: leaked.sh PREFIX [GRACE_S]
# Prints the pids of processes whose command line starts with PREFIX and that
# are still running GRACE_S whole seconds (default 30) after the call; exits 0.
#
# A process that ends by itself within the grace period is not a leak: Python's
# multiprocessing resource tracker, started by any test that uses the "spawn"
# context, reads EOF when pytest exits and ends a moment after it. A process that
# has become a zombie between pgrep and the read of its state is not counted either.
set -uo pipefail

prefix=$1
grace_s=${2:-30}

running() {
    local pid state
    for pid in $(pgrep -f "^$prefix" || true); do
        state=$(sed -e 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
        [ -n "$state" ] && [ "$state" != Z ] && printf '%s ' "$pid"
    done
    return 0
}

# Half-second polls, counted: the wait is never shorter than the grace period.
polls=$(( grace_s * 2 ))
pids=$(running)
while [ -n "$pids" ] && [ "$polls" -gt 0 ]; do
    sleep 0.5
    polls=$(( polls - 1 ))
    pids=$(running)
done
printf '%s' "$pids"
