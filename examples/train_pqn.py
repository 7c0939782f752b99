"""Train an instruction-following PQN agent on Craftax-Classic with OIR (or a baseline).

    python examples/train_pqn.py                           # OIR, embedded offline CPU defaults
    python examples/train_pqn.py --method cosine           # PQN + cosine reward on the 22 achievements
    python examples/train_pqn.py --method ellm --ellm-proposer rules   # ELLM baseline, rule goal proposer
    python examples/train_pqn.py --method ellm --ellm-proposer llm     # ELLM with the offline Gemma (or --llm-backend)
    python examples/train_pqn.py --preset paper --num-seeds 3 --run-dir runs/paper_oir   # GPU
    python examples/train_pqn.py --run-dir runs/x --resume # continue a run from its checkpoint

Writes ``--run-dir``: config.json, metrics.jsonl / metrics.csv, TensorBoard events (if the
``tensorboard`` package is installed), checkpoint.pkl, eval_<update>.json, eval_final.md and
PNG plots; method ``oir`` also instructions.json (every instruction inserted into the buffer, with
counts) and method ``ellm`` goals.json (every goal proposed, with counts), written at checkpoints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import pqn  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(pqn.PRESETS), default="cpu")
    p.add_argument("--run-dir", default=None, help="output folder (default runs/<method>_<time>)")
    p.add_argument("--resume", action="store_true", help="continue from <run-dir>/checkpoint.pkl")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --run-dir")
    p.add_argument("--max-updates", type=int, default=None,
                   help="stop after this many updates in this process (to split long runs; resume later)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="checkpoint and stop after this many seconds (to split long runs; resume later)")
    p.add_argument("--eval-only", metavar="TAG", default=None,
                   help="no training: evaluate <run-dir>/checkpoint.pkl with this run's --eval-* settings and "
                        "write eval_TAG.json / eval_TAG.md (e.g. --eval-only eps0.05 --eval-epsilon 0.05)")
    choices = {"method": pqn.METHODS, "relabeler": pqn.RELABELERS, "ellm_proposer": pqn.ELLM_PROPOSERS}
    for f in dataclasses.fields(pqn.PQNConfig):
        flag = "--" + f.name.replace("_", "-")
        typ = {int: int, float: float, bool: lambda s: s.lower() in ("1", "true", "yes"), str: str}[type(f.default)]
        p.add_argument(flag, type=typ, default=None, choices=choices.get(f.name), help=f"(default {f.default!r})")
    return p.parse_args(argv)


def _mean_table(per_seed: list[dict]) -> str:
    """Markdown table of per-seed evaluation dicts (``EvalResult.to_dict()``), rates averaged over seeds."""
    import numpy as np

    from oir_gym.evaluation import EvalResult

    res = EvalResult()
    for s in per_seed[0]:
        res.texts[s] = per_seed[0][s]["texts"]
        res.achievements[s] = per_seed[0][s]["achievements"]
        res.rates[s] = np.mean([f[s]["rates"] for f in per_seed], axis=0)
    return res.to_markdown()


def _finished_update(run_dir: Path) -> int | None:
    """The last logged update of a run that wrote its final evaluation, else None."""
    metrics = run_dir / "metrics.jsonl"
    if not (run_dir / "eval_final.json").exists() or not metrics.exists():
        return None
    lines = metrics.read_text().strip().splitlines()
    return int(json.loads(lines[-1])["update"]) if lines else None


def build_config(args) -> pqn.PQNConfig:
    values = dict(pqn.PRESETS[args.preset])
    for f in dataclasses.fields(pqn.PQNConfig):
        v = getattr(args, f.name)
        if v is not None:
            values[f.name] = v
    return pqn.PQNConfig(**values).validate()


class Logger:
    """metrics.jsonl + metrics.csv + optional TensorBoard."""

    def __init__(self, run_dir: Path) -> None:
        self.jsonl = open(run_dir / "metrics.jsonl", "a")
        self.csv_path = run_dir / "metrics.csv"
        self.tb = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tb"))
        except Exception:  # tensorboard not installed: JSONL/CSV only
            self.tb = None
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        self.rows.append(row)
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k not in ("update", "env_steps"):
                    self.tb.add_scalar(k, v, row["env_steps"])

    def close(self) -> None:
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = build_config(args)
    run_dir = Path(args.run_dir or f"runs/{cfg.method}_{time.strftime('%Y%m%d-%H%M%S')}")
    if args.eval_only is not None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", args.eval_only):
            print(f"error: --eval-only tag {args.eval_only!r} may hold only letters, digits, '.', '_' and '-'",
                  file=sys.stderr)
            return 2
        if args.overwrite:
            print("error: --eval-only reads a run; it cannot be combined with --overwrite", file=sys.stderr)
            return 2
        args.resume = True  # read the run's config and checkpoint
    if not args.resume and not args.overwrite and ((run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoint.pkl").exists()):
        print(f"error: {run_dir} already holds a run; pass --resume to continue it, --overwrite to replace it, "
              "or choose another --run-dir", file=sys.stderr)
        return 2
    if args.overwrite:
        for name in ("metrics.jsonl", "metrics.csv", "checkpoint.pkl"):
            (run_dir / name).unlink(missing_ok=True)
    if args.resume and not (run_dir / "checkpoint.pkl").exists():
        flag = "--eval-only" if args.eval_only is not None else "--resume"
        print(f"error: {flag} given but {run_dir / 'checkpoint.pkl'} does not exist", file=sys.stderr)
        return 2
    if args.resume:
        saved = json.loads((run_dir / "config.json").read_text())
        cli = {f.name: getattr(args, f.name) for f in dataclasses.fields(pqn.PQNConfig) if getattr(args, f.name) is not None}
        cfg = pqn.PQNConfig.from_dict({**saved, **cli}).validate()
        done = _finished_update(run_dir)
        if args.eval_only is None and done is not None and done >= cfg.num_updates:
            print(f"{run_dir} is already complete ({done}/{cfg.num_updates} updates, eval_final.json written); "
                  "nothing to resume. Evaluate it again with --eval-only TAG.", flush=True)
            return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.eval_only is None:
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))

    import jax

    from agents.oir import Trainer
    from oir_gym import analysis

    source = {"oir": f" relabeler={cfg.relabeler}", "ellm": f" proposer={cfg.ellm_proposer}"}.get(cfg.method, "")
    print(f"oir-gym PQN | method={cfg.method}{source} "
          f"| {cfg.num_seeds} seed(s) x {cfg.num_envs} envs x {cfg.num_steps} steps | {cfg.num_updates} updates "
          f"| {cfg.total_timesteps:,} env steps | device {jax.devices()[0].platform} | run dir {run_dir}", flush=True)
    t0 = time.time()
    if args.eval_only is not None:
        # evaluation needs no relabeler or goal proposer: build the rule ones, never an LLM
        trainer = Trainer(dataclasses.replace(cfg, relabeler="rules", ellm_proposer="rules"), run_dir)
    else:
        trainer = Trainer(cfg, run_dir)
    if args.resume:
        trainer.load()
        print(f"resumed from update {trainer.update_idx} ({trainer.env_steps:,} env steps)", flush=True)
    else:
        trainer.init_state()

    def run_eval(tag: str) -> list:
        results = trainer.evaluate()
        row = {"update": trainer.update_idx, "env_steps": trainer.env_steps}
        for s, r in enumerate(results):
            for k, v in r.flat_metrics().items():
                row[f"seed{s}/{k}"] = v
        for k in results[0].flat_metrics():
            row[k] = float(sum(r.flat_metrics()[k] for r in results) / len(results))
        (run_dir / f"eval_{tag}.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
        return results, row

    if args.eval_only is not None:  # before the Logger: the run's metrics and TensorBoard files stay as they are
        trainer.close()
        results, _ = run_eval(args.eval_only)
        table = _mean_table([r.to_dict() for r in results])
        (run_dir / f"eval_{args.eval_only}.md").write_text(
            f"# Evaluation '{args.eval_only}' ({cfg.method}, {cfg.num_seeds} seed(s), checkpoint at {trainer.env_steps:,} "
            f"env steps, {cfg.eval_episodes} episodes x {cfg.eval_horizon} steps per instruction, "
            f"epsilon {cfg.eval_epsilon})\n\n{table}\n")
        print(table + f"\nwrote {run_dir / f'eval_{args.eval_only}.json'}", flush=True)
        return 0

    logger = Logger(run_dir)
    print(f"setup {time.time() - t0:.1f}s; compiling the rollout, update and evaluation programs...", flush=True)

    stopped_early = False
    t_loop = time.time()
    try:
        while trainer.update_idx < cfg.num_updates:
            log = trainer.iteration()
            row = {"update": log.update, "env_steps": log.env_steps, "time": time.time() - t0, **log.metrics}
            last = log.update == cfg.num_updates
            if log.update % cfg.eval_every == 0 or last:
                _, erow = run_eval("final" if last else f"{log.update:06d}")
                row.update({k: v for k, v in erow.items() if k not in ("update", "env_steps")})
            logger.write(row)
            ev = f" | eval success {row['eval/original/mean_success_rate']:.3f}" if "eval/original/mean_success_rate" in row else ""
            rl = f" | relabel rows {row['relabel/rows']:.0f} grounded {row['relabel/grounded_frac']:.2f}" if "relabel/rows" in row else ""
            if "ellm/distinct_goals" in row:
                rl = (f" | goals {row['ellm/distinct_goals']:.0f} distinct, pinned {row['ellm/distinct_pinned']:.0f}, "
                      f"cache hits {row['ellm/cache_hit_rate']:.2f}")
            share = row.get("relabel/llm_share", row.get("ellm/llm_fraction"))
            if share is not None:  # the LLM's part of the relabels (ELLM: of the goals); falls while it is down
                rl += f" | LLM share {share:.0%}"
            if row.get("curriculum/unpayable_step_frac", 0.0) > 0:
                rl += f" | unpayable steps {row['curriculum/unpayable_step_frac']:.2f}"
            print(f"[{log.update:5d}/{cfg.num_updates}] steps {log.env_steps:>10,} | {row['sps']:8.0f} sps | "
                  f"eps {row['epsilon']:.2f} | loss {row['loss']:.4f} | train success {row['train/success_rate']:.3f}"
                  f"{rl}{ev}", flush=True)
            if log.update % cfg.checkpoint_every == 0 or last:
                trainer.save()
            if args.max_updates and trainer.update_idx >= args.max_updates and not last:
                stopped_early = True
                break
            if args.time_limit and time.time() - t0 > args.time_limit and not last:
                stopped_early = True
                break
    except KeyboardInterrupt:
        stopped_early = True
        print("interrupted: saving a checkpoint", flush=True)
    finally:
        if stopped_early:
            trainer.save()
        trainer.close()
        logger.close()

    rows = analysis.read_jsonl(run_dir / "metrics.jsonl")
    analysis.write_csv(rows, run_dir / "metrics.csv")
    analysis.plot_training(rows, run_dir / "training.png")
    if stopped_early:
        print(f"stopped at update {trainer.update_idx}/{cfg.num_updates}; continue with: "
              f"python examples/train_pqn.py --run-dir {run_dir} --resume", flush=True)
        return 0
    analysis.plot_learning_curves({cfg.method: [run_dir]}, run_dir / "learning_curves.png")
    final = json.loads((run_dir / "eval_final.json").read_text())
    analysis.plot_instruction_bars({cfg.method: final}, run_dir / "instruction_success.png")
    table = _mean_table(final)
    (run_dir / "eval_final.md").write_text(
        f"# Final evaluation ({cfg.method}, {cfg.num_seeds} seed(s), {trainer.env_steps:,} env steps, "
        f"{cfg.eval_episodes} episodes x {cfg.eval_horizon} steps per instruction)\n\n{table}\n")
    print("\nFinal evaluation (mean over seeds):\n" + table)
    print(f"\ndone in {time.time() - t0:.0f}s (training loop {time.time() - t_loop:.0f}s); outputs in {run_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
