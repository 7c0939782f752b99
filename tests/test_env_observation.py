"""Observation spaces and the content of the paper's observation vector for a hand-built state."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from conftest import NUM_ENVS, A, B, Scene

from oir_gym.observation import OBS_MODES, PAPER_OBS_DIM, SYMBOLIC_OBS_DIM, obs_dim, observe
from oir_gym.vector_env import InstructionCraftax

_observe_paper = jax.jit(jax.vmap(lambda s: observe(s, "paper")))
_observe_symbolic = jax.jit(jax.vmap(lambda s: observe(s, "symbolic")))


def test_obs_dims():
    assert PAPER_OBS_DIM == 888 and obs_dim("paper") == 888
    assert SYMBOLIC_OBS_DIM == 1345 and obs_dim("symbolic") == 1345
    with pytest.raises(ValueError, match="paper"):
        obs_dim("pixels")


def test_paper_space_and_values(venv):
    space = venv.single_observation_space
    assert space["obs"].shape == (888,) and space["obs"].dtype == np.float32
    assert float(space["obs"].low.min()) == 0.0 and float(space["obs"].high.max()) == 1.0
    assert space["instruction"].shape == (384,)
    obs, _ = venv.reset(seed=0)
    assert obs["obs"].shape == (NUM_ENVS, 888) and obs["obs"].dtype == np.float32
    assert venv.observation_space.contains(obs)
    rng = np.random.default_rng(0)
    for _ in range(5):
        obs, *_ = venv.step(rng.integers(0, 17, NUM_ENVS))
        assert obs["obs"].min() >= 0.0 and obs["obs"].max() <= 1.0
        np.testing.assert_allclose(np.linalg.norm(obs["instruction"], axis=1), 1.0, atol=1e-5)
        assert obs["obs"].flags.writeable


def test_symbolic_space_and_values(venv, encoder):
    env = InstructionCraftax(num_envs=NUM_ENVS, obs_mode="symbolic", encoder=encoder)
    assert env.single_observation_space["obs"].shape == (1345,)
    assert env.observation_space["obs"].shape == (NUM_ENVS, 1345)
    # Craftax's own symbolic vector of the shared env's states (no need to compile a second step)
    sym = np.asarray(_observe_symbolic(venv._state.env.craftax))
    assert sym.shape == (NUM_ENVS, 1345) and sym.dtype == np.float32
    assert env.single_observation_space["obs"].contains(sym[0])


@pytest.mark.parametrize("mode", ["bogus", "pixels", "", None])
def test_unknown_obs_mode_names_allowed_modes(mode):
    with pytest.raises(ValueError) as e:
        InstructionCraftax(num_envs=NUM_ENVS, obs_mode=mode)
    msg = str(e.value)
    assert repr(mode) in msg and all(m in msg for m in OBS_MODES)


def test_paper_vector_layout_of_hand_built_state(venv):
    sc = Scene(venv)
    # env 0: tree ahead, water at distance 1, stone at 2, a cow at 2, a zombie at 3
    sc.block(0, (0, 1), B.TREE).block(0, (-1, 0), B.WATER).block(0, (2, 2), B.STONE)
    sc.mob(0, "cows", 0, (0, -2)).mob(0, "zombies", 1, (3, -1))
    sc.inventory(0, wood=2, sapling=1, wood_pickaxe=1)
    sc.set(0, player_food=8, player_drink=7, player_energy=6)
    # env 1: facing a cow, asleep, at night
    sc.mob(1, "cows", 2, (0, 1)).set(1, is_sleeping=True, light_level=0.25)
    # env 2: facing down, lots of wood (counts clip at 9 -> 1.0)
    sc.set(2, player_direction=A.DOWN.value).inventory(2, wood=9)
    sc.apply()
    obs = np.asarray(_observe_paper(venv._state.env.craftax))
    assert obs.shape == (NUM_ENVS, 888) and obs.min() >= 0 and obs.max() <= 1

    o = obs[0]
    blocks = o[:833].reshape(7, 7, 17)
    np.testing.assert_array_equal(blocks.sum(-1), 1.0)  # one-hot per tile
    window = blocks.argmax(-1)
    assert window[3, 4] == B.TREE.value and window[2, 3] == B.WATER.value and window[5, 5] == B.STONE.value
    assert window[3, 3] == B.SAND.value  # the player's own tile
    mob_counts = o[833:845].reshape(4, 3)  # zombie, cow, skeleton, arrow x distance 1..3
    expected_counts = np.zeros((4, 3))
    expected_counts[1, 1] = 1 / 3  # one cow (max 3) at distance 2
    expected_counts[0, 2] = 1 / 3  # one zombie (max 3) at distance 3
    np.testing.assert_allclose(mob_counts, expected_counts, atol=1e-6)
    facing = o[845:866]
    assert facing.argmax() == B.TREE.value and facing.sum() == 1
    inv = o[866:878]
    np.testing.assert_allclose(inv, np.array([2, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0]) / 9, atol=1e-6)
    np.testing.assert_allclose(o[878:882], np.array([9, 8, 7, 6]) / 9, atol=1e-6)
    np.testing.assert_array_equal(o[882:886], [0, 1, 0, 0])  # facing right
    np.testing.assert_allclose(o[886:888], [0.0, 1.0])  # awake, daylight

    o = obs[1]
    assert o[845:866].argmax() == 17 + 1  # the faced "block" is a cow (mob id 17 + 1)
    assert o[833 + 3] == pytest.approx(1 / 3)  # cow at distance 1
    np.testing.assert_allclose(o[886:888], [1.0, 0.25])

    o = obs[2]
    np.testing.assert_array_equal(o[882:886], [0, 0, 0, 1])  # facing down
    assert o[866] == 1.0
