"""PQN agent and OIR loop: targets, relabeled batches, config validation, training and resume."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from agents.pqn import network as pqn  # noqa: E402
from agents.pqn.config import PQNConfig, TrainConfig, preset  # noqa: E402
from agents.pqn.trainer import build_batch  # noqa: E402
from agents.pqn.oir_method import balanced_choice  # noqa: E402
from oir_gym.captions import NUM_EVENTS, VOCAB  # noqa: E402


def test_q_lambda_targets_match_hand_computation():
    # T=3, one env; gamma=0.5, lambda=0.5; done after step 1 (index 1).
    r = jnp.array([[1.0], [0.0], [2.0]])
    d = jnp.array([[False], [True], [False]])
    qn = jnp.array([[4.0], [8.0], [6.0]])  # max_a Q(s_{t+1}, a)
    g = pqn.q_lambda_targets(r, d, qn, gamma=0.5, lam=0.5)
    # G2 = 2 + 0.5 * (0.5*6 + 0.5*6) = 5   (G_T bootstraps with max Q(s_T) = 6)
    # G1 = 0 + 0 (done)                     = 0
    # G0 = 1 + 0.5 * (0.5*4 + 0.5*G1) = 2
    np.testing.assert_allclose(np.asarray(g)[:, 0], [2.0, 0.0, 5.0], rtol=1e-6)


def test_q_lambda_with_lambda_one_is_monte_carlo_return():
    r = jnp.array([[0.0], [0.0], [1.0]])
    d = jnp.array([[False], [False], [True]])
    qn = jnp.full((3, 1), 100.0)  # ignored with lambda=1 except at the end, which is done
    g = pqn.q_lambda_targets(r, d, qn, gamma=0.9, lam=1.0)
    np.testing.assert_allclose(np.asarray(g)[:, 0], [0.81, 0.9, 1.0], rtol=1e-6)


def test_q_lambda_cut_steps_take_their_own_q_value_and_earlier_steps_bootstrap_from_it():
    # T=3, gamma=0.5, lambda=0.5; step 1 is cut (the episode ended there for another instruction)
    r = jnp.array([[1.0], [0.0], [2.0]])
    d = jnp.array([[False], [True], [False]])
    qn = jnp.array([[4.0], [8.0], [6.0]])
    cuts = jnp.array([[False], [True], [False]])
    q_taken = jnp.array([[0.0], [3.0], [0.0]])
    g = pqn.q_lambda_targets(r, d, qn, gamma=0.5, lam=0.5, cuts=cuts, q_taken=q_taken)
    # G2 = 5 as without the cut; G1 = Q(s1, a1) = 3 instead of 0 (done);
    # G0 = 1 + 0.5 * (0.5*4 + 0.5*3) = 2.75
    np.testing.assert_allclose(np.asarray(g)[:, 0], [2.75, 3.0, 5.0], rtol=1e-6)
    no_cut = pqn.q_lambda_targets(r, d, qn, gamma=0.5, lam=0.5, cuts=jnp.zeros_like(cuts), q_taken=q_taken)
    np.testing.assert_allclose(np.asarray(no_cut), np.asarray(pqn.q_lambda_targets(r, d, qn, 0.5, 0.5)))


def test_epsilon_schedule_is_linear_then_flat():
    cfg = PQNConfig(eps_decay=0.1, num_envs=4, num_steps=8)
    assert float(pqn.epsilon(cfg, 1000, 0)) == pytest.approx(1.0)
    assert float(pqn.epsilon(cfg, 1000, 50)) == pytest.approx(0.55)
    assert float(pqn.epsilon(cfg, 1000, 100)) == pytest.approx(0.1)
    assert float(pqn.epsilon(cfg, 1000, 900)) == pytest.approx(0.1)


def test_paper_preset_matches_the_paper_table():
    cfg = preset("paper").validate()
    p = cfg.pqn
    assert (cfg.run.total_timesteps, p.num_envs, p.num_steps) == (10_000_000, 64, 128)
    assert (p.num_minibatches, p.num_epochs, p.lr, p.gamma, p.lam) == (4, 8, 1e-5, 0.99, 0.5)
    assert (p.eps_start, p.eps_finish, p.eps_decay, p.hidden_size) == (1.0, 0.1, 0.1, 512)
    assert (cfg.oir.instruction_buffer_size, cfg.env.delta, p.max_grad_norm) == (10, 0.9, 0.5)


def _synthetic_rollouts(T=6, E=2, D=3, emb_dim=4):
    events = np.zeros((2, T, E, NUM_EVENTS), bool)  # [L=2 rollouts, T, E, Ev]
    wood, table = VOCAB.event_id("collect_wood"), VOCAB.event_id("place_table")
    events[0, 1, 0, wood] = True
    events[0, 4, 0, wood] = True
    events[0, 3, 1, table] = True
    events[1, 2, 1, wood] = True  # previous rollout
    done = np.zeros((2, T, E), bool)
    done[0, 5, 1] = True
    z = lambda *s: jnp.zeros(s)  # noqa: E731
    trajs = dict(
        obs=jnp.asarray(np.random.default_rng(0).random((2, T, E, D)), jnp.float32),
        instr=jnp.zeros((2, T, E), jnp.int32), action=jnp.ones((2, T, E), jnp.int32), reward=z(2, T, E),
        done=jnp.asarray(done), reset=jnp.zeros((2, T, E), bool), events=jnp.asarray(events),
        last_obs=z(2, E, D), last_instr=z(2, E, emb_dim), carry0=(z(2, E, 5), z(2, E, 5)),
    )
    return trajs


def test_relabeled_rows_get_reward_and_termination_at_matching_steps():
    cfg = TrainConfig().replace(**{"pqn.num_envs": 2, "pqn.num_steps": 6, "oir.k": 2, "pqn.num_minibatches": 2,
                                   "env.delta": 0.9})
    trajs = _synthetic_rollouts()
    sim_wood = np.full(NUM_EVENTS, 0.1, np.float32)
    sim_wood[VOCAB.event_id("collect_wood")] = 0.95
    sim_table = np.full(NUM_EVENTS, 0.1, np.float32)
    sim_table[VOCAB.event_id("place_table")] = 0.99
    slots = dict(
        src=jnp.array([0, 0, 1, 0]), env=jnp.array([0, 1, 1, 0]),
        emb=jnp.ones((4, 4)) * jnp.arange(4)[:, None], final=jnp.asarray(np.stack([sim_wood, sim_table, sim_wood, sim_table])),
        pre=-jnp.ones((4, NUM_EVENTS)),
        valid=jnp.array([True, True, True, False]),
    )
    table_emb = jnp.zeros((1, 4))
    b = build_batch(cfg, trajs, table_emb, slots)
    assert b["rewards"].shape == (6, 2 + 4)
    r = np.asarray(b["rewards"])
    d = np.asarray(b["dones"])
    c = np.asarray(b["cuts"])
    # row 2: env 0 of the current rollout relabeled "collect wood": its first wood (step 1) pays and
    # ends the relabeled episode; the rest of that original episode, second wood included, has no target
    np.testing.assert_array_equal(r[:, 2], [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(d[:, 2], [0, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(c[:, 2], [0, 0, 1, 1, 1, 1])
    # row 3: env 1 relabeled "place table": reward at step 3; the original done at step 5 is kept
    np.testing.assert_array_equal(r[:, 3], [0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(d[:, 3], [0, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(c[:, 3], [0, 0, 0, 0, 1, 1])
    # with relabel_every_match, every wood pays as a relabeled episode of its own, nothing is cut
    b_all = build_batch(cfg.replace(**{"oir.relabel_every_match": True}), trajs, table_emb, slots)
    np.testing.assert_array_equal(np.asarray(b_all["rewards"])[:, 2], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(np.asarray(b_all["dones"])[:, 2], [0, 1, 0, 0, 1, 0])
    assert not np.asarray(b_all["cuts"]).any()
    # row 4 comes from the previous rollout (env 1 collected wood at step 2)
    np.testing.assert_array_equal(r[:, 4], [0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(np.asarray(b["obs"])[:, 4], np.asarray(trajs["obs"])[1, :, 1])
    # the relabeled rows carry the candidate embedding; padding rows have weight 0
    np.testing.assert_allclose(np.asarray(b["instr"])[:, 3], np.ones((6, 4)))
    np.testing.assert_array_equal(np.asarray(b["weights"]), [1, 1, 1, 1, 1, 0])
    # original rows are untouched
    np.testing.assert_array_equal(r[:, :2], 0)


def test_relabeled_rows_are_cut_where_the_original_instruction_succeeded_and_they_did_not_pay():
    """The env reset after the original instruction's success: for another instruction that step is
    no terminal (a 'place table' copy must not learn that collecting the wood ends everything)."""
    cfg = TrainConfig().replace(**{"pqn.num_envs": 2, "pqn.num_steps": 6, "oir.k": 2, "pqn.num_minibatches": 2,
                                   "env.delta": 0.9})
    trajs = _synthetic_rollouts()
    success = np.zeros((2, 6, 2), bool)
    success[0, 1, 0] = True  # env 0's own instruction ("collect wood") paid at its first wood...
    done = np.asarray(trajs["done"]).copy()
    done[0, 1, 0] = True  # ...and ended the episode there
    done[0, 2, 1] = True  # env 1 died at step 2 (done without success)
    reset = np.zeros((2, 6, 2), bool)
    reset[0, 2, 0] = reset[0, 3, 1] = True  # the steps after those ends start new episodes
    trajs = dict(trajs, done=jnp.asarray(done), success=jnp.asarray(success), reset=jnp.asarray(reset))
    sim = {}
    for name in ("collect_wood", "place_table", "defeat_zombie"):
        sim[name] = np.full(NUM_EVENTS, 0.1, np.float32)
        sim[name][VOCAB.event_id(name)] = 0.95
    slots = dict(src=jnp.array([0, 0, 0, 0]), env=jnp.array([0, 0, 1, 0]), emb=jnp.ones((4, 4)),
                 final=jnp.asarray(np.stack([sim["collect_wood"], sim["defeat_zombie"], sim["place_table"],
                                             sim["defeat_zombie"]])), pre=-jnp.ones((4, NUM_EVENTS)),
                 valid=jnp.array([True, True, True, False]))
    b = build_batch(cfg, trajs, jnp.zeros((1, 4)), slots)
    cuts = np.asarray(b["cuts"])
    assert not cuts[:, :2].any()  # original rows: their own success is a true terminal
    # "collect wood" copy pays at that step (terminal, no cut), and again in the next episode, whose
    # last step then has no target
    np.testing.assert_array_equal(cuts[:, 2], [0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(b["rewards"])[:, 2], [0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(cuts[:, 3], [0, 1, 0, 0, 0, 0])  # other instruction: cut at step 1
    np.testing.assert_array_equal(np.asarray(b["dones"])[:, 3], [0, 1, 0, 0, 0, 0])  # (no bootstrap across the reset)
    # "place table" on env 1: the death at step 2 stays terminal for every instruction (no cut);
    # the table at step 3 pays, and the rest of that episode has no target
    np.testing.assert_array_equal(cuts[:, 4], [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(np.asarray(b["dones"])[:, 4], [0, 0, 1, 1, 0, 1])  # (the original end at 5 kept)


def _terminal_batch(seed: int, **cfg_kw):
    """A small network and a fixed batch of T=8 steps x N=4 rows in which every step is terminal:
    the targets are the rewards, so the regression problem does not move with the parameters."""
    cfg = PQNConfig(num_envs=4, num_steps=8, hidden_size=16, lr=1e-2, **cfg_kw)
    net = pqn.make_network(cfg, 17)
    ts = pqn.create_train_state(jax.random.PRNGKey(0), cfg, net, 5, 3, num_updates=100)
    rng = np.random.default_rng(seed)
    T, N = 8, 4
    batch = dict(
        obs=jnp.asarray(rng.random((T, N, 5)), jnp.float32), instr=jnp.ones((T, N, 3)),
        next_obs_last=jnp.zeros((N, 5)), next_instr_last=jnp.ones((N, 3)),
        actions=jnp.asarray(rng.integers(0, 17, (T, N))), rewards=jnp.asarray(rng.random((T, N)) < 0.3, jnp.float32),
        dones=jnp.ones((T, N), bool), resets=jnp.zeros((T, N), bool), weights=jnp.ones(N), carry0=net.initial_carry(N),
    )
    return cfg, ts, batch


def test_cut_steps_add_nothing_to_the_loss():
    cfg, ts, batch = _terminal_batch(1, num_minibatches=1, num_epochs=1)
    T, N = batch["rewards"].shape
    loss = lambda b: float(pqn.update(ts, cfg, jax.random.PRNGKey(0), b)[1]["loss"])  # noqa: E731
    assert loss(dict(batch, cuts=jnp.zeros((T, N), bool))) == pytest.approx(loss(batch))
    assert loss(dict(batch, cuts=jnp.ones((T, N), bool))) == 0.0
    # with every step terminal, a cut step's reward cannot change the loss
    cut = jnp.zeros((T, N), bool).at[3, 2].set(True)
    flipped = batch["rewards"].at[3, 2].set(1.0 - batch["rewards"][3, 2])
    assert loss(dict(batch, cuts=cut)) == pytest.approx(loss(dict(batch, cuts=cut, rewards=flipped)))
    assert loss(batch) != pytest.approx(loss(dict(batch, rewards=flipped)))


def test_update_reduces_loss_on_a_fixed_batch():
    cfg, ts, batch = _terminal_batch(0, num_minibatches=2, num_epochs=4, lr_linear_decay=False)
    upd = jax.jit(lambda ts, k: pqn.update(ts, cfg, k, batch))
    losses = []
    for i in range(15):
        ts, m = upd(ts, jax.random.PRNGKey(i))
        losses.append(float(m["loss"]))
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.slow  # the paper's LSTM 512 over a 16 x 64 batch: ~20 s on 2 cores
def test_initial_q_values_are_small_next_to_the_unit_reward():
    # Rewards are 0/1 and an episode pays at most once, so true Q-values lie in [0, 1]. The Q head
    # reads the tanh-bounded LSTM output; an initial max over 17 actions near 2 (what a
    # LayerNorm+ReLU head gave) makes the bootstrapped targets start far above any real return,
    # and the greedy policy never learned even "collect wood" at the paper's learning rate.
    cfg = PQNConfig(hidden_size=512)
    net = pqn.make_network(cfg, 17)
    ts = pqn.create_train_state(jax.random.PRNGKey(0), cfg, net, 888, 384, num_updates=100)
    rng = np.random.default_rng(0)
    T, N = 16, 64
    obs = jnp.asarray(rng.random((T, N, 888)) < 0.05, jnp.float32)
    instr = jnp.asarray(rng.normal(size=(T, N, 384)) / np.sqrt(384), jnp.float32)
    _, q = net.apply(ts.params, net.initial_carry(N), obs, instr, jnp.zeros((T, N), bool))
    assert float(jnp.abs(q).max(-1).mean()) < 0.5


def test_seeds_are_initialised_one_matrix_per_qr_call_with_a_vmaps_values():
    # jaxlib 0.10's CPU QR of a batch of matrices splits the batch over XLA's intra-op pool and
    # blocks the calling pool thread until the pieces finish; the LSTM's four orthogonal
    # initialisers run side by side, so on a 2-core CPU (2 pool threads) a vmap over 3 seeds waited
    # for ever (the paper and fast presets' first update). The rule: no QR call gets a batch.
    cfg = PQNConfig(hidden_size=32)
    net = pqn.make_network(cfg, 17)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    init = jax.jit(lambda ks: pqn.create_train_states(ks, cfg, net, 5, 3, num_updates=10))
    hlo = init.lower(keys).as_text()
    qr_calls = [line for line in hlo.splitlines() if "custom_call" in line and "geqrf" in line]
    if jax.default_backend() == "cpu":
        assert qr_calls  # the gates' orthogonal hidden-to-hidden kernels (LAPACK geqrf)
    assert all('num_batch_dims = "0"' in line for line in qr_calls), qr_calls
    # the values of a vmap (at this size jaxlib runs the batch on one thread: no hazard here)
    batched = jax.jit(jax.vmap(lambda k: pqn.create_train_state(k, cfg, net, 5, 3, num_updates=10)))(keys)
    states = init(keys)
    for got, want in ((states.params, batched.params), (states.opt_state, batched.opt_state)):
        jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)


def test_balanced_choice_keeps_the_rare_event_that_first_k_would_drop():
    # every trajectory woke up and collected wood first; one also placed a table, late
    trajs = [["wake up", "collect wood", "collect sapling"], ["wake up", "collect wood", "place table"],
             ["wake up", "collect wood"]]
    first_k = [t[:2] for t in trajs]
    assert all("place table" not in t for t in first_k)
    chosen = balanced_choice(trajs, 2)
    assert "place table" in chosen[1]
    # round 1: wake up, then collect wood (wake up has a row), then wake up (a tie, first in order);
    # round 2: sapling and table (no rows yet), and the last trajectory's only candidate left
    assert chosen == [["wake up", "collect sapling"], ["collect wood", "place table"], ["wake up", "collect wood"]]
    assert balanced_choice(trajs, 0) == [[], [], []]
    assert balanced_choice([], 3) == []


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdefg"), max_size=6, unique=True), max_size=8), st.integers(0, 5))
def test_balanced_choice_fills_each_trajectory_from_its_own_candidates(trajs, k):
    chosen = balanced_choice(trajs, k)
    assert len(chosen) == len(trajs)
    for cands, picks in zip(trajs, chosen):
        assert len(picks) == min(k, len(cands)) and len(set(picks)) == len(picks) and set(picks) <= set(cands)


def _lstm_inputs(hidden=32, T=12, B=5):
    k = jax.random.PRNGKey(3)
    obs = jax.random.normal(k, (T, B, 10))
    instr = jax.random.normal(jax.random.PRNGKey(4), (T, B, 384))
    resets = jax.random.uniform(jax.random.PRNGKey(5), (T, B)) < 0.2
    carry = (jax.random.normal(jax.random.PRNGKey(6), (B, hidden)), jax.random.normal(jax.random.PRNGKey(7), (B, hidden)))
    return carry, obs, instr, resets


def test_sequence_lstm_has_the_parameters_and_outputs_of_flax_optimized_lstm_cell():
    """The network's LSTM projects every step's input before its scan; checkpoints written with
    flax's OptimizedLSTMCell under nn.scan (the earlier network) must load and act the same."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from update_cost import cell_network  # the earlier network (bench/update_cost.py times both)

    carry, obs, instr, resets = _lstm_inputs()
    new, old = pqn.QNetwork(17, 32, 1, True, 4), cell_network(17, 32, 4)
    p_new = new.init(jax.random.PRNGKey(0), carry, obs, instr, resets)
    p_old = old.init(jax.random.PRNGKey(0), carry, obs, instr, resets)
    assert jax.tree_util.tree_structure(p_new) == jax.tree_util.tree_structure(p_old)
    for a, b in zip(jax.tree_util.tree_leaves(p_new), jax.tree_util.tree_leaves(p_old)):
        np.testing.assert_array_equal(a, b)  # same names, shapes and initial values
    (c1, h1), q1 = new.apply(p_new, carry, obs, instr, resets)
    (c2, h2), q2 = old.apply(p_new, carry, obs, instr, resets)
    for a, b in ((q1, q2), (c1, c2), (h1, h2)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    g1 = jax.grad(lambda p: new.apply(p, carry, obs, instr, resets)[1].sum())(p_new)
    g2 = jax.grad(lambda p: old.apply(p, carry, obs, instr, resets)[1].sum())(p_new)
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_bfloat16_compute_keeps_float32_parameters_and_close_q_values():
    """pqn.compute_dtype bfloat16 casts only the matmuls' inputs: parameters, carry and Q-values
    stay float32, and Q-values stay within bfloat16 rounding of the float32 network's."""
    carry, obs, instr, resets = _lstm_inputs()
    f32 = pqn.make_network(PQNConfig(hidden_size=32), 17)
    bf16 = pqn.make_network(PQNConfig(hidden_size=32, compute_dtype="bfloat16"), 17)
    params = f32.init(jax.random.PRNGKey(0), carry, obs, instr, resets)
    p_bf16 = bf16.init(jax.random.PRNGKey(0), carry, obs, instr, resets)
    assert {x.dtype for x in jax.tree_util.tree_leaves(p_bf16)} == {jnp.dtype("float32")}
    (c, h), q = bf16.apply(params, carry, obs, instr, resets)
    _, q32 = f32.apply(params, carry, obs, instr, resets)
    assert q.dtype == c.dtype == h.dtype == jnp.float32
    err = float(jnp.abs(q - q32).max())
    assert 0 < err < 0.05 * float(jnp.abs(q32).max()) + 1e-3  # it does change the maths, a little


def test_unknown_compute_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"pqn.compute_dtype='float16'; expected one of \('float32', 'bfloat16'\)"):
        TrainConfig().replace(**{"pqn.compute_dtype": "float16"}).validate()


