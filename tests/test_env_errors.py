"""Bad constructor arguments fail early with an error naming the value and the allowed range."""

from __future__ import annotations

import math

import pytest
from conftest import NUM_ENVS

from oir_gym.vector_env import InstructionCraftax


@pytest.mark.parametrize("delta", [1.5, -1, -1.0, 2, math.nan, math.inf, -math.inf, "0.9", None])
def test_delta_outside_range(delta, encoder):
    with pytest.raises(ValueError, match=r"\(-1, 1\]") as e:
        InstructionCraftax(num_envs=NUM_ENVS, delta=delta, encoder=encoder)
    assert repr(delta) in str(e.value)


@pytest.mark.parametrize("delta", [1.0, 1, 0.9, -0.99, 0.0])
def test_delta_inside_range_is_accepted(delta, encoder):
    env = InstructionCraftax(num_envs=NUM_ENVS, delta=delta, encoder=encoder)
    assert env.params.delta == pytest.approx(float(delta))


@pytest.mark.parametrize("n", [0, -3, 2.5, "4", None])
def test_num_envs_below_one(n):
    with pytest.raises(ValueError, match=">= 1") as e:
        InstructionCraftax(num_envs=n)
    assert repr(n) in str(e.value)


@pytest.mark.parametrize("steps", [0, -1, 1.5])
def test_max_episode_steps(steps):
    with pytest.raises(ValueError, match="max_episode_steps"):
        InstructionCraftax(num_envs=NUM_ENVS, max_episode_steps=steps)


def test_unknown_reward_mode():
    with pytest.raises(ValueError, match="'cosine'.*'gt'") as e:
        InstructionCraftax(num_envs=NUM_ENVS, reward="sparse")
    assert "'sparse'" in str(e.value)


def test_unknown_autoreset_mode():
    with pytest.raises(ValueError, match="same_step.*next_step"):
        InstructionCraftax(num_envs=NUM_ENVS, autoreset_mode="disabled")


def test_unknown_render_mode():
    with pytest.raises(ValueError, match="rgb_array"):
        InstructionCraftax(num_envs=NUM_ENVS, render_mode="human")


@pytest.mark.parametrize("instructions,exc,match", [
    ([], ValueError, "at least one"),
    ([""], ValueError, "non-empty"),
    (["collect wood", "  \n "], ValueError, "non-empty"),
    (["collect wood", 7], TypeError, "string"),
    (["x" * 501], ValueError, "501 characters, more than the 500 allowed"),
])
def test_bad_initial_instructions(instructions, exc, match, encoder):
    with pytest.raises(exc, match=match):
        InstructionCraftax(num_envs=NUM_ENVS, instructions=instructions, encoder=encoder)


@pytest.mark.parametrize("make", ["class", "gym.make", "gym.make_vec"])
def test_a_string_where_a_list_of_instructions_is_expected(make, encoder):
    """instructions="wood" used to become three one-letter instructions."""
    import gymnasium as gym

    from oir_gym import ENV_ID

    with pytest.raises(TypeError, match=r"list of strings.*\['wood'\]"):
        if make == "class":
            InstructionCraftax(num_envs=NUM_ENVS, instructions="wood", encoder=encoder)
        elif make == "gym.make":
            gym.make(ENV_ID, instructions="wood", encoder=encoder)
        else:
            gym.make_vec(ENV_ID, num_envs=NUM_ENVS, instructions="wood", encoder=encoder)


def test_missing_encoder_path_names_the_path():
    with pytest.raises(FileNotFoundError, match="/nonexistent/encoder"):
        InstructionCraftax(num_envs=NUM_ENVS, encoder="/nonexistent/encoder")
