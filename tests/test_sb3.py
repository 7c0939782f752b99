"""Stable-Baselines3 integration: the VecEnv adapter, the relabeling callback, the agents.

One env configuration (4 envs, 40-step episodes) is shared by the whole module: each distinct
configuration costs a JAX compile of the Craftax step (20-60 s on a small CPU).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import torch  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.vec_env import VecEnvWrapper, VecMonitor, VecNormalize  # noqa: E402

from oir_gym.buffer import InstructionBuffer  # noqa: E402
from oir_gym.event_rates import RATE_NAMES  # noqa: E402
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS  # noqa: E402
from oir_gym.relabel import HindsightRelabeler  # noqa: E402
from oir_gym.reward import first_success_step  # noqa: E402
from oir_gym.sb3 import (  # noqa: E402
    HindsightRelabelCallback, RelabelConfig, RelabelReplayBuffer, SB3VecEnv, find_instruction_env,
)
from oir_gym.vector_env import InstructionCraftax  # noqa: E402
from relabel_config import relabel_config

N_ENVS = 4
HORIZON = 40

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cenv():
    env = InstructionCraftax(num_envs=N_ENVS, seed=0, max_episode_steps=HORIZON)
    yield env
    env.close()


@pytest.fixture
def venv(cenv):
    """The shared env behind a fresh adapter, with a fresh 22-instruction buffer and no pins."""
    cenv.buffer = InstructionBuffer(len(ORIGINAL_INSTRUCTIONS), initial=list(ORIGINAL_INSTRUCTIONS), seed=0)
    cenv.set_instructions(None)
    v = SB3VecEnv(cenv)
    v.seed(0)
    v.reset()
    return v


@pytest.fixture(scope="module")
def rules():
    r = HindsightRelabeler(relabel_config("rules", k=4, cache_size=0))
    yield r
    r.close()


def _run(venv, steps, seed=None, actions=None):
    rng = np.random.default_rng(0 if seed is None else seed)
    out = []
    for t in range(steps):
        a = rng.integers(0, 17, N_ENVS) if actions is None else actions[t]
        out.append(venv.step(a))
    return out


# ------------------------------------------------------------------------------------ adapter


def test_reset_and_step_return_writable_independent_copies(venv):
    obs = venv.reset()
    assert set(obs) == {"obs", "instruction"}
    for k, v in obs.items():
        assert v.shape == (N_ENVS,) + venv.observation_space[k].shape and v.dtype == np.float32
        assert v.flags.writeable and v.flags.owndata
    obs2, rew, dones, infos = venv.step(np.zeros(N_ENVS, np.int64))
    assert rew.dtype == np.float32 and rew.shape == (N_ENVS,) and rew.flags.writeable
    rew += 1.0  # RecurrentPPO adds the bootstrapped value in place
    assert dones.dtype == bool and dones.shape == (N_ENVS,)
    assert isinstance(infos, list) and len(infos) == N_ENVS
    assert len({id(d) for d in infos}) == N_ENVS
    for d in infos:
        assert d["events"].flags.writeable and "TimeLimit.truncated" in d and isinstance(d["instruction"], str)
    infos[0]["events"][:] = True
    assert not infos[1]["events"].all()
    assert not np.shares_memory(obs2["obs"], obs["obs"])
    assert [r["instruction"] for r in venv.reset_infos] == venv.current_instructions()


def test_terminal_observation_and_truncation_exactly_for_finished_envs(venv):
    seen_done = seen_trunc = 0
    for obs, rew, dones, infos in _run(venv, 3 * HORIZON):
        for i, d in enumerate(infos):
            assert ("terminal_observation" in d) == bool(dones[i])
            assert ("episode" in d) == bool(dones[i])
            if dones[i]:
                seen_done += 1
                term = d["terminal_observation"]
                assert set(term) == {"obs", "instruction"} and term["obs"].flags.writeable
                assert term["obs"].shape == obs["obs"][i].shape
                # same-step autoreset: the returned obs is the next episode's first observation
                assert not np.array_equal(term["obs"], obs["obs"][i])
                ep = d["episode"]
                assert set(ep) == {"r", "l", "t"} and 1 <= ep["l"] <= HORIZON
                if d["TimeLimit.truncated"]:  # truncated and not terminated
                    seen_trunc += 1
                    assert ep["l"] == HORIZON and not d["success"] and ep["r"] == 0
                elif ep["l"] < HORIZON:
                    assert not d["TimeLimit.truncated"]  # terminated (success, death)
                assert venv.reset_infos[i]["instruction"] == venv.current_instructions()[i]
            else:
                assert not d["TimeLimit.truncated"]
    assert seen_done >= N_ENVS and seen_trunc >= 1


def test_adapter_matches_the_gymnasium_env(venv, cenv):
    """Same seed and actions: the adapter returns what InstructionCraftax returns (final_obs mapped)."""
    actions = np.random.default_rng(3).integers(0, 17, (2 * HORIZON, N_ENVS))
    cenv.reset(seed=11)
    raw = [cenv.step(a) for a in actions]
    venv.seed(11)
    venv.reset()
    for (o, r, te, tr, inf), (o2, r2, d2, infos) in zip(raw, _run(venv, len(actions), actions=actions)):
        np.testing.assert_array_equal(o["obs"], o2["obs"])
        np.testing.assert_array_equal(r, r2)
        np.testing.assert_array_equal(te | tr, d2)
        for i in range(N_ENVS):
            assert infos[i]["TimeLimit.truncated"] == bool(tr[i] and not te[i])
            if d2[i]:
                np.testing.assert_array_equal(inf["final_obs"][i]["obs"], infos[i]["terminal_observation"]["obs"])


def test_seed_reproduces_and_maps_env_i_to_seed_plus_i(venv):
    assert venv.seed(123) == [123 + i for i in range(N_ENVS)]
    first = venv.reset()
    a = _run(venv, 50, seed=1)
    venv.seed(123)
    again = venv.reset()
    b = _run(venv, 50, seed=1)
    np.testing.assert_array_equal(first["obs"], again["obs"])
    for (o1, r1, d1, i1), (o2, r2, d2, i2) in zip(a, b):
        np.testing.assert_array_equal(o1["obs"], o2["obs"])
        np.testing.assert_array_equal(r1, r2)
        np.testing.assert_array_equal(d1, d2)
        assert [x["instruction"] for x in i1] == [x["instruction"] for x in i2]
    venv.seed(124)
    other = venv.reset()
    assert not np.array_equal(other["obs"], first["obs"])
    venv._seeds = [5, 9, None, None]  # not seed + i: warned, batch seeded with the first
    with pytest.warns(UserWarning, match="not consecutive"):
        venv.reset()


def test_vecmonitor_sees_the_same_episodes(venv):
    class Spy(VecEnvWrapper):
        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            out = self.venv.step_wait()
            self.last = [dict(d) for d in out[3]]
            return out

    spy = Spy(venv)
    mon = VecMonitor(spy)
    mon.reset()
    n = 0
    rng = np.random.default_rng(0)
    for _ in range(2 * HORIZON + 5):
        _, _, dones, infos = mon.step(rng.integers(0, 17, N_ENVS))
        for i in np.flatnonzero(dones):
            assert infos[i]["episode"]["l"] == spy.last[i]["episode"]["l"]
            assert infos[i]["episode"]["r"] == pytest.approx(spy.last[i]["episode"]["r"])
            n += 1
    assert n >= N_ENVS
    assert find_instruction_env(mon)[0] is venv


def test_attrs_methods_and_instruction_pins(venv):
    assert venv.get_attr("num_envs") == [N_ENVS] * N_ENVS
    assert venv.get_attr("obs_mode", indices=[1, 2]) == ["paper", "paper"]
    assert venv.has_attr("encoder") and not venv.has_attr("no_such_attribute")
    assert venv.get_attr("instruction") == venv.current_instructions()
    assert venv.env_method("current_instructions", indices=[0, 3]) == [venv.current_instructions()] * 2
    assert venv.env_is_wrapped(VecMonitor) == [False] * N_ENVS
    assert venv.metadata["render_fps"] == venv.env.metadata["render_fps"]  # for VecVideoRecorder
    venv.set_attr("instruction", "collect wood", indices=[1])
    venv.reset()
    assert venv.get_attr("instruction", indices=1) == ["collect wood"]
    assert venv.reset_infos[1]["instruction"] == "collect wood"
    venv.set_options({"instruction": "place table"})
    venv.reset()
    assert venv.get_attr("instruction") == ["place table"] * N_ENVS
    with pytest.raises(ValueError, match="whole JAX batch"):
        venv.set_attr("info_text", True, indices=[0])
    venv.set_attr("info_text", False)
    venv.set_attr("instruction", None)
    with pytest.raises(IndexError):
        venv.get_attr("num_envs", indices=[N_ENVS])


def test_next_step_autoreset_is_refused(cenv):
    env = InstructionCraftax(num_envs=N_ENVS, autoreset_mode="next_step", encoder=cenv.encoder)
    with pytest.raises(ValueError, match="same_step"):
        SB3VecEnv(env)


# ------------------------------------------------------------------------------------ callback


def test_callback_writes_relabeled_rows_into_the_dqn_replay_buffer(venv, rules):
    """Rewards are 1 exactly at the first grounded step, dones cut the relabeled episode there."""
    model = DQN("MultiInputPolicy", venv, seed=0, learning_starts=10**9, buffer_size=20_000, verbose=0,
                replay_buffer_class=RelabelReplayBuffer, replay_buffer_kwargs=dict(keep_history=True))
    cb = HindsightRelabelCallback(rules, asynchronous=False, segment_length=32, keep_history=True)
    model.learn(1600, callback=cb)
    assert cb.mode == "replay"
    st = cb.stats
    buf = model.replay_buffer
    assert st["results"] > 0 and st["grounded"] > 0 and st["rows_added"] > 0
    assert st["rows_added"] == len(buf.history) and st["rows_pending"] < N_ENVS
    assert st["first_step_mismatch"] == 0
    # training rates of the achievements and progress events over the 1,600 steps, as PQN logs them
    rates = cb.metrics(reset=True)
    assert {f"rate/{n}" for n in RATE_NAMES} <= set(rates)
    assert all(abs(rates[f"rate/{n}"] * 1.6 - round(rates[f"rate/{n}"] * 1.6)) < 1e-3 for n in RATE_NAMES)
    assert not any(k.startswith("rate/") for k in cb.metrics())  # a new window: no step yet

    env = venv.env
    delta = float(env.params.delta)
    groups = defaultdict(list)
    for h in buf.history:
        groups[h["tag"]].append(h)
    n_success = 0
    for (tid, text), rows in groups.items():
        rows.sort(key=lambda h: h["t"])
        traj = cb.trajectories[tid]
        emb = env.encoder.encode(text)
        first = first_success_step(traj.events, env.registry.similarity_to_events(emb[None])[0], delta)
        if rows[-1]["t"] < first:  # the tail of this relabeled episode is still pending
            continue
        assert first == rows[0]["first_step"] >= 0
        assert [h["t"] for h in rows] == list(range(first + 1)), "episode cut at the first grounded step"
        for h in rows:
            p, c, t = h["pos"], h["col"], h["t"]
            assert buf.rewards[p, c] == (1.0 if t == first else 0.0)
            assert buf.dones[p, c] == (1.0 if t == first else 0.0)
            assert buf.timeouts[p, c] == 0.0
            np.testing.assert_allclose(buf.observations["instruction"][p, c], emb, atol=1e-6)
            np.testing.assert_allclose(buf.next_observations["instruction"][p, c], emb, atol=1e-6)
            np.testing.assert_array_equal(buf.observations["obs"][p, c], traj.meta["obs"]["obs"][t])
            np.testing.assert_array_equal(buf.next_observations["obs"][p, c], traj.meta["obs"]["obs"][t + 1])
            assert buf.actions[p, c, 0] == traj.actions[t]
        n_success += 1
    assert n_success > 0
    # every reward-1 row in the buffer beyond the agent's own successes is a relabeled first success
    assert st["success_rows"] == sum(1 for h in buf.history if h["t"] == h["first_step"])
    # the instruction buffer learned the grounded candidates and their relabeled returns
    assert st["buffer_inserted"] > 0
    grounded_texts = {text for (_, text) in groups}
    assert any(venv.buffer.stats(t).count > 0 for t in grounded_texts)
    assert grounded_texts & set(venv.buffer.contents())


@pytest.mark.parametrize("done, timeout, stored_timeout", [(True, True, True), (True, False, False),
                                                            (False, True, False)])
def test_an_ungrounded_replay_keeps_the_segment_end(venv, done, timeout, stored_timeout):
    """first_step -1: the whole segment with reward 0; its end is a terminal unless it was a time
    limit or the original instruction's success (``timeout``): then SB3 bootstraps from the next
    observation instead of learning a value of 0."""
    buf = RelabelReplayBuffer(100, venv.observation_space, venv.action_space, n_envs=1)
    T = 5
    obs = {"obs": np.arange(T + 1, dtype=np.float32)[:, None] * np.ones((1, venv.observation_space["obs"].shape[0]),
                                                                       np.float32)}
    emb = np.full(venv.observation_space["instruction"].shape, 0.1, np.float32)
    assert buf.add_relabeled(obs, np.arange(T), emb, -1, done=done, timeout=timeout) == T
    assert buf.pos == T and buf.stats() == {"rows_added": T, "success_rows": 0, "rows_pending": 0}
    assert buf.dones[:T, 0].tolist() == [0.0] * (T - 1) + [float(done)]
    assert buf.timeouts[:T, 0].tolist() == [0.0] * (T - 1) + [float(stored_timeout)]
    assert not buf.rewards[:T].any()
    np.testing.assert_array_equal(buf.next_observations["obs"][:T, 0, 0], np.arange(1, T + 1))
    np.testing.assert_allclose(buf.observations["instruction"][:T, 0], np.broadcast_to(emb, (T, emb.size)))


def test_relabeled_rows_stop_at_the_first_success_and_fill_rows_of_n_envs(venv):
    buf = RelabelReplayBuffer(100, venv.observation_space, venv.action_space, n_envs=N_ENVS, keep_history=True)
    D = venv.observation_space["obs"].shape[0]
    emb = np.zeros(venv.observation_space["instruction"].shape, np.float32)
    seg = {"obs": np.zeros((7, D), np.float32)}
    assert buf.add_relabeled(seg, np.zeros(6), emb, 2, tag="a") == 3  # steps 0..2, success at 2
    assert buf.pos == 0 and buf.pending_transitions == 3  # waits for a full row of N_ENVS
    assert buf.add_relabeled(seg, np.zeros(6), emb, 0, tag="b") == 1
    assert buf.pos == 1 and buf.pending_transitions == 0
    assert buf.rewards[0].tolist() == [0.0, 0.0, 1.0, 1.0] and buf.dones[0].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert [(h["tag"], h["t"], h["col"]) for h in buf.history] == [("a", 0, 0), ("a", 1, 1), ("a", 2, 2), ("b", 0, 3)]
    with pytest.raises(ValueError, match="first_step=6 outside"):
        buf.add_relabeled(seg, np.zeros(6), emb, 6)
    with pytest.raises(ValueError, match="7 observations"):
        buf.add_relabeled({"obs": seg["obs"][:3]}, np.zeros(6), emb, -1)


def test_relabeled_trajectories_follow_the_agent_experience(venv, rules):
    """Segment observations chain: obs[t + 1] of a segment is the agent's next observation at t."""
    model = DQN("MultiInputPolicy", venv, seed=1, learning_starts=10**9, buffer_size=5_000, verbose=0,
                replay_buffer_class=RelabelReplayBuffer, replay_buffer_kwargs=dict(keep_history=True))
    cb = HindsightRelabelCallback(rules, asynchronous=True, segment_length=16, keep_history=True)
    model.learn(400, callback=cb)
    assert cb.stats["results"] == cb.stats["submitted"] > 0  # async results all collected at the end
    buf = model.replay_buffer
    agent_rows = buf.pos - len(buf.history) // N_ENVS
    assert agent_rows >= 100
    # each trajectory's first observation appears among the agent's stored observations of its env
    relabeled = {h["pos"] for h in buf.history}
    stored = {(c, buf.observations["obs"][p, c].tobytes())
              for p in range(buf.pos) if p not in relabeled for c in range(N_ENVS)}
    for tid, traj in list(cb.trajectories.items())[:10]:
        assert (traj.env_id, traj.meta["obs"]["obs"][0].tobytes()) in stored


