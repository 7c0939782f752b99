"""``InstructionCraftaxEnv``: a one-env :class:`~oir_gym.vector_env.InstructionCraftax` as a plain ``gym.Env``."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from oir_gym.validation import ArgumentTypeError, check_int, check_seed, show
from oir_gym.vector_env import InstructionCraftax, check_reset_options


class InstructionCraftaxEnv(gym.Env):
    """Single-env face of :class:`InstructionCraftax`; takes the same keyword arguments."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, render_mode: str | None = None, **kwargs: Any) -> None:
        if "num_envs" in kwargs and check_int("num_envs", kwargs.pop("num_envs"), minimum=1) != 1:
            raise ValueError("num_envs: the single env holds one env; for several use "
                             "gym.make_vec('OIR-CraftaxClassic-v0', num_envs=n)")
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
        options = check_reset_options(options)
        check_seed("seed", seed)
        super().reset(seed=seed)
        if isinstance(options.get("instruction"), str):
            options["instruction"] = [options["instruction"]]
        obs, infos = self._venv.reset(seed=seed, options=options)
        self._done = False
        return _first(obs), _first_info(infos)

    def step(self, action):
        # the argument first: a wrong action is wrong whatever the episode's state (a bool is not one)
        integer = isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_))
        if not (integer and self.action_space.contains(action)):
            raise (ValueError if integer else ArgumentTypeError)(
                f"action={show(action)} outside the action space Discrete({self.action_space.n}): an action is an "
                f"integer in [0, {self.action_space.n - 1}]")
        if self._done:
            raise RuntimeError("the episode has ended: call reset() before step()")
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
