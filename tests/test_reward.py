"""The cosine-threshold reward as pure functions (no env)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from oir_gym.reward import (event_similarity, first_per_episode, first_success_step, relabel_rewards, step_match,
                            step_similarity, threshold_confusion)

FAST = settings(max_examples=40, deadline=None)
T, E = 6, 5  # fixed shapes for the property tests: one compiled program per function


def test_step_match_is_strict():
    events = jnp.array([True, False, True])
    sims = jnp.array([0.9, 0.99, 0.5])
    assert not bool(step_match(events, sims, 0.9))  # 0.9 is not > 0.9
    assert bool(step_match(events, sims, 0.8999))
    # a high similarity of an event that did not happen does not count
    assert not bool(step_match(jnp.array([False, False, True]), sims, 0.6))
    assert not bool(step_match(jnp.zeros(3, bool), sims, -0.99))


def test_step_match_batched():
    events = jnp.array([[True, False], [False, True], [False, False]])
    sims = jnp.array([[0.95, 0.1], [0.95, 0.1], [0.95, 0.95]])
    np.testing.assert_array_equal(step_match(events, sims, 0.9), [True, False, False])


def test_step_similarity_is_max_over_happened_events():
    events = jnp.array([[True, True, False], [False, False, False]])
    sims = jnp.array([0.2, 0.7, 0.99])
    np.testing.assert_allclose(step_similarity(events, sims), [0.7, -1.0])


def test_relabel_rewards_on_synthetic_trajectories():
    # [T=5, E=3] events of two envs ([2, T, E]); env-specific instruction similarities [2, E]
    events = np.zeros((2, 5, 3), bool)
    events[0, 1, 0] = True  # matching event
    events[0, 3, 0] = True  # matching again (first_per_episode decides whether it pays)
    events[0, 2, 1] = True  # non-matching event
    events[1, 0, 2] = events[1, 4, 2] = True
    sims = np.array([[0.95, 0.3, 0.99], [0.1, 0.2, 0.91]], np.float32)
    rewards, terms = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), 0.9)
    # env 0: event 2 (sim 0.99) never happened; env 1: event 2 at t=0 and t=4
    np.testing.assert_array_equal(rewards, [[0, 1, 0, 1, 0], [1, 0, 0, 0, 1]])
    np.testing.assert_array_equal(terms, rewards.astype(bool))
    assert rewards.dtype == jnp.float32 and terms.dtype == jnp.bool_
    r2, _ = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), 0.92)
    np.testing.assert_array_equal(r2, [[0, 1, 0, 1, 0], [0, 0, 0, 0, 0]])


def test_first_per_episode_keeps_one_success_per_original_episode():
    # one row, T=8: matches at 1, 2, 4 and 6; a new original episode starts at step 4
    m = jnp.array([0, 1, 1, 0, 1, 0, 1, 0], bool)[:, None]
    starts = jnp.array([1, 0, 0, 0, 1, 0, 0, 0], bool)[:, None]
    first, after = first_per_episode(m, starts)
    np.testing.assert_array_equal(first[:, 0], [0, 1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(after[:, 0], [0, 0, 1, 1, 0, 1, 1, 1])


@FAST
@given(hnp.arrays(bool, (12, 3)), hnp.arrays(bool, (12, 3)))
def test_first_per_episode_properties(matches, starts):
    first, after = (np.asarray(x) for x in first_per_episode(jnp.asarray(matches), jnp.asarray(starts)))
    assert not (first & after).any()
    assert not (first & ~matches).any()  # a first success is a match
    episode = np.cumsum(starts, axis=0)  # episode index of each step, per row
    for col in range(3):
        for ep in np.unique(episode[:, col]):
            steps = episode[:, col] == ep
            m, f, a = matches[steps, col], first[steps, col], after[steps, col]
            assert f.sum() == int(m.any())  # exactly one first success where the episode matched
            if m.any():  # "after" is everything past the first match in the episode, nothing before
                i = int(np.argmax(m))
                assert f[i] and not a[: i + 1].any() and a[i + 1:].all()
            else:
                assert not a.any()


def test_first_success_step():
    events = np.zeros((5, 3), bool)
    sims = np.array([0.95, 0.3, 0.99])
    assert first_success_step(events, sims, 0.9) == -1
    events[3, 0] = events[4, 2] = True
    events[1, 1] = True
    assert first_success_step(events, sims, 0.9) == 3
    assert first_success_step(events, sims, 0.96) == 4
    assert first_success_step(events, sims, 0.2) == 1
    assert first_success_step(np.zeros((0, 3), bool), sims, 0.9) == -1


def test_event_similarity_numpy_and_jax_agree():
    rng = np.random.default_rng(0)
    instr = rng.normal(size=(3, 8)).astype(np.float32)
    instr /= np.linalg.norm(instr, axis=1, keepdims=True)
    phrases = rng.normal(size=(7, 8)).astype(np.float32)
    phrases /= np.linalg.norm(phrases, axis=1, keepdims=True)
    owner = np.array([0, 0, 1, 2, 2, 2, 4])  # event 3 has no phrase
    out_np = event_similarity(instr, phrases, owner, 5)
    out_jx = event_similarity(jnp.asarray(instr), jnp.asarray(phrases), owner, 5)
    assert out_np.shape == (3, 5) and out_np.dtype == np.float32
    np.testing.assert_allclose(out_np, np.asarray(out_jx), atol=1e-6)
    sims = instr @ phrases.T
    np.testing.assert_allclose(out_np[:, 0], sims[:, :2].max(1), atol=1e-6)
    np.testing.assert_allclose(out_np[:, 2], sims[:, 3:6].max(1), atol=1e-6)
    np.testing.assert_array_equal(out_np[:, 3], -1.0)


events_st = hnp.arrays(bool, (T, E))
# No subnormal floats: XLA on CPU flushes them to zero, so JAX compares 1e-45 > 0.0 as False where
# NumPy says True (hypothesis found this); similarities are never that small in practice.
_sim = st.floats(-1, 1, width=32, allow_subnormal=False)
sims_st = hnp.arrays(np.float32, (E,), elements=_sim)
delta_st = st.floats(-0.9990000128746033, 1.0, width=32, allow_subnormal=False)


@FAST
@given(events=events_st, sims=sims_st, delta=delta_st)
def test_relabel_rewards_are_one_exactly_where_a_matching_event_occurs(events, sims, delta):
    rewards, terms = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), jnp.float32(delta))
    expected = np.array([any(events[t, e] and sims[e] > np.float32(delta) for e in range(E)) for t in range(T)])
    np.testing.assert_array_equal(np.asarray(rewards), expected.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(terms), expected)
    first = first_success_step(events, sims, np.float32(delta))
    assert first == (int(np.flatnonzero(expected)[0]) if expected.any() else -1)


@FAST
@given(events=events_st, sims=hnp.arrays(np.float32, (E,), elements=st.floats(-1, 0.9998999834060669, width=32, allow_subnormal=False)))
def test_delta_one_never_fires_below_perfect_similarity(events, sims):
    rewards, _ = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), jnp.float32(1.0))
    assert not np.asarray(rewards).any()
    assert first_success_step(events, sims, 1.0) == -1


@FAST
@given(events=events_st, sims=sims_st, d1=delta_st, d2=delta_st)
def test_higher_threshold_rewards_a_subset(events, sims, d1, d2):
    lo, hi = sorted((d1, d2))
    r_lo, _ = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), jnp.float32(lo))
    r_hi, _ = relabel_rewards(jnp.asarray(events), jnp.asarray(sims), jnp.float32(hi))
    assert np.all(np.asarray(r_hi) <= np.asarray(r_lo))


@pytest.mark.parametrize("delta", [0.5, 0.9, 0.95])
def test_no_event_no_reward(delta):
    rewards, terms = relabel_rewards(jnp.zeros((T, E), bool), jnp.ones((E,)), delta)
    assert not np.asarray(rewards).any() and not np.asarray(terms).any()


def test_threshold_confusion_counts_own_and_other_rewarded_events():
    sims = np.array([[0.95, 0.6, 0.2], [0.3, 0.8, 0.85]], np.float32)
    c = threshold_confusion(sims, [0, 1], [0.5, 0.9])
    np.testing.assert_allclose(c["recall"], [1.0, 0.5])  # at 0.9 the second instruction misses its event
    np.testing.assert_allclose(c["wrong_per_instruction"], [1.0, 0.0])
    np.testing.assert_allclose(c["any_wrong"], [1.0, 0.0])
    assert c["wrong"][0].tolist() == [[False, True, False], [False, False, True]]
    with pytest.raises(ValueError, match="target events"):
        threshold_confusion(sims, [0, 3], [0.5])
    with pytest.raises(ValueError, match="N >= 1"):
        threshold_confusion(np.zeros((0, 3)), [], [0.5])


@FAST
@given(sims=hnp.arrays(np.float32, (4, E), elements=_sim),
       targets=hnp.arrays(np.int64, (4,), elements=st.integers(0, E - 1)), d1=delta_st, d2=delta_st)
def test_threshold_confusion_shrinks_as_delta_grows(sims, targets, d1, d2):
    c = threshold_confusion(sims, targets, sorted((d1, d2)))
    assert c["recall"][1] <= c["recall"][0] and c["wrong_per_instruction"][1] <= c["wrong_per_instruction"][0]
    assert np.all(c["wrong"][1] <= c["wrong"][0])
    assert not c["wrong"][:, np.arange(4), targets].any()  # an instruction's own event is never "wrong"


def test_at_the_default_delta_each_achievement_instruction_pays_for_its_own_event_only(encoder):
    """The caption phrasings decide what the cosine reward pays for: at delta 0.9, "defeat zombie"
    must not fire when the agent merely hits a zombie (it did, through a "fight a zombie" phrasing)."""
    from oir_gym.captions import EVENT_NAMES, VOCAB
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.instructions import get_instruction_set

    registry = InstructionRegistry(encoder, capacity=1)
    original = get_instruction_set("original")
    sims = registry.similarity_to_events(encoder.encode([i.text for i in original]))
    targets = [VOCAB.achievement_of_event.index(i.achievement_index) for i in original]
    c = threshold_confusion(sims, targets, [0.9])
    wrong = {i.text: [EVENT_NAMES[e] for e in np.flatnonzero(c["wrong"][0, n])] for n, i in enumerate(original)}
    assert c["recall"][0] == 1.0
    assert not any(wrong.values()), wrong
