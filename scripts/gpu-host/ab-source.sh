#!/usr/bin/env bash
# Export the plugin as committed at REV to .ab/LABEL/python, for a benchmark arm BASE+LABEL
# (benchmarks/serving_vs_upstream.py) that runs that build beside this checkout's in one device call.
#
#   scripts/gpu-host/ab-source.sh REV LABEL     # then: run(..., carry=[".gpu-bundle", ".whl", ".ab"])
#
# .ab/ is git-ignored, so it travels to the GPU host only when a call names it in `carry`.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 REV LABEL   (LABEL: letters, digits, '-' and '_')" >&2
  exit 2
fi
rev=$1 label=$2
case $label in
  *[!A-Za-z0-9_-]*|"") echo "$0: LABEL '$label' may hold only letters, digits, '-' and '_'" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "$0: no commit '$rev' in this repository" >&2; exit 2; }
dest=.ab/$label
rm -rf "$dest"
mkdir -p "$dest"
git archive "$commit" python/sglang_edgeacc | tar -x -C "$dest"
echo "$commit" >"$dest/REVISION"
echo "$dest/python: sglang_edgeacc at $commit ($(git log -1 --format=%s "$commit" | cut -c1-80))"
