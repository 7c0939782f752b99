"""The evaluation protocol and its control (issue 13, item 3): pairing, keys, results, real episodes.

The real-env tests run Craftax episodes through the evaluator: a uniform random policy ignores its
instruction (gain near 0), a scripted policy that follows a few instructions has a clearly positive gain.
"""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym import functional as F
from oir_gym.captions import ACHIEVEMENT_NAMES
from oir_gym.craftax_compat import Action
from oir_gym.evaluation import (
    NEUTRAL_SET,
    NEUTRAL_TEXT,
    PREREQUISITES,
    EvalConfig,
    eval_config,
    eval_instructions,
    eval_key,
    eval_keys,
    eval_params,
    eval_result,
    evaluate_jax_seeds,
    evaluate_python_policy,
    make_jax_evaluator,
    mismatch_pairing,
    mismatch_partners,
    related,
)
from oir_gym.instructions import SET_NAMES

A = {n: i for i, n in enumerate(ACHIEVEMENT_NAMES)}
FAST = settings(max_examples=60, deadline=None)


def _user_file(tmp_path, sets: dict, name: str = "mine.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"sets": sets}))
    return p


# --------------------------------------------------------------------------- the pairing


def test_the_pairing_of_the_22_achievements_is_a_derangement_without_prerequisite_pairs():
    pairing = mismatch_pairing([(i,) for i in range(22)])
    assert sorted(pairing) == sorted(pairing.values()) == [(i,) for i in range(22)]
    assert all(a != b and not related(a, b) for a, b in pairing.items())
    # a few documented pairs (docs/evaluation.md holds the whole table)
    assert pairing[(A["collect_wood"],)] == (A["eat_cow"],)
    assert pairing[(A["place_table"],)] == (A["collect_sapling"],)
    assert pairing[(A["make_iron_sword"],)] == (A["make_iron_pickaxe"],)
    assert pairing[(A["wake_up"],)] == (A["place_table"],)


def test_ties_go_to_the_nearest_following_partner_row_by_row():
    # four achievements without prerequisites among them: every derangement is free of related pairs,
    # and the rule picks the cyclic shift by one
    free = [(A[n],) for n in ("eat_cow", "collect_sapling", "collect_drink", "defeat_zombie")]
    assert mismatch_pairing(free) == dict(zip(free, free[1:] + free[:1]))


def test_the_pairing_table_in_the_docs_is_the_computed_one():
    from pathlib import Path

    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

    doc = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    table = doc[doc.index("| asked for A | mismatched: given |"):].split("\n\n")[0]
    pairs = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        pairs.update({a: b for a, b in (cells[0:2], cells[3:5]) if a})
    pairing = mismatch_pairing([(i,) for i in range(22)])
    assert pairs == {ORIGINAL_INSTRUCTIONS[a[0]]: ORIGINAL_INSTRUCTIONS[b[0]] for a, b in pairing.items()}


def test_prerequisites_make_related_pairs_both_ways():
    assert related((A["collect_wood"],), (A["make_iron_pickaxe"],))  # transitively
    assert related((A["make_iron_pickaxe"],), (A["collect_wood"],))
    assert related((A["collect_sapling"],), (A["eat_plant"],))
    assert not related((A["make_wood_sword"],), (A["make_wood_pickaxe"],))  # siblings, neither needs the other
    assert related((A["eat_cow"], A["collect_wood"]), (A["place_table"],))  # a compound target: any member
    assert set(PREREQUISITES) <= set(ACHIEVEMENT_NAMES)
    assert all(set(v) <= set(ACHIEVEMENT_NAMES) for v in PREREQUISITES.values())


target_lists = st.lists(st.sampled_from(range(22)), min_size=0, max_size=9).map(lambda xs: [(x,) for x in xs])


@FAST
@given(target_lists)
def test_pairing_is_a_deterministic_derangement_of_the_distinct_targets(targets):
    pairing = mismatch_pairing(targets)
    uniq = sorted(set(targets))
    if len(uniq) < 2:
        assert pairing == {}
        return
    assert sorted(pairing) == uniq and sorted(pairing.values()) == uniq
    assert all(a != b for a, b in pairing.items())
    assert mismatch_pairing(list(reversed(targets))) == pairing  # order of the instructions does not matter


@FAST
@given(st.sets(st.sampled_from(range(22)), min_size=2, max_size=6))
def test_pairing_has_the_fewest_related_pairs_of_any_derangement(achs):
    uniq = [(a,) for a in sorted(achs)]
    best = min(sum(related(a, b) for a, b in zip(uniq, perm))
               for perm in itertools.permutations(uniq) if all(a != b for a, b in zip(uniq, perm)))
    assert sum(related(a, b) for a, b in mismatch_pairing(uniq).items()) == best


def test_partners_pair_the_kth_paraphrase_with_the_kth_of_the_partner():
    # two achievements with 3 and 2 instructions
    targets = [(0,), (0,), (0,), (2,), (2,)]
    assert mismatch_partners(targets) == [3, 4, 3, 0, 1]
    assert mismatch_partners([(0,), (0,)]) is None  # one achievement: no mismatched instruction


# --------------------------------------------------------------------------- keys


def test_eval_keys_depend_on_the_seed_the_seed_index_and_the_update():
    keys = {(s, i, u): tuple(np.asarray(eval_key(s, i, u)).tolist()) for s in (0, 1, 1000) for i in (0, 1) for u in (0, 50)}
    assert len(set(keys.values())) == len(keys)
    np.testing.assert_array_equal(eval_key(7, 1, 3), eval_key(7, 1, 3))
    np.testing.assert_array_equal(eval_keys(7, 3, 50)[2], eval_key(7, 2, 50))
    for bad in (-1, 2**32, 1.5, True):
        with pytest.raises(ValueError, match="must be an integer"):
            eval_key(bad)


# --------------------------------------------------------------------------- config and instruction files


def test_user_files_add_their_sets_after_the_built_in_ones(tmp_path):
    a = _user_file(tmp_path, {"tools": [{"text": "make a pickaxe out of wood", "achievement": "make_wood_pickaxe"}],
                              "both": [{"text": "table and sword", "achievements": ["make_wood_sword", "place_table"]}]})
    b = _user_file(tmp_path, {"food": [{"text": "grab a bite of beef", "achievement": "eat_cow"}]}, "b.json")
    cfg = eval_config([a, b], episodes=3, horizon=10)
    assert cfg.set_names == (*SET_NAMES, "tools", "both", "food") and cfg.instruction_files == (str(a), str(b))
    texts, achs, sets = eval_instructions(cfg)
    assert len(texts) == 22 + 66 + 66 + 3 + 1
    assert texts[-1] == NEUTRAL_TEXT and sets[-1] == NEUTRAL_SET and achs[-1] == -1
    both = cfg.instruction_sets()["both"][0]
    assert both.achievement_index == -1 and both.targets == (A["place_table"], A["make_wood_sword"])
    assert EvalConfig(sets=(), instruction_files=(str(b),)).set_names == ("food",)
    assert eval_config(b, sets=()).instruction_files == (str(b),)  # one path, not its characters
    assert EvalConfig(sets=("food", "original"), instruction_files=(str(b),)).set_names == ("food", "original")
    assert eval_instructions(EvalConfig(sets=("original",), control=False))[0] == eval_instructions(
        EvalConfig(sets=("original",)))[0][:-1]


def test_config_errors_come_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown instruction set 'hard'"):
        EvalConfig(sets=("hard",))
    with pytest.raises(ValueError, match="no instruction set to evaluate"):
        EvalConfig(sets=())
    with pytest.raises(ValueError, match="neutral_text"):
        EvalConfig(neutral_text="  ")
    bad = _user_file(tmp_path, {"x": [{"text": "dig", "achievement": "collect_gold"}]})
    with pytest.raises(ValueError, match=rf"{bad}: set 'x', entry 0 \('dig'\): field 'achievement': unknown"):
        eval_config([bad])


# --------------------------------------------------------------------------- results from hand-built episodes


def _achieved(cfg: EvalConfig, per_text: dict[str, list[list[str]]]) -> np.ndarray:
    """``[n_texts * episodes, 22]`` flags: ``per_text[text][episode]`` lists the achievements that happened."""
    texts, _, _ = eval_instructions(cfg)
    out = np.zeros((len(texts), cfg.episodes, 22), bool)
    for i, t in enumerate(texts):
        for e, names in enumerate(per_text.get(t, [])):
            out[i, e, [A[n] for n in names]] = True
    return out.reshape(-1, 22)


def test_control_rates_and_gains_from_hand_built_episodes(tmp_path):
    f = _user_file(tmp_path, {"s": [
        {"text": "chop", "achievement": "collect_wood"},
        {"text": "drink", "achievement": "collect_drink"},
        {"text": "chop and drink", "achievements": ["collect_wood", "collect_drink"]}]})
    cfg = EvalConfig(sets=(), instruction_files=(str(f),), episodes=2)
    texts, achs, sets = eval_instructions(cfg)
    # sorted targets (wood), (wood, drink), (drink): every derangement of 3 is a cycle with 2 related pairs
    # (shared achievements); the tie goes to the forward shift in that order
    assert [texts[j] for j in mismatch_partners([(0,), (4,), (0, 4)])] == ["chop and drink", "chop", "drink"]
    achieved = _achieved(cfg, {
        "chop": [["collect_wood"], ["collect_wood", "collect_drink"]],
        "drink": [["collect_drink"], []],
        "chop and drink": [["collect_wood", "collect_drink"], ["collect_wood"]],
        NEUTRAL_TEXT: [["collect_wood"], []],
    })
    res = eval_result(cfg, texts, achs, sets, achieved)
    np.testing.assert_allclose(res.rates["s"], [1.0, 0.5, 0.5])  # "chop and drink" needs both
    c = res.control["s"]
    assert c.mismatched_texts == ["chop and drink", "chop", "drink"]
    # wood under "chop and drink": 2/2; drink under "chop": 1/2; wood and drink under "drink": 0/2
    np.testing.assert_allclose(c.mismatched_rates, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(c.neutral_rates, [0.5, 0.0, 0.0])
    m = res.flat_metrics()
    assert m["eval/control/s/gain"] == pytest.approx((0.0 + 0.0 + 0.5) / 3)
    assert m["eval/control/s/gain_neutral"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)
    assert m["eval/control/s/mismatched_mean_success_rate"] == pytest.approx(0.5)
    assert m["eval/s/mean_success_rate"] == pytest.approx(2 / 3)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["s"]["targets"] == [[0], [4], [0, 4]] and d["s"]["achievements"] == [0, 4, -1]
    assert d["s"]["control"]["gain_per_instruction"] == [0.0, 0.0, 0.5]
    assert d["s"]["control"]["neutral_text"] == NEUTRAL_TEXT and d["s"]["control"]["gain"] == pytest.approx(1 / 6)
    assert "| s | 0.667 | 0.500 | 0.167 | +0.167 | +0.500 |" in res.to_markdown()


def test_the_table_lists_every_instruction_of_a_user_set(tmp_path):
    """--eval-only with a user file prints that file's per-instruction table (only the original set's
    was printed), with and without the control, and with the built-in sets left out."""
    f = _user_file(tmp_path, {"mine": [{"text": "chop a tree", "achievement": "collect_wood"},
                                       {"text": "have a drink", "achievement": "collect_drink"}]})
    for control in (True, False):
        cfg = EvalConfig(sets=(), instruction_files=(str(f),), episodes=2, control=control)
        res = eval_result(cfg, *eval_instructions(cfg), _achieved(cfg, {"chop a tree": [["collect_wood"], []]}))
        table = res.to_markdown()
        assert "Set mine, per instruction:" in table
        assert ("| chop a tree | 0.50 | 0.00 (have a drink) | 0.00 |" if control else "| chop a tree | 0.50 |") in table
        assert "| have a drink | 0.00 |" in table
    both = EvalConfig(sets=("original", "simple"), instruction_files=(str(f),), episodes=1, control=False)
    table = eval_result(both, *eval_instructions(both), np.zeros((22 + 66 + 2, 22), bool)).to_markdown()
    assert "| collect wood | 0.00 |" in table and "| chop a tree | 0.00 |" in table
    assert "Set simple" not in table  # the paraphrase sets (66 rows) stay in the summary


def test_a_set_of_one_achievement_reports_only_the_neutral_gain(tmp_path):
    f = _user_file(tmp_path, {"one": [{"text": "chop", "achievement": "collect_wood"},
                                      {"text": "get logs", "achievement": "collect_wood"}]})
    cfg = EvalConfig(sets=(), instruction_files=(str(f),), episodes=1)
    res = eval_result(cfg, *eval_instructions(cfg), _achieved(cfg, {"chop": [["collect_wood"]]}))
    assert res.control["one"].mismatched_rates is None
    m = res.flat_metrics()
    assert "eval/control/one/gain" not in m and m["eval/control/one/gain_neutral"] == pytest.approx(0.5)
    assert res.to_dict()["one"]["control"]["gain_per_instruction"] is None
    assert "- (one achievement only)" in res.to_markdown()


def test_results_without_control_keep_the_old_layout():
    cfg = EvalConfig(sets=("original",), episodes=1, control=False)
    res = eval_result(cfg, *eval_instructions(cfg), np.zeros((22, 22), bool))
    assert set(res.to_dict()["original"]) == {"texts", "achievements", "rates", "mean_success_rate", "num_completed",
                                              "aggregate_score"}
    assert not any(k.startswith("eval/control/") for k in res.flat_metrics())


def test_eval_result_checks_its_inputs():
    cfg = EvalConfig(sets=("original",), episodes=2)
    texts, achs, sets = eval_instructions(cfg)
    with pytest.raises(ValueError, match=r"achieved must be \[n_instructions \* episodes, 22\] = \[46, 22\]"):
        eval_result(cfg, texts, achs, sets, np.zeros(46, bool))
    with pytest.raises(ValueError, match="eval_instructions"):
        eval_result(cfg, texts[:-1], achs[:-1], sets[:-1], np.zeros((44, 22), bool))


@pytest.mark.parametrize("episodes", [1, 32])
def test_32_episodes_per_instruction_fit_the_result_shapes(episodes):
    cfg = EvalConfig(episodes=episodes)
    texts, achs, sets = eval_instructions(cfg)
    rng = np.random.default_rng(0)
    res = eval_result(cfg, texts, achs, sets, rng.random((len(texts) * episodes, 22)) < 0.3)
    assert [len(res.rates[s]) for s in SET_NAMES] == [22, 66, 66]
    assert all(0 <= r <= 1 for s in SET_NAMES for r in res.rates[s])
    assert set(res.control) == set(SET_NAMES)


# --------------------------------------------------------------------------- real episodes (JAX driver)

#: The scripted policy's repertoire: what it does when asked for exactly these instructions.
REPERTOIRE = ("collect sapling", "collect wood", "wake up")


@pytest.fixture(scope="module")
def jax_eval(encoder):
    """One compiled evaluator (original set, 8 episodes, 60 steps) for a random and a scripted policy.

    ``params["follow"]`` switches between them inside one program: False is the uniform random
    policy (blind to the instruction); True follows the instructions of :data:`REPERTOIRE` (DO with
    random steps to find grass or a tree for "collect sapling" / "collect wood", SLEEP for "wake
    up") and does nothing (NOOP) for any other instruction, the neutral one included.
    """
    from oir_gym.instruction_registry import InstructionRegistry

    cfg = EvalConfig(sets=("original",), episodes=8, horizon=60)
    texts, achs, sets = eval_instructions(cfg)
    registry = InstructionRegistry(encoder, capacity=32)
    rows = registry.rows(texts, achs)
    emb = registry.emb[registry.rows(list(REPERTOIRE))]

    def policy(params, carry, obs, done, key):
        k_rand, k_move, k_coin = jax.random.split(key, 3)
        n = obs["obs"].shape[0]
        instr = obs["instruction"] / jnp.linalg.norm(obs["instruction"], axis=1, keepdims=True)
        ref = params["emb"] / jnp.linalg.norm(params["emb"], axis=1, keepdims=True)
        asked = (instr @ ref.T) > 0.999  # [n, 3]: exactly one of the repertoire's texts
        forage = jnp.where(jax.random.uniform(k_coin, (n,)) < 0.7, Action.DO.value,
                           jax.random.randint(k_move, (n,), Action.LEFT.value, Action.DOWN.value + 1))
        scripted = jnp.where(asked[:, 0] | asked[:, 1], forage, jnp.where(asked[:, 2], Action.SLEEP.value,
                                                                             Action.NOOP.value))
        random = jax.random.randint(k_rand, (n,), 0, 17)
        return carry, jnp.where(params["follow"], scripted, random)

    evaluator = make_jax_evaluator(policy, lambda n: jnp.zeros(n), len(texts) * cfg.episodes, cfg.horizon)
    seeds = jax.jit(jax.vmap(evaluator, in_axes=(0, 0, None, None)))
    params = {"emb": jnp.asarray(np.stack([emb, emb])), "follow": jnp.array([False, True])}
    # both policies in one call, on the same worlds (same key)
    keys = jnp.stack([eval_key(0), eval_key(0)])
    env_params = F.EnvParams(table=registry.device_table())
    blind, follow = evaluate_jax_seeds(seeds, keys, params, env_params, rows, cfg, texts, achs, sets)
    # the raw episode records of the same program (no new compile), for the record's own checks
    records = np.asarray(seeds(keys, params, eval_params(env_params, rows, achs),
                               jnp.repeat(jnp.asarray(rows, jnp.int32), cfg.episodes)))
    return blind, follow, records


def test_a_random_policy_that_ignores_its_instruction_gains_nothing(jax_eval):
    blind, _, _ = jax_eval
    m = blind.flat_metrics()
    # something is achieved (the test has content) ...
    assert m["eval/original/num_completed"] >= 3 and m["eval/original/mean_success_rate"] > 0.04
    # ... but no more when asked for it than when asked for something else. With 8 episodes, the
    # mean gain's standard deviation under blindness is about 0.025 (22 differences of two
    # 8-episode rates, about 5 of them away from 0 or 1): 0.1 is 4 standard deviations.
    assert abs(m["eval/control/original/gain"]) < 0.1
    assert abs(m["eval/control/original/gain_neutral"]) < 0.1
    gains = blind.to_dict()["original"]["control"]["gain_per_instruction"]
    assert max(abs(g) for g in gains) <= 0.5


def test_a_scripted_policy_that_follows_instructions_has_a_positive_gain(jax_eval):
    _, follow, _ = jax_eval
    d = follow.to_dict()["original"]
    gain = dict(zip(d["texts"], d["control"]["gain_per_instruction"]))
    rate = dict(zip(d["texts"], d["rates"]))
    # asked for its repertoire, it does it; asked for anything else, it does nothing of it
    assert rate["collect sapling"] >= 0.625 and gain["collect sapling"] >= 0.625  # 10% a DO on grass
    assert rate["wake up"] >= 0.75 and gain["wake up"] >= 0.75
    assert gain["collect wood"] > 0
    # other achievements happen only by accident of the foraging (a cow in the way), in at most 1 of 8 episodes
    assert all(abs(g) <= 0.125 for t, g in gain.items() if t not in REPERTOIRE)
    assert d["control"]["neutral_rates"] == [0.0] * 22  # NOOP under the neutral instruction
    assert d["control"]["gain"] > 0.08 and d["control"]["gain_neutral"] == pytest.approx(d["mean_success_rate"])


# --------------------------------------------------------------------------- real episodes (Python driver)


def test_python_driver_scores_a_scripted_sleeper_and_its_neutral_control(tmp_path, encoder):
    """A one-achievement user set: the mismatched condition cannot exist, the neutral one can."""
    f = _user_file(tmp_path, {"rest": [{"text": "wake up", "achievement": "wake_up"}]})
    cfg = EvalConfig(sets=(), instruction_files=(str(f),), episodes=2, horizon=80)
    wake = encoder.encode(["wake up"])[0]

    def sleeper(obs, state, start):
        asked = obs["instruction"] @ wake / np.linalg.norm(obs["instruction"], axis=1) / np.linalg.norm(wake) > 0.999
        return np.where(asked, Action.SLEEP.value, Action.NOOP.value), state

    res = evaluate_python_policy(sleeper, cfg, seed=3, env_kwargs={"encoder": encoder})  # 2 texts x 2 episodes
    assert res.rates["rest"].tolist() == [1.0]
    c = res.control_summary()["rest"]
    assert c == {"gain_neutral": 1.0, "neutral_mean_success_rate": 0.0}


def test_episode_records_hold_first_steps_and_the_order_of_every_pair(jax_eval):
    """The evaluator's records (RECORD_SHAPE): row 0 the first step of each achievement, row 1 + a
    the first step of b after an earlier a; consistent with each other on every episode."""
    from oir_gym.evaluation import RECORD_SHAPE

    _, _, records = jax_eval
    assert records.shape[2:] == RECORD_SHAPE and records.dtype == np.int32
    first, after = records[:, :, 0], records[:, :, 1:]
    assert (first >= -1).all() and (first < 60).all() and (first >= 0).sum() > 10  # the horizon is 60 steps
    s, e, a, b = np.nonzero(after >= 0)
    assert len(s) > 0  # some pairs happened in order (the random policy collects several things)
    # b after a: a happened strictly before that step, and b first happened no later
    assert (first[s, e, a] >= 0).all() and (first[s, e, a] < after[s, e, a, b]).all()
    assert (first[s, e, b] >= 0).all() and (first[s, e, b] <= after[s, e, a, b]).all()
    # where both happened and a's first step is before b's, "b after a" is b's first step; never b after b
    both = (first[:, :, :, None] >= 0) & (first[:, :, None, :] >= 0) & (first[:, :, :, None] < first[:, :, None, :])
    np.testing.assert_array_equal(np.where(both, after, 0), np.where(both, np.broadcast_to(first[:, :, None, :],
                                                                                            after.shape), 0))


def test_ordered_instructions_are_scored_by_their_order_and_horizon(tmp_path):
    from oir_gym.evaluation import RECORD_SHAPE

    f = _user_file(tmp_path, {"order": [
        {"text": "wood then drink", "sequence": ["collect_wood", "collect_drink"]},
        {"text": "drink then wood", "sequence": ["collect_drink", "collect_wood"]},
        {"text": "wood soon", "achievement": "collect_wood", "horizon": 5}]})
    cfg = EvalConfig(sets=(), instruction_files=(str(f),), episodes=2, horizon=50)
    texts, achs, sets = eval_instructions(cfg)
    rec = np.full((len(texts) * 2, *RECORD_SHAPE), -1, np.int32)
    rec[0, 0, [0, 4]] = [3, 9]  # "wood then drink", episode 0: wood at 3, drink at 9
    rec[0, 1 + 0, 4] = 9
    rec[1, 0, [0, 4]] = [9, 3]  # episode 1: drink first, no drink after the wood
    rec[1, 1 + 4, 0] = 9
    rec[2, 0, [0, 4]] = [2, 1]  # "drink then wood", episode 0: drink at 1, wood at 2
    rec[2, 1 + 4, 0] = 2
    rec[4, 0, 0] = 4  # "wood soon": wood at 4 (within 5 steps), then at 5 (too late)
    rec[5, 0, 0] = 5
    res = eval_result(cfg, texts, achs, sets, rec)
    np.testing.assert_allclose(res.rates["order"], [0.5, 0.5, 0.5])
    c = res.control["order"]
    assert c.reverse_texts == ["drink then wood", "wood then drink", None]
    # wood before drink when asked "drink then wood": never; drink before wood when asked "wood then drink": episode 1
    np.testing.assert_allclose(c.reverse_rates[:2], [0.0, 0.5])
    assert np.isnan(c.reverse_rates[2])
    m = res.flat_metrics()
    assert m["eval/control/order/order_gain"] == pytest.approx((0.5 + 0.0) / 2)
    d = json.loads(json.dumps(res.to_dict()))
    assert d["order"]["ordered"] == [True, True, False] and d["order"]["targets"][:2] == [[0, 4], [4, 0]]
    assert d["order"]["control"]["order_gain_per_instruction"] == [0.5, 0.0, None]
    with pytest.raises(ValueError, match="ordered instructions"):  # bare flags cannot tell the order
        eval_result(cfg, texts, achs, sets, np.zeros((len(texts) * 2, 22), bool))
