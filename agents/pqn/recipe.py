"""The PQN trainer's :class:`~agents.run.train.Recipe`, :data:`PQN` (``examples/train_pqn.py``): its command line,
checkpoints, header and progress lines, and the diversity report of an ``oir`` run."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import tyro

from agents.pqn.config import TrainConfig
from agents.run.run_dir import RunDir, atomic_write_json
from agents.run.resume import parse_with_base
from agents.run.train import Recipe, RunOptions, RunTrainer, main


@dataclass
class PQNOptions(RunOptions):
    """Train PQN with OIR or a baseline on Craftax-Classic."""

    config: Annotated[TrainConfig, tyro.conf.arg(name="")] = field(default_factory=TrainConfig)


class PQNRecipe(Recipe):
    """The PQN trainer (:class:`agents.pqn.trainer.Trainer`), its config and checkpoints."""

    name = "PQN"
    script = "examples/train_pqn.py"
    multi_process = True

    def parse(self, argv: list[str], description: str | None = None) -> Any:
        """``--resume`` / ``--eval-only`` start from the run's saved config, else from the preset named first."""
        from agents.pqn.config import cli, load_config

        return parse_with_base(argv, description, PQNOptions, cli, load_config)

    def default_run_dir(self, cfg: Any) -> str:
        return f"runs/{cfg.run.method}_{time.strftime('%Y%m%d-%H%M%S')}"

    def checkpoint_place(self, own_dir: Path) -> Path:
        return own_dir / "checkpoints"

    def checkpoints(self, own_dir: Path) -> dict[int, Path]:
        from agents.run.checkpoint import list_checkpoints

        return {int(p.name): p for p in list_checkpoints(own_dir)}

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        from agents.run.checkpoint import load_checkpoint

        return load_checkpoint(path)[1]

    def no_checkpoint(self, own_dir: Path) -> None:
        from agents.run.checkpoint import refuse_legacy

        refuse_legacy(own_dir)

    def drop_newer(self, own_dir: Path, update: int) -> None:
        """Remove this process's checkpoints after ``update`` and say so, and what is skipped."""
        from agents.run.checkpoint import incomplete_checkpoints, remove_checkpoints_after

        for p in remove_checkpoints_after(own_dir, update):
            print(f"removed {p}: not every process of the run reached it; updates after {update} run again",
                  flush=True)
        for p in incomplete_checkpoints(own_dir):
            if int(p.name) > update:
                print(f"skipped {p}: it has no manifest.json (a copy that stopped part way); resuming from update "
                      f"{update}", flush=True)

    def build(self, cfg: Any, own_dir: Path, eval_only: bool, fresh: bool = False) -> RunTrainer:
        if eval_only:  # the checkpoint's network and table alone: no relabeler, proposer, LLM or update
            from agents.pqn.evaluator import PQNEvaluator

            return PQNEvaluator(cfg, own_dir)
        from agents.pqn.trainer import Trainer

        return Trainer(cfg, own_dir, prefetch_worlds=fresh)

    def header(self, cfg: Any, trainer: RunTrainer, procs: int, run: RunDir) -> str:
        import jax

        offline = {"rules": " (the offline LLM beside the rules: --oir.relabeler both)"}.get(cfg.oir.relabeler, "")
        source = {"oir": f" relabeler={cfg.oir.relabeler}{offline}", "ellm": f" proposer={cfg.ellm.proposer}"}.get(
            cfg.run.method, "")
        return (f"oir-gym PQN | method={cfg.run.method}{source} | {cfg.run.num_seeds} seed(s) x {cfg.pqn.num_envs} "
                f"envs x {cfg.pqn.num_steps} steps | {cfg.num_updates} updates | {cfg.run.total_timesteps:,} env "
                f"steps | device {jax.devices()[0].platform}{f' | {procs} processes' if procs > 1 else ''} | "
                f"run dir {run.path}")

    def summary_line(self, row: dict[str, Any], num_updates: int) -> str:
        return summary_line(row, num_updates)

    def label(self, cfg: Any) -> str:
        return cfg.run.method

    def eval_title(self, cfg: Any, trainer: RunTrainer, tag: str | None) -> str:
        if tag is None:
            return (f"# Final evaluation ({cfg.run.method}, {cfg.run.num_seeds} seed(s), {trainer.env_steps:,} env "
                    f"steps, {cfg.eval.final_episodes} episodes x {cfg.eval.horizon} steps per instruction)")
        return (f"# Evaluation '{tag}' ({cfg.run.method}, {cfg.run.num_seeds} seed(s), checkpoint at "
                f"{trainer.env_steps:,} env steps, {cfg.eval.final_episodes} episodes x {cfg.eval.horizon} steps per "
                f"instruction, epsilon {cfg.eval.epsilon})")

    def compile_ahead(self, trainer: RunTrainer) -> bool:
        # a CPU has no spare cores for the throwaway calls of compiling ahead
        import jax

        return jax.default_backend() != "cpu"

    def final_extras(self, trainer: RunTrainer) -> dict[str, float]:
        method = getattr(trainer, "method", None)
        return method.diversity() if hasattr(method, "diversity") else {}  # oir: the diversity of all buffer offers

    def write_diversity(self, trainer: RunTrainer, folder: Path, cfg: Any) -> None:
        """oir: :func:`write_diversity_report`."""
        method = getattr(trainer, "method", None)
        if hasattr(method, "diversity"):
            write_diversity_report(method, trainer.update_idx, folder, cfg.oir.grounding, cfg.oir.relabeler)


