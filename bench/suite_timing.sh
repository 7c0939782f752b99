#!/usr/bin/env bash
# The default test suite's times, as docs/benchmarks.md quotes them: runs
# `python -m pytest -q -p no:cacheprovider --durations=25` from the repository root and writes its
# raw output with the commit, `nproc`, `uptime` before and after, and the wall time to
# results/test_suite/<date>_<shortcommit>.txt (tests/test_benchmarks_doc.py reads the newest).
# Extra arguments go to pytest. Run it on a machine with nothing else running.
set -u
cd "$(dirname "$0")/.."
commit=$(git rev-parse HEAD)
dirty=$(git status --porcelain --untracked-files=no | wc -l)
mkdir -p results/test_suite
out="results/test_suite/$(date -u +%Y-%m-%dT%H%M%SZ)_${commit:0:7}.txt"
{
    echo "commit: $commit"
    echo "tracked files changed since the commit: $dirty"
    echo "nproc: $(nproc)"
    echo "uptime before: $(uptime)"
    echo "command: python -m pytest -q -p no:cacheprovider --durations=25 $*"
    echo
} > "$out"
start=$(date +%s%N)
python -m pytest -q -p no:cacheprovider --durations=25 "$@" >> "$out" 2>&1
rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
{
    echo
    echo "uptime after: $(uptime)"
    echo "pytest exit status: $rc"
    printf 'wall time: %d.%01d s\n' $((ms / 1000)) $((ms % 1000 / 100))
} >> "$out"
echo "$out"
exit $rc
