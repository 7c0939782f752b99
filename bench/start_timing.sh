#!/usr/bin/env bash
# The fast preset's start, cold then warm compilation cache, with a timeline of compiles and cache hits.
# Usage: bash bench/gpu_session.sh bash bench/start_timing.sh CACHE_DIR TAG [extra flags]   (writes $OUT/start_TAG_{cold,warm}.log)
set -u
cache=$1; tag=$2; shift 2
export OIR_GYM_JAX_CACHE_DIR=$cache JAX_LOG_COMPILES=1
for i in cold warm; do
  timeout 240 python examples/train_pqn.py fast --max-updates 2 --run-dir /tmp/start_${tag}_$i --overwrite \
      --no-progress "$@" 2>&1 | python3 -u -c "
import sys, time
t = time.time()
for l in sys.stdin:
    print(f'{time.time() - t:6.1f} {l}', end='', flush=True)" > $OUT/start_${tag}_$i.log
  grep -E "ready after|first update done" $OUT/start_${tag}_$i.log
  echo "$tag $i: $(grep -c 'Finished XLA compilation' $OUT/start_${tag}_$i.log) compiles," \
       "$(grep -c 'cache hit' $OUT/start_${tag}_$i.log) cache hits"
done
