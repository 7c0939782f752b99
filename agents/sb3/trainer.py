"""The SB3 trainer behind the run driver (:mod:`agents.run.train`): :class:`SB3Trainer` and its recipe :data:`SB3`.
``model.learn`` runs on a worker thread that waits at each update boundary while the driver evaluates, logs and
saves (the two threads never run together): the training is the one ``learn`` call would give in one go.
"""

from __future__ import annotations

import importlib.util
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import tyro

from agents.run.run_dir import RunDir, read_json
from agents.sb3.config import SB3_PRESETS, SB3TrainConfig, load_sb3_config
from agents.run.train import IterationLog, Recipe, RunOptions, RunTrainer

_STOP = "stop"


class SB3Trainer:
    """One SB3 run (one seed) with the driver's interface (:class:`agents.run.train.RunTrainer`) in ``run_dir``;
    ``eval_only``: no relabeler; ``fresh``: the model is built now, so a refused hyperparameter fails early."""

    def __init__(self, cfg: SB3TrainConfig, run_dir: str | Path, eval_only: bool = False, fresh: bool = False) -> None:
        from agents.run.llm import check_llm
        from agents.sb3.models import configure_torch_threads, make_env, make_relabeler

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.update_idx = self.env_steps = self.process_index = self.seed_offset = 0
        self.method = None  # the driver's diversity report: PQN's OIR method only
        self.eval_only = eval_only
        self.startup: dict[str, float] = {}
        self.model = self.relabel_cb = self.relabeler = None  # the model: built now with fresh, else by load/init_state
        self._thread: Optional[threading.Thread] = None
        self._to_main: queue.Queue = queue.Queue(maxsize=1)
        self._to_learner: queue.Queue = queue.Queue(maxsize=1)
        self._last = (time.time(), 0)
        configure_torch_threads(cfg.sb3.threads or None)
        t = time.time()
        self.venv = make_env(cfg.sb3.num_envs, cfg.run.seed, obs_mode=cfg.env.obs_mode, delta=cfg.env.delta,
                             max_episode_steps=cfg.env.max_episode_steps, reward=cfg.reward,
                             buffer_size=cfg.oir.instruction_buffer_size if cfg.relabeler != "none" else None,
                             tau_low=cfg.oir.tau_low, tau_high=cfg.oir.tau_high)
        self.startup["env"] = time.time() - t
        try:
            if cfg.relabeler != "none" and not eval_only:
                t = time.time()
                self.relabeler = make_relabeler(cfg.relabeler, cfg.oir, llm=cfg.llm, delta=cfg.env.delta,
                                                encoder=self.venv.encoder, seed=cfg.run.seed,
                                                eval_files=cfg.eval.instruction_files)
                check_llm(self.relabeler, cfg.relabeler == "llm", "--oir.relabeler")  # as PQN's: llm stops, both warns
                self.startup["relabeler"] = time.time() - t
            if fresh and not eval_only:
                t = time.time()
                self.model = self._new_model()  # a refused hyperparameter fails now
                self.startup["model"] = time.time() - t
        except BaseException:
            self.close()
            raise

    def _new_model(self) -> Any:
        from agents.sb3.models import make_model

        c = self.cfg
        return make_model(c.sb3.algo, self.venv, c.run.seed, c.sb3.hyperparams, device=c.sb3.device,
                          defaults=c.sb3.defaults)

    def init_state(self) -> None:
        """A fresh model (update 0): the one built with ``fresh``, else a new one."""
        if self.model is None or int(self.model.num_timesteps) > 0:
            self.model = self._new_model()
        self._attach()

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore the run's checkpoint in ``path`` (its verified ``model.zip`` and ``state.json``)."""
        from agents.sb3.models import INSTRUCTION_BUFFER_JSON, load_model, verified_model_zip

        c = self.cfg
        model_path, state = verified_model_zip(path, repair=True)
        self.model = load_model(c.sb3.algo, model_path, self.venv, device=c.resolved_device,
                                hyperparams=c.sb3.hyperparams, seed=c.run.seed, defaults=c.sb3.defaults)
        if "instruction_buffer" in state:
            self.venv.buffer.load_state_dict(state["instruction_buffer"])
        elif (Path(path) / INSTRUCTION_BUFFER_JSON).exists():  # checkpoints before format 1
            self.venv.buffer.load_state_dict(read_json(Path(path) / INSTRUCTION_BUFFER_JSON))
        self.update_idx = int(state.get("update", 0))
        self.env_steps = int(self.model.num_timesteps)
        self._attach()
        return state

    def _attach(self) -> None:
        from stable_baselines3.common.logger import Logger, configure

        from agents.sb3.models import make_relabel_callback

        if importlib.util.find_spec("tensorboard") is None or self.eval_only:  # an evaluation keeps tb/ as it is
            self.model.set_logger(Logger(folder=None, output_formats=[]))
        else:
            self.model.set_logger(configure(str(self.run_dir / "tb"), ["tensorboard"]))
        self._last = (time.time(), int(self.model.num_timesteps))
        if self.relabeler is not None:
            s = self.cfg.sb3
            kw = {} if s.asynchronous is None else {"asynchronous": s.asynchronous}
            self.relabel_cb = make_relabel_callback(self.relabeler, s.algo, segment_length=s.segment_length, verbose=1,
                                                    **kw)

    def iteration(self) -> IterationLog:
        """Let ``learn`` run to the next update boundary (or its end); that update's metrics row."""
        if self._thread is None:
            remaining = self.cfg.run.total_timesteps - int(self.model.num_timesteps)
            if remaining <= 0:  # resumed at the end: the last row, no training
                self.update_idx = self.cfg.num_updates
                return IterationLog(self.update_idx, self.env_steps, self._row({}, final=True))
            self._thread = threading.Thread(target=self._learn, args=(remaining,), name="sb3-learn", daemon=True)
            self._thread.start()
        else:
            self._to_learner.put("go")
        kind, payload = self._to_main.get()
        if kind == "error":
            self._thread = None
            raise payload
        final = kind == "done"
        if final:
            self._thread.join()
            self._thread = None
            self.update_idx = self.cfg.num_updates
        else:
            self.update_idx += 1
        self.env_steps = int(self.model.num_timesteps)
        return IterationLog(self.update_idx, self.env_steps, self._row(payload, final=final))

    def _learn(self, remaining: int) -> None:
        from stable_baselines3.common.callbacks import CallbackList

        from agents.sb3.models import configure_torch_threads

        try:
            configure_torch_threads(self.cfg.sb3.threads or None)  # this thread's own torch settings
            run_cb = _boundary_callback(self)
            cbs = [run_cb] if self.relabel_cb is None else [self.relabel_cb, run_cb]
            self.model.learn(remaining, callback=CallbackList(cbs), reset_num_timesteps=self.model.num_timesteps == 0,
                             progress_bar=False)
            self._to_main.put(("done", dict(run_cb.capture.values)))
        except BaseException as e:  # noqa: BLE001 - handed to the driver's thread, which raises it
            self._to_main.put(("error", e))

    def at_boundary(self, values: dict[str, float]) -> bool:
        """The learner thread at an update boundary: hand over the row's values and wait; False: stop learning."""
        self._to_main.put(("row", dict(values)))
        return self._to_learner.get() != _STOP

    def next_boundary(self, t: int) -> Optional[int]:
        """The env-step count of the next update boundary after ``t`` (None: only the end of learn)."""
        s = self.cfg.sb3.steps_per_update
        nxt = (t // s + 1) * s
        return nxt if nxt < self.cfg.run.total_timesteps else None

    def _row(self, sb3_values: dict[str, float], final: bool) -> dict[str, float]:
        model = self.model
        t = int(model.num_timesteps)
        now = time.time()
        row: dict[str, float] = {}
        if not final:  # the last row is written after learn(): not a training throughput
            row["sps"] = (t - self._last[1]) / max(now - self._last[0], 1e-9)
        self._last = (now, t)
        vals = {**sb3_values, **{k: float(v) for k, v in model.logger.name_to_value.items()
                                 if isinstance(v, (int, float, np.floating))}}
        if "train/loss" in vals:
            row["loss"] = vals["train/loss"]
        if hasattr(model, "exploration_rate"):
            row["epsilon"] = float(model.exploration_rate)
        row.update({k: vals[k] for k in ("train/entropy_loss", "train/value_loss", "train/approx_kl",
                                         "train/explained_variance") if k in vals})
        if len(model.ep_success_buffer):
            row["train/success_rate"] = float(np.mean(model.ep_success_buffer))
        if len(model.ep_info_buffer):
            row["train/ep_return_mean"] = float(np.mean([e["r"] for e in model.ep_info_buffer]))
            row["train/ep_length_mean"] = float(np.mean([e["l"] for e in model.ep_info_buffer]))
        if self.relabel_cb is not None:
            row.update({f"relabel/{k}": float(v) for k, v in self.relabel_cb.stats.items()
                        if isinstance(v, (int, float))})
            row.update(self.relabel_cb.metrics(reset=True))  # the schema PQN logs (docs/api.md)
        row["buffer/size"] = len(self.venv.buffer.contents())
        return row

    def log_row(self, row: dict[str, Any]) -> None:
        """The driver's metrics row through SB3's logger too (off-policy SB3 alone may never dump in a short run)."""
        logger = self.model.logger
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("update", "env_steps", "time"):
                logger.record(k, v)  # the metrics.jsonl names (one schema with PQN)
        logger.dump(step=int(row["env_steps"]))

    def evaluate(self, final: bool = False) -> list:
        """The greedy evaluation of the run's one seed (``final``: eval.final_sets and eval.final_episodes)."""
        from agents.sb3.models import evaluate

        return [evaluate(self.model, self.cfg.eval.eval_config(final), seed=self.cfg.run.seed + 12345,
                         env_kwargs={"obs_mode": self.cfg.env.obs_mode})]

    def save(self, *, metrics: Any = None) -> Path:
        """A checkpoint: model.zip, and state.json with the instruction buffer, metrics position and update."""
        from agents.sb3.models import save_checkpoint

        position = metrics.to_dict() if hasattr(metrics, "to_dict") else metrics
        save_checkpoint(self.run_dir, self.model, {"update": self.update_idx, "metrics": position,
                                                   "instruction_buffer": self.venv.buffer.state_dict()})
        return self.run_dir

    def close(self) -> None:
        """Stop the learner thread, the relabeler and the envs (the model stays for an evaluation)."""
        if self._thread is not None:
            self._to_learner.put(_STOP)
            self._to_main.get()  # its "done" (or error) after learn() returned
            self._thread.join()
            self._thread = None
        if self.relabeler is not None and hasattr(self.relabeler, "close"):
            self.relabeler.close()
            self.relabeler = None
        if self.venv is not None:
            self.venv.close()
            self.venv = None


def _boundary_callback(trainer: SB3Trainer):
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter

    class LastValues(KVWriter):
        """An SB3 logger output that remembers the last value of every numeric key."""

        def __init__(self) -> None:
            self.values: dict[str, float] = {}

        def write(self, key_values, key_excluded, step: int = 0) -> None:
            for k, v in key_values.items():
                if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                    self.values[k] = float(v)

        def close(self) -> None:
            pass

    class Boundaries(BaseCallback):
        """At every update boundary (before the end of learn), hand over to the driver and wait."""

        def __init__(self) -> None:
            super().__init__(0)
            self.capture = LastValues()
            self._next: Optional[int] = None

        def _on_training_start(self) -> None:
            if self.capture not in self.model.logger.output_formats:
                self.model.logger.output_formats.append(self.capture)
            self._next = trainer.next_boundary(self.num_timesteps)

        def _on_step(self) -> bool:
            if self._next is None or self.num_timesteps < self._next:
                return True
            self._next = trainer.next_boundary(self.num_timesteps)
            if trainer.update_idx + 1 >= trainer.cfg.num_updates:  # the end of learn() makes the last row
                return True
            return trainer.at_boundary(self.capture.values)

    return Boundaries()


@dataclass
class SB3Options(RunOptions):
    """Train a Stable-Baselines3 agent on Craftax-Classic with OIR relabeling or a baseline."""

    config: Annotated[SB3TrainConfig, tyro.conf.arg(name="")] = field(default_factory=SB3TrainConfig)


class SB3Recipe(Recipe):
    """The SB3 trainer, its :class:`~agents.sb3.config.SB3TrainConfig` and its checkpoint (model.zip + state.json)."""

    name = "SB3"
    script = "examples/train_sb3.py"
    tensorboard = False  # SB3's own logger writes tb/ (its train/ and rollout/ scalars and every row)
    compiles = False

    def parse(self, argv: list[str], description: str | None = None) -> Any:
        """As the PQN trainer's; an old flag spelling is a usage error naming the new flag."""
        import functools
        import sys

        from agents.run.config import cli
        from agents.run.resume import parse_with_base
        from agents.sb3.config import old_flag_error

        old = old_flag_error(argv)
        if old:
            print(f"error: {old}", file=sys.stderr)
            raise SystemExit(2)

        parse = functools.partial(cli, default_preset="cpu", presets=SB3_PRESETS, config_type=SB3TrainConfig)
        opts = parse_with_base(argv, description, SB3Options, parse, load_sb3_config)
        opts.config = opts.config.with_hp()
        return opts

    def default_run_dir(self, cfg: Any) -> str:
        return f"runs/sb3_{cfg.sb3.algo}_{cfg.relabeler}_{time.strftime('%Y%m%d-%H%M%S')}"

    def checkpoints(self, own_dir: Path) -> dict[int, Path]:
        from agents.sb3.models import MODEL_ZIP, UntrustedModelError, read_checkpoint_state, verified_model_zip

        state = read_checkpoint_state(own_dir)
        if state is None and not (own_dir / MODEL_ZIP).exists():
            return {}
        try:  # a model.zip without the checksum the run recorded is refused before anything is built
            _, state = verified_model_zip(own_dir, repair=True)
        except UntrustedModelError as e:
            raise ValueError(str(e)) from None
        return {int(state.get("update", 0)): own_dir}

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """The checkpoint's state.json, its zip checked (before anything is written; nothing unpickled)."""
        from agents.sb3.models import check_model_zip, verified_model_zip

        zip_path, state = verified_model_zip(path, repair=True)
        check_model_zip(zip_path)
        return state

    def build(self, cfg: Any, own_dir: Path, eval_only: bool, fresh: bool = False) -> RunTrainer:
        return SB3Trainer(cfg, own_dir, eval_only=eval_only, fresh=fresh)

    def write_config(self, run: RunDir, cfg: Any) -> None:
        from agents.sb3.models import resolve_hyperparams

        run.write_config({**cfg.to_dict(), "resolved_hyperparams": resolve_hyperparams(
            cfg.sb3.algo, cfg.sb3.num_envs, cfg.sb3.hyperparams, cfg.sb3.defaults)})

    def header(self, cfg: Any, trainer: RunTrainer, procs: int, run: RunDir) -> str:
        device = cfg.resolved_device
        return (f"oir-gym SB3 | algo={cfg.sb3.algo} ({cfg.sb3.defaults} hyperparameters) method={cfg.run.method} "
                f"relabeler={cfg.relabeler} | "
                f"{cfg.sb3.num_envs} envs | {cfg.num_updates} updates of {cfg.sb3.steps_per_update:,} env steps | "
                f"{cfg.run.total_timesteps:,} env steps | device {device} | run dir {run.path}")

    def summary_line(self, row: dict[str, Any], num_updates: int) -> str:
        parts = [f"[{row['update']:5d}/{num_updates}] steps {row['env_steps']:>9,}"]
        shown = (("sps", "{:6.0f} sps"), ("epsilon", "eps {:.2f}"), ("loss", "loss {:.4f}"),
                 ("train/success_rate", "train success {:.3f}"))
        parts += [fmt.format(row[k]) for k, fmt in shown if k in row]
        if "relabel/rows" in row:
            parts.append(f"relabel rows {row['relabel/rows']:.0f} grounded "
                         f"{row.get('relabel/grounded_frac', 0.0):.2f}")
        if "eval/original/mean_success_rate" in row:
            parts.append(f"eval success {row['eval/original/mean_success_rate']:.3f}")
        return " | ".join(parts)

    def on_row(self, trainer: RunTrainer, row: dict[str, Any]) -> None:
        trainer.log_row(row)  # type: ignore[attr-defined]

    def label(self, cfg: Any) -> str:
        return cfg.sb3.algo

    def eval_title(self, cfg: Any, trainer: RunTrainer, tag: str | None) -> str:
        what = "Final evaluation" if tag is None else f"Evaluation '{tag}'"
        return (f"# {what} ({cfg.sb3.algo}, method {cfg.run.method}, relabeler {cfg.relabeler}, "
                f"{trainer.env_steps:,} env steps, {cfg.eval.final_episodes} episode(s) x {cfg.eval.horizon} steps "
                "per instruction)")

    def completion_info(self, trainer: RunTrainer) -> dict[str, Any]:
        from agents.sb3.models import read_checkpoint_state

        return {"model_sha256": (read_checkpoint_state(trainer.run_dir) or {}).get("model_sha256")}  # type: ignore[attr-defined]


#: The SB3 trainer's recipe (``examples/train_sb3.py``).
SB3 = SB3Recipe()


def sb3_main(argv: list[str] | None = None, started: float | None = None) -> int:
    """``examples/train_sb3.py``'s command line ``argv``: :func:`agents.run.train.main` with :data:`SB3`."""
    from agents.run.train import main

    return main(SB3, argv, started)
