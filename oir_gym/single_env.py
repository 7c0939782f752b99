"""``InstructionCraftaxEnv``: a single (non-vector) Gymnasium env for checks and single-env tools.

It wraps a one-env :class:`~oir_gym.vector_env.InstructionCraftax` without auto-reset, so it
behaves like any ``gym.Env`` (and passes ``gymnasium.utils.env_checker.check_env``). For speed,
use the vector env.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from oir_gym.vector_env import InstructionCraftax


class InstructionCraftaxEnv(gym.Env):
    """Single-env face of :class:`InstructionCraftax`; takes the same keyword arguments."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        kwargs.pop("num_envs", None)
        kwargs.setdefault("autoreset_mode", "next_step")
        self._venv = InstructionCraftax(num_envs=1, render_mode=render_mode, **kwargs)
        self.render_mode = render_mode
        self.observation_space = self._venv.single_observation_space
        self.action_space = self._venv.single_action_space
        self._done = True

    @property
    def unwrapped_vector(self) -> InstructionCraftax:
        return self._venv

    @property
    def buffer(self):
        return self._venv.buffer

    def set_instruction(self, instruction: str | None) -> None:
        """Pin (or with ``None`` unpin) the instruction used from the next reset on."""
        self._venv.set_instructions(instruction if instruction is None else [instruction])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = dict(options or {})
        if isinstance(options.get("instruction"), str):
            options["instruction"] = [options["instruction"]]
        obs, infos = self._venv.reset(seed=seed, options=options)
        self._done = False
        return _first(obs), _first_info(infos)

    def step(self, action):
        if self._done:
            raise RuntimeError("the episode has ended: call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside the action space Discrete({self.action_space.n})")
        obs, r, term, trunc, infos = self._venv.step(np.array([int(action)]))
        self._done = bool(term[0] or trunc[0])
        return _first(obs), float(r[0]), bool(term[0]), bool(trunc[0]), _first_info(infos)

    def render(self):
        return self._venv.render()[0]

    def close(self) -> None:
        self._venv.close()


def _first(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v[0].copy() for k, v in obs.items()}


def _first_info(infos: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if k.startswith("_") or k in ("final_obs", "final_info"):
            continue
        if isinstance(v, dict):
            out[k] = {kk: (vv[0].item() if hasattr(vv[0], "item") else vv[0]) for kk, vv in v.items()}
        else:
            out[k] = v[0].copy() if isinstance(v[0], np.ndarray) else (v[0].item() if hasattr(v[0], "item") else v[0])
    return out
