"""The Gymnasium vector env: registration, autoreset modes, instructions, buffer, seeding, errors."""

from __future__ import annotations

import time
from collections.abc import Sequence

import gymnasium as gym
import jax
import numpy as np
import pytest
from conftest import CENTER, NUM_ENVS, A, B, Scene
from gymnasium.vector import AutoresetMode

from oir_gym import ENV_ID
from oir_gym.buffer import InstructionBuffer
from oir_gym.observation import VIEW_RADIUS
from oir_gym.vector_env import InstructionCraftax

UNREACHABLE = "collect diamond"  # cannot happen within a few steps of a fresh world


@pytest.fixture(scope="module")
def venv3(encoder):
    """``gym.make_vec`` env with a 3-step limit (same-step autoreset, the default)."""
    env = gym.make_vec(ENV_ID, num_envs=NUM_ENVS, max_episode_steps=3, seed=1, encoder=encoder)
    yield env
    env.close()


@pytest.fixture(scope="module")
def venv_next(encoder):
    env = InstructionCraftax(num_envs=NUM_ENVS, max_episode_steps=3, autoreset_mode="next_step", seed=2, encoder=encoder)
    yield env
    env.close()


def set_steps(env, steps):
    env._state = env._state.replace(env=env._state.env.replace(steps=jax.numpy.asarray(steps, jax.numpy.int32)))


def decode_window(obs_vec: np.ndarray) -> np.ndarray:
    """The 7x7 block ids encoded at the start of a paper observation."""
    w = 2 * VIEW_RADIUS + 1
    return obs_vec[: w * w * 17].reshape(w * w, 17).argmax(-1).reshape(w, w)


def state_window(env, i: int) -> np.ndarray:
    cs = jax.device_get(env._state.env.craftax)
    padded = np.pad(cs.map[i], VIEW_RADIUS, constant_values=1)
    r, c = cs.player_position[i]
    return padded[r: r + 2 * VIEW_RADIUS + 1, c: c + 2 * VIEW_RADIUS + 1]


# --------------------------------------------------------------------------- registration


def test_make_vec_returns_instruction_craftax(venv3):
    assert isinstance(venv3, InstructionCraftax)
    assert venv3.num_envs == NUM_ENVS
    assert venv3.params.max_steps == 3
    assert venv3.single_action_space == gym.spaces.Discrete(17)
    assert set(venv3.single_observation_space.spaces) == {"obs", "instruction"}
    assert venv3.action_space.shape == (NUM_ENVS,)
    assert venv3.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert venv3.metadata["render_fps"] > 0  # video wrappers read it


def test_registered_spec_has_both_entry_points():
    spec = gym.spec(ENV_ID)
    assert spec.entry_point == "oir_gym.registration:_make_single"  # InstructionCraftaxEnv in EnvChecker
    assert spec.vector_entry_point is not None


# --------------------------------------------------------------------------- same-step autoreset


