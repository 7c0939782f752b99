"""The evaluation protocol of the paper (Sec. 5), shared by the PQN and SB3 agents.

Every instruction of the chosen sets (``original``, ``simple``, ``complex``; see
:mod:`oir_gym.instructions`) is given to ``episodes`` envs; the policy acts greedily for a
fixed ``horizon`` (the env's cosine termination is off, so reward shaping cannot end an
episode early); an episode succeeds when the instruction's ground-truth Craftax achievement
happens before the horizon or the player's death. Metrics per set: per-instruction success
rate, mean success rate, number of completed instructions, aggregate score.

Two drivers: :func:`evaluate_jax` runs everything in one jitted ``lax.scan`` (PQN), and
:func:`evaluate_policy` steps an :class:`~oir_gym.vector_env.InstructionCraftax` from Python for
any policy object (SB3 agents).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from oir_gym import functional as F
from oir_gym.instructions import SET_NAMES, get_instruction_set
from oir_gym.metrics import summarize


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings.

    Attributes:
        sets: instruction sets to evaluate.
        episodes: episodes per instruction.
        horizon: steps per episode (the paper does not state one; we document ours).
    """

    sets: tuple[str, ...] = SET_NAMES
    episodes: int = 2
    horizon: int = 300

    def __post_init__(self) -> None:
        for s in self.sets:
            if s not in SET_NAMES:
                raise ValueError(f"unknown instruction set {s!r}; expected some of {SET_NAMES}")
        if self.episodes < 1 or self.horizon < 1:
            raise ValueError(f"episodes ({self.episodes}) and horizon ({self.horizon}) must be >= 1")


