"""Tests of the evaluation metrics (paper Sec. 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.metrics import (
    aggregate_score,
    mean_and_stderr,
    mean_success_rate,
    num_completed,
    success_rates,
    summarize,
)

FAST = settings(max_examples=80, deadline=None)
rate_lists = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=30)


def test_success_rates_from_mapping_and_array():
    rates = success_rates({"a": [True, False, True, True], "b": [False], "c": [1, 1]})
    np.testing.assert_allclose(rates, [0.75, 0.0, 1.0])
    arr = np.array([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=bool)
    np.testing.assert_allclose(success_rates(arr), [0.25, 1.0])
    np.testing.assert_allclose(success_rates([[0, 1], [1, 1]]), [0.5, 1.0])


@pytest.mark.parametrize(
    "bad,match",
    [({}, "at least one"), ({"a": []}, "no episodes"), ({"a": [0.5]}, "0/1"),
     (np.zeros((2, 0)), "shape"), (np.zeros(3), "2-D"), ([[0, float("nan")]], "NaN")],
)
def test_success_rates_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        success_rates(bad)


def test_hand_computed_values():
    rates = [1.0, 0.0, 0.5, 0.0]
    assert mean_success_rate(rates) == pytest.approx(0.375)
    assert num_completed(rates) == 2
    assert num_completed(rates, eps=0.5) == 1
    expected = math.exp((math.log(2) + math.log(1.5)) / 4) - 1
    assert aggregate_score(rates) == pytest.approx(expected)
    assert summarize(rates) == {
        "mean_success_rate": pytest.approx(0.375),
        "num_completed": 2,
        "aggregate_score": pytest.approx(expected),
    }
    assert aggregate_score([0.0, 0.0]) == 0.0
    assert aggregate_score([1.0]) == pytest.approx(1.0)
    assert aggregate_score([0.0, 1.0]) == pytest.approx(math.sqrt(2) - 1)


@pytest.mark.parametrize(
    "bad,match",
    [([], "at least one"), ([0.2, float("nan")], "NaN"), ([0.2, 1.5], r"\[0, 1\]"),
     ([-0.1], r"\[0, 1\]"), ([95.8], "percentages"), ([[0.1, 0.2]], "1-D")],
)
@pytest.mark.parametrize("fn", [mean_success_rate, num_completed, aggregate_score, summarize])
def test_rate_validation(fn, bad, match):
    with pytest.raises(ValueError, match=match):
        fn(bad)


@FAST
@given(rate_lists)
def test_aggregate_between_zero_and_mean(rates):
    agg, mean = aggregate_score(rates), mean_success_rate(rates)
    assert 0.0 <= agg <= mean + 1e-12  # Jensen: log(1+s) is concave
    assert num_completed(rates) == sum(r > 0 for r in rates)


@FAST
@given(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), st.integers(1, 20))
def test_aggregate_equals_mean_when_all_equal(s, n):
    assert aggregate_score([s] * n) == pytest.approx(s, abs=1e-12)


@FAST
@given(rate_lists, st.integers(0, 29), st.floats(min_value=0.0, max_value=1.0, allow_nan=False))
def test_aggregate_monotone(rates, i, bump):
    """Raising any one rate never lowers the aggregate score."""
    i %= len(rates)
    higher = list(rates)
    higher[i] = max(rates[i], bump)
    assert aggregate_score(higher) >= aggregate_score(rates) - 1e-12


def test_mean_and_stderr():
    m, se = mean_and_stderr([1.0, 2.0, 3.0])
    assert m == pytest.approx(2.0) and se == pytest.approx(1.0 / math.sqrt(3))
    assert mean_and_stderr([0.4]) == (0.4, 0.0)
    curves = np.array([[0.0, 1.0], [2.0, 1.0]])
    m, se = mean_and_stderr(curves)
    np.testing.assert_allclose(m, [1.0, 1.0])
    np.testing.assert_allclose(se, [1.0, 0.0])
    m, se = mean_and_stderr(curves, axis=1)
    np.testing.assert_allclose(m, [0.5, 1.5])


@pytest.mark.parametrize("bad,match", [([], "at least one"), (3.0, "at least one"), ([1.0, float("inf")], "finite")])
def test_mean_and_stderr_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        mean_and_stderr(bad)
