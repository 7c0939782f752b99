#!/usr/bin/env bash
# Fast-preset runs one after another, each with a fresh (cold) compilation cache, then the same
# preset again on the warm cache of the last one, stopped after 2 updates.
# Usage: [FIRST_SEED=k] bash bench/gpu_session.sh bash bench/fast_runs.sh NAME... (seed k+i for the i-th name;
# "warm" = the warm start)
set -u
i=${FIRST_SEED:-0}  # the first run's seed
for name in "$@"; do
  if [ "$name" = warm ]; then
    flags="--max-updates 2"; cache=/tmp/jc_last
  else
    flags="--run.seed $i"; cache=/tmp/jc_$name; rm -rf "$cache"; i=$((i + 1))
  fi
  start=$(date +%s)
  OIR_GYM_JAX_CACHE_DIR=$cache timeout 300 python examples/train_pqn.py fast $flags --run-dir /tmp/runs/$name \
      --overwrite --no-progress > /tmp/runs_$name.log 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - start )) s: $(grep -E 'first update done' /tmp/runs_$name.log)"
  [ "$name" = warm ] || { rm -rf /tmp/jc_last; cp -r "$cache" /tmp/jc_last; }
  grep -v "Loading weights" /tmp/runs_$name.log > /tmp/runs/$name/log.txt 2>/dev/null
done
tar czf $OUT/runs.tgz -C /tmp/runs --exclude='*.npz' --exclude='*.msgpack' --exclude=metrics.csv --exclude=tb .
