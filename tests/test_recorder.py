"""TrajectoryRecorder / rollout: vector env step outputs -> Trajectory objects -> relabeler."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EV, NUM_ENVS, A, B, Scene

import oir_gym
from oir_gym.captions import NUM_EVENTS
from oir_gym.relabel import HindsightRelabeler


def step_info(n: int, instruction: str = "collect wood", events=None, success=None) -> dict:
    ev = np.zeros((n, NUM_EVENTS), bool)
    for i, name in (events or {}).items():
        ev[i, EV[name]] = True
    return {"events": ev, "instruction": np.array([instruction] * n, dtype=object),
            "success": np.array(success if success is not None else [False] * n)}


def test_segments_end_with_their_episode_and_at_max_length():
    rec = oir_gym.TrajectoryRecorder(num_envs=2, max_length=3)
    z = np.zeros(2, bool)
    rec.record([5, 5], [0, 0], z, z, step_info(2, events={0: "collect_wood"}))
    rec.record([1, 2], [1, 0], [True, False], z, step_info(2, success=[True, False]))  # env 0's episode ends
    rec.record([3, 3], [0, 0], z, z, step_info(2, "place table"))  # env 1 reaches max_length
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
    results = HindsightRelabeler(backend="rules", k=4).relabel(trajs)
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