def test_same_step_autoreset_truncation(venv3):
    t_reset = time.perf_counter()
    obs, infos = venv3.reset(seed=1, options={"instruction": UNREACHABLE})
    assert venv3.observation_space.contains(obs)
    assert list(infos["instruction"]) == [UNREACHABLE] * NUM_ENVS
    rng = np.random.default_rng(0)
    for t in range(2):
        obs, r, te, tr, infos = venv3.step(rng.integers(0, 17, NUM_ENVS))
        assert not (te | tr).any() and "final_obs" not in infos and "episode" not in infos
    # Stagger the episodes: env 1 is one step behind, so only envs 0, 2, 3 hit the limit now.
    set_steps(venv3, [2, 1, 2, 2])
    obs, r, te, tr, infos = venv3.step(rng.integers(0, 17, NUM_ENVS))
    elapsed = time.perf_counter() - t_reset
    done = np.array([True, False, True, True])
    np.testing.assert_array_equal(tr, done)
    np.testing.assert_array_equal(te, False)
    np.testing.assert_array_equal(r, 0.0)
    for arr in (r, te, tr):
        assert isinstance(arr, np.ndarray) and arr.flags.writeable
    np.testing.assert_array_equal(infos["_final_obs"], done)
    np.testing.assert_array_equal(infos["_episode"], done)
    np.testing.assert_array_equal(infos["episode"]["l"], [3, 0, 3, 3])
    np.testing.assert_array_equal(infos["episode"]["r"], 0.0)
    # "t": the episode's elapsed seconds (RecordEpisodeStatistics), 0 where no episode ended
    t = infos["episode"]["t"]
    assert (t[done] > 0).all() and (t[done] <= elapsed).all() and t[1] == 0
    # final_info: the finished envs' own info of their last step, episode statistics included
    fi = infos["final_info"]
    np.testing.assert_array_equal(fi["episode"]["l"], [3, 0, 3, 3])
    np.testing.assert_array_equal(fi["episode"]["t"], t)
    assert fi["events"].shape == infos["events"].shape and fi["achievements"].shape == (NUM_ENVS, 22)
    np.testing.assert_array_equal(fi["success"], infos["success"])
    assert not np.shares_memory(fi["events"], infos["events"])
    assert infos["final_obs"][1] is None
    steps = np.asarray(venv3._state.env.steps)
    np.testing.assert_array_equal(steps, [0, 2, 0, 0])
    for i in (0, 2, 3):
        fo = infos["final_obs"][i]
        assert set(fo) == {"obs", "instruction"} and venv3.single_observation_space.contains(fo)
        # the returned obs is the first obs of the next episode, not the last one
        assert not np.array_equal(fo["obs"], obs["obs"][i])
        np.testing.assert_array_equal(decode_window(obs["obs"][i]), state_window(venv3, i))
        # a fresh world: the player stands at the map centre
        np.testing.assert_array_equal(np.asarray(venv3._state.env.craftax.player_position[i]), CENTER)
    np.testing.assert_array_equal(decode_window(obs["obs"][1]), state_window(venv3, 1))
    assert infos["final_info"]["instruction"][0] == UNREACHABLE
    # env 1 finishes one step later
    obs, r, te, tr, infos = venv3.step(np.zeros(NUM_ENVS, np.int64))
    np.testing.assert_array_equal(tr, [False, True, False, False])
    np.testing.assert_array_equal(infos["_final_obs"], [False, True, False, False])
    # env 1 ends one step later, on its own clock
    assert infos["episode"]["t"][1] > 0


def test_seed_lists(venv3):
    """One seed per env is accepted when it means what seed=s means ([s, s+1, ...]); else a clear error."""
    venv3.set_instructions(None)
    by_int, _ = venv3.reset(seed=7)
    by_list, _ = venv3.reset(seed=[7 + i for i in range(NUM_ENVS)])
    np.testing.assert_array_equal(by_int["obs"], by_list["obs"])
    venv3.reset(seed=[None] * NUM_ENVS)
    with pytest.raises(ValueError, match="consecutive"):
        venv3.reset(seed=[7, 3, 11, 1])
    with pytest.raises(ValueError, match=f"2 seeds for {NUM_ENVS} envs"):
        venv3.reset(seed=[7, 8])
    with pytest.raises(TypeError, match="seed must be"):
        venv3.reset(seed="7")


# --------------------------------------------------------------------------- next-step autoreset


def test_next_step_autoreset(venv_next):
    env = venv_next
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    env.reset(seed=2, options={"instruction": UNREACHABLE})
    set_steps(env, [2, 0, 0, 1])
    obs0, r, te, tr, infos = env.step(np.full(NUM_ENVS, A.NOOP.value))
    np.testing.assert_array_equal(tr, [True, False, False, False])
    assert "final_obs" not in infos  # next-step mode returns the last obs itself
    np.testing.assert_array_equal(infos["_episode"], [True, False, False, False])
    last_window = decode_window(obs0["obs"][0])
    np.testing.assert_array_equal(last_window, state_window(env, 0))

    # The next step resets env 0: its action is ignored, reward 0, no termination, no events.
    cs_before = jax.device_get(env._state.env.craftax)
    obs1, r, te, tr, infos = env.step(np.array([A.DO.value, A.LEFT.value, A.NOOP.value, A.NOOP.value]))
    assert r[0] == 0.0 and not te[0] and not tr[0]
    assert not infos["events"][0].any() and not infos["success"][0] and infos["similarity"][0] == -1.0
    np.testing.assert_array_equal(tr, [False, False, False, True])  # env 3 hits its limit now
    state = env._state.env
    np.testing.assert_array_equal(np.asarray(state.steps), [0, 2, 2, 3])
    cs = jax.device_get(state.craftax)
    assert cs.timestep[0] == 0 and tuple(cs.player_position[0]) == CENTER  # untouched fresh world
    assert cs.timestep[1] == cs_before.timestep[1] + 1  # the other envs did step
    np.testing.assert_array_equal(decode_window(obs1["obs"][0]), state_window(env, 0))
    assert infos["instruction"][0] == UNREACHABLE

    # Next: env 3 resets (action ignored); env 0 now steps normally; envs 1, 2 reach the limit.
    obs2, r, te, tr, infos = env.step(np.full(NUM_ENVS, A.NOOP.value))
    np.testing.assert_array_equal(tr, [False, True, True, False])
    np.testing.assert_array_equal(np.asarray(env._state.env.steps), [1, 3, 3, 0])
    assert not infos["events"][3].any() and infos["events"][0].any()  # env 0's noop is an event


