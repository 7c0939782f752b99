"""Tests of the evaluation metrics (paper Sec. 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.metrics import (
    aggregate_score,
    bootstrap_ci,
    control_summary,
    following_gain,
    mean_and_stderr,
    mean_success_rate,
    num_completed,
    success_rates,
    summarize,
    t_interval,
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


# --------------------------------------------------------------------------- the control's gain


def test_following_gain_and_control_summary_by_hand():
    asked, mism, neutral = [1.0, 0.5, 0.0, 0.25], [0.0, 0.5, 0.25, 0.25], [0.5, 0.0, 0.0, 0.0]
    np.testing.assert_allclose(following_gain(asked, mism), [1.0, 0.0, -0.25, 0.0])
    assert control_summary(asked, mism, neutral) == {
        "gain": pytest.approx(0.75 / 4), "mismatched_mean_success_rate": pytest.approx(0.25),
        "gain_neutral": pytest.approx(1.25 / 4), "neutral_mean_success_rate": pytest.approx(0.125)}
    # no mismatched condition (a set of one achievement): only the neutral gain
    assert control_summary([0.5], None, [0.0]) == {"gain_neutral": 0.5, "neutral_mean_success_rate": 0.0}


@pytest.mark.parametrize("asked,control,match", [
    ([0.5, 0.5], [0.5], "aligned"), ([0.5], [1.5], r"\[0, 1\]"), ([], [], "at least one"), ([0.5], [float("nan")], "NaN")])
def test_following_gain_errors(asked, control, match):
    with pytest.raises(ValueError, match=match):
        following_gain(asked, control)


pairs = st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0, 1), min_size=n, max_size=n), st.lists(st.floats(0, 1), min_size=n, max_size=n),
    st.lists(st.floats(0, 1), min_size=n, max_size=n)))


@FAST
@given(pairs)
def test_gain_properties(abc):
    asked, mism, neutral = abc
    g = following_gain(asked, mism)
    assert np.all(g >= -1) and np.all(g <= 1)
    np.testing.assert_allclose(following_gain(mism, asked), -g)  # antisymmetric
    np.testing.assert_array_equal(following_gain(asked, asked), 0.0)  # a blind policy in identical worlds: 0
    s = control_summary(asked, mism, neutral)
    # the mean gain is the difference of the mean success rates
    assert s["gain"] == pytest.approx(mean_success_rate(asked) - s["mismatched_mean_success_rate"], abs=1e-12)
    assert s["gain_neutral"] == pytest.approx(mean_success_rate(asked) - s["neutral_mean_success_rate"], abs=1e-12)


@FAST
@given(pairs, st.integers(0, 29), st.floats(0, 1))
def test_gain_rises_with_success_when_asked(abc, i, bump):
    asked, mism, neutral = abc
    i %= len(asked)
    higher = list(asked)
    higher[i] = max(asked[i], bump)
    assert control_summary(higher, mism, neutral)["gain"] >= control_summary(asked, mism, neutral)["gain"] - 1e-12


# --------------------------------------------------------------------------- bootstrap confidence intervals


def test_bootstrap_ci_by_hand():
    low, high = bootstrap_ci([0.30, 0.35, 0.37])
    # 3 seeds: 27 equally likely resamples; the 2.5% and 97.5% percentiles of their means are the extremes
    assert low == pytest.approx(0.30) and high == pytest.approx(0.37)
    assert bootstrap_ci([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert all(np.isnan(bootstrap_ci([0.4])))
    assert bootstrap_ci([0.1, 0.5, 0.2, 0.9], seed=3) == bootstrap_ci([0.1, 0.5, 0.2, 0.9], seed=3)  # deterministic


@pytest.mark.parametrize("bad,match", [([], "non-empty"), ([[0.1, 0.2]], "1-D"), ([0.1, float("inf")], "finite")])
def test_bootstrap_ci_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(bad)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([0.1, 0.2], confidence=1.5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12))
def test_bootstrap_ci_holds_the_mean_within_the_range_of_the_seeds(values):
    low, high = bootstrap_ci(values, n_resamples=999)
    assert min(values) - 1e-12 <= low <= high <= max(values) + 1e-12
    # the interval of the mean holds the sample mean except for very skewed small samples
    if len(set(values)) > 1 and len(values) >= 6:
        assert low - 1e-9 <= float(np.mean(values)) <= high + 1e-9


# --------------------------------------------------------------------------- t intervals


def test_t_interval_by_hand():
    # [1, 2, 3]: mean 2, std 1, s.e. 1/sqrt(3); t_{2, 0.975} = 4.302653
    low, high = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)
    assert low == pytest.approx(2 - half) and high == pytest.approx(2 + half)
    # 90%: t_{2, 0.95} = 2.919986
    low, high = t_interval([1.0, 2.0, 3.0], confidence=0.9)
    assert high - 2 == pytest.approx(2.919985580355516 / math.sqrt(3))
    assert t_interval([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert all(np.isnan(t_interval([0.4])))


@pytest.mark.parametrize("bad,match", [([], "non-empty"), ([[0.1, 0.2]], "1-D"), ([0.1, float("nan")], "finite")])
def test_t_interval_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        t_interval(bad)
    with pytest.raises(ValueError, match="confidence"):
        t_interval([0.1, 0.2], confidence=0.0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12))
def test_t_interval_is_centred_on_the_mean_and_wider_than_the_standard_error(values):
    low, high = t_interval(values)
    mean, se = mean_and_stderr(np.asarray(values))
    assert (low + high) / 2 == pytest.approx(mean, abs=1e-12)
    # the 97.5% t quantile exceeds the normal's 1.96 at every sample size
    assert high - mean >= 1.96 * se - 1e-12


# --------------------------------------------------------------------------- paraphrase retention


def test_paraphrase_retention_averages_per_learned_achievement_ratios():
    from oir_gym.metrics import LEARNED_THRESHOLD, paraphrase_retention

    assert LEARNED_THRESHOLD == 0.25
    # achievement 0 learned (0.5): paraphrases 0.25 and 0.5 -> 0.375 / 0.5 = 0.75; achievement 1 not
    # learned (0.2, left out); achievement 2 learned (1.0): 0.5 -> 0.5; retention (0.75 + 0.5) / 2
    assert paraphrase_retention([0.5, 0.2, 1.0], [0, 1, 2], [0.25, 0.5, 0.1, 0.5], [0, 0, 1, 2]) == pytest.approx(0.625)
    # exactly at the threshold counts as learned; a paraphrase followed better than the original: > 1
    assert paraphrase_retention([0.25], [7], [0.5, 0.5], [7, 7]) == pytest.approx(2.0)
    assert paraphrase_retention([0.5], [3], [0.5], [3], learned=0.6) != paraphrase_retention([0.5], [3], [0.5], [3])
    # nothing learned, or no learned achievement asked in the set: undefined
    assert math.isnan(paraphrase_retention([0.2, 0.1], [0, 1], [0.2], [0]))
    assert math.isnan(paraphrase_retention([0.9, 0.1], [0, 1], [0.2], [1]))
    for bad, match in [
        (([0.5], [0, 1], [0.5], [0]), "aligned"),
        (([0.5, 0.5], [0, 0], [0.5], [0]), "appears twice"),
        (([50.0], [0], [0.5], [0]), "percentages"),
        (([0.5], [0], [0.5], [0], 0.0), "learned=0.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            paraphrase_retention(*bad)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=22), st.data())
def test_paraphrase_retention_properties(original, data):
    from oir_gym.metrics import paraphrase_retention

    achs = list(range(len(original)))
    per = data.draw(st.integers(1, 3))
    para_achs = [a for a in achs for _ in range(per)]
    # the original wordings asked again: retention 1 on whatever was learned
    same = paraphrase_retention(original, achs, [original[a] for a in para_achs], para_achs)
    learned = [o for o in original if o >= 0.25]
    assert math.isnan(same) if not learned else same == pytest.approx(1.0)
    # every paraphrase at c times the original success: retention c
    c = data.draw(st.floats(0, 1))
    scaled = paraphrase_retention(original, achs, [c * original[a] for a in para_achs], para_achs)
    assert math.isnan(scaled) if not learned else scaled == pytest.approx(c, abs=1e-9)
    # the order of the instructions does not matter; retention is >= 0
    rates = data.draw(st.lists(st.floats(0, 1), min_size=len(para_achs), max_size=len(para_achs)))
    perm = data.draw(st.permutations(range(len(para_achs))))
    a = paraphrase_retention(original, achs, rates, para_achs)
    b = paraphrase_retention(original, achs, [rates[i] for i in perm], [para_achs[i] for i in perm])
    assert (math.isnan(a) and math.isnan(b)) or (a == pytest.approx(b) and a >= 0)


def test_welch_interval_of_a_difference_between_two_arms():
    from scipy import stats

    from oir_gym.metrics import welch_interval

    a, b = [0.5, 0.6, 0.7, 0.55, 0.65, 0.6], [0.4, 0.5, 0.45]
    diff, low, high = welch_interval(a, b)
    res = stats.ttest_ind(a, b, equal_var=False)  # scipy's Welch test agrees on the interval
    ci = res.confidence_interval(0.95)
    assert diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (low, high) == pytest.approx((ci.low, ci.high))
    assert welch_interval([0.3, 0.3], [0.1, 0.1]) == pytest.approx((0.2, 0.2, 0.2))
    for bad in (([0.1], [0.1, 0.2]), ([0.1, float("nan")], [0.1, 0.2])):
        with pytest.raises(ValueError):
            welch_interval(*bad)
