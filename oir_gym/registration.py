"""Gymnasium registration of ``OIR-CraftaxClassic-v0``.

``gym.make(ENV_ID)`` gives the single env in :class:`EnvChecker` and ``OrderEnforcing``;
``gym.make_vec(ENV_ID, num_envs=n)`` gives :class:`~oir_gym.vector_env.InstructionCraftax` itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import EnvSpec
from gymnasium.wrappers import PassiveEnvChecker

ENV_ID = "OIR-CraftaxClassic-v0"


class EnvChecker(PassiveEnvChecker):
    """Gymnasium's :class:`~gymnasium.wrappers.PassiveEnvChecker`, except that a first ``reset`` that
    raises leaves the check armed (Gymnasium's marks it done, and every later ``step`` then fails)."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        first = not self.checked_reset
        try:
            return super().reset(seed=seed, options=options)
        except Exception:
            if first:
                self.checked_reset = False  # check the next reset instead of keeping nothing
            raise

    @property
    def spec(self) -> EnvSpec | None:
        # the plain wrapper spec: the parent's would switch Gymnasium's checker back on
        return gym.Wrapper.spec.fget(self)


def _make_single(**kwargs: Any) -> EnvChecker:
    from oir_gym.single_env import InstructionCraftaxEnv

    return EnvChecker(InstructionCraftaxEnv(**kwargs))


def _make_vector(num_envs: int = 16, max_episode_steps: int | None = None, **kwargs):
    from oir_gym.vector_env import InstructionCraftax

    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return InstructionCraftax(num_envs=num_envs, **kwargs)


def register_envs() -> None:
    """Register the env ids (idempotent)."""
    if ENV_ID in gym.registry:
        return
    gym.register(
        id=ENV_ID,
        # not through additional_wrappers: gym.make_vec refuses a vector entry point beside them
        entry_point="oir_gym.registration:_make_single",
        vector_entry_point="oir_gym.registration:_make_vector",
        max_episode_steps=None,  # the env truncates itself (max_episode_steps kwarg)
        disable_env_checker=True,  # EnvChecker replaces Gymnasium's (see its docstring)
    )