def test_callback_curriculum_mode_leaves_the_rollout_alone(venv, rules):
    from sb3_contrib import RecurrentPPO

    model = RecurrentPPO("MultiInputLstmPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0,
                         policy_kwargs=dict(lstm_hidden_size=32, net_arch=dict(pi=[32], vf=[32])))
    cb = HindsightRelabelCallback(rules, asynchronous=False, segment_length=32)
    model.learn(256, callback=cb)
    assert cb.mode == "curriculum"
    assert cb.stats["results"] > 0 and cb.stats["rows_added"] == 0
    with pytest.raises(TypeError, match="replay_buffer_class=oir_gym.sb3.RelabelReplayBuffer"):
        HindsightRelabelCallback(rules, mode="replay").init_callback(model)


def test_replay_needs_the_relabel_replay_buffer(venv, rules):
    """A DQN with SB3's plain DictReplayBuffer cannot take relabeled rows: said before training."""
    model = DQN("MultiInputPolicy", venv, learning_starts=10**9, buffer_size=1_000)
    with pytest.raises(TypeError, match="RelabelReplayBuffer"):
        HindsightRelabelCallback(rules).init_callback(model)


def test_replay_refuses_a_vecnormalize_env(venv, rules):
    """Relabeled rows would be stored unnormalised beside SB3's normalised ones: refused before training."""
    normed = VecNormalize(venv, norm_obs=False, norm_reward=True)
    model = DQN("MultiInputPolicy", normed, learning_starts=10**9, buffer_size=1_000,
                replay_buffer_class=RelabelReplayBuffer)
    with pytest.raises(TypeError, match="VecNormalize is not supported"):
        HindsightRelabelCallback(rules).init_callback(model)
    HindsightRelabelCallback(rules, mode="curriculum").init_callback(model)  # no rows stored: fine