def _sequential_q_lambda(rewards, dones, next_q_max, gamma, lam, cuts, q_taken):
    """The Q(lambda) recursion written as the definition reads, one step at a time backwards."""
    r, d, qn, c, qa = (np.asarray(x, np.float64) for x in (rewards, dones, next_q_max, cuts, q_taken))
    g = np.zeros_like(r)
    g_next = qn[-1]
    for t in range(len(r) - 1, -1, -1):
        g[t] = np.where(c[t] > 0, qa[t], r[t] + gamma * (1 - d[t]) * ((1 - lam) * qn[t] + lam * g_next))
        g_next = g[t]
    return g


_JIT_TARGETS = jax.jit(pqn.q_lambda_targets)  # gamma and lambda traced: one compile per shape


@settings(max_examples=40, deadline=None)  # few shapes: each new one compiles the scan again
@given(T=st.sampled_from([1, 2, 9, 40]), B=st.sampled_from([1, 3]), gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0),
       seed=st.integers(0, 2**16), p_cut=st.sampled_from([0.0, 0.2, 1.0]))
def test_q_lambda_targets_follow_the_step_by_step_recursion(T, B, gamma, lam, seed, p_cut):
    rng = np.random.default_rng(seed)
    r = (rng.random((T, B)) < 0.2).astype(np.float32)
    d = rng.random((T, B)) < 0.1
    qn, qa = rng.normal(size=(T, B)).astype(np.float32), rng.normal(size=(T, B)).astype(np.float32)
    cuts = rng.random((T, B)) < p_cut
    got = _JIT_TARGETS(jnp.asarray(r), jnp.asarray(d), jnp.asarray(qn), gamma, lam, jnp.asarray(cuts), jnp.asarray(qa))
    np.testing.assert_allclose(np.asarray(got), _sequential_q_lambda(r, d, qn, gamma, lam, cuts, qa), atol=1e-5)


