#!/usr/bin/env bash
# The runs of docs/experiments/mixed-arm.md and docs/experiments/stone-tier.md (arm list `main`, the
# default) or of docs/experiments/oracle-ladder.md (arm list `ladder`; bench/oracle_ladder.sh) on a
# lent 4-GPU machine, one run per card at a time, detached so that they outlive one 10-minute device
# call. Run it through bench/gpu_session.sh (wheels and encoder):
#
#   bash bench/gpu_session.sh bash bench/experiments.sh start /tmp/exp [main|ladder]  # every card's queue
#   bash bench/gpu_session.sh bash bench/experiments.sh wait /tmp/exp 560 # poll up to 560 s
#   bash bench/gpu_session.sh bash bench/experiments.sh collect /tmp/exp $OUT
#
# main: card g runs two runs of the mixed-arm experiment (fast preset, 3 seeds each), then one
# process of the stone-tier experiment (fast preset to 382 updates = 50,069,504 env steps per seed,
# 3 seeds). ladder: batch 1, canonical and diverse, seeds 0 and 1 (3 seeds vmapped each); batch 2,
# tasks, compound and noisy, seed 0. Every OIR arm: fast preset, rule relabeler, bound grounding,
# the example file's sets evaluated.
set -u
cmd=$1; root=$2; shift 2
EX=oir_gym/data/example_instruction_sets.json
oir() {  # oir NAME ORACLE SEED GPU [extra flags]
  local name=$1 oracle=$2 seed=$3 gpu=$4; shift 4
  CUDA_VISIBLE_DEVICES=$gpu python examples/train_pqn.py fast --oir.relabeler rules --oir.grounding bound \
    --oir.oracle "$oracle" --run.seed "$seed" --eval.instruction-files $EX \
    --run-dir "$root/$name" --no-progress "$@" > "$root/$name.log" 2>&1
}
gt() {  # gt NAME SEED GPU
  CUDA_VISIBLE_DEVICES=$3 python examples/train_pqn.py fast --run.method gt --run.seed "$2" \
    --eval.instruction-files $EX --run-dir "$root/$1" --no-progress > "$root/$1.log" 2>&1
}
stone() {  # stone NAME ORACLE SEED GPU
  oir "$@" --run.total-timesteps 50069504 --eval.every 16
}
case $cmd in
start)
  if [ "${1:-main}" = ladder ]; then
    arms="oir canonical_s0 canonical 0 0 & oir canonical_s1 canonical 1 1 &
      oir diverse_s0 diverse 0 2 & oir diverse_s1 diverse 1 3 & wait
      oir tasks_s0 tasks 0 0 & oir compound_s0 compound 0 1 & oir noisy_s0 noisy 0 2 & wait"
  else
    mkdir -p "$root/mixed" "$root/stone"
    arms="(oir mixed/canonical_s0 canonical 0 0; oir mixed/canonical_s3 canonical 3 0; stone stone/canonical_s0 canonical 0 0) &
      (oir mixed/mixed_s0 mixed 0 1; oir mixed/mixed_s3 mixed 3 1; stone stone/canonical_s3 canonical 3 1) &
      (oir mixed/diverse_s0 diverse 0 2; oir mixed/diverse_s3 diverse 3 2; stone stone/progress_s0 progress 0 2) &
      (gt mixed/gt_s0 0 3; gt mixed/gt_s3 3 3; stone stone/progress_s3 progress 3 3) & wait"
  fi
  mkdir -p "$root"
  setsid nohup bash -c "source bench/experiments.sh lib '$root'
    $arms; touch '$root/DONE'" > "$root/experiments.log" 2>&1 < /dev/null &
  sleep 2; echo "started -> $root" ;;
lib) ;;  # sourced for the functions above
wait)
  limit=$1; t=0
  while [ ! -f "$root/DONE" ] && [ "$t" -lt "$limit" ]; do sleep 10; t=$((t + 10)); done
  for f in "$root"/*_s?.log "$root"/*/*.log; do
    [ -f "$f" ] && { echo "== $f"; grep -v "Loading weights" "$f" | tail -n 2; }
  done
  ls "$root"/DONE 2>/dev/null
  nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used --format=csv,noheader ;;
collect)  # run folders without weights (checkpoint manifests kept), metrics.csv left out (rebuilt from metrics.jsonl)
  tar czf "$1/experiments.tgz" -C "$root" --exclude='*.npz' --exclude='*.msgpack' --exclude='*.bin' \
    --exclude=metrics.csv --exclude='tb' . ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