def write_diversity_report(method: Any, update: int, folder: Path, grounding: str, relabeler: str) -> None:
    """Write ``diversity.json`` of an OIR method (:meth:`diversity`, :meth:`llm_report`) and print it in brief."""
    llm = method.llm_report()
    d = {"grounding": grounding, "relabeler": relabeler, "update": update,
         **method.diversity(), **({"llm": llm} if llm else {})}
    atomic_write_json(folder / "diversity.json", d)
    print(f"relabeled instructions ({grounding} grounding): novelty share "
          f"{d['diversity/novelty_share']:.3f} of {int(d['diversity/instructions'])} distinct; LLM share of "
          f"buffer offers {d['relabel/llm_offer_share_total']:.3f} of {int(d['relabel/offers_total'])}; "
          f"{d['diversity/wordings_per_event']:.2f} distinct wordings per event "
          f"({int(d['diversity/events_named'])} events); wrote {folder / 'diversity.json'}")
    if "diversity/llm_echo_share" in d:
        print(f"LLM instructions: {int(d['diversity/llm_instructions'])} distinct, "
              f"{d['diversity/llm_echo_share']:.3f} of them copies of the prompt's example answers")
    if llm:
        rows, buf = int(llm.get("rows_in_batch", 0)), int(llm.get("into_buffer", 0))
        print(f"LLM instructions reached {rows} training batch rows and {buf} buffer entries"
              if rows or buf else "the LLM contributed nothing: none of its instructions reached a training batch "
              "or a buffer (rule instructions or nothing trained the agent)")
    if llm.get("errors_by_type"):
        kinds = sorted(llm["errors_by_type"].items(), key=lambda kv: -kv[1])
        print(f"LLM errors by type (calls): {', '.join(f'{k} {n}' for k, n in kinds)}; "
              f"e.g. {llm['error_examples'].get(kinds[0][0], '')}")


def summary_line(row: dict[str, Any], num_updates: int) -> str:
    """The one-line progress summary of a PQN metrics row."""
    ev = f" | eval success {row['eval/original/mean_success_rate']:.3f}" if "eval/original/mean_success_rate" in row else ""
    rl = f" | relabel rows {row['relabel/rows']:.0f} grounded {row['relabel/grounded_frac']:.2f}" if "relabel/rows" in row else ""
    if "ellm/distinct_goals" in row:
        rl = (f" | goals {row['ellm/distinct_goals']:.0f} distinct, pinned {row['ellm/distinct_pinned']:.0f}, "
              f"cache hits {row['ellm/cache_hit_rate']:.2f}")
    if "relabel/llm_share" in row:
        # the LLM's answers in time of all that arrived, then what its instructions reached (run totals)
        rows, buf = row.get("relabel/llm_rows_total", 0.0), row.get("relabel/llm_buffered_total", 0.0)
        in_time, stale = row.get("relabel/llm_in_time_total", 0.0), row.get("relabel/llm_stale", 0.0)
        reached = (f"its instructions in {rows:.0f} batch rows, {buf:.0f} buffer entries" if rows or buf
                   else "none of its instructions reached a batch or a buffer yet")
        rl += (f" | LLM answers {in_time:.0f}/{in_time + stale:.0f} in time, offers "
               f"{row.get('relabel/llm_offer_share', 0.0):.0%}; {reached}")
    elif "ellm/llm_fraction" in row:
        rl += f" | LLM goals {row['ellm/llm_fraction']:.0%}"
    if row.get("curriculum/unpayable_step_frac", 0.0) > 0:
        rl += f" | unpayable steps {row['curriculum/unpayable_step_frac']:.2f}"
    return (f"[{row['update']:5d}/{num_updates}] steps {row['env_steps']:>10,} | {row['sps']:8.0f} sps | "
            f"eps {row['epsilon']:.2f} | loss {row['loss']:.4f} | train success {row['train/success_rate']:.3f}"
            f"{rl}{ev}")


#: The PQN trainer's recipe (``examples/train_pqn.py``).
PQN = PQNRecipe()


def pqn_main(argv: list[str] | None = None, started: float | None = None) -> int:
    """``examples/train_pqn.py``'s command line ``argv``: :func:`main` with :data:`PQN`."""
    return main(PQN, argv, started)

