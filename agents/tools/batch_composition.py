"""What does each update train on? Per instruction: rollout share, relabeled rows, rewards, cut steps.

Runs the PQN trainer for ``--updates`` iterations and counts per instruction, after the first ``--skip``
(all seeds pooled). Compare ``--method oir`` with ``--method cosine``:

    python examples/batch_composition.py --method oir --updates 40 --skip 30 --out /tmp/oir_batch.json

``--set PART.FIELD=VALUE`` overrides any :class:`agents.pqn.config.TrainConfig` field (JSON values
parsed). The defaults (:data:`CPU_DEFAULTS`) make early competence reachable on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from agents.pqn import config as config_lib

CPU_DEFAULTS = {"pqn.hidden_size": 64, "pqn.lr": 3e-4, "pqn.lr_linear_decay": False, "pqn.num_epochs": 2,
                "pqn.eps_decay": 0.3, "oir.relabeler": "rules", "eval.every": 10**9}


def _override(item: str) -> tuple[str, object]:
    """``PART.FIELD=VALUE`` as ``(key, value)``, the value parsed as JSON where it is JSON."""
    if "=" not in item:
        raise SystemExit(f"--set takes KEY=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def count(trainer, totals: dict[str, Counter]) -> None:
    """Add the trainer's last iteration to ``totals[instruction]`` (all seeds)."""
    host, batch = trainer.last_rollout, trainer.last_batch
    text = np.vectorize(trainer.registry.text, otypes=[object])
    E = trainer.cfg.pqn.num_envs
    rewards = np.asarray(batch["rewards"])  # [S, T, N]
    cuts = np.asarray(batch["cuts"])
    weights = np.asarray(batch["weights"])  # [S, N]
    for s in range(trainer.S):
        names = text(host["instr"][s])  # [T, E]
        for name, n in Counter(names.ravel().tolist()).items():
            totals[name]["rollout_steps"] += n
        for t, e in zip(*np.nonzero(host["done"][s])):
            totals[names[t, e]]["episodes"] += 1
            totals[names[t, e]]["successes"] += int(host["success"][s, t, e])
        for t, e in zip(*np.nonzero(rewards[s, :, :E] > 0)):
            totals[names[t, e]]["rewarded_steps"] += 1
        relabeled = getattr(trainer.method, "last_texts", [])  # method oir: the relabeled rows' texts
        for j, name in enumerate(relabeled[s] if relabeled else []):
            if not name or weights[s, E + j] == 0:
                continue
            totals[name]["relabeled_rows"] += 1
            totals[name]["rewarded_steps"] += int((rewards[s, :, E + j] > 0).sum())
            totals[name]["cut_steps"] += int(cuts[s, :, E + j].sum())


def table(totals: dict[str, Counter]) -> str:
    """Markdown table, instructions by their share of the rewarded steps."""
    all_steps = max(sum(c["rollout_steps"] for c in totals.values()), 1)
    all_rewards = max(sum(c["rewarded_steps"] for c in totals.values()), 1)
    lines = ["| instruction | rollout steps | episodes | successes | relabeled rows | rewarded steps | share of rewards | cut steps |",
             "|---|---|---|---|---|---|---|---|"]
    for name, c in sorted(totals.items(), key=lambda kv: (-kv[1]["rewarded_steps"], kv[0])):
        lines.append(f"| {name} | {c['rollout_steps'] / all_steps:.1%} | {c['episodes']} | {c['successes']} | "
                     f"{c['relabeled_rows']} | {c['rewarded_steps']} | {c['rewarded_steps'] / all_rewards:.1%} | "
                     f"{c['cut_steps']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", default="oir", choices=["oir", "cosine", "gt"])
    p.add_argument("--preset", default="paper", choices=sorted(config_lib.PRESETS))
    p.add_argument("--updates", type=int, default=40, help="iterations to run")
    p.add_argument("--skip", type=int, default=30, help="iterations before counting starts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", nargs="*", default=[], metavar="PART.FIELD=VALUE", help="config overrides")
    p.add_argument("--out", help="write the counts as JSON here")
    args = p.parse_args(argv)
    if not 0 <= args.skip < args.updates:
        raise SystemExit(f"--skip must be in [0, --updates), got {args.skip} and {args.updates}")
    over = {**CPU_DEFAULTS, **dict(map(_override, args.set))}
    try:
        cfg = config_lib.preset(args.preset).replace(**over, **{"run.method": args.method, "run.seed": args.seed})
        # room for at least 100 updates, so the epsilon schedule (a fraction of the total) is the CPU defaults'
        own = cfg.run.total_timesteps if "run.total_timesteps" in over else 0
        cfg = cfg.replace(**{"run.total_timesteps": max(own, 100 * cfg.batch_steps)})
        cfg.validate()
    except (ValueError, TypeError) as e:  # unknown fields or bad values
        raise SystemExit(f"error: {e}") from None

    from agents.pqn.trainer import Trainer

    totals: dict[str, Counter] = defaultdict(Counter)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, tmp, log=lambda *_: None)
        trainer.init_state()
        try:
            for u in range(args.updates):
                log = trainer.iteration()
                if u >= args.skip:
                    count(trainer, totals)
                m = log.metrics
                print(f"[{u + 1}/{args.updates}] {'counted' if u >= args.skip else 'warm-up'} | eps {m['epsilon']:.2f} "
                      f"| train success {m['train/success_rate']:.3f} | relabel rows {m.get('relabel/rows', 0):.0f}",
                      flush=True)
        finally:
            trainer.close()
    print(f"\n## {args.method}: updates {args.skip + 1}-{args.updates}, {cfg.run.num_seeds} seed(s)\n")
    print(table(totals))
    if args.out:
        Path(args.out).write_text(json.dumps({"method": args.method, "config": cfg.to_dict(), "skip": args.skip,
                                              "updates": args.updates, "counts": totals}, indent=1, default=int))
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
