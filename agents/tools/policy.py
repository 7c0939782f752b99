"""Trained policies as objects that act in the Gymnasium env, for any instruction text.

    import gymnasium as gym, oir_gym
    from agents.tools.policy import load_policy

    policy = load_policy("runs/paper_oir", seed=0)            # a PQN or an SB3 run directory
    env = gym.make("OIR-CraftaxClassic-v0", **policy.env_kwargs)
    obs, info = env.reset(seed=1, options={"instruction": "collect wood then place a table"})
    policy.reset()
    while True:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        if terminated or truncated:
            break

A policy keeps its recurrent state between calls; :meth:`Policy.reset` starts a new episode (with
a vector env, pass ``episode_start``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np

__all__ = ["Policy", "PQNPolicy", "load_policy", "is_sb3_run"]


@runtime_checkable
class Policy(Protocol):
    """What :func:`load_policy` returns, for PQN and SB3 runs alike."""

    #: ``gym.make("OIR-CraftaxClassic-v0", **env_kwargs)`` arguments that match the training env
    env_kwargs: dict[str, Any]

    def reset(self) -> None:
        """Start a new episode: the next :meth:`act` begins from a fresh recurrent state."""
        ...

    def act(self, obs: Mapping[str, np.ndarray], episode_start: Any = None) -> Any:
        """The action for ``obs`` (``int``, or ``int64 [num_envs]``); ``episode_start`` marks new episodes."""
        ...


def is_sb3_run(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` was written by the SB3 trainer."""
    from agents.run.run_dir import CONFIG, read_json

    run_dir = Path(run_dir)
    if (run_dir / CONFIG).is_file():
        cfg = read_json(run_dir / CONFIG)
        if isinstance(cfg, dict) and ("sb3" in cfg or "algo" in cfg):  # nested, or flat (older runs)
            return True
    return (run_dir / "model.zip").exists() and not (run_dir / "checkpoints").is_dir()


def load_policy(run_dir: str | os.PathLike, seed: int = 0, device: Any = None) -> Policy:
    """The greedy policy of seed ``seed`` of a PQN or SB3 run directory, on ``device`` (a JAX or torch device).
    Raises ``FileNotFoundError`` (no run or checkpoint), ``CheckpointError`` (a damaged, legacy or mismatched
    checkpoint) or ``ImportError`` (an SB3 run without stable-baselines3)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory")
    if is_sb3_run(run_dir):
        from agents.sb3.models import load_sb3_policy

        return load_sb3_policy(run_dir, seed=seed, device=device)
    return PQNPolicy.load(run_dir, seed=seed, device=device)


class PQNPolicy:
    """One seed of a PQN run's Q-network acting epsilon-greedily on env observations; built by :meth:`load`."""

    def __init__(self, net: Any, params: Any, env_kwargs: dict[str, Any], obs_dim: int, epsilon: float = 0.0,
                 rng_seed: int = 0, device: Any = None) -> None:
        import jax

        self.net, self.env_kwargs, self.obs_dim, self.epsilon = net, dict(env_kwargs), int(obs_dim), float(epsilon)
        self.device = device
        if isinstance(device, str):
            device = jax.devices(device)[0]
        self.params = jax.device_put(params, device) if device is not None else params
        self._rng = np.random.default_rng(rng_seed)
        self.reset()

        def step(params, carry, obs, instr, start):
            carry, q = net.apply(params, carry, obs[None], instr[None], start[None])
            return carry, q[0]

        self._step = jax.jit(step)  # runs where the parameters are

    @classmethod
    def load(cls, run_dir: str | os.PathLike, seed: int = 0, device: Any = None, epsilon: float = 0.0) -> "PQNPolicy":
        """Seed ``seed`` of the PQN run in ``run_dir``, from its newest checkpoint (verified; no pickle)."""
        import jax
        import jax.numpy as jnp

        from agents.pqn import network as pqn
        from agents.run.checkpoint import ARRAYS, latest_checkpoint, load_checkpoint, restore_tree
        from agents.pqn.config import load_config
        from agents.run.run_dir import RunDir
        from oir_gym.craftax_compat import NUM_ACTIONS
        from oir_gym.observation import obs_dim

        run_dir = Path(run_dir)
        cfg = load_config(RunDir(run_dir).read_config())
        if not 0 <= seed < cfg.run.num_seeds:
            raise ValueError(f"seed={seed}: the run in {run_dir} trained seeds 0..{cfg.run.num_seeds - 1}")
        arrays, host = load_checkpoint(run_dir)
        saved = load_config(host["config"]) if "config" in host else cfg
        net = pqn.make_network(saved.pqn, NUM_ACTIONS)
        d_obs = obs_dim(saved.env.obs_mode)
        emb_dim = int(np.asarray(arrays["registry"]["emb"]).shape[-1])
        shapes = jax.eval_shape(lambda ks: pqn.create_train_states(ks, saved.pqn, net, d_obs, emb_dim, 1).params,
                                jax.random.split(jax.random.PRNGKey(0), saved.run.num_seeds))
        template = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
        params = restore_tree(template, arrays["train_state"]["params"], latest_checkpoint(run_dir) / ARRAYS,
                              prefix="train_state/params")
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x[seed]), params)
        env_kwargs = {"obs_mode": saved.env.obs_mode, "delta": saved.env.delta}
        return cls(net, params, env_kwargs, d_obs, epsilon=epsilon, rng_seed=seed, device=device)

    def reset(self) -> None:
        self._carry = None
        self._start = True

    def act(self, obs: Mapping[str, np.ndarray], episode_start: Any = None) -> Any:
        import jax.numpy as jnp

        if not isinstance(obs, Mapping) or "obs" not in obs or "instruction" not in obs:
            raise TypeError("obs must be the env's observation dict with 'obs' and 'instruction' "
                            f"(got {type(obs).__name__})")
        single = np.ndim(obs["obs"]) == 1
        o, ins = (np.atleast_2d(np.asarray(obs[k], np.float32)) for k in ("obs", "instruction"))
        if o.shape[-1] != self.obs_dim:
            raise ValueError(f"observation of {o.shape[-1]} features; this policy was trained on "
                             f"{self.obs_dim} (make the env with {self.env_kwargs})")
        n = o.shape[0]
        if self._carry is None or self._carry[0].shape[0] != n:
            self._carry = self.net.initial_carry(n)
            self._start = True
        start = np.broadcast_to(np.asarray(False if episode_start is None else episode_start, bool), (n,)) | self._start
        self._start = False
        self._carry, q = self._step(self.params, self._carry, jnp.asarray(o), jnp.asarray(ins), jnp.asarray(start))
        action = np.asarray(q).argmax(-1).astype(np.int64)
        if self.epsilon > 0:
            rand = self._rng.random(n) < self.epsilon
            action = np.where(rand, self._rng.integers(0, q.shape[-1], n), action)
        return int(action[0]) if single else action
