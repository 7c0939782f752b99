"""Tests of the prioritized instruction replay buffer (paper Sec. 4.3)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.buffer import (
    FAILING,
    LEARNING_BOUNDARY,
    MASTERED,
    EmptyBufferError,
    InstructionBuffer,
    InstructionStats,
    instruction_status,
    priority_order,
)

FAST = settings(max_examples=60, deadline=None)
words = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
returns = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


# ---- pure functions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "r,expected",
    [(0.0, FAILING), (0.1, FAILING), (0.1000001, LEARNING_BOUNDARY), (0.5, LEARNING_BOUNDARY),
     (0.9, LEARNING_BOUNDARY), (0.9000001, MASTERED), (1.0, MASTERED), (-3.0, FAILING)],
)
def test_status_boundaries(r, expected):
    assert instruction_status(r, 0.1, 0.9) == expected


@pytest.mark.parametrize("lo,hi", [(0.5, 0.5), (0.9, 0.1), (-0.1, 0.5), (float("nan"), 0.5)])
def test_status_bad_thresholds(lo, hi):
    with pytest.raises(ValueError, match="tau_low"):
        instruction_status(0.3, lo, hi)


def test_status_nan_return():
    with pytest.raises(ValueError, match="NaN"):
        instruction_status(float("nan"), 0.1, 0.9)


def test_priority_order_example():
    cands = [
        ("mastered", 0.95, 3),
        ("failing_seen", 0.05, 2),
        ("boundary_hi", 0.8, 1),
        ("unseen", 0.0, 0),
        ("boundary_lo", 0.3, 9),
        ("failing_zero_many", 0.0, 5),
    ]
    assert priority_order(cands, 0.1, 0.9) == [
        "boundary_lo", "boundary_hi", "unseen", "failing_zero_many", "failing_seen", "mastered",
    ]


def test_priority_order_ties_keep_input_order():
    cands = [("c", 0.5, 1), ("a", 0.5, 1), ("b", 0.5, 1)]
    assert priority_order(cands, 0.1, 0.9) == ["c", "a", "b"]


def test_priority_order_bad_candidate():
    with pytest.raises(ValueError, match="triple"):
        priority_order([("a", 0.5)], 0.1, 0.9)


@FAST
@given(st.lists(st.tuples(words, returns, st.integers(0, 5)), max_size=12))
def test_priority_order_is_sorted_permutation(cands):
    out = priority_order(cands, 0.1, 0.9)
    assert sorted(out) == sorted(c[0] for c in cands)
    keys = [(instruction_status(m, 0.1, 0.9), m, n) for _, m, n in cands]
    # The output must be the stable sort of the input by key.
    expect = [cands[i][0] for i in sorted(range(len(cands)), key=lambda i: keys[i])]
    assert out == expect


# ---- construction / validation -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [({"capacity": 0}, "capacity"), ({"capacity": 2.5}, "capacity"), ({"capacity": True}, "capacity"),
     ({"tau_low": 0.9, "tau_high": 0.1}, "tau_low"), ({"tau_low": -1.0}, "tau_low"),
     ({"max_tracked": 0}, "max_tracked"), ({"initial": "collect wood"}, "single string"),
     ({"initial": ["ok", ""]}, "non-empty string")],
)
def test_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InstructionBuffer(**kwargs)


def test_starts_empty_and_sample_raises():
    buf = InstructionBuffer()
    assert len(buf) == 0 and buf.contents() == []
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample(1)


def test_initial_truncated_to_capacity_in_order():
    buf = InstructionBuffer(capacity=3, initial=["a", "b", "c", "d", "e"])
    assert buf.contents() == ["a", "b", "c"] and buf.cursor == 0


def test_bad_inputs():
    buf = InstructionBuffer(initial=["a"])
    with pytest.raises(ValueError, match="non-empty"):
        buf.insert(["ok", 3])
    with pytest.raises(ValueError, match="single string"):
        buf.insert("abc")
    with pytest.raises(ValueError, match="finite"):
        buf.record("a", float("nan"))
    with pytest.raises(ValueError, match="non-empty"):
        buf.record("  ", 1.0)
    with pytest.raises(ValueError, match="length"):
        buf.record_many(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="n must be"):
        buf.sample(-1)


# ---- statistics ----------------------------------------------------------------------------


def test_running_mean_and_unseen_stats():
    buf = InstructionBuffer()
    assert buf.stats("x") == InstructionStats(0, 0.0)
    buf.record_many(["x", "x", "x", "y"], np.array([1.0, 0.0, 0.5, 0.2]))
    assert buf.stats("x").count == 3 and buf.stats("x").mean_return == pytest.approx(0.5)
    assert buf.status("x") == LEARNING_BOUNDARY and buf.status("y") == LEARNING_BOUNDARY
    assert buf.status("never") == FAILING


def test_stats_bounded_evict_least_recently_updated():
    buf = InstructionBuffer(max_tracked=2)
    buf.record("a", 1.0)
    buf.record("b", 1.0)
    buf.record("a", 1.0)  # a is now the most recently updated
    buf.record("c", 1.0)  # evicts b
    assert buf.num_tracked() == 2
    assert buf.stats("b").count == 0 and buf.stats("a").count == 2 and buf.stats("c").count == 1


# ---- insertion / eviction ------------------------------------------------------------------


def test_insert_orders_by_priority():
    buf = InstructionBuffer(capacity=10)
    buf.record("m", 1.0)  # mastered
    buf.record("b", 0.5)  # boundary
    buf.record("f", 0.05)  # failing, seen
    written = buf.insert(["m", "f", "new", "b"])
    assert written == ["b", "new", "f", "m"]
    assert buf.contents() == ["b", "new", "f", "m"]


def test_insert_more_than_capacity_keeps_top():
    buf = InstructionBuffer(capacity=2)
    buf.record("m", 1.0)
    buf.record("b", 0.5)
    assert buf.insert(["m", "x", "b", "y"]) == ["b", "x"]
    assert buf.contents() == ["b", "x"] and buf.cursor == 0


def test_round_robin_overwrites_oldest():
    buf = InstructionBuffer(capacity=3, initial=["a", "b", "c"])
    buf.insert(["d"])
    assert buf.contents() == ["d", "b", "c"]
    buf.insert(["e", "f"])
    assert buf.contents() == ["d", "e", "f"] and buf.cursor == 0
    buf.insert(["g"])
    assert buf.contents() == ["g", "e", "f"]


def test_duplicates_skipped_by_default_and_allowed_when_asked():
    buf = InstructionBuffer(capacity=4, initial=["a", "b"])
    assert buf.insert(["a", "c", "c"]) == ["c"]
    assert buf.contents() == ["a", "b", "c"]
    dup = InstructionBuffer(capacity=4, initial=["a", "b"], allow_duplicates=True)
    assert dup.insert(["a", "c", "c"]) == ["a", "c", "c"]  # ties keep batch order
    assert dup.contents() == ["c", "b", "a", "c"]  # the third write wrapped onto slot 0


@FAST
@given(st.integers(1, 6), st.lists(st.lists(words, max_size=9), max_size=6), st.booleans())
def test_never_exceeds_capacity(capacity, batches, allow_dup):
    buf = InstructionBuffer(capacity=capacity, allow_duplicates=allow_dup)
    for batch in batches:
        buf.insert(batch)
        assert len(buf) <= capacity and len(buf.contents()) == len(buf)
        assert 0 <= buf.cursor < capacity
        if not allow_dup:
            assert len(set(buf.contents())) == len(buf)


@FAST
@given(
    st.integers(1, 8),
    st.lists(words, min_size=0, max_size=8, unique=True),
    st.lists(st.tuples(words, returns), max_size=10),
    st.data(),
)
def test_new_distinct_instructions_all_present_in_priority_order(capacity, existing, history, data):
    buf = InstructionBuffer(capacity=capacity, initial=existing)
    for text, r in history:
        buf.record(text, r)
    fresh = [w + "_new" for w in data.draw(st.lists(words, max_size=capacity, unique=True))]
    start = buf.cursor
    written = buf.insert(fresh)
    assert sorted(written) == sorted(fresh)
    assert all(w in buf for w in fresh)
    # Written sequentially from the cursor, in priority order.
    triples = [(w, buf.stats(w).mean_return, buf.stats(w).count) for w in fresh]
    assert written == priority_order(triples, buf.tau_low, buf.tau_high)
    slots = buf.state_dict()["slots"]
    assert [slots[(start + k) % capacity] for k in range(len(written))] == written


@FAST
@given(st.integers(1, 6), st.lists(words, min_size=1, max_size=30, unique=True))
def test_round_robin_keeps_most_recent(capacity, stream):
    """Inserting one new instruction at a time keeps exactly the last `capacity` of them."""
    buf = InstructionBuffer(capacity=capacity)
    for w in stream:
        buf.insert([w])
    assert sorted(buf.contents()) == sorted(stream[-capacity:])


# ---- sampling / persistence ----------------------------------------------------------------


def test_sample_uniform_over_filled_slots():
    buf = InstructionBuffer(capacity=10, initial=["a", "b", "c", "d"], seed=0)
    draws = buf.sample(4000)
    assert set(draws) == {"a", "b", "c", "d"}
    counts = np.array([draws.count(x) for x in "abcd"])
    assert np.all(np.abs(counts - 1000) < 150)
    assert buf.sample(0) == []
    rng = np.random.default_rng(3)
    assert buf.sample(5, rng=rng) == buf.sample(5, rng=np.random.default_rng(3))


def test_same_seed_same_samples():
    a = InstructionBuffer(initial=["x", "y", "z"], seed=7)
    b = InstructionBuffer(initial=["x", "y", "z"], seed=7)
    assert a.sample(20) == b.sample(20)


@FAST
@given(
    st.integers(1, 5),
    st.lists(st.lists(words, max_size=6), min_size=1, max_size=4),
    st.lists(st.tuples(words, returns), max_size=8),
    st.integers(0, 2**32 - 1),
)
def test_state_dict_round_trip(capacity, batches, history, seed):
    buf = InstructionBuffer(capacity=capacity, seed=seed, max_tracked=5)
    for text, r in history:
        buf.record(text, r)
    for batch in batches + [["seed_instr"]]:
        buf.insert(batch)
    buf.sample(3)  # advance the rng before saving
    state = json.loads(json.dumps(buf.state_dict()))  # must survive JSON
    other = InstructionBuffer()
    other.load_state_dict(state)
    assert other.state_dict() == buf.state_dict()
    assert other.sample(10) == buf.sample(10)
    nxt = ["later_a", "later_b"]
    assert other.insert(nxt) == buf.insert(nxt) and other.contents() == buf.contents()


def test_save_load_file(tmp_path):
    buf = InstructionBuffer(capacity=3, tau_low=0.2, tau_high=0.8, seed=11, allow_duplicates=True)
    buf.record("a", 0.5)
    buf.insert(["a", "b", "c", "d"])
    buf.sample(2)
    path = tmp_path / "sub" / "buf.json"
    buf.save(path)
    loaded = InstructionBuffer.load(path)
    assert (loaded.capacity, loaded.tau_low, loaded.tau_high, loaded.allow_duplicates) == (3, 0.2, 0.8, True)
    assert loaded.stats("a") == buf.stats("a")
    assert loaded.sample(10) == buf.sample(10)
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


@pytest.mark.parametrize(
    "mutate,match",
    [(lambda s: s.pop("cursor"), "missing key 'cursor'"),
     (lambda s: s.update(version=99), "version"),
     (lambda s: s.update(cursor=7), "out of range"),
     (lambda s: s.update(size=1), "inconsistent"),
     (lambda s: s.update(stats=[["a", 1]]), "stats entries"),
     (lambda s: s.update(rng_state={"bit_generator": "MT19937"}), "PCG64")],
)
def test_load_state_dict_errors(mutate, match):
    state = InstructionBuffer(capacity=3, initial=["a", "b"]).state_dict()
    mutate(state)
    with pytest.raises(ValueError, match=match):
        InstructionBuffer().load_state_dict(state)