@pytest.mark.parametrize("kwargs, match", [
    (dict(mode="her"), "mode='her'"), (dict(insert="some"), "insert='some'"),
    (dict(segment_length=0), "segment_length=0"), (dict(submit_batch=2.5), "submit_batch=2.5"),
    (dict(end_timeout=-1), "end_timeout=-1"), (dict(max_candidates=0), "max_candidates=0"),
])
def test_relabel_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RelabelConfig(**kwargs)


def test_callback_options_override_the_config_and_unknown_ones_are_refused(rules):
    cb = HindsightRelabelCallback(rules, RelabelConfig(segment_length=64), asynchronous=False)
    assert cb.config == RelabelConfig(segment_length=64, asynchronous=False)
    with pytest.raises(TypeError, match="wait_on_end"):
        HindsightRelabelCallback(rules, wait_on_end=True)


# ------------------------------------------------------------------------------------ agents


@pytest.mark.parametrize("algo", ["dqn", "qrdqn", "recurrent_ppo"])
def test_short_training_with_callback_then_save_and_load(algo, venv, rules, tmp_path):
    from agents.sb3 import models as sb3_agents

    small = {
        "dqn": dict(learning_starts=500, buffer_size=10_000, batch_size=32, target_update_interval=500,
                    policy_kwargs=dict(net_arch=[64, 64])),
        "qrdqn": dict(learning_starts=500, buffer_size=10_000, batch_size=32, target_update_interval=500,
                      policy_kwargs=dict(n_quantiles=10, net_arch=[64, 64])),
        "recurrent_ppo": dict(n_steps=64, n_epochs=1, policy_kwargs=dict(lstm_hidden_size=64, net_arch=dict(pi=[64], vf=[64]))),
    }[algo]
    # behaviour, not learning: a few relabeled segments (64 steps x 4 envs each) and some gradient steps
    # past learning_starts
    steps = 768 if algo == "recurrent_ppo" else 1024
    model = sb3_agents.make_model(algo, venv, seed=0, hyperparams=small)
    cb = sb3_agents.make_relabel_callback(rules, algo, segment_length=64)
    t0 = time.time()
    model.learn(steps, callback=cb)
    assert model.num_timesteps >= steps
    assert cb.stats["results"] > 0
    if algo != "recurrent_ppo":
        assert cb.stats["rows_added"] > 0
    print(f"{algo}: {steps} steps in {time.time() - t0:.1f}s, stats {cb.stats}")

    obs = venv.reset()
    policy = sb3_agents.SB3Policy(model)
    a1, s1 = policy(obs, None, np.ones(N_ENVS, bool))
    a1b, _ = policy(obs, s1, np.zeros(N_ENVS, bool))
    model.save(tmp_path / "m.zip")
    loaded = sb3_agents.load_model(algo, tmp_path / "m.zip", venv)
    p2 = sb3_agents.SB3Policy(loaded)
    a2, s2 = p2(obs, None, np.ones(N_ENVS, bool))
    a2b, _ = p2(obs, s2, np.zeros(N_ENVS, bool))
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(a1b, a2b)
    assert a1.shape == (N_ENVS,)
    if algo == "recurrent_ppo":
        assert s1 is not None and np.asarray(s1[0]).shape[1] == N_ENVS
    # a further learn() on the loaded model continues the step count
    loaded.learn(200, reset_num_timesteps=False)
    assert loaded.num_timesteps >= model.num_timesteps + 200


