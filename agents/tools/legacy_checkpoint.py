"""Convert a trusted legacy ``checkpoint.pkl`` of a PQN run into a checkpoint folder.

    python -m agents.tools.legacy_checkpoint RUN_DIR

:mod:`agents.run.checkpoint` refuses pickles, because unpickling runs any code the file names;
this converter unpickles one, so use it only on files you trust.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from agents.run.checkpoint import LEGACY_PICKLE, CheckpointError


def convert_legacy(run_dir: str | os.PathLike, keep: int = 2) -> Path:
    """Convert a TRUSTED legacy ``checkpoint.pkl`` (it is unpickled) into a checkpoint folder, through
    the run's :class:`~agents.pqn.trainer.Trainer` (no LLM); the pickle is left in place."""
    import pickle

    import jax.numpy as jnp
    import numpy as np

    from agents.pqn.config import load_config
    from agents.pqn.trainer import Runner, Trainer
    from agents.run.run_dir import RunDir
    from oir_gym import functional as F

    run_dir = Path(run_dir)
    path = run_dir / LEGACY_PICKLE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    cfg = load_config(RunDir(run_dir).read_config())
    cfg = cfg.replace(**{"oir.relabeler": "rules", "ellm.proposer": "rules"})  # no LLM needed to convert
    with open(path, "rb") as f:
        state = pickle.load(f)  # noqa: S301  (explicit, documented: trusted files only)
    tr = Trainer(cfg.validate(), run_dir, log=lambda s: None)
    try:
        tr.init_state()
        params, opt_state, step = state["train_state"]
        tr.train_state = tr.train_state.replace(params=params, opt_state=opt_state, step=step)
        runner = state["runner"]
        env = runner[0].env
        if "also_pays" not in vars(env):  # pickles written before EnvState.also_pays existed
            env = F.EnvState(**vars(env), also_pays=np.full((env.instr.shape[0], tr.num_also_pays), -1, np.int32))
            runner = (runner[0].replace(env=env),) + tuple(runner[1:])
        import jax

        tr.runner = Runner(*jax.tree_util.tree_map(jnp.asarray, tuple(runner)))
        tr.key = jnp.asarray(state["key"])
        for b, sd in zip(tr.buffers, state["buffers"]):
            b.load_state_dict(sd)
        reg = state["registry"]
        tr.registry.load_state_dict({"texts": list(reg["texts"]), "emb": reg["emb"], "event_sim": reg["event_sim"],
                                     "achievement": reg["achievement"], "rows": dict(reg["rows"])})
        tr.method.load_state_dict(state.get("generated") or {})
        tr.update_idx, tr.env_steps = int(state["update"]), int(state["env_steps"])
        metrics_rows = [r for r in RunDir(run_dir).read_metrics() if r["update"] <= tr.update_idx]
        return tr.save(keep=keep, metrics_after_update=tr.update_idx if metrics_rows else None)
    finally:
        tr.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agents.tools.legacy_checkpoint", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="the run directory holding checkpoint.pkl (a TRUSTED file: it is unpickled)")
    args = p.parse_args(argv)
    try:
        out = convert_legacy(args.run_dir)
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"converted {Path(args.run_dir) / LEGACY_PICKLE} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