@dataclass
class EvalResult:
    """Per-set results. ``rates[set]`` is a ``[n_instructions]`` array aligned with ``texts[set]``."""

    texts: dict[str, list[str]] = field(default_factory=dict)
    achievements: dict[str, list[int]] = field(default_factory=dict)
    rates: dict[str, np.ndarray] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        return {s: summarize(r) for s, r in self.rates.items()}

    def flat_metrics(self) -> dict[str, float]:
        """``{"eval/original/mean_success_rate": ..., ...}`` for logging."""
        out = {}
        for s, m in self.summary().items():
            for k, v in m.items():
                out[f"eval/{s}/{k}"] = float(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {s: {"texts": self.texts[s], "achievements": self.achievements[s],
                    "rates": [float(x) for x in self.rates[s]], **self.summary()[s]} for s in self.rates}

    def to_markdown(self) -> str:
        """Summary table plus the per-instruction table of the original set."""
        lines = ["| set | mean success rate | completed instructions | aggregate score |", "|---|---|---|---|"]
        for s, m in self.summary().items():
            lines.append(f"| {s} | {m['mean_success_rate']:.3f} | {m['num_completed']} / {len(self.rates[s])} | {m['aggregate_score']:.3f} |")
        if "original" in self.rates:
            lines += ["", "| instruction | success rate |", "|---|---|"]
            lines += [f"| {t} | {r:.2f} |" for t, r in zip(self.texts["original"], self.rates["original"])]
        return "\n".join(lines)


def eval_instructions(cfg: EvalConfig) -> tuple[list[str], list[int], list[str]]:
    """Texts, achievement indices and set names of all evaluated instructions, in order."""
    texts, achs, sets = [], [], []
    for s in cfg.sets:
        for ins in get_instruction_set(s):
            texts.append(ins.text)
            achs.append(ins.achievement_index)
            sets.append(s)
    return texts, achs, sets


def eval_result(cfg: EvalConfig, texts, achs, sets, success: np.ndarray) -> EvalResult:
    """Per-set rates from ``success``: ``[n_instructions * episodes]`` bool, instruction-major."""
    per = success.reshape(len(texts), cfg.episodes).mean(axis=1)
    res = EvalResult()
    for s in cfg.sets:
        idx = [i for i, x in enumerate(sets) if x == s]
        res.texts[s] = [texts[i] for i in idx]
        res.achievements[s] = [achs[i] for i in idx]
        res.rates[s] = per[idx]
    return res


def eval_params(params: F.EnvParams, rows: np.ndarray, achievements: Sequence[int]) -> F.EnvParams:
    """Evaluation copy of env params: no termination on success, rows mapped to achievements."""
    table = params.table
    ach = jnp.asarray(table.achievement).at[jnp.asarray(rows)].set(jnp.asarray(achievements, jnp.int32))
    return params.replace(table=table.replace(achievement=ach), terminate_on_success=False)


def make_jax_evaluator(policy_step: Callable, init_carry: Callable, num_envs: int, horizon: int,
                       obs_mode: str = "paper", pool_size: int | None = None):
    """Build a jitted ``evaluate(key, policy_params, env_params, pinned_rows) -> success [num_envs]``.

    Args:
        policy_step: ``(policy_params, carry, obs, done, key) -> (carry, actions)``, batched,
            greedy (the caller decides how greedy).
        init_carry: ``(num_envs) -> carry``.
    """

    def evaluate(key, policy_params, env_params, pinned):
        k_reset, k_run = jax.random.split(key)
        obs, bstate = F.batch_reset(k_reset, env_params, num_envs, pool_size or num_envs, pinned, obs_mode)
        ach = env_params.table.achievement[pinned]

        def body(c, k):
            obs, bstate, carry, alive, success, done_prev = c
            k_pol, k_env = jax.random.split(k)
            carry, actions = policy_step(policy_params, carry, obs, done_prev, k_pol)
            obs, bstate, _, term, trunc, info, _ = F.batch_step(
                k_env, bstate, actions, env_params, obs_mode=obs_mode, autoreset=False
            )
            hit = jnp.take_along_axis(info.achievements, jnp.maximum(ach, 0)[:, None], axis=1)[:, 0]
            success = success | (hit & alive & (ach >= 0))
            alive = alive & ~term
            return (obs, bstate, carry, alive, success, jnp.zeros_like(term)), None

        init = (obs, bstate, init_carry(num_envs), jnp.ones(num_envs, bool), jnp.zeros(num_envs, bool),
                jnp.ones(num_envs, bool))
        final, _ = jax.lax.scan(body, init, jax.random.split(k_run, horizon))
        return final[4]

    return jax.jit(evaluate)


def _jax_success(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray, cfg: EvalConfig,
                 achs) -> np.ndarray:
    pinned = jnp.repeat(jnp.asarray(rows, jnp.int32), cfg.episodes)
    return np.asarray(evaluator(key, policy_params, eval_params(env_params, rows, achs), pinned))


def evaluate_jax(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                 cfg: EvalConfig, texts, achs, sets) -> EvalResult:
    """Run a :func:`make_jax_evaluator` evaluator on the instructions (``rows`` in the table)."""
    success = _jax_success(evaluator, key, policy_params, env_params, rows, cfg, achs)
    return eval_result(cfg, texts, achs, sets, success)


def evaluate_jax_seeds(evaluator, keys, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                       cfg: EvalConfig, texts, achs, sets) -> list[EvalResult]:
    """Like :func:`evaluate_jax` for several policies in one program, one result per policy.

    ``evaluator`` is a :func:`make_jax_evaluator` evaluator vmapped over its key and policy
    parameters (``jax.jit(jax.vmap(ev, in_axes=(0, 0, None, None)))``, built once and kept:
    the evaluation is a long sequential scan, so policies side by side cost about what one
    does); ``keys`` and the leaves of ``policy_params`` have a leading policy axis.
    """
    success = _jax_success(evaluator, keys, policy_params, env_params, rows, cfg, achs)
    return [eval_result(cfg, texts, achs, sets, s) for s in success]


def evaluate_policy(policy: Callable, cfg: EvalConfig = EvalConfig(), seed: int = 0,
                    env_kwargs: dict | None = None) -> EvalResult:
    """Evaluate any Python policy on a fresh :class:`InstructionCraftax`.

    Args:
        policy: ``policy(obs: dict[str, np.ndarray], state, episode_start: np.ndarray) ->
            (actions, state)``; ``state`` is whatever the policy keeps (e.g. LSTM states),
            ``None`` at the start.
        env_kwargs: extra keyword arguments of the env (``obs_mode``, ``encoder``...).
    """
    from oir_gym.vector_env import InstructionCraftax

    texts, achs, sets = eval_instructions(cfg)
    n = len(texts) * cfg.episodes
    env = InstructionCraftax(num_envs=n, terminate_on_success=False, max_episode_steps=cfg.horizon + 1,
                             seed=seed, **(env_kwargs or {}))
    env.register_instructions(texts, achs)
    env_texts = [t for t in texts for _ in range(cfg.episodes)]
    obs, _ = env.reset(seed=seed, options={"instruction": env_texts})
    rows = env.register_instructions(texts, achs)
    target = np.repeat(np.asarray(achs), cfg.episodes)
    alive = np.ones(n, bool)
    success = np.zeros(n, bool)
    state, start = None, np.ones(n, bool)
    del rows
    for _ in range(cfg.horizon):
        actions, state = policy(obs, state, start)
        obs, _, term, trunc, info = env.step(np.asarray(actions))
        hit = info["achievements"][np.arange(n), target]
        success |= hit & alive
        alive &= ~(term | trunc)
        start = np.zeros(n, bool)
        if not alive.any():
            break
    env.close()
    return eval_result(cfg, texts, achs, sets, success)
