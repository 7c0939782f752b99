#!/bin/bash
# The fixed-seed 100-update CPU run of issue 17's before/after check, at whatever commit WORKTREE
# has checked out (old flat flags before 10fccfb, the nested --part.field flags after; flags that
# a commit does not know yet are left out). Prints update 1's loss and q_mean.
# Usage: bash run.sh WORKTREE OUTDIR
set -e
wt=$1; out=$2; [ -e "$out" ] && { echo "$out exists: name a new folder" >&2; exit 2; }
cd "$wt"; export PYTHONPATH=$wt
common_old="--run-dir $out --method oir --relabeler rules --total-timesteps 6400 --num-envs 4 --num-steps 16 --hidden-size 32 --num-epochs 2 --num-minibatches 2 --lr 1e-3 --k 2 --seed 0 --eval-every 100 --eval-episodes 1 --eval-horizon 8 --checkpoint-every 50"
if grep -q '"--method"' examples/train_pqn.py; then
  args="--preset cpu $common_old"
else
  args="cpu --run-dir $out --run.method oir --oir.relabeler rules --run.total-timesteps 6400 --pqn.num-envs 4 --pqn.num-steps 16 --pqn.hidden-size 32 --pqn.num-epochs 2 --pqn.num-minibatches 2 --pqn.lr 1e-3 --oir.k 2 --run.seed 0 --eval.every 100 --eval.episodes 1 --eval.horizon 8 --run.checkpoint-every 50"
  grep -q "grounding:" agents/config.py && args="$args --oir.grounding cosine"
  grep -q "control: bool" agents/config.py && args="$args --eval.no-control"
  grep -q "num_devices:" agents/config.py && args="$args --run.num-devices 1"
fi
timeout 300 python examples/train_pqn.py $args > "$out.log" 2>&1 || { tail -5 "$out.log"; exit 125; }
python -c "import json,sys; r=json.loads(open('$out/metrics.jsonl').readline()); print(r['update'], r['loss'], r['q_mean'])"
