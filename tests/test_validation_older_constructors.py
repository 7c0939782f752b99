"""The older constructors and CLIs check their arguments with :mod:`oir_gym.validation` (issue 37):
``EvalConfig``, ``BackgroundRelabeler``, the oracle labels, and the helpers the ``bench/`` CLIs use.

Numbers of the wrong kind (NaN, 0 or negative sizes and limits, bools for ints, floats for ints)
and a string where a list of strings is expected (``EvalConfig(sets="original")`` once meant the
set 'o') raise a ``TypeError``/``ValueError`` that names the argument. Property-based where the
inputs are open-ended (few examples, derandomized: the same ones every run).
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oir_gym.evaluation import EvalConfig
from oir_gym.instructions import PACKAGED_SET_NAMES
from oir_gym.relabel.background import BackgroundRelabeler
from oir_gym.relabel.oracle import Label, NoiseProfile, load_pool, oracle_labels
from oir_gym.relabel.synthetic import random_trajectories
from oir_gym.validation import ArgumentTypeError, check_str_sequence, int_arg, real_arg

CHECKED = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Anything a caller might pass by mistake (and some valid values).
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 70), st.integers(2**31, 2**70), st.integers(-(2**70), -(2**31)),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=3),
    st.lists(st.one_of(st.text(max_size=4), st.integers()), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([np.int64(3), np.float32(0.5), np.bool_(True), np.array([1, 2]), object(), 1j, (1,), "no",
                     "original", ("original",), ["simple", "complex"]]),
)


def refused_or_ok(name: str | tuple[str, ...], call):
    """``call()``, or None after a TypeError/ValueError whose message names ``name`` (or one of the names)."""
    names = (name,) if isinstance(name, str) else name
    try:
        return call()
    except (TypeError, ValueError) as e:
        assert any(n in str(e) for n in names), f"the error does not name {names}: {type(e).__name__}: {e}"
        return None


# ----------------------------------------------------------------------------- sequences of strings
@CHECKED
@given(value=WEIRD)
def test_check_str_sequence_takes_only_sequences_of_non_empty_strings(value):
    got = refused_or_ok("names", lambda: check_str_sequence("names", value))
    if isinstance(value, (str, bytes)):
        assert got is None  # one string is never a list of one-character strings
    if got is not None:
        assert isinstance(got, tuple) and list(got) == list(value) and all(isinstance(t, str) and t.strip() for t in got)


def test_one_string_for_a_list_says_how_to_write_it():
    with pytest.raises(ArgumentTypeError, match=r"sets='original' must be a list of strings, got one str; "
                                                r"write \['original'\]"):
        check_str_sequence("sets", "original")
    with pytest.raises(ArgumentTypeError, match=r"sets\[1\]=3 must be a string"):
        check_str_sequence("sets", ["original", 3])


# ----------------------------------------------------------------------------- argparse types of bench/
@CHECKED
@given(text=st.one_of(st.text(max_size=8), st.integers(-5, 5).map(str), st.floats(allow_nan=True).map(str),
                      st.sampled_from(["nan", "-inf", "inf", "1e3", "2.5", "0", "1", " 3 ", "True"])))
def test_int_arg_and_real_arg_accept_exactly_what_their_bounds_allow(text):
    try:
        n = int_arg(1)(text)
    except argparse.ArgumentTypeError as e:
        assert str(e)
    else:
        assert isinstance(n, int) and n >= 1 and n == int(text, 10)
    try:
        x = real_arg(0, low_open=True)(text)
    except argparse.ArgumentTypeError as e:
        assert str(e)
    else:
        assert math.isfinite(x) and x > 0 and x == float(text)


# ----------------------------------------------------------------------------- EvalConfig
EVAL_ARGS = {
    "sets": st.one_of(WEIRD, st.lists(st.sampled_from(PACKAGED_SET_NAMES), max_size=3)),
    "episodes": st.one_of(WEIRD, st.sampled_from([1, 2, 32])),
    "horizon": st.one_of(WEIRD, st.sampled_from([1, 300])),
    "instruction_files": WEIRD.filter(lambda v: not isinstance(v, str)),  # one path is a list of one (a file test)
    "control": st.one_of(WEIRD, st.booleans()),
    "neutral_text": st.one_of(WEIRD, st.just("do anything")),
}


@CHECKED
@given(arg=st.sampled_from(sorted(EVAL_ARGS)).flatmap(lambda n: st.tuples(st.just(n), EVAL_ARGS[n])))
def test_eval_config_checks_every_argument(arg):
    name, value = arg
    # a file that is not there is named by its own error ("PATH: cannot read the instruction file")
    names = (name, "cannot read the instruction file") if name == "instruction_files" else name
    cfg = refused_or_ok(names, lambda: EvalConfig(**{name: value}))
    if cfg is not None:
        assert all(isinstance(s, str) and s in PACKAGED_SET_NAMES for s in cfg.sets) and cfg.set_names
        assert type(cfg.episodes) is not bool and cfg.episodes >= 1 and cfg.horizon >= 1
        assert cfg.control in (True, False) and isinstance(cfg.neutral_text, str)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"sets": "original"}, TypeError, r"sets='original' must be a list of strings.*\['original'\]"),
    ({"episodes": True}, TypeError, "episodes=True must be an integer >= 1, got bool"),
    ({"episodes": 2.0}, TypeError, "episodes=2.0 must be an integer >= 1, got float"),
    ({"episodes": 0}, ValueError, "episodes=0 must be an integer >= 1"),
    ({"horizon": float("nan")}, TypeError, "horizon=nan must be an integer"),
    ({"horizon": -1}, ValueError, "horizon=-1 must be an integer >= 1"),
    ({"control": "no"}, TypeError, "control='no' must be True or False"),
    ({"instruction_files": [3]}, TypeError, r"instruction_files\[0\]=3 must be a path"),
])
def test_eval_config_errors_name_the_argument_and_what_is_allowed(kwargs, error, message):
    with pytest.raises(error, match=message):
        EvalConfig(**kwargs)
    assert EvalConfig(sets=("original",)).sets == ("original",)


# ----------------------------------------------------------------------------- BackgroundRelabeler
@CHECKED
@given(lag=WEIRD)
def test_background_relabeler_rules_lag_is_0_or_1(lag):
    bg = refused_or_ok("rules_lag", lambda: BackgroundRelabeler(object(), rules_lag=lag))
    if bg is not None:
        assert type(lag) is not bool and lag in (0, 1) and bg.rules_lag in (0, 1)
        if bg._pool is not None:
            bg._pool.shutdown()


def test_background_relabeler_checks_its_method_arguments(encoder):
    from oir_gym.relabel import HindsightRelabeler

    bg = BackgroundRelabeler(HindsightRelabeler.rules(k=2, encoder=encoder))
    try:
        with pytest.raises(TypeError, match="trajectories='abc' must be a list of Trajectory"):
            bg.submit("abc")
        with pytest.raises(TypeError, match=r"trajectories\[0\]=1 must be Trajectory"):
            bg.submit([1])
        with pytest.raises(TypeError, match="ask=.* must be a list of Trajectory"):
            bg.submit([], ask=random_trajectories(1)[0])
        for bad in (float("nan"), -1.0, True, "1"):
            with pytest.raises(ValueError, match="timeout="):
                bg.collect(timeout=bad)
        with pytest.raises(TypeError, match="block=1 must be True or False"):
            bg.collect(block=1)
        with pytest.raises(ValueError, match="timeout=nan"):
            bg.close(timeout=float("nan"))
        bg.submit(tuple(random_trajectories(2)))  # any sequence of trajectories
        assert len(bg.collect()) == 2
    finally:
        bg.close()


# ----------------------------------------------------------------------------- the oracle labels
LABEL_ARGS = {"text": st.one_of(WEIRD, st.just("collect wood")), "final": st.one_of(WEIRD, st.integers(0, 40)),
              "pre": st.one_of(WEIRD, st.integers(-3, 40))}


@CHECKED
@given(arg=st.sampled_from(sorted(LABEL_ARGS)).flatmap(lambda n: st.tuples(st.just(n), LABEL_ARGS[n])))
def test_a_label_names_a_real_event_with_a_text(arg):
    name, value = arg
    label = refused_or_ok(name, lambda: Label(**{"text": "collect wood", "final": 0, "pre": -1, name: value}))
    if label is not None:
        assert isinstance(label.text, str) and label.text.strip()
        assert type(label.final) is not bool and 0 <= label.final < 32 and -1 <= label.pre < 32


@CHECKED
@given(rates=st.tuples(*[st.one_of(WEIRD, st.floats(0, 1)) for _ in range(3)]))
def test_noise_rates_are_probabilities(rates):
    profile = refused_or_ok("", lambda: NoiseProfile(*rates, echo_examples={}, sources={}))
    if profile is not None:
        assert all(0 <= r <= 1 for r in rates) and rates[1] + rates[2] <= 1


@pytest.mark.parametrize("seed", [float("nan"), 1.5, True, "0", None])
def test_oracle_labels_refuse_a_seed_that_is_not_an_integer(seed):
    traj = random_trajectories(1)[0]
    for oracle in ("canonical", "diverse"):
        with pytest.raises(TypeError, match=f"seed={seed!r}"):
            oracle_labels(traj, oracle, seed=seed, pool=load_pool())
    assert oracle_labels(traj, "diverse", seed=7, pool=load_pool()) == oracle_labels(traj, "diverse", seed=7,
                                                                                     pool=load_pool())


def test_a_deeply_nested_oracle_pool_names_its_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"{path}: nested too deeply"):
        load_pool(path)
