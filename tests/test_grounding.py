"""The grounding rule (oir_gym.grounding): binding on hand-built trajectories, ordered pairs, and
the JAX rule against its numpy twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.captions import EVENT_NAMES, NUM_EVENTS
from oir_gym.grounding import (
    BOUND, Binding, bind, bind_ordered, episode_starts_from_dones, first_paid_step, indicator_row,
    no_precondition, paid_steps, paid_steps_jax, split_ordered, verify,
)

E = NUM_EVENTS
WOOD, TABLE = EVENT_NAMES.index("collect_wood"), EVENT_NAMES.index("place_table")


def traj(T: int, at: dict[int, list[int]]) -> np.ndarray:
    ev = np.zeros((T, E), bool)
    for t, es in at.items():
        ev[t, es] = True
    return ev


def sim_row(**events: float) -> np.ndarray:
    s = np.full((E,), 0.1, np.float32)
    for name, v in events.items():
        s[EVENT_NAMES.index(name)] = v
    return s


def test_bind_picks_the_event_that_happened_at_its_first_step():
    ev = traj(10, {3: [WOOD], 7: [TABLE]})
    # "chop down a tree for logs": far below delta 0.9 against "collect wood", still the best event
    b = bind(sim_row(collect_wood=0.5, place_table=0.3, collect_stone=0.6), ev, threshold=0.4)
    assert b == Binding(final=WOOD, step=3)  # collect_stone is more similar but never happened
    assert verify(b, ev, episode_starts_from_dones(np.zeros(10, bool)))


def test_bind_drops_an_instruction_without_its_event():
    ev = traj(10, {3: [WOOD]})
    assert bind(sim_row(place_table=0.8), ev, threshold=0.4) is None  # nothing similar happened
    assert bind(sim_row(collect_wood=0.3), ev, threshold=0.4) is None  # below the threshold
    assert bind(sim_row(collect_wood=0.9), ev, threshold=0.4, window=(4, 10)) is None  # outside the segment


def test_bind_ordered_respects_order_and_episodes():
    s_wood, s_table = sim_row(collect_wood=0.8), sim_row(place_table=0.8)
    ev = traj(12, {2: [WOOD], 5: [TABLE], 9: [WOOD]})
    starts = episode_starts_from_dones(np.zeros(12, bool))
    assert bind_ordered(s_wood, s_table, ev, starts, threshold=0.5) == Binding(final=TABLE, pre=WOOD, step=5)
    # table then wood: "place table then collect wood" binds the wood at 9, after the table
    assert bind_ordered(s_table, s_wood, ev, starts, threshold=0.5) == Binding(final=WOOD, pre=TABLE, step=9)
    # the table only happened before the wood: reversed order is dropped
    ev2 = traj(12, {2: [TABLE], 5: [WOOD]})
    assert bind_ordered(s_wood, s_table, ev2, starts, threshold=0.5) is None
    # an episode boundary between the two events breaks the pair
    dones = np.zeros(12, bool)
    dones[3] = True
    ev3 = traj(12, {2: [WOOD], 5: [TABLE]})
    assert bind_ordered(s_wood, s_table, ev3, episode_starts_from_dones(dones), threshold=0.5) is None


def test_compound_pays_only_after_its_first_half():
    """The ordered pair fixes "compounds pay at the first occurrence of their final event"."""
    final, pre = Binding(final=TABLE, pre=WOOD).rows(E)
    ev = traj(10, {1: [TABLE], 4: [WOOD], 6: [TABLE], 8: [TABLE]})
    starts = episode_starts_from_dones(np.zeros(10, bool))
    assert np.flatnonzero(paid_steps(ev, final, pre, starts, 0.9)).tolist() == [6, 8]
    assert first_paid_step(ev, final, pre, starts, 0.9) == 6
    # the same step holding both events does not complete the pair (first strictly before)
    ev_same = traj(5, {2: [WOOD, TABLE]})
    assert not paid_steps(ev_same, final, pre, starts[:5], 0.9).any()


def test_bound_rows_pay_under_any_delta():
    final = indicator_row(WOOD, E)
    assert final[WOOD] == BOUND and (np.delete(final, WOOD) == -1).all()
    ev = traj(4, {2: [WOOD]})
    for delta in (-0.99, 0.0, 0.9, 1.0):
        assert paid_steps(ev, final, no_precondition(E), np.eye(4, dtype=bool)[0], delta).tolist() == [0, 0, 1, 0]


def test_split_ordered():
    assert split_ordered("collect wood then place table") == ("collect wood", "place table")
    assert split_ordered("First, chop a tree, then build a workbench") == ("chop a tree", "build a workbench")
    assert split_ordered("gather some logs") is None
    assert split_ordered("then go") is None


def test_binding_round_trip_and_errors():
    b = Binding(final=3, pre=1, step=7)
    assert Binding.from_list(b.to_list()) == b
    with pytest.raises(ValueError, match="final, pre, step"):
        Binding.from_list([1, 2])
    with pytest.raises(ValueError, match="outside"):
        indicator_row(E, E)


def test_verify_refuses_a_wrong_step():
    ev = traj(6, {2: [WOOD]})
    starts = episode_starts_from_dones(np.zeros(6, bool))
    assert verify(Binding(final=WOOD, step=2), ev, starts)
    assert not verify(Binding(final=WOOD, step=3), ev, starts)
    assert not verify(Binding(final=WOOD, pre=TABLE, step=2), ev, starts)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 24), st.integers(0, 2**31 - 1),
    st.floats(-0.9, 0.95, allow_subnormal=False), st.booleans(),
)
def test_jax_rule_matches_numpy_twin(T, seed, delta, with_pre):
    rng = np.random.default_rng(seed)
    ev = rng.random((T, E)) < 0.15
    dones = rng.random(T) < 0.2
    final = rng.uniform(-1, 1, E).astype(np.float32)
    pre = rng.uniform(-1, 1, E).astype(np.float32) if with_pre else no_precondition(E)
    starts = episode_starts_from_dones(dones)
    host = paid_steps(ev, final, pre, starts, delta)
    dev = np.asarray(paid_steps_jax(ev[:, None], final[None], pre[None], starts[:, None], delta))[:, 0]
    assert host.tolist() == dev.tolist()
