"""TrajectoryRecorder / rollout: vector env step outputs -> Trajectory objects -> relabeler."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EV, NUM_ENVS, A, B, Scene

import oir_gym
from oir_gym.captions import NUM_EVENTS
from oir_gym.relabel import HindsightRelabeler


def step_info(n: int, instruction: str | list[str] = "collect wood", events=None, success=None) -> dict:
    ev = np.zeros((n, NUM_EVENTS), bool)
    for i, name in (events or {}).items():
        ev[i, EV[name]] = True
    return {"events": ev, "instruction": np.array([instruction] * n if isinstance(instruction, str) else instruction,
                                                 dtype=object),
            "success": np.array(success if success is not None else [False] * n)}


def test_segments_end_with_their_episode_and_at_max_length():
    rec = oir_gym.TrajectoryRecorder(num_envs=2, max_length=3)
    z = np.zeros(2, bool)
    rec.record([5, 5], [0, 0], z, z, step_info(2, events={0: "collect_wood"}))
    rec.record([1, 2], [1, 0], [True, False], z, step_info(2, success=[True, False]))  # env 0's episode ends
    rec.record([3, 3], [0, 0], z, z, step_info(2, ["place table", "collect wood"]))  # env 1 reaches max_length
    assert len(rec) == 2
    t0, t1 = rec.trajectories(include_open=False)
    assert (t0.env_id, len(t0), t0.instruction, t0.dones.tolist()) == (0, 2, "collect wood", [False, True])
    assert t0.event_names_at(0) == ["collect_wood"] and t0.actions.tolist() == [5, 1]
    assert t0.meta == {"start_step": 0, "terminated": True, "truncated": False, "success": True, "return": 1.0}
    assert (t1.env_id, len(t1), t1.dones.tolist(), t1.meta["terminated"]) == (1, 3, [False, False, False], False)
    assert t1.instruction == "collect wood"  # the one its episode started with
    (open0,) = rec.trajectories()  # env 0's new episode, cut at the current step
    assert (open0.env_id, len(open0), open0.instruction, open0.meta["start_step"]) == (0, 1, "place table", 2)
    assert rec.trajectories() == []


def test_next_step_autoreset_skips_the_reset_step():
    class Envs:  # what the recorder reads from a Gymnasium vector env
        num_envs = 1
        metadata = {"autoreset_mode": "next_step"}

    rec = oir_gym.TrajectoryRecorder(Envs())
    rec.record([1], [0], [True], [False], step_info(1))
    rec.record([2], [0], [False], [False], step_info(1))  # the reset step: action ignored
    rec.record([3], [0], [False], [False], step_info(1, "place table"))
    first, second = rec.trajectories()
    assert first.actions.tolist() == [1] and second.actions.tolist() == [3]
    assert second.instruction == "place table" and second.meta["start_step"] == 2


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="num_envs"):
        oir_gym.TrajectoryRecorder()
    rec = oir_gym.TrajectoryRecorder(num_envs=2)
    with pytest.raises(ValueError, match="'events' and 'instruction'"):
        rec.record([0, 0], [0, 0], [False] * 2, [False] * 2, {"episode": {}})
    with pytest.raises(ValueError, match="actions must hold one value per env"):
        rec.record([0, 0, 0], [0, 0], [False] * 2, [False] * 2, step_info(2))
    assert rec.trajectories() == []  # nothing half-recorded


def test_recorded_env_steps_feed_the_relabeler(venv):
    """A scripted agent collects wood in the real env; the recorded trajectory is relabeled with it."""
    venv.reset(seed=0, options={"instruction": "place table"})
    sc = Scene(venv)
    for i in range(NUM_ENVS):
        sc.block(i, (0, 1), B.TREE)
    sc.apply()
    rec = oir_gym.TrajectoryRecorder(venv)
    infos = []
    for a in (A.NOOP, A.DO, A.NOOP):
        actions = np.full(NUM_ENVS, a.value)
        _, reward, term, trunc, info = venv.step(actions)
        rec.record(actions, reward, term, trunc, info)
        infos.append(info)
    trajs = rec.trajectories()
    assert [t.env_id for t in trajs] == list(range(NUM_ENVS)) and all(len(t) == 3 for t in trajs)
    for t in trajs:
        np.testing.assert_array_equal(t.events, np.stack([inf["events"][t.env_id] for inf in infos]))
        assert t.instruction == "place table" and "collect_wood" in t.event_names_at(1)
    results = HindsightRelabeler.rules(k=4).relabel(trajs)
    assert all("collect wood" in [c.text for c in r.grounded] for r in results)
    assert all(c.first_step == 1 for r in results for c in r.grounded if c.text == "collect wood")


def test_rollout_records_every_step(venv):
    trajs = oir_gym.rollout(venv, steps=20, seed=1)
    assert sum(len(t) for t in trajs) == 20 * NUM_ENVS
    assert {t.env_id for t in trajs} == set(range(NUM_ENVS))
    assert all(t.dones[:-1].sum() == 0 for t in trajs)  # one episode per trajectory
    policy_calls = []

    def policy(obs):
        policy_calls.append(obs["obs"].shape)
        return np.zeros(NUM_ENVS, np.int64)

    trajs = oir_gym.rollout(venv, policy, steps=3, seed=1)
    assert policy_calls == [(NUM_ENVS, venv.single_observation_space["obs"].shape[0])] * 3
    assert all((t.actions == 0).all() for t in trajs)


NOOP = np.full(NUM_ENVS, A.NOOP.value)


def record_only(envs, num_envs_only: bool = False):
    """A recorder fed by the caller's own ``record`` calls (it is not told of resets)."""
    rec = oir_gym.TrajectoryRecorder(num_envs=NUM_ENVS) if num_envs_only else oir_gym.TrajectoryRecorder(envs)

    def step(actions):
        out = envs.step(actions)
        rec.record(actions, *out[1:])
        return out
    return rec, step