def test_sb3_policy_keeps_and_resets_lstm_state(venv):
    from agents.sb3 import models as sb3_agents

    model = sb3_agents.make_model("recurrent_ppo", venv, hyperparams=dict(
        n_steps=16, policy_kwargs=dict(lstm_hidden_size=16, net_arch=dict(pi=[16], vf=[16]))))
    pol = sb3_agents.SB3Policy(model)
    obs = venv.reset()
    _, s0 = pol(obs, None, np.ones(N_ENVS, bool))
    _, s1 = pol(obs, s0, np.zeros(N_ENVS, bool))
    _, s_reset = pol(obs, s1, np.ones(N_ENVS, bool))
    assert not np.allclose(s0[0], s1[0])  # the state is carried
    np.testing.assert_allclose(s_reset[0], s0[0], atol=1e-6)  # episode_start resets it


def test_callback_in_bound_mode_pays_at_the_bound_step_and_binds_buffer_instructions(venv):
    """Event-bound grounding (oir_gym.grounding): a relabeled copy ends at its candidate's bound step
    (from the candidate's own rows, no second cosine), and the buffer's bound instructions get their
    indicator rows in the env's table."""
    from oir_gym.captions import NUM_EVENTS
    from oir_gym.grounding import indicator_row

    bound = HindsightRelabeler(relabel_config("rules", k=4, cache_size=0, grounding="bound"), encoder=venv.env.encoder)
    model = DQN("MultiInputPolicy", venv, seed=0, learning_starts=10**9, buffer_size=20_000, verbose=0,
                replay_buffer_class=RelabelReplayBuffer, replay_buffer_kwargs=dict(keep_history=True))
    cb = HindsightRelabelCallback(bound, asynchronous=False, segment_length=32, keep_history=True)
    model.learn(1200, callback=cb)
    st = cb.stats
    assert st["grounded"] > 0 and st["rows_added"] > 0 and st["first_step_mismatch"] == 0
    steps = {}
    for tid, traj in cb.trajectories.items():  # the rules relabeler is deterministic: the same candidates
        for c in bound.relabel([traj])[0].candidates:
            steps[(tid, c.text)] = c.binding
    firsts = {h["tag"]: h["first_step"] for h in model.replay_buffer.history}
    assert firsts
    for tag, first in firsts.items():
        assert first == steps[tag].step >= 0
    env = venv.env
    bound_texts = [t for t in venv.buffer.contents() if t in env.registry.bindings]
    assert bound_texts, "no bound instruction reached the buffer"
    for t in bound_texts:
        row = env.registry.find([t])[t]
        np.testing.assert_array_equal(env.registry.event_sim[row],
                                      indicator_row(env.registry.bindings[t].final, NUM_EVENTS))
    assert not set(ORIGINAL_INSTRUCTIONS) & set(env.registry.bindings)  # the originals keep their rows
    bound.close()
