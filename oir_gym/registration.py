"""Gymnasium registration of ``OIR-CraftaxClassic-v0``."""

from __future__ import annotations

import gymnasium as gym

ENV_ID = "OIR-CraftaxClassic-v0"


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
        entry_point="oir_gym.single_env:InstructionCraftaxEnv",
        vector_entry_point="oir_gym.registration:_make_vector",
        max_episode_steps=None,  # the env truncates itself (max_episode_steps kwarg)
        disable_env_checker=False,
    )