# --------------------------------------------------------------------------- instructions


def test_reset_option_pins_all_envs(venv, encoder):
    obs, infos = venv.reset(options={"instruction": "collect wood"})
    assert venv.current_instructions() == ["collect wood"] * NUM_ENVS
    assert list(infos["instruction"]) == ["collect wood"] * NUM_ENVS
    np.testing.assert_allclose(obs["instruction"], np.tile(encoder.encode("collect wood"), (NUM_ENVS, 1)), atol=1e-6)
    # still pinned after the episodes end
    set_steps(venv, [venv.params.max_steps - 1] * NUM_ENVS)
    obs, _, _, tr, infos = venv.step(np.zeros(NUM_ENVS, np.int64))
    assert tr.all() and venv.current_instructions() == ["collect wood"] * NUM_ENVS


def test_set_instructions_per_env_and_unpin(venv, encoder):
    per_env = ["place table", None, "eat cow", "a brand new instruction"]
    venv.set_instructions(per_env)
    # applies at the next reset of each env
    obs, infos = venv.reset()
    current = venv.current_instructions()
    assert current[0] == "place table" and current[2] == "eat cow" and current[3] == "a brand new instruction"
    assert current[1] in venv.buffer.contents()
    np.testing.assert_allclose(obs["instruction"][3], encoder.encode("a brand new instruction"), atol=1e-6)
    venv.set_instructions(None)
    venv.reset(seed=3)
    assert all(t in venv.buffer.contents() for t in venv.current_instructions())


def test_unpinned_resets_draw_from_buffer(venv):
    seen = set()
    for seed in range(4):
        venv.reset(seed=seed)
        seen.update(venv.current_instructions())
    assert seen <= set(venv.buffer.contents()) and len(seen) > 1


def test_buffer_changes_are_picked_up_and_returns_recorded(venv):
    buf = InstructionBuffer(capacity=2, initial=["collect diamond", "make iron sword"], seed=0)
    venv.buffer = buf
    venv.reset(seed=0)
    assert set(venv.current_instructions()) <= {"collect diamond", "make iron sword"}
    # Replace the buffer's contents; the env uses them from the next episode on.
    buf.insert(["eat cow", "place stone"])
    assert set(buf.contents()) == {"eat cow", "place stone"}
    set_steps(venv, [venv.params.max_steps - 1] * NUM_ENVS)
    _, _, _, tr, infos = venv.step(np.zeros(NUM_ENVS, np.int64))
    assert tr.all()
    assert set(venv.current_instructions()) <= {"eat cow", "place stone"}
    # the 4 finished episodes (return 0) were recorded under their instructions
    counts = buf.stats("collect diamond").count + buf.stats("make iron sword").count
    assert counts == NUM_ENVS
    assert buf.stats("collect diamond").mean_return == 0.0


def test_set_instructions_errors(venv):
    with pytest.raises(ValueError, match="non-empty"):
        venv.set_instructions("")
    with pytest.raises(ValueError, match="non-empty"):
        venv.set_instructions(["collect wood", "   ", None, None])
    with pytest.raises(TypeError, match="string"):
        venv.set_instructions(["collect wood", 3, None, None])
    with pytest.raises(ValueError, match="4 envs"):
        venv.set_instructions(["collect wood"])
    with pytest.raises(ValueError, match="non-empty"):
        venv.reset(options={"instruction": ""})
    with pytest.raises(TypeError, match="string"):
        venv.reset(options={"instruction": 5})
    # the env is still usable and unpinned
    venv.reset(seed=0)
    assert all(t in venv.buffer.contents() for t in venv.current_instructions())


