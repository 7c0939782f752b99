"""The single (non-vector) env registered as ``OIR-CraftaxClassic-v0``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import A, B, Scene
from gymnasium.utils.env_checker import check_env

from oir_gym import ENV_ID
from oir_gym.single_env import InstructionCraftaxEnv


@pytest.fixture(scope="module")
def single(encoder):
    env = gym.make(ENV_ID, encoder=encoder)
    yield env
    env.close()


def test_check_env(single):
    assert isinstance(single.unwrapped, InstructionCraftaxEnv)
    check_env(single.unwrapped, skip_render_check=True)


def test_reset_step_contract(single, encoder):
    env = single.unwrapped
    obs, info = env.reset(seed=0, options={"instruction": "collect wood"})
    assert env.observation_space.contains(obs)
    assert info["instruction"] == "collect wood"
    np.testing.assert_allclose(obs["instruction"], encoder.encode("collect wood"), atol=1e-6)
    obs, r, term, trunc, info = env.step(A.NOOP.value)
    assert isinstance(r, float) and isinstance(term, bool) and isinstance(trunc, bool)
    assert info["instruction"] == "collect wood" and info["events"].shape == (len(env.unwrapped_vector.event_names),)
    # a numpy integer action is fine too
    env.step(np.int64(A.LEFT.value))


@pytest.mark.parametrize("action", [17, -1, 2.5, "up"])
def test_action_outside_space_raises(single, action):
    env = single.unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside the action space"):
        env.step(action)


def test_episode_end_then_step_raises(single):
    """Scripted success under "collect wood" terminates; stepping on needs a reset."""
    env = single.unwrapped
    env.reset(seed=0, options={"instruction": "collect wood"})
    sc = Scene(env.unwrapped_vector)
    sc.block(0, (0, 1), B.TREE)
    sc.apply()
    _, r, term, trunc, info = env.step(A.DO.value)
    assert r == 1.0 and term and not trunc and info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(A.NOOP.value)
    env.reset()
    env.step(A.NOOP.value)


def test_set_instruction_and_empty_instruction(single):
    env = single.unwrapped
    env.set_instruction("place table")
    _, info = env.reset(seed=1)
    assert info["instruction"] == "place table"
    with pytest.raises(ValueError, match="non-empty"):
        env.reset(options={"instruction": ""})
    with pytest.raises(TypeError, match="string"):
        env.set_instruction(42)
    env.set_instruction(None)
    _, info = env.reset(seed=1)
    assert info["instruction"] in env.buffer.contents()


@pytest.mark.slow
def test_render_rgb_array_single(encoder):
    env = gym.make(ENV_ID, render_mode="rgb_array", encoder=encoder)
    try:
        env.reset(seed=0)
        frame = env.render()
        assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3
    finally:
        env.close()