@pytest.mark.parametrize("how", ["wrapper", "record_reset", "reset_count", "instruction_change"])
def test_a_reset_ends_every_trajectory(venv, how):
    """The README's own loop: reset to "collect wood", 10 steps, reset to "drink water", 10 steps.

    Whichever way the recorder learns of the reset (the wrapper sees it; ``record_reset``; the env's
    ``reset_count``; with ``num_envs=`` only, the instruction each step reports), no trajectory
    spans it and each carries the instruction of its own reset.
    """
    if how == "wrapper":
        envs = oir_gym.RecordTrajectories(venv)
        rec, step = envs.recorder, envs.step
    else:
        envs = venv
        rec, step = record_only(venv, num_envs_only=how == "instruction_change")
    for instruction in ("collect wood", "drink water"):
        envs.reset(seed=0, options={"instruction": instruction})
        if how == "record_reset":
            rec.record_reset()
        for _ in range(10):
            step(NOOP)
    trajs = rec.trajectories()
    assert [(t.instruction, len(t), t.meta["start_step"], t.env_id) for t in trajs] == (
        [("collect wood", 10, 0, i) for i in range(NUM_ENVS)] + [("drink water", 10, 10, i) for i in range(NUM_ENVS)])
    assert not any(t.dones.any() or t.meta["terminated"] or t.meta["truncated"] for t in trajs)  # cut, not ended


def test_a_reset_with_the_same_instruction_is_seen_through_reset_count(venv):
    rec, step = record_only(venv)
    for seed in (0, 1):
        venv.reset(seed=seed, options={"instruction": "collect wood"})
        for _ in range(3):
            step(NOOP)
    trajs = rec.trajectories()
    assert [(len(t), t.meta["start_step"]) for t in trajs] == [(3, 0)] * NUM_ENVS + [(3, 3)] * NUM_ENVS