# --------------------------------------------------------------------------- actions


@pytest.mark.parametrize("actions,match", [
    ([0, 0, 0, 17], "17 outside the action space"),
    ([0, -1, 0, 0], "-1 outside the action space"),
    ([0, 0, 0], "expected 4 actions"),
    ([0.5, 0, 0, 0], "integers"),
])
def test_bad_actions_raise(venv, actions, match):
    with pytest.raises(ValueError, match=match):
        venv.step(np.array(actions))


def test_integral_float_actions_are_accepted(venv):
    _, r, _, _, _ = venv.step(np.array([0.0, 1.0, 2.0, 3.0]))
    assert r.shape == (NUM_ENVS,) and r.dtype == np.float32


def test_step_and_instructions_before_reset_raise(encoder):
    env = InstructionCraftax(num_envs=NUM_ENVS, encoder=encoder)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(NUM_ENVS, np.int64))
    with pytest.raises(RuntimeError, match="reset"):
        env.current_instructions()


# --------------------------------------------------------------------------- infos, seeding


def test_step_infos_and_text(venv):
    venv.reset(seed=0, options={"instruction": "collect wood"})
    sc = Scene(venv)
    sc.block(0, (0, 1), B.TREE)
    sc.apply()
    venv.info_text = True
    try:
        _, _, _, _, infos = venv.step(np.array([A.DO.value, A.NOOP.value, A.LEFT.value, A.DO.value]))
    finally:
        venv.info_text = False
    assert infos["action_text"][0] == "interact with tree"
    assert list(infos["action_text"][1:]) == ["noop", "move left", "interact with sand"]
    assert infos["text"][0].startswith("Facing: tree; Nearby: [1] tree; Inventory: empty; Status: health 9")
    assert infos["events"].shape == (NUM_ENVS, len(venv.event_names))
    assert infos["achievements"].shape == (NUM_ENVS, 22)
    assert infos["similarity"].dtype == np.float32
    assert list(infos["instruction"]) == ["collect wood"] * NUM_ENVS


def test_same_seed_same_trajectory(venv3, encoder):
    other = gym.make_vec(ENV_ID, num_envs=NUM_ENVS, max_episode_steps=3, seed=1, encoder=encoder)
    try:
        actions = np.random.default_rng(123).integers(0, 17, (20, NUM_ENVS))
        runs = []
        for env in (venv3, other):
            env.set_instructions(None)
            obs, _ = env.reset(seed=7)
            traj = [(obs, None, None, None, env.current_instructions())]
            for a in actions:
                obs, r, te, tr, _ = env.step(a)
                traj.append((obs, r, te, tr, env.current_instructions()))
            runs.append(traj)
        for (o1, r1, te1, tr1, i1), (o2, r2, te2, tr2, i2) in zip(*runs):
            np.testing.assert_array_equal(o1["obs"], o2["obs"])
            np.testing.assert_array_equal(o1["instruction"], o2["instruction"])
            if r1 is not None:
                np.testing.assert_array_equal(r1, r2)
                np.testing.assert_array_equal(te1, te2)
                np.testing.assert_array_equal(tr1, tr2)
            assert i1 == i2
        # a different seed gives a different trajectory
        obs_a, _ = other.reset(seed=7)
        obs_b, _ = other.reset(seed=8)
        assert not np.array_equal(obs_a["obs"], obs_b["obs"])
    finally:
        other.close()


# --------------------------------------------------------------------------- render


@pytest.mark.slow
def test_render_rgb_array(venv):
    frames = venv.render()
    # a sequence of per-env frames: what Gymnasium's vector RecordVideo asserts
    assert isinstance(frames, Sequence) and len(frames) == NUM_ENVS
    for f in frames:
        assert f.dtype == np.uint8 and f.ndim == 3 and f.shape[-1] == 3 and f.shape[0] > 0
    assert max(f.max() for f in frames) > 0


def test_render_without_mode_raises(venv3):
    with pytest.raises(RuntimeError, match="rgb_array"):
        venv3.render()