@pytest.mark.parametrize("unroll", [1, 3])
def test_lstm_written_out_gradient_equals_autodiff_of_the_scan(unroll):
    T, B, F, H = 11, 5, 6, 8
    k = jax.random.split(jax.random.PRNGKey(3), 4)
    x, resets = jax.random.normal(k[0], (T, B, F)), jax.random.uniform(k[1], (T, B)) < 0.25
    carry = (jax.random.normal(k[2], (B, H)), jax.random.normal(k[3], (B, H)))
    hoisted, autodiff = pqn.SequenceLSTM(H, unroll, grad="hoisted"), pqn.SequenceLSTM(H, unroll, grad="autodiff")
    params = hoisted.init(k[0], carry, x, resets)

    def loss(lstm, params, carry):  # every output used: the sequence and the final carry
        (c, h), hs = lstm.apply(params, carry, x, resets)
        return jnp.sum(jnp.sin(hs)) + jnp.sum(c ** 2) + jnp.sum(h)

    (lh, gh), (la, ga) = (jax.value_and_grad(lambda p, c, m=m: loss(m, p, c), argnums=(0, 1))(params, carry)
                          for m in (hoisted, autodiff))
    assert float(lh) == pytest.approx(float(la), rel=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(gh), jax.tree_util.tree_leaves(ga)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    # a reset blocks the gradient to the carry before it: with every step reset, the initial carry gets none
    all_reset = jnp.ones((T, B), bool)
    g0 = jax.grad(lambda c: jnp.sum(hoisted.apply(params, c, x, all_reset)[1]))(carry)
    assert all(float(jnp.abs(g).max()) == 0.0 for g in g0)


def test_lstm_gradient_in_bfloat16_stays_close_to_float32_autodiff():
    # bfloat16 compute reads x_proj and stacks the gates and their gradients in bfloat16: a rounding, not a bias
    T, B, F, H = 16, 8, 6, 32
    k = jax.random.split(jax.random.PRNGKey(5), 4)
    x, resets = jax.random.normal(k[0], (T, B, F)), jax.random.uniform(k[1], (T, B)) < 0.2
    carry = (jax.random.normal(k[2], (B, H)), jax.random.normal(k[3], (B, H)))
    params = pqn.SequenceLSTM(H).init(k[0], carry, x, resets)

    def grads(lstm):
        return jax.grad(lambda p: jnp.sum(jnp.sin(lstm.apply(p, carry, x, resets)[1])))(params)

    low, ref = grads(pqn.SequenceLSTM(H, dtype=jnp.bfloat16)), grads(pqn.SequenceLSTM(H, grad="autodiff"))
    for a, b in zip(jax.tree_util.tree_leaves(low), jax.tree_util.tree_leaves(ref)):
        assert a.dtype == b.dtype == jnp.float32
        assert float(jnp.linalg.norm(a - b)) < 0.01 * float(jnp.linalg.norm(b))  # bfloat16 autodiff: 0.3-0.6%


def test_update_losses_equal_with_either_lstm_gradient():
    cfg, ts, batch = _terminal_batch(0, num_minibatches=2, num_epochs=3, lr_linear_decay=False)
    rng = np.random.default_rng(1)  # episodes that run on and restart: targets bootstrap, the carry resets
    batch = dict(batch, dones=jnp.asarray(rng.random((8, 4)) < 0.2), resets=jnp.asarray(rng.random((8, 4)) < 0.2))
    ts_auto = ts.replace(apply_fn=pqn.QNetwork(17, cfg.hidden_size, grad="autodiff").apply)
    for i in range(3):
        key = jax.random.PRNGKey(i)
        (ts, m), (ts_auto, m_auto) = pqn.update(ts, cfg, key, batch), pqn.update(ts_auto, cfg, key, batch)
        assert float(m["loss"]) == pytest.approx(float(m_auto["loss"]), rel=1e-5, abs=1e-7)
    for a, b in zip(jax.tree_util.tree_leaves(ts.params), jax.tree_util.tree_leaves(ts_auto.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("unroll", [1, 4])
def test_update_is_the_gradient_of_the_loss_over_the_sequence_and_its_bootstrap_state(unroll):
    # the reference: the network over T + 1 steps (the batch then s_T), q_next from steps 1..T
    cfg, ts, batch = _terminal_batch(0, num_minibatches=1, num_epochs=1, lr_linear_decay=False, scan_unroll=unroll)
    ts = ts.replace(apply_fn=pqn.make_network(cfg, 17).apply)
    rng = np.random.default_rng(2)
    T, N = batch["rewards"].shape
    batch = dict(batch, dones=jnp.asarray(rng.random((T, N)) < 0.2), resets=jnp.asarray(rng.random((T, N)) < 0.2),
                 next_obs_last=jnp.asarray(rng.random((N, 5)), jnp.float32),
                 carry0=tuple(jnp.asarray(rng.normal(size=(N, 16)), jnp.float32) for _ in range(2)))

    def reference_loss(params):
        ext = lambda x, last: jnp.concatenate([x, last[None]], axis=0)  # noqa: E731
        _, q = ts.apply_fn(params, batch["carry0"], ext(batch["obs"], batch["next_obs_last"]),
                           ext(batch["instr"], batch["next_instr_last"]), ext(batch["resets"], batch["dones"][-1]))
        q_a = jnp.take_along_axis(q[:-1], batch["actions"][..., None], axis=-1)[..., 0]
        targets = pqn.q_lambda_targets(batch["rewards"], batch["dones"], jax.lax.stop_gradient(q[1:]).max(-1),
                                       cfg.gamma, cfg.lam)
        return 0.5 * jnp.mean((q_a - targets) ** 2)

    loss, grads = jax.value_and_grad(reference_loss)(ts.params)
    new_ts, metrics = pqn.update(ts, cfg, jax.random.PRNGKey(0), batch)
    assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(new_ts.params), jax.tree_util.tree_leaves(ts.apply_gradients(grads=grads).params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def _dot_generals(jaxpr) -> list:
    """Every dot_general of ``jaxpr``, inside its sub-programs too."""
    found = []
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            found.append(e)
        for v in e.params.values():
            for sub in (v if isinstance(v, (list, tuple)) else [v]):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dot_generals(inner)
    return found


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 5)])
def test_matmul_gradient_is_autodiffs_in_float32_and_multiplies_in_bfloat16_under_bfloat16(shape):
    """pqn.matmul's written-out gradient: autodiff's maths in float32; under bfloat16 every matmul of
    the backward takes bfloat16 inputs (JAX's own would multiply the float32 cotangent in float32),
    and the gradients stay within bfloat16 rounding of float32's."""
    k = jax.random.split(jax.random.PRNGKey(0), 3)
    x, w = jax.random.normal(k[0], shape), jax.random.normal(k[1], (shape[-1], 7))
    probe = jax.random.normal(k[2], (*shape[:-1], 7))

    def loss(fn):
        return lambda x, w: jnp.sum(jnp.sin(fn(x, w)) * probe)

    ours = jax.grad(loss(lambda x, w: pqn.matmul(x, w)), argnums=(0, 1))(x, w)
    ref = jax.grad(loss(lambda x, w: jnp.matmul(x, w)), argnums=(0, 1))(x, w)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)

    bf16 = jnp.dtype("bfloat16")
    grad_bf16 = jax.grad(loss(lambda x, w: pqn.matmul(x, w, bf16)), argnums=(0, 1))
    dots = _dot_generals(jax.make_jaxpr(grad_bf16)(x, w).jaxpr)
    assert len(dots) == 3  # forward, then g @ w^T and x^T @ g
    assert all(v.aval.dtype == bf16 for e in dots for v in e.invars)
    for a, b in zip(grad_bf16(x, w), ours):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0.05, atol=0.05)


