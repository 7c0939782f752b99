"""The ``--eval-only`` trainer of a PQN run: its checkpoint's network and instruction table, evaluated."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from agents.pqn.trainer import ProcessSeeds


class PQNEvaluator(ProcessSeeds):
    """Every seed of a PQN run's checkpoint evaluated as the run's evaluations do, nothing of training built."""

    def __init__(self, cfg: Any, run_dir: str | os.PathLike) -> None:
        self._init_seeds(cfg)
        self._init_programs()
        self.run_dir = Path(run_dir)
        self.checkpoint: Path | None = None
        self.method = None
        self._params: Any = None
        self._registry: Any = None

    def load(self, path: str | os.PathLike) -> dict[str, Any]:
        """Read the checkpoint at ``path`` (or a run folder's newest); returns its host state. Raises
        ``CheckpointError`` (naming the file) for a damaged, foreign or mismatched one."""
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

    def evaluate(self, final: bool = False) -> list:
        """Every seed's :class:`~oir_gym.evaluation.EvalResult` on the run's own evaluation worlds."""
        from oir_gym.evaluation import eval_instructions

        if self._params is None:
            raise RuntimeError("PQNEvaluator.evaluate before load: load a checkpoint first")
        ecfg = self.eval_config(final)
        texts, achs, sets = eval_instructions(ecfg)
        rows = self._registry.rows(texts, achs)  # the checkpoint's rows; new texts (a user's file) get rows
        return self._evaluation_of(self._params, self._registry.device_table(), rows, ecfg, texts, achs, sets)()

    def close(self) -> None:
        """Nothing to stop."""
