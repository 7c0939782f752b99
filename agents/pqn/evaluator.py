"""The ``--eval-only`` trainer of a PQN run: its checkpoint's network and instruction table, evaluated
(no relabeler, goal proposer, LLM or update)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np


class PQNEvaluator:
    """Every seed of a PQN run's checkpoint evaluated as the run's own evaluations do, with nothing of
    training built (what ``--eval-only`` runs; the driver's :class:`agents.run.train.RunTrainer`
    interface). ``cfg``: the run's :class:`~agents.pqn.config.TrainConfig`; ``run_dir``: this process's run folder.
    """

    def __init__(self, cfg: Any, run_dir: str | os.PathLike) -> None:
        import jax

        from agents.run.multihost import seed_slice
        from agents.pqn.trainer import trainer_programs
        from agents.pqn.sharding import Layout, check_layout
        from oir_gym import get_encoder

        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.processes, self.process_index = jax.process_count(), jax.process_index()
        self.seeds = seed_slice(cfg.run.num_seeds, self.processes, self.process_index)
        self.S, self.seed_offset = self.seeds.stop - self.seeds.start, self.seeds.start
        local = len(jax.local_devices())
        num_devices = cfg.run.num_devices or local
        check_layout(self.S, cfg.pqn.num_envs, num_devices, visible=local)
        self.layout = Layout(self.S, cfg.pqn.num_envs, num_devices)
        self.startup: dict[str, float] = {}
        t = time.time()
        self.encoder = get_encoder()
        self.startup["encoder"] = time.time() - t
        self.programs = trainer_programs(cfg, self.layout, self.encoder.dim)
        self.update_idx = 0
        self.env_steps = 0
        self.checkpoint: Path | None = None
        self.method = None
        self._params: Any = None
        self._registry: Any = None

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Read the checkpoint at ``path`` (a checkpoint folder, or a run folder's newest); returns its host state.

        Raises:
            agents.run.checkpoint.CheckpointError: a damaged, foreign or mismatched checkpoint (naming the file).
        """
        import jax
        import jax.numpy as jnp

        from agents.run.checkpoint import ARRAYS, MANIFEST, CheckpointError, latest_checkpoint, load_checkpoint, \
            restore_tree
        from oir_gym.instruction_registry import InstructionRegistry

        arrays, host = load_checkpoint(path)
        folder = Path(path) if (Path(path) / MANIFEST).exists() else latest_checkpoint(path)
        try:
            keys = jax.ShapeDtypeStruct((self.S, 2), jnp.uint32)
            shapes = jax.eval_shape(self.programs.init_train_states, keys).params
            template = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), shapes)
            params = restore_tree(template, arrays["train_state"]["params"], folder / ARRAYS,
                                  prefix="train_state/params")
            registry = InstructionRegistry(self.encoder, capacity=int(host["registry"]["capacity"]))
            registry.load_state_dict({**host["registry"], **arrays["registry"]})
            self.update_idx, self.env_steps = int(host["update"]), int(host["env_steps"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(folder / "host.json", f"does not hold what an evaluation needs "
                                                        f"({type(e).__name__}: {e})") from None
        lay = self.layout
        self._params = lay.place(jax.tree_util.tree_map(jnp.asarray, params),
                                 jax.tree_util.tree_map(lambda _: lay.seed_spec, params))
        self._registry = registry
        self.checkpoint = folder
        return host

    def eval_config(self, final: bool = False) -> Any:
        """The :class:`~oir_gym.evaluation.EvalConfig` of an evaluation (``final``: the final one)."""
        from oir_gym.evaluation import eval_config

        ev = self.cfg.eval
        return eval_config(ev.instruction_files, sets=(*ev.sets, *(ev.final_sets if final else ())),
                           episodes=ev.final_episodes if final else ev.episodes, horizon=ev.horizon,
                           control=ev.control)

    def evaluate(self, final: bool = False) -> list:
        """Every seed's :class:`~oir_gym.evaluation.EvalResult` on the run's own evaluation worlds."""
        from agents.pqn.trainer import method_spec
        from oir_gym import functional as F
        from oir_gym.evaluation import eval_instructions, eval_keys, evaluate_jax_seeds

        if self._params is None:
            raise RuntimeError("PQNEvaluator.evaluate before load: load a checkpoint first")
        cfg = self.cfg
        ecfg = self.eval_config(final)
        texts, achs, sets = eval_instructions(ecfg)
        rows = self._registry.rows(texts, achs)  # the checkpoint's rows; new texts (a user's file) get rows
        params = F.EnvParams(table=self._registry.device_table(), delta=cfg.env.delta,
                             max_steps=cfg.env.max_episode_steps, reward_mode=method_spec(cfg.run.method).reward_mode)
        keys = eval_keys(cfg.run.seed, self.seeds.stop, self.update_idx)[self.seeds]
        evaluator = self.programs.evaluator(len(texts) * ecfg.episodes)
        return evaluate_jax_seeds(evaluator, keys, self._params, params, rows, ecfg, texts, achs, sets)

    def close(self) -> None:
        """Nothing to stop."""