def _padded(batch, valid, garbage_seed=None):
    """``batch`` with rows weighted by ``valid``; ``garbage_seed``: the padding rows' inputs replaced by noise."""
    w = jnp.asarray(valid, jnp.float32)
    if garbage_seed is None:
        return dict(batch, weights=w)
    rng = np.random.default_rng(garbage_seed)
    pad = ~np.asarray(valid, bool)
    noisy = dict(batch, weights=w)
    for k in ("obs", "instr", "rewards"):
        x = np.array(batch[k])
        x[:, pad] = rng.normal(size=x[:, pad].shape)
        noisy[k] = jnp.asarray(x, batch[k].dtype)
    return noisy


def _leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


def test_skipping_padding_changes_nothing_when_every_row_trains():
    cfg, ts, batch = _terminal_batch(0, num_minibatches=2, num_epochs=3)
    skip = dataclasses.replace(cfg, skip_padding=True)
    key = jax.random.PRNGKey(3)
    (a, ma), (b, mb) = pqn.update(ts, cfg, key, batch), pqn.update(ts, skip, key, batch)
    assert _leaves_equal(a.params, b.params) and _leaves_equal(a.opt_state, b.opt_state)
    assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-6)


@settings(max_examples=12, deadline=None)
@given(valid=st.lists(st.booleans(), min_size=8, max_size=8), garbage=st.integers(0, 2**16))
def test_skipped_padding_runs_only_minibatches_holding_a_row_and_its_inputs_change_nothing(valid, garbage):
    """8 rows in 4 minibatches of 2 for 2 epochs: ceil(rows that train / 2) optimiser steps per epoch (at least
    one), the learning-rate schedule 4 further per epoch, and what the padding rows hold changes nothing."""
    cfg, ts, batch = _terminal_batch(0, num_minibatches=4, num_epochs=2, skip_padding=True)
    batch = jax.tree_util.tree_map(lambda x: jnp.concatenate([x, x], axis=1 if x.ndim >= 2 and x.shape[0] == 8
                                                             else 0), batch)  # 8 rows
    upd = _jitted_update(cfg)
    key = jax.random.PRNGKey(0)
    out, m = upd(ts, key, _padded(batch, valid))
    noisy, _ = upd(ts, key, _padded(batch, valid, garbage))
    assert _leaves_equal(out.params, noisy.params)
    runs = max(1, -(-sum(valid) // 2))
    assert int(out.step) == 2 * runs and np.isfinite(float(m["loss"]))
    schedule = [s for s in jax.tree_util.tree_leaves(out.opt_state, is_leaf=lambda x: isinstance(
        x, optax.ScaleByScheduleState)) if isinstance(s, optax.ScaleByScheduleState)]
    assert [int(s.count) for s in schedule] == [2 * 4]


_JITTED: dict[str, object] = {}


def _jitted_update(cfg):
    """One jitted update per config (hypothesis's examples share its compile)."""
    return _JITTED.setdefault(repr(cfg), jax.jit(lambda ts, k, b: pqn.update(ts, cfg, k, b)))


def test_skipped_padding_under_vmap_gives_each_seed_its_own_update():
    """Seeds with different numbers of rows that train, vmapped as the trainer does: each seed's result is its
    update alone (the minibatch loop runs to the longest seed's count, the others' results untouched)."""
    cfg, ts, batch = _terminal_batch(0, num_minibatches=2, num_epochs=2, skip_padding=True)
    masks = [[1, 0, 0, 0], [1, 1, 1, 1]]
    keys = jax.random.split(jax.random.PRNGKey(1), 2)
    both = jax.vmap(lambda k, b: pqn.update(ts, cfg, k, b))(
        keys, jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[_padded(batch, m) for m in masks]))
    for s, m in enumerate(masks):
        alone, _ = pqn.update(ts, cfg, keys[s], _padded(batch, m))
        for x, y in zip(jax.tree_util.tree_leaves(alone.params), jax.tree_util.tree_leaves(both[0].params)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y)[s], rtol=1e-5, atol=1e-6)
        assert int(both[0].step[s]) == int(alone.step)
