"""Stable-Baselines3 ``VecEnv`` adapter for :class:`~oir_gym.vector_env.InstructionCraftax` (docs/sb3.md).

SB3 assumes same-step autoreset (``infos["final_obs"][i]`` becomes ``terminal_observation``), so the
adapter refuses ``"next_step"`` envs. The batch is one JAX key: ``seed(s)`` seeds it with ``s`` (env 0's
seed), and non-consecutive per-env seeds raise a warning. Every returned array is a fresh copy (SB3
writes into ``rewards``).
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from oir_gym.vector_env import InstructionCraftax

__all__ = ["SB3VecEnv", "find_instruction_env", "make_sb3_env", "PER_ENV_ATTRS"]

#: Per-env "virtual" attributes understood by :meth:`SB3VecEnv.get_attr` / :meth:`SB3VecEnv.set_attr`.
PER_ENV_ATTRS = ("instruction",)

_STEP_INFO_KEYS = ("instruction", "success", "events", "achievements", "similarity", "text", "action_text")


class SB3VecEnv(VecEnv):
    """:class:`~oir_gym.vector_env.InstructionCraftax` (``env``, or one built from ``env_kwargs``) as an SB3
    ``VecEnv``; its step infos are listed in docs/sb3.md.

    The batch is one Python object: ``get_attr``/``set_attr``/``env_method`` act on it once for all
    indices (``set_attr`` on a strict subset raises), except ``"instruction"``: each env's current one,
    and ``set_attr("instruction", text, indices)`` pins those envs from their next reset.
    """

    def __init__(self, env: Optional[InstructionCraftax] = None, **env_kwargs: Any) -> None:
        if env is None:
            env = InstructionCraftax(**env_kwargs)
        elif env_kwargs:
            raise TypeError("pass either an env or env keyword arguments, not both")
        if not isinstance(env, InstructionCraftax):
            raise TypeError(f"SB3VecEnv wraps an InstructionCraftax, got {type(env).__name__}")
        if getattr(env, "autoreset", "same_step") != "same_step":
            raise ValueError(
                "SB3 needs same-step autoreset (the step that ends an episode returns the next episode's "
                "first observation and the last one in terminal_observation); build InstructionCraftax "
                f"with autoreset_mode='same_step', not {env.autoreset!r}"
            )
        self.env = env
        self._actions: Optional[np.ndarray] = None
        self._t_start = time.time()
        self._pins: list[Optional[str]] = [None] * env.num_envs
        super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
        # render_fps for SB3's VecVideoRecorder (get_images gives the env's rgb_array frames)
        self.metadata = dict(self.metadata, autoreset_mode="same_step", render_fps=env.metadata["render_fps"])

    # ------------------------------------------------------------------ pass-throughs
    @property
    def encoder(self):
        """The env's sentence encoder (the one that embeds the ``"instruction"`` observation)."""
        return self.env.encoder

    @property
    def buffer(self):
        """The env's :class:`~oir_gym.buffer.InstructionBuffer` (the curriculum)."""
        return self.env.buffer

    @property
    def last_actions(self) -> Optional[np.ndarray]:
        """The actions of the last step (a copy), or ``None`` before the first step."""
        return None if self._actions is None else self._actions.copy()

    def current_instructions(self) -> list[str]:
        return self.env.current_instructions()

    # ------------------------------------------------------------------ VecEnv API
    def _batch_seed(self) -> Optional[int]:
        first = next(((i, s) for i, s in enumerate(self._seeds) if s is not None), None)
        if first is None:
            return None
        i0, s0 = first
        base = int(s0) - i0
        expected = [base + i for i in range(self.num_envs)]
        if any(s is not None and int(s) != e for s, e in zip(self._seeds, expected)):
            warnings.warn(
                f"InstructionCraftax is one JAX batch seeded once: per-env seeds {self._seeds} are not "
                f"consecutive; seeding the batch with {base} (env i gets world i of that key)",
                stacklevel=3,
            )
        return base

    def _reset_options_arg(self) -> Optional[dict[str, Any]]:
        if not any(self._options):
            return None
        unknown = {k for o in self._options for k in o} - {"instruction"}
        if unknown:
            warnings.warn(f"ignoring unsupported reset options {sorted(unknown)} (only 'instruction')", stacklevel=3)
        if not any("instruction" in o for o in self._options):
            return None
        pins = [o.get("instruction", p) if o else p for o, p in zip(self._options, self._pins)]
        self._pins = list(pins)
        return {"instruction": pins}

    def reset(self):
        seed = self._batch_seed()
        options = self._reset_options_arg()
        obs, infos = self.env.reset(seed=seed, options=options)
        instr = infos["instruction"]
        self.reset_infos = [{"instruction": str(instr[i])} for i in range(self.num_envs)]
        if "text" in infos:
            for i in range(self.num_envs):
                self.reset_infos[i]["text"] = str(infos["text"][i])
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.array(actions).reshape(self.num_envs)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_async() must be called before step_wait()")
        obs, rewards, terms, truncs, infos = self.env.step(self._actions)
        n = self.num_envs
        dones = np.logical_or(terms, truncs)
        out: list[dict[str, Any]] = []
        for i in range(n):
            d: dict[str, Any] = {}
            for k in _STEP_INFO_KEYS:
                if k in infos:
                    v = infos[k][i]
                    d[k] = v.copy() if isinstance(v, np.ndarray) else (v.item() if isinstance(v, np.generic) else v)
            d["TimeLimit.truncated"] = bool(truncs[i] and not terms[i])
            out.append(d)
        if dones.any():
            t = round(time.time() - self._t_start, 6)
            final = infos["final_obs"]
            ep = infos["episode"]
            current = self.env.current_instructions()
            for i in np.flatnonzero(dones):
                d = out[i]
                d["terminal_observation"] = {k: np.array(v, copy=True) for k, v in final[i].items()}
                r = float(ep["r"][i])
                d["episode"] = {"r": r, "l": int(ep["l"][i]), "t": t}
                d["is_success"] = r > 0.0
                self.reset_infos[i] = {"instruction": current[i]}
        return obs, np.array(rewards, dtype=np.float32, copy=True), dones.astype(bool), out

    def close(self) -> None:
        self.env.close()

    def _indices(self, indices) -> list[int]:
        idx = [int(i) for i in self._get_indices(indices)]
        for i in idx:
            if not 0 <= i < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
        return idx

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        idx = self._indices(indices)
        if attr_name == "instruction":
            cur = self.env.current_instructions()
            return [cur[i] for i in idx]
        value = getattr(self.env, attr_name)
        return [value for _ in idx]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        idx = self._indices(indices)
        if attr_name == "instruction":
            vals = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * len(idx)
            if len(vals) != len(idx):
                raise ValueError(f"got {len(vals)} instructions for {len(idx)} envs")
            for i, v in zip(idx, vals):
                self._pins[i] = v
            self.env.set_instructions(list(self._pins))
            return
        if sorted(set(idx)) != list(range(self.num_envs)):
            raise ValueError(
                f"{attr_name!r} is an attribute of the whole JAX batch: set it for all envs (indices=None), "
                f"not for {idx}"
            )
        setattr(self.env, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        idx = self._indices(indices)
        result = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [result for _ in idx]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def get_images(self) -> Sequence[Optional[np.ndarray]]:
        if self.render_mode != "rgb_array":
            warnings.warn(f"render_mode is {self.render_mode!r}; get_images needs 'rgb_array'", stacklevel=2)
            return [None] * self.num_envs
        return list(self.env.render())


def make_sb3_env(num_envs: int = 16, *, monitor: bool = False, monitor_file: Optional[str] = None,
                 **env_kwargs: Any) -> VecEnv:
    """Build ``InstructionCraftax(num_envs, **env_kwargs)`` as an SB3 ``VecEnv``.

    The adapter already reports ``Monitor``-style episode statistics; ``monitor=True`` adds SB3's
    ``VecMonitor`` on top anyway (e.g. to write a ``monitor.csv`` with ``monitor_file``).
    """
    venv: VecEnv = SB3VecEnv(InstructionCraftax(num_envs=num_envs, **env_kwargs))
    if monitor or monitor_file:
        from stable_baselines3.common.vec_env import VecMonitor

        venv = VecMonitor(venv, filename=monitor_file, info_keywords=("instruction",))
    return venv


def find_instruction_env(venv: Any) -> tuple[SB3VecEnv, InstructionCraftax]:
    """The :class:`SB3VecEnv` under any stack of ``VecEnvWrapper`` and its ``InstructionCraftax``."""
    cur = venv
    while isinstance(cur, VecEnvWrapper):
        cur = cur.venv
    if not isinstance(cur, SB3VecEnv):
        raise TypeError(
            f"expected an oir_gym.sb3.SB3VecEnv (possibly wrapped), got {type(cur).__name__}; "
            "build the training env with SB3VecEnv(InstructionCraftax(...))"
        )
    return cur, cur.env
