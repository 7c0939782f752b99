"""Every public argument is checked at the boundary (:mod:`oir_gym.validation`).

Property-based: arbitrary values (wrong types, bools, NaN, huge and negative numbers, strings,
containers, arbitrary objects, and valid values) are thrown at one argument at a time of the
public constructors, ``reset``'s ``seed`` and ``options``, ``step`` and the relabeler's and
recorder's methods. Each call either succeeds or raises a ``TypeError``/``ValueError`` whose
message names the argument; nothing may get through to fail deep inside JAX or Craftax, or be
taken silently (``terminate_on_success="no"`` used to mean True, ``num_envs=True`` one env).

Kept cheap: few examples each (``derandomize``: the same examples every run), envs built but not
reset (construction compiles nothing), ``reset``/``step`` on the session's shared 4-env env.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import NUM_ENVS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gymnasium as gym

from oir_gym import ENV_ID, HindsightRelabeler, InstructionBuffer, Trajectory, TrajectoryRecorder
from oir_gym.buffer import FAILING
from oir_gym.captions import NUM_EVENTS
from oir_gym.single_env import InstructionCraftaxEnv
from oir_gym.validation import ArgumentTypeError, check_bool, check_int, check_real
from oir_gym.vector_env import InstructionCraftax
from relabel_config import relabel_config

CHECKED = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: Anything a caller might pass by mistake (and some valid values).
WEIRD = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 70), st.integers(2**31, 2**70), st.integers(-(2**70), -(2**31)),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=3),
    st.lists(st.integers(-2, 20), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sampled_from([np.int64(3), np.float32(0.5), np.bool_(True), np.array([1, 2]), object(), 1j, (1,), "no",
                     "yes", "true"]),
)
NOT_STR = WEIRD.filter(lambda v: not isinstance(v, (str, bytes)))


def refused_or_ok(name: str | tuple[str, ...], call):
    """Run ``call``: its result, or None after a TypeError/ValueError whose message names ``name``
    (or one of the names)."""
    names = (name,) if isinstance(name, str) else name
    try:
        return call()
    except (TypeError, ValueError) as e:
        assert any(n in str(e) for n in names), f"the error does not name {names}: {type(e).__name__}: {e}"
        return None


# ----------------------------------------------------------------------------- the helpers themselves


@pytest.mark.parametrize("value", [True, np.bool_(False), 2.5, 2.0, "3", None, [1]])
def test_check_int_refuses_what_is_not_an_integer(value):
    with pytest.raises(ArgumentTypeError, match=r"^n=.* must be an integer >= 1"):
        check_int("n", value, minimum=1)


def test_the_type_error_is_also_a_value_error_and_ranges_are_value_errors():
    with pytest.raises(TypeError):
        check_bool("flag", "no")
    with pytest.raises(ValueError):
        check_bool("flag", 1)
    with pytest.raises(ValueError, match=r"x=nan is outside the allowed range \(0, 1\]"):
        check_real("x", float("nan"), low=0, high=1, low_open=True)
    with pytest.raises(ValueError, match=r"k=0 must be an integer >= 1") as e:
        check_int("k", 0, minimum=1)
    assert not isinstance(e.value, TypeError)
    assert check_int("k", np.int64(3), minimum=1) == 3 and check_bool("flag", np.bool_(True)) is True


# ----------------------------------------------------------------------------- the vector env

ENV_ARGS = {
    "num_envs": st.one_of(WEIRD, st.sampled_from([1, 2, NUM_ENVS])),
    "obs_mode": st.one_of(WEIRD, st.sampled_from(["paper", "symbolic"])),
    "delta": st.one_of(WEIRD, st.sampled_from([0.9, 1.0, -0.5])),
    "max_episode_steps": st.one_of(WEIRD, st.sampled_from([1, 1000])),
    "instructions": st.one_of(WEIRD, st.lists(st.text(max_size=8), max_size=3), st.just(["collect wood"])),
    "buffer": st.one_of(WEIRD, st.just(None)),
    "reward": st.one_of(WEIRD, st.sampled_from(["cosine", "gt"])),
    "terminate_on_success": st.one_of(WEIRD, st.booleans()),
    "autoreset_mode": st.one_of(WEIRD, st.sampled_from(["same_step", "next_step"])),
    "info_text": st.one_of(WEIRD, st.booleans()),
    "encoder": NOT_STR,  # a string is a model path: a missing one is a FileNotFoundError naming it (test_env_errors)
    "render_mode": st.one_of(WEIRD, st.sampled_from([None, "rgb_array"])),
    "seed": st.one_of(WEIRD, st.sampled_from([0, 2**32 - 1, 2**32])),
    "pool_size": st.one_of(WEIRD, st.sampled_from([None, 1, 64])),
    "pool_refresh": st.one_of(WEIRD, st.sampled_from([None, 1, 4])),
    "table_capacity": st.one_of(WEIRD, st.sampled_from([22, 256])),
}


def _one_arg(args: dict) -> st.SearchStrategy:
    return st.sampled_from(sorted(args)).flatmap(lambda name: st.tuples(st.just(name), args[name]))


@CHECKED
@given(arg=_one_arg(ENV_ARGS))
def test_the_vector_env_constructor_checks_every_argument(arg, encoder):
    name, value = arg
    kwargs = {"num_envs": 2, "encoder": encoder, name: value}
    env = refused_or_ok(name, lambda: InstructionCraftax(**kwargs))
    if env is not None:
        assert env.num_envs == kwargs["num_envs"] and env.num_envs >= 1
        assert env.params.terminate_on_success == kwargs.get("terminate_on_success", True)
        env.close()


@CHECKED
@given(arg=_one_arg({k: v for k, v in ENV_ARGS.items() if k in ("num_envs", "delta", "seed", "pool_size",
                                                                 "terminate_on_success", "max_episode_steps")}))
def test_gym_make_vec_checks_its_arguments(arg, encoder):
    name, value = arg
    kwargs = {"num_envs": 2, "encoder": encoder, name: value}
    env = refused_or_ok(name, lambda: gym.make_vec(ENV_ID, **kwargs))
    if env is not None:
        env.close()


@pytest.mark.parametrize("kwargs, name", [
    ({"terminate_on_success": "no"}, "terminate_on_success"), ({"num_envs": True}, "num_envs"),
    ({"pool_size": -5}, "pool_size"), ({"info_text": "yes"}, "info_text"), ({"delta": True}, "delta"),
    ({"seed": 2**32}, "seed"), ({"seed": -1}, "seed"), ({"max_episode_steps": 2**40}, "max_episode_steps"),
    ({"autoreset_mode": ["same_step"]}, "autoreset_mode"), ({"encoder": 3}, "encoder"),
    ({"buffer": ["collect wood"]}, "buffer"), ({"pool_refresh": 0}, "pool_refresh"),
])
def test_values_that_used_to_pass_or_fail_deep_inside_are_refused_at_once(kwargs, name, encoder):
    with pytest.raises((TypeError, ValueError), match=name):
        InstructionCraftax(**{"num_envs": 2, "encoder": encoder, **kwargs})


SEEDS = st.one_of(WEIRD, st.lists(st.one_of(st.none(), st.integers(-1, 6)), min_size=NUM_ENVS, max_size=NUM_ENVS))
OPTIONS = st.one_of(WEIRD, st.just({"instrucion": "collect wood"}), st.fixed_dictionaries({"instruction": st.one_of(
    WEIRD, st.sampled_from(["collect wood", None, ["collect wood", None, "drink water", "sleep"]]))}))


@CHECKED
@given(seed=SEEDS)
def test_reset_checks_its_seed(venv, seed):
    out = refused_or_ok("seed", lambda: venv.reset(seed=seed))
    if out is not None:
        assert out[0]["obs"].shape[0] == NUM_ENVS


@CHECKED
@given(options=OPTIONS)
def test_reset_checks_its_options(venv, options):
    out = refused_or_ok(("option", "instruction"), lambda: venv.reset(seed=0, options=options))
    if out is not None:
        assert len(out[1]["instruction"]) == NUM_ENVS


@CHECKED
@given(actions=st.one_of(WEIRD, st.lists(st.integers(-3, 20), min_size=NUM_ENVS, max_size=NUM_ENVS),
                         st.lists(st.floats(allow_nan=True), min_size=NUM_ENVS, max_size=NUM_ENVS),
                         st.lists(st.booleans(), min_size=NUM_ENVS, max_size=NUM_ENVS),
                         st.just([[0, 1], [2], 3, 4])))
def test_step_checks_its_actions(venv, actions):
    out = refused_or_ok("action", lambda: venv.step(actions))
    if out is not None:
        assert out[1].shape == (NUM_ENVS,)


# ----------------------------------------------------------------------------- the single env


@CHECKED
@given(arg=_one_arg({**{k: v for k, v in ENV_ARGS.items() if k != "num_envs"},
                     "num_envs": st.one_of(WEIRD, st.just(1))}))
def test_the_single_env_constructor_checks_every_argument(arg, encoder):
    name, value = arg
    env = refused_or_ok(name, lambda: InstructionCraftaxEnv(**{"encoder": encoder, name: value}))
    if env is not None:
        env.close()


@CHECKED
@given(action=st.one_of(WEIRD, st.integers(0, 16)))
def test_single_env_step_checks_the_action_before_anything_else(action, encoder):
    env = InstructionCraftaxEnv(encoder=encoder)  # not reset: a valid action meets "call reset() first"
    try:
        env.step(action)
    except RuntimeError as e:
        assert "reset" in str(e)
        assert isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_))
        assert 0 <= action < 17
    except (TypeError, ValueError) as e:
        assert "action" in str(e)
    env.close()


@pytest.mark.parametrize("kwargs, name", [
    ({"seed": True}, "seed"), ({"seed": 2**40}, "seed"), ({"seed": -1}, "seed"), ({"seed": "0"}, "seed"),
    ({"options": ["collect wood"]}, "options"), ({"options": {"instrucion": "collect wood"}}, "instrucion"),
    ({"options": {"instruction": 5}}, "instruction"), ({"options": {"instruction": "a\x00b"}}, "instruction"),
])
def test_single_env_reset_checks_seed_and_options_before_the_env_runs(kwargs, name, encoder):
    env = InstructionCraftaxEnv(encoder=encoder)
    with pytest.raises((TypeError, ValueError), match=name):
        env.reset(**kwargs)
    env.close()


# ----------------------------------------------------------------------------- the relabeler

def _traj(n: int = 3) -> Trajectory:
    return Trajectory("collect wood", np.zeros((n, NUM_EVENTS), bool), np.zeros(n, np.int32))


RELABEL_ARGS = {
    "backend": st.one_of(WEIRD.filter(lambda v: not (isinstance(v, str) and ":" in v)), st.just("rules")),
    "k": st.one_of(WEIRD, st.just(4)),
    "template": st.one_of(WEIRD, st.sampled_from(["segments", "paper"])),
    "use_rules": WEIRD, "keep_ungrounded": WEIRD, "skip_idle": WEIRD, "isolate": WEIRD,
    "delta": WEIRD, "dedup_threshold": WEIRD, "bind_threshold": WEIRD, "llm_timeout": WEIRD,
    "encoder": NOT_STR, "cache_size": WEIRD, "cache_path": NOT_STR, "samples": WEIRD, "fallback": WEIRD,
    "candidate_filter": WEIRD, "rules": WEIRD, "queue_size": WEIRD, "on_full": WEIRD, "cache_save_every": WEIRD,
    "cache_key": WEIRD, "backend_kwargs": WEIRD, "child_config": WEIRD, "warn_after": WEIRD,
    "grounding": st.one_of(WEIRD, st.sampled_from(["cosine", "bound"])), "max_prompt_tokens": WEIRD,
}


@CHECKED
@given(arg=_one_arg(RELABEL_ARGS))
def test_the_relabeler_constructor_checks_every_argument(arg, encoder):
    name, value = arg
    kwargs = {"backend": "rules", "encoder": encoder, name: value}
    objects = {key: kwargs.pop(key) for key in ("encoder", "rules") if key in kwargs}
    relabeler = refused_or_ok(name, lambda: HindsightRelabeler(relabel_config(**kwargs), **objects))
    if relabeler is not None:
        assert isinstance(relabeler.k, int) and relabeler.k >= 1
        relabeler.close()


@pytest.mark.parametrize("kwargs, name", [
    ({"k": 2.5}, "k"), ({"k": True}, "k"), ({"encoder": object()}, "encoder"), ({"queue_size": -5}, "queue_size"),
    ({"bind_threshold": "high"}, "bind_threshold"), ({"max_prompt_tokens": True}, "max_prompt_tokens"),
    ({"keep_ungrounded": "no"}, "keep_ungrounded"),
])
def test_relabeler_values_that_used_to_pass_are_refused(kwargs, name):
    objects = {key: kwargs.pop(key) for key in ("encoder",) if key in kwargs}
    with pytest.raises((TypeError, ValueError), match=name):
        HindsightRelabeler(relabel_config("rules", **kwargs), **objects)


@CHECKED
@given(batch=st.one_of(WEIRD, st.just([]), st.lists(st.sampled_from([_traj(), _traj(1), "collect wood", None]),
                                                   max_size=3)))
def test_relabel_and_submit_refuse_what_is_not_a_batch_of_trajectories(batch, encoder):
    relabeler = HindsightRelabeler(relabel_config("rules"), encoder=encoder)
    try:
        results = refused_or_ok("trajectories", lambda: relabeler.relabel(batch))
        if results is not None:
            assert len(results) == len(batch)
        refused_or_ok("trajectories", lambda: relabeler.submit(batch))
    finally:
        relabeler.close()


@CHECKED
@given(block=WEIRD, timeout=st.one_of(WEIRD, st.just(0.0)))
def test_collect_checks_block_and_timeout(block, timeout, encoder):
    relabeler = HindsightRelabeler(relabel_config("rules"), encoder=encoder)
    try:
        out = refused_or_ok(("block", "timeout"), lambda: relabeler.collect(block=block, timeout=timeout))
        assert out in (None, [])
    finally:
        relabeler.close()


def test_a_non_trajectory_batch_is_an_error_not_a_warning_and_empty_results(encoder):
    relabeler = HindsightRelabeler(relabel_config("rules"), encoder=encoder)
    with pytest.raises(TypeError, match=r"trajectories\[1\]=.* must be an oir_gym.Trajectory"):
        relabeler.relabel([_traj(), {"events": []}])
    with pytest.raises(TypeError, match="trajectories="):
        relabeler.relabel(_traj())  # one trajectory, not a list of them
    relabeler.close()


# ----------------------------------------------------------------------------- the buffer and the recorder

BUFFER_ARGS = {
    "capacity": st.one_of(WEIRD, st.just(10)), "tau_low": WEIRD, "tau_high": WEIRD,
    "initial": st.one_of(WEIRD, st.lists(st.text(max_size=5), max_size=3)), "seed": WEIRD,
    "allow_duplicates": WEIRD, "max_tracked": WEIRD,
}


@CHECKED
@given(arg=_one_arg(BUFFER_ARGS))
def test_the_instruction_buffer_checks_every_argument(arg):
    name, value = arg
    buf = refused_or_ok(name, lambda: InstructionBuffer(**{name: value}))
    if buf is not None:
        assert 0 <= len(buf) <= buf.capacity and 0 <= buf.tau_low < buf.tau_high
        buf.insert(["collect wood"])
        assert buf.sample(2) == ["collect wood"] * 2 or len(buf) > 1
        assert buf.status("never seen") == FAILING


@CHECKED
@given(arg=_one_arg({"envs": st.one_of(WEIRD, st.builds(lambda: SimpleNamespace(num_envs=3, metadata={}))),
                     "max_length": st.one_of(WEIRD, st.just(None)), "num_envs": WEIRD}))
def test_the_recorder_constructor_checks_every_argument(arg):
    name, value = arg
    kwargs = {"num_envs": 2} if name != "envs" else {}
    kwargs[name] = value
    rec = refused_or_ok(name, lambda: TrajectoryRecorder(**kwargs))
    if rec is not None:
        assert rec.num_envs >= 1


@CHECKED
@given(arg=_one_arg({"actions": WEIRD, "rewards": WEIRD, "terminated": WEIRD, "truncated": WEIRD,
                     "info": st.one_of(WEIRD, st.just({"events": np.zeros((2, 3), bool), "instruction": ["a", "b"]}))}))
def test_recorder_record_checks_every_argument(arg):
    name, value = arg
    good = {"actions": [1, 2], "rewards": [0.0, 1.0], "terminated": [False, True], "truncated": [False, False],
            "info": {"events": np.zeros((2, NUM_EVENTS), bool), "instruction": np.array(["a", "b"], dtype=object),
                     "success": np.array([False, True])}}
    rec = TrajectoryRecorder(num_envs=2)
    if refused_or_ok(name, lambda: rec.record(**{**good, name: value})) is None:
        return
    assert [len(t) for t in rec.trajectories()] == [1, 1]
