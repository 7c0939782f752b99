"""The single (non-vector) env registered as ``OIR-CraftaxClassic-v0``, used through ``gym.make``
(with its env checker and order enforcing), as users get it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import A, B, Scene
from gymnasium.utils.env_checker import check_env

from oir_gym import ENV_ID
from oir_gym.registration import EnvChecker
from oir_gym.single_env import InstructionCraftaxEnv


@pytest.fixture(scope="module")
def single(encoder):
    env = gym.make(ENV_ID, encoder=encoder)
    yield env
    env.close()


def test_check_env(single):
    assert isinstance(single.unwrapped, InstructionCraftaxEnv)
    wrappers = []
    env = single
    while isinstance(env, gym.Wrapper):
        wrappers.append(type(env))
        env = env.env
    assert EnvChecker in wrappers  # gym.make wraps it in the repaired passive checker (once)
    assert gym.wrappers.PassiveEnvChecker not in wrappers
    check_env(single.unwrapped, skip_render_check=True)
    with pytest.warns(UserWarning, match="wrapped"):  # check_env also passes on what gym.make returns
        check_env(single, skip_render_check=True)


def test_a_refused_first_reset_does_not_break_later_steps(encoder):
    """Gymnasium 1.4's own checker fails every step after a refused first reset ("cannot unpack
    non-iterable NoneType"); the registered env recovers once a valid reset follows."""
    env = gym.make(ENV_ID, encoder=encoder)
    try:
        with pytest.raises(ValueError, match="non-empty"):
            env.reset(options={"instruction": ""})
        obs, info = env.reset(seed=0, options={"instruction": "collect wood"})
        assert env.observation_space.contains(obs)
        for _ in range(5):
            obs, r, term, trunc, info = env.step(A.NOOP.value)
        assert info["instruction"] == "collect wood" and env.observation_space.contains(obs)
        # the spec remakes the same wrapper stack (the checker once, not Gymnasium's as well)
        assert env.spec.additional_wrappers[-1].name == "EnvChecker" and env.spec.disable_env_checker
    finally:
        env.close()


def test_reset_step_contract(single, encoder):
    env = single
    obs, info = env.reset(seed=0, options={"instruction": "collect wood"})
    assert env.observation_space.contains(obs)
    assert info["instruction"] == "collect wood"
    np.testing.assert_allclose(obs["instruction"], encoder.encode("collect wood"), atol=1e-6)
    obs, r, term, trunc, info = env.step(A.NOOP.value)
    assert isinstance(r, float) and isinstance(term, bool) and isinstance(trunc, bool)
    assert info["instruction"] == "collect wood"
    assert info["events"].shape == (len(env.unwrapped.unwrapped_vector.event_names),)
    # a numpy integer action is fine too
    env.step(np.int64(A.LEFT.value))


@pytest.mark.parametrize("action", [17, -1, 2.5, "up", True, np.bool_(False), None, [1]])
def test_action_outside_space_raises(single, action):
    """A bool is not an action (``step(True)`` used to take action 1)."""
    env = single
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside the action space"):
        env.step(action)


def test_episode_end_then_step_raises(single):
    """Scripted success under "collect wood" terminates; stepping on needs a reset."""
    env = single
    env.reset(seed=0, options={"instruction": "collect wood"})
    sc = Scene(env.unwrapped.unwrapped_vector)
    sc.block(0, (0, 1), B.TREE)
    sc.apply()
    _, r, term, trunc, info = env.step(A.DO.value)
    assert r == 1.0 and term and not trunc and info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(A.NOOP.value)
    env.reset()
    env.step(A.NOOP.value)


def test_set_instruction_and_empty_instruction(single):
    env = single
    env.unwrapped.set_instruction("place table")
    _, info = env.reset(seed=1)
    assert info["instruction"] == "place table"
    with pytest.raises(ValueError, match="non-empty"):
        env.reset(options={"instruction": ""})
    with pytest.raises(TypeError, match="string"):
        env.unwrapped.set_instruction(42)
    env.unwrapped.set_instruction(None)
    _, info = env.reset(seed=1)
    assert info["instruction"] in env.unwrapped.buffer.contents()


@pytest.mark.slow
def test_render_rgb_array_single(encoder):
    env = gym.make(ENV_ID, render_mode="rgb_array", encoder=encoder)
    try:
        env.reset(seed=0)
        frame = env.render()
        assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3
    finally:
        env.close()