def test_the_wrapper_keeps_same_step_autoreset_episodes_apart(venv):
    """Episodes that end between two resets (success, then Gymnasium's same-step autoreset) split as
    before; the reset then cuts the running one, and the next starts under the new instruction."""
    envs = oir_gym.RecordTrajectories(venv)
    envs.reset(seed=0, options={"instruction": "collect wood"})
    sc = Scene(venv)
    for i in range(NUM_ENVS):
        sc.block(i, (0, 1), B.TREE)
    sc.apply()
    for a in (A.NOOP, A.DO, A.NOOP, A.NOOP):  # DO collects wood: success ends the episode
        envs.step(np.full(NUM_ENVS, a.value))
    envs.reset(seed=1, options={"instruction": "drink water"})
    envs.step(NOOP)
    envs.step(NOOP)
    trajs = envs.trajectories()
    assert len(trajs) == 3 * NUM_ENVS
    done, cut, new = trajs[:NUM_ENVS], trajs[NUM_ENVS:2 * NUM_ENVS], trajs[2 * NUM_ENVS:]
    for t in done:
        assert (t.instruction, t.dones.tolist(), t.meta["terminated"], t.meta["success"]) == (
            "collect wood", [False, True], True, True)
    for t in cut:  # the autoreset episode, cut by the reset
        assert (t.instruction, len(t), t.meta["start_step"], t.dones.any()) == ("collect wood", 2, 2, False)
    for t in new:
        assert (t.instruction, len(t), t.meta["start_step"]) == ("drink water", 2, 4)


def test_relabeled_rewards_land_only_in_their_own_reset(venv):
    """Wood collected after the second reset is relabeled into that reset's trajectory, at its own
    step 1, never into the trajectory of the reset before."""
    envs = oir_gym.RecordTrajectories(venv)
    envs.reset(seed=0, options={"instruction": "drink water"})
    for _ in range(3):
        envs.step(NOOP)
    envs.reset(seed=0, options={"instruction": "place table"})
    sc = Scene(venv)
    for i in range(NUM_ENVS):
        sc.block(i, (0, 1), B.TREE)
    sc.apply()
    for a in (A.NOOP, A.DO, A.NOOP):
        envs.step(np.full(NUM_ENVS, a.value))
    results = HindsightRelabeler.rules(k=4).relabel(envs.trajectories())
    before = [r for r in results if r.trajectory.instruction == "drink water"]
    after = [r for r in results if r.trajectory.instruction == "place table"]
    assert len(before) == len(after) == NUM_ENVS
    assert all(len(r.trajectory) == 3 for r in results)
    assert not any(c.text == "collect wood" for r in before for c in r.grounded)
    for r in after:
        assert [c.first_step for c in r.grounded if c.text == "collect wood"] == [1]


def test_a_reset_replaces_a_pending_next_step_autoreset():
    class Envs:  # what the recorder reads from a Gymnasium vector env
        num_envs = 1
        metadata = {"autoreset_mode": "next_step"}

    rec = oir_gym.TrajectoryRecorder(Envs())
    rec.record([1], [0], [True], [False], step_info(1))
    rec.record_reset()  # the caller reset the envs: the next step is a real one of the new episode
    rec.record([2], [0], [False], [False], step_info(1, "place table"))
    first, second = rec.trajectories()
    assert first.actions.tolist() == [1] and second.actions.tolist() == [2]
    assert second.instruction == "place table" and second.meta["start_step"] == 1


def test_the_wrapper_takes_a_vector_env_and_passes_its_attributes_through(venv):
    with pytest.raises(TypeError, match="env=.*must be a gymnasium.vector.VectorEnv"):
        oir_gym.RecordTrajectories(object())
    envs = oir_gym.RecordTrajectories(venv)
    assert envs.buffer is venv.buffer and envs.num_envs == NUM_ENVS and envs.unwrapped is venv
    with pytest.raises(AttributeError, match="_state"):
        envs._state
