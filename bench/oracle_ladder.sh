#!/usr/bin/env bash
# The oracle-ladder runs of docs/experiments/oracle-ladder.md on a lent 4-GPU machine, one arm per
# card, detached so that they outlive one 10-minute device call. Run it through bench/gpu_session.sh
# (wheels and encoder):
#
#   bash bench/gpu_session.sh bash bench/oracle_ladder.sh start /tmp/ladder   # both batches, in order
#   bash bench/gpu_session.sh bash bench/oracle_ladder.sh wait /tmp/ladder 560 # poll up to 560 s
#   bash bench/gpu_session.sh bash bench/oracle_ladder.sh collect /tmp/ladder $OUT
#
# Batch 1: canonical and diverse, seeds 0 and 1 (3 seeds vmapped each: 6 per arm); batch 2: tasks,
# compound and noisy, seed 0 (3 seeds each). Every arm: the fast preset, rule relabeler, bound
# grounding, the example file's sets evaluated, the final evaluation at the preset's 16 episodes.
set -u
cmd=$1; root=$2; shift 2
arm() {  # arm NAME ORACLE SEED GPU
  CUDA_VISIBLE_DEVICES=$4 python examples/train_pqn.py fast --oir.relabeler rules --oir.grounding bound \
    --oir.oracle "$2" --run.seed "$3" --eval.instruction-files oir_gym/data/example_instruction_sets.json \
    --run-dir "$root/$1" --no-progress > "$root/$1.log" 2>&1
}
case $cmd in
start)
  mkdir -p "$root"
  # shellcheck disable=SC2016
  setsid nohup bash -c "
    source bench/oracle_ladder.sh lib '$root'
    arm canonical_s0 canonical 0 0 & arm canonical_s1 canonical 1 1 &
    arm diverse_s0 diverse 0 2 & arm diverse_s1 diverse 1 3 & wait
    arm tasks_s0 tasks 0 0 & arm compound_s0 compound 0 1 & arm noisy_s0 noisy 0 2 & wait
    touch '$root/DONE'" > "$root/ladder.log" 2>&1 < /dev/null &
  sleep 2; echo "started -> $root" ;;
lib) ;;  # sourced for arm()
wait)
  limit=$1; t=0
  while [ ! -f "$root/DONE" ] && [ "$t" -lt "$limit" ]; do sleep 10; t=$((t + 10)); done
  for f in "$root"/*_s?.log; do echo "== $f"; grep -v "Loading weights" "$f" | tail -n 2; done
  ls "$root"/DONE 2>/dev/null
  nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used --format=csv,noheader ;;
collect)
  tar czf "$1/ladder.tgz" -C "$root" --exclude=checkpoints . ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
