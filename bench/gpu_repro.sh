#!/usr/bin/env bash
# Paper-preset reproduction runs on a lent GPU machine, detached so that they outlive the
# 10-minute limit of one device call (the machine itself is held for at most 30 minutes).
# Run it through bench/gpu_session.sh, which installs the carried wheels and the encoder:
#
#   bash bench/gpu_session.sh bash bench/gpu_repro.sh launch /tmp/oir 1200 gt:0 oir:1
#   bash bench/gpu_session.sh bash bench/gpu_repro.sh status /tmp/oir
#   bash bench/gpu_session.sh bash bench/gpu_repro.sh collect /tmp/oir $OUT
#
# launch ROOT LIMIT METHOD:GPU[:NAME[:FLAGS]]...
#        one process per spec on the card(s) GPU (CUDA_VISIBLE_DEVICES; "0,1" for two): 3 seeds vmapped,
#        the paper preset ($PRESET names another, e.g. fast), stopping (with a checkpoint) after LIMIT seconds if 1e7 steps are not
#        reached; then two evaluations of the last checkpoint, side by side on the same card:
#        greedy (eval_end_greedy.json) and epsilon 0.05 (eval_end_eps0.05.json).
#        ROOT/METHOD.log holds the output; ROOT/METHOD/DONE marks the end (ROOT/NAME when NAME
#        is given). FLAGS are extra train_pqn.py flags with '+'
#        for spaces; $EXTRA adds flags to every spec. DRY_RUN=1 prints the commands instead of
#        starting them; END_EVAL=0 skips the two evaluations after training (when the run's own
#        evaluation schedule ends on its last update).
#
# One method's seeds over several cards no longer need one process per card: the trainer shards
# its seeds over every visible device in one program (--run.num-devices, default all visible),
# e.g. GPU "0,1" in a spec: `launch /tmp/oir 1500 oir:0,1:oir:--run.num-seeds+6` runs 3 seeds on
# each card (docs/reproduce.md). This launcher stays for running DIFFERENT methods side by side
# (gt on card 0, oir on card 1): they are different programs with their own host loops (relabeler,
# buffer, checkpoints, evaluation, time limit), and separate processes keep them independent (one
# method's crash or resume touches nothing of the other) with no change to the trainer.
# finish ROOT NAME:GPU...          for runs that hit LIMIT before 1e7 steps: stops the launch wrappers
#        (so the stopped checkpoint is not evaluated), waits for training to checkpoint, resumes
#        each run to the end on its card (its in-run final evaluation is greedy), then writes
#        eval_end_eps0.05.json; ROOT/NAME.finish.log holds the output.
# status ROOT                      last lines of every log, GPU use.
# collect ROOT DEST                DEST/runs.tgz: every run directory without checkpoints.
set -u
cmd=$1; root=$2; shift 2
case $cmd in
launch)
  limit=$1; shift
  mkdir -p "$root"
  for spec in "$@"; do
    IFS=: read -r m gpu name flags <<< "$spec"
    name=${name:-$m}; flags=${flags//+/ }
    job="export CUDA_VISIBLE_DEVICES=$gpu
      python examples/train_pqn.py ${PRESET:-paper} --run.method $m --run.num-seeds 3 --run-dir $root/$name \
        --no-progress --time-limit $limit $flags ${EXTRA:-}
      if [ \"${END_EVAL:-1}\" = 1 ]; then
      python examples/train_pqn.py --run-dir $root/$name --eval-only end_greedy --eval.epsilon 0 &
      python examples/train_pqn.py --run-dir $root/$name --eval-only end_eps0.05 --eval.epsilon 0.05
      wait
      fi
      touch $root/$name/DONE"
    if [ -n "${DRY_RUN:-}" ]; then echo "$job"; continue; fi
    setsid nohup bash -c "$job" > "$root/$name.log" 2>&1 < /dev/null &
    echo "launched $name ($m) on GPU $gpu -> $root/$name.log"
  done
  sleep 5 ;;
finish)
  pkill -f '^bash -c export CUDA_VISIBLE_DEVICES' || true
  while pgrep -f 'train_pqn.py paper' > /dev/null; do sleep 5; done
  for spec in "$@"; do
    IFS=: read -r name gpu <<< "$spec"
    CUDA_VISIBLE_DEVICES=$gpu bash -c "python examples/train_pqn.py --run-dir $root/$name --resume --no-progress &&
      python examples/train_pqn.py --run-dir $root/$name --eval-only end_eps0.05 --eval.epsilon 0.05 &&
      touch $root/$name/DONE" > "$root/$name.finish.log" 2>&1 &
  done
  wait
  for spec in "$@"; do grep -v "Loading weights" "$root/${spec%%:*}.finish.log" | tail -n 3; done ;;
status)
  for f in "$root"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | tail -n 4; done
  ls "$root"/*/DONE 2>/dev/null
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader ;;
collect)
  dest=$1
  tar czf "$dest/runs.tgz" -C "$root" --exclude=checkpoints --exclude=checkpoint.pkl --exclude=tb . ;;
*) echo "unknown command $cmd" >&2; exit 2 ;;
esac
