"""The oracle relabelers (oir_gym.relabel.oracle): each variant's labels and bindings, the wording
pool's disjointness from every evaluation set, bad input, and a smoke run of each variant."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, NUM_EVENTS, VOCAB
from oir_gym.grounding import episode_starts_from_dones, paid_steps
from oir_gym.instructions import load_instruction_file, load_instruction_sets
from oir_gym.prerequisites import related_achievements
from oir_gym.relabel import HindsightRelabeler, RuleBackend
from oir_gym.relabel.oracle import (
    MAX_EVAL_COSINE, MIN_WORDINGS, ORACLES, check_pool, compound_labels, evaluation_texts, load_pool, load_settings,
    oracle_labels,
)
from oir_gym.relabel.prompts import load_template
from oir_gym.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]
E = {n: i for i, n in enumerate(EVENT_NAMES)}


def traj_of(steps: list[list[str]], dones=None, env_id: int = 0, **meta) -> Trajectory:
    t = Trajectory.from_event_names("x", steps, dones=dones, env_id=env_id)
    t.meta.update(meta)
    return t


#: sapling at 1, wood at 3 and 6, drink at 4, table at 8, a cow attacked at 9 and eaten at 10; the
#: episode ends at 11; then wood again at 13
STEPS = [[], ["collect_sapling"], ["move"], ["collect_wood"], ["collect_drink"], [], ["collect_wood"], [],
         ["place_table"], ["attack_cow"], ["eat_cow"], ["noop"], [], ["collect_wood"], []]
DONES = [False] * 11 + [True] + [False] * 3


# --------------------------------------------------------------------------- the wording pool


def test_the_packaged_pool_names_every_achievement_with_at_least_15_distinct_wordings():
    pool = load_pool()
    assert sorted(pool.wordings) == sorted(E[a] for a in ACHIEVEMENT_NAMES)
    assert all(len(ws) >= MIN_WORDINGS for ws in pool.wordings.values())
    words = pool.texts()
    assert len(words) == len(set(words)) and not any(" then " in w for w in words)


def _packaged_and_example_sets() -> dict[str, list[str]]:
    sets = {f"packaged:{k}": [i.text for i in v] for k, v in load_instruction_sets().items()}
    example = ROOT / "oir_gym" / "data" / "example_instruction_sets.json"
    sets.update({f"example:{k}": [i.text for i in v] for k, v in load_instruction_file(example).items()})
    return sets


def test_the_pool_is_disjoint_from_every_evaluation_set(encoder):
    """No pool wording is an evaluation string, and none is within cosine 0.85 of one, for every
    packaged set (original, simple, complex, heldout, ordered, ordered_reverse) and every example set."""
    sets = _packaged_and_example_sets()
    assert {"packaged:heldout", "packaged:ordered", "packaged:ordered_reverse", "example:own_words"} <= set(sets)
    evals = [t for texts in sets.values() for t in texts]
    assert sorted(evaluation_texts()) == sorted(set(evals))  # what a run checks is every one of them
    pool = load_pool()
    lowered = {t.lower().strip(" .") for t in evals}
    assert not [w for w in pool.texts() if w.lower() in lowered]
    sim = encoder.encode(pool.texts()) @ encoder.encode(evals).T
    i, j = np.unravel_index(int(sim.argmax()), sim.shape)
    assert sim[i, j] < MAX_EVAL_COSINE, (pool.texts()[i], evals[j], float(sim[i, j]))
    check_pool(pool, evals, encoder)  # the run's own check agrees


def test_the_heldout_set_is_in_no_prompt_pool_or_few_shot_example(encoder):
    heldout = [i.text for i in load_instruction_sets()["heldout"]]
    assert len(heldout) == 44 and len(set(heldout)) == 44
    low = {t.lower() for t in heldout}
    for p in sorted((ROOT / "oir_gym" / "data" / "prompts").glob("*.txt")):
        text = p.read_text().lower()
        assert not [t for t in low if t.strip(".") in text], p.name
    examples = {e.lower() for name in ("segments", "paper") for e in load_template(name).examples()}
    examples |= {e.lower() for e in load_settings().noise.echo_examples.values()}
    assert not (low & examples)
    assert not (low & {w.lower() for w in load_pool().texts()})


def test_no_label_of_any_variant_is_one_the_relabelers_filter_drops():
    """Every text an oracle can give passes the relabeler's candidate filter (movement words,
    self-harm, idle...): a dropped label would silently thin out an arm."""
    from oir_gym.relabel.filters import CandidateFilter

    settings_ = load_settings()
    texts = load_pool().texts() + list(settings_.noise.echo_examples.values())
    texts += [VOCAB.canonical(e) for e in settings_.task_events]
    texts += [VOCAB.canonical(e) for e in range(NUM_EVENTS) if VOCAB.achievement_of_event[e] >= 0]
    texts += [f"{VOCAB.canonical(a)} then {VOCAB.canonical(b)}" for a in range(NUM_EVENTS) for b in range(NUM_EVENTS)
              if VOCAB.achievement_of_event[a] >= 0 and VOCAB.achievement_of_event[b] >= 0 and a != b]
    kept, why = CandidateFilter().filter(texts)
    assert len(kept) == len(texts), (why, [t for t in texts if t not in kept][:5])


def test_the_noise_profiles_echo_examples_are_the_segments_prompts_few_shot_answers():
    examples = load_template("segments").examples()
    echo = load_settings().noise.echo_examples
    assert set(echo.values()) <= set(examples)
    # each names its own event: the caption vocabulary agrees on the event of the wording's prompt answer
    assert [EVENT_NAMES[e] for e in echo] == ["collect_wood", "place_table", "make_wood_pickaxe", "collect_drink",
                                              "eat_cow", "wake_up"]


def _pool_file(tmp_path, **changes) -> Path:
    raw = json.loads(resources.files("oir_gym.data").joinpath("oracle_pool.json").read_text())
    for name, spec in changes.items():
        if spec is None:
            raw["events"].pop(name)
        else:
            raw["events"][name] = spec
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(raw))
    return path


def test_bad_pool_files_stop_with_an_error_naming_the_file_and_what_is_wrong(tmp_path, encoder):
    wood = json.loads(resources.files("oir_gym.data").joinpath("oracle_pool.json").read_text())["events"]["collect_wood"]
    cases = [
        ({"collect_gold": wood}, r"unknown event 'collect_gold'"),
        ({"attack_cow": wood, "collect_wood": None}, r"event 'attack_cow' is not one of the 22 achievements"),
        ({"collect_wood": {"wordings": ["fell a tree"] * 3}}, r"event 'collect_wood' has 1 wordings; at least 15"),
        ({"collect_wood": None}, r"no wordings for the achievement event\(s\) collect_wood"),
        ({"place_table": {**wood}}, r"wording 'cut a wooden log' is given for both 'collect_wood' and 'place_table'"),
        ({"collect_wood": {**wood, "wordings": ["chop wood then rest"]}}, r"'chop wood then rest' contains 'then'"),
        ({"collect_wood": {**wood, "wordings": ["walk to a tree for wood"]}},
         r"event 'collect_wood': the relabeler's filter drops the wording 'walk to a tree for wood' \(forbidden_word"),
    ]
    for change, match in cases:
        path = _pool_file(tmp_path, **change)
        with pytest.raises(ValueError, match=re.escape(str(path)) + ": .*" + match):
            load_pool(path)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        load_pool(tmp_path / "broken.json")
    # a wording equal to an evaluation string (case and final dot aside), then one too close to one
    verbatim = _pool_file(tmp_path, collect_wood={**wood, "wordings": ["gather some timber"]})
    with pytest.raises(ValueError, match=r"pool.json: wording 'gather some timber' \(collect_wood\) is the evaluation "
                                         r"string 'Gather some timber.'"):
        check_pool(load_pool(verbatim), evaluation_texts())
    close = _pool_file(tmp_path, collect_wood={**wood, "wordings": ["gather up some timber"]})
    check_pool(load_pool(close), evaluation_texts())  # not verbatim ...
    with pytest.raises(ValueError, match=r"wording 'gather up some timber' \(collect_wood\) has cosine 0\.9\d+ to "
                                         r"the evaluation string 'Gather some timber\.'"):
        check_pool(load_pool(close), evaluation_texts(), encoder)  # ... but too close


def test_unknown_variants_and_variants_the_grounding_cannot_pay_are_refused():
    with pytest.raises(ValueError, match=r"unknown oracle relabeler 'paraphrase'; expected one of canonical, diverse"):
        RuleBackend(oracle="paraphrase")
    with pytest.raises(ValueError, match="oracle 'noisy' needs event-bound grounding"):
        HindsightRelabeler.rules(grounding="cosine", oracle="noisy")


# --------------------------------------------------------------------------- the labelers


def test_canonical_names_single_events_and_the_natural_pairs():
    labels = oracle_labels(traj_of(STEPS, DONES), "canonical")
    assert [(l.text, l.pre, l.final) for l in labels] == [
        ("collect sapling", -1, E["collect_sapling"]), ("collect wood", -1, E["collect_wood"]),
        ("collect drink", -1, E["collect_drink"]), ("place table", -1, E["place_table"]),
        ("eat cow", -1, E["eat_cow"]), ("kill and eat a cow", E["attack_cow"], E["eat_cow"])]
    assert RuleBackend().instructions(traj_of(STEPS, DONES)) == [l.text for l in labels]


def test_diverse_draws_one_pool_wording_per_event_per_trajectory_reproducibly():
    pool = load_pool()
    traj = traj_of(STEPS, DONES, env_id=3, seed=0, update=7)
    labels = oracle_labels(traj, "diverse", seed=5)
    assert [l.final for l in labels] == [E[n] for n in ("collect_sapling", "collect_wood", "collect_drink",
                                                        "place_table", "eat_cow")]
    assert all(l.text in pool.wordings[l.final] and l.pre == -1 for l in labels)
    assert oracle_labels(traj, "diverse", seed=5) == labels  # the same seed and trajectory: the same draw
    # over trajectories (other envs, updates or seeds) the draws cover the pool
    wood = Counter(oracle_labels(traj_of([["collect_wood"]], env_id=e, update=u), "diverse", seed=s)[0].text
                   for e in range(8) for u in range(8) for s in range(2))
    assert len(wood) >= 15 and set(wood) <= set(pool.wordings[E["collect_wood"]])
    assert max(wood.values()) < 20  # roughly uniform: 128 draws over 18 wordings


def test_tasks_adds_the_non_achievement_events_but_not_moving_or_waiting():
    labels = oracle_labels(traj_of(STEPS, DONES), "tasks")
    canonical = oracle_labels(traj_of(STEPS, DONES), "canonical")
    assert labels[:len(canonical)] == canonical
    assert [(l.text, l.final) for l in labels[len(canonical):]] == [("attack cow", E["attack_cow"])]
    steps = [["fall_asleep"], ["search_grass"], ["take_damage"], ["move"], ["noop"], ["hit_hard_block"], ["die"]]
    # not moving or waiting, nor taking damage or dying (the relabeler's filter refuses self-harm)
    assert [l.text for l in oracle_labels(traj_of(steps), "tasks")] == [
        "fall asleep", "search the grass", "hit a rock without the right pickaxe"]


def test_compound_names_unrelated_pairs_in_their_order_within_an_episode():
    traj = traj_of(STEPS, DONES)
    labels = oracle_labels(traj, "compound")
    canonical = oracle_labels(traj, "canonical")
    assert labels[:len(canonical)] == canonical
    pairs = {(l.text, EVENT_NAMES[l.pre], EVENT_NAMES[l.final]) for l in labels[len(canonical):]}
    assert pairs == {
        ("collect sapling then collect wood", "collect_sapling", "collect_wood"),
        ("collect sapling then collect drink", "collect_sapling", "collect_drink"),
        ("collect sapling then place table", "collect_sapling", "place_table"),
        ("collect sapling then eat cow", "collect_sapling", "eat_cow"),
        ("collect wood then collect drink", "collect_wood", "collect_drink"),
        ("collect drink then collect wood", "collect_drink", "collect_wood"),  # wood again at 6, after the drink
        ("collect wood then eat cow", "collect_wood", "eat_cow"),
        ("collect drink then place table", "collect_drink", "place_table"),
        ("collect drink then eat cow", "collect_drink", "eat_cow"),
        ("place table then eat cow", "place_table", "eat_cow"),
    }  # never "collect wood then place table" (a prerequisite), never across the episode end at 11
    assert sorted(l.text for l in compound_labels(traj, seed=1)) == sorted(p[0] for p in pairs)


def test_noisy_corrupts_diverse_labels_at_the_measured_rates():
    pool, noise = load_pool(), load_settings().noise
    assert (noise.drop, noise.echo, noise.wrong) == (0.762, 0.67, 0.179) and set(noise.sources) == {"drop", "echo",
                                                                                                    "wrong"}
    owner = pool.owner()
    echoes = set(noise.echo_examples.values())
    n, kept, kinds = 0, 0, Counter()
    for env in range(400):
        traj = traj_of([["collect_wood"], ["collect_drink"], ["collect_stone"]], env_id=env)
        diverse = oracle_labels(traj, "diverse")
        noisy = oracle_labels(traj, "noisy")
        n += len(diverse)
        kept += len(noisy)
        assert oracle_labels(traj, "noisy") == noisy  # reproducible
        for lab in noisy:
            assert lab.final in {E["collect_wood"], E["collect_drink"], E["collect_stone"]}  # always a true event
            if lab.text in echoes:
                kinds["echo"] += 1
                # a copy of the event's own prompt example where the prompt has one
                if lab.final in noise.echo_examples:
                    assert lab.text == noise.echo_examples[lab.final]
            elif owner[lab.text] != lab.final:
                kinds["wrong"] += 1  # another event's wording, bound to this one
            else:
                kinds["clean"] += 1
                assert lab in diverse
    assert abs(1 - kept / n - noise.drop) < 0.04  # 1,200 labels: the standard error is about 0.012
    assert abs(kinds["echo"] / kept - noise.echo) < 0.08
    assert abs(kinds["wrong"] / kept - noise.wrong) < 0.07
    assert kinds["clean"] > 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(EVENT_NAMES), max_size=2), min_size=1, max_size=24),
       st.lists(st.booleans(), min_size=24, max_size=24), st.sampled_from(ORACLES), st.integers(0, 3))
def test_every_label_names_an_event_that_happened_in_its_order(steps, dones, oracle, seed):
    traj = traj_of(steps, dones[: len(steps)], env_id=seed)
    labels = oracle_labels(traj, oracle, seed=seed)
    assert len({l.text for l in labels}) == len(labels)
    starts = episode_starts_from_dones(traj.dones)
    for lab in labels:
        final = np.zeros(NUM_EVENTS, np.float32) - 1
        final[lab.final] = 1
        pre = np.zeros(NUM_EVENTS, np.float32) - 1
        if lab.pre >= 0:
            pre[lab.pre] = 1
        if " then " in lab.text:  # a compound: two unrelated achievements
            assert not related_achievements(VOCAB.achievement_of_event[lab.pre], VOCAB.achievement_of_event[lab.final])
        # the label pays somewhere on its own trajectory: its event(s) happened, in order, in one episode
        assert paid_steps(traj.events, final, pre, starts, 0.9).any(), lab
    assert oracle_labels(traj, oracle, seed=seed) == labels


def test_a_diverse_wording_pays_at_its_events_step_under_bound_grounding(encoder):
    """Whatever the wording, a relabeled copy pays where its event happened (first time per episode)."""
    steps = [[], [], ["collect_wood"], [], ["place_table"], [], ["collect_wood"], [], []]
    traj = traj_of(steps, [False] * 5 + [True] + [False] * 3)
    rl = HindsightRelabeler.rules(k=8, grounding="bound", oracle="diverse", encoder=encoder)
    (res,) = rl.relabel([traj])
    pool = load_pool()
    by_event = {c.binding.final: c for c in res.candidates}
    assert set(by_event) == {E["collect_wood"], E["place_table"]}
    wood = by_event[E["collect_wood"]]
    assert wood.text in pool.wordings[E["collect_wood"]] and wood.grounded and wood.first_step == 2
    assert wood.similarity < 0.9  # a wording the cosine reward would not pay
    paid = paid_steps(traj.events, wood.final_row, wood.pre_row, episode_starts_from_dones(traj.dones), rl.delta)
    np.testing.assert_array_equal(np.flatnonzero(paid), [2, 6])  # each episode's first wood
    table = by_event[E["place_table"]]
    assert table.first_step == 4 and table.text in pool.wordings[E["place_table"]]
    rl.close()


# --------------------------------------------------------------------------- through the trainer


def _host_trainer(tmp_path, oracle: str):
    from test_oir_grounding import SAPLING_FIRST, _trainer

    return _trainer(tmp_path, SAPLING_FIRST, **{"oir.grounding": "bound", "oir.oracle": oracle, "oir.k": 8})


@pytest.mark.parametrize("oracle", ORACLES)
def test_each_variant_relabels_a_rollout_into_rows_that_pay_at_their_events(tmp_path, oracle):
    """One relabel step of the trainer per variant (a hand-built rollout: the arms differ in labels only)."""
    from oir_gym.reward import first_success_step

    tr, host = _host_trainer(tmp_path, oracle)
    assert tr.method.relabeler.rules.k == 8 and tr.method.relabeler.rules.grounding == "bound"
    slots, _ = tr.method.relabel(host)
    valid = np.asarray(slots["valid"][0])
    texts = [t for t, v in zip(tr.method.last_texts[0], valid) if v]
    rules = RuleBackend(oracle=oracle, seed=tr.cfg.run.seed)  # what the trainer's relabeler was built as
    expected = {t for traj in tr.method.trajectories(host, tr.update_idx) for t in rules.instructions(traj)}
    assert set(texts) <= expected and (texts or oracle == "noisy")
    for c, j in zip(tr.method.last_candidates[0], np.flatnonzero(valid)):
        events = host["events"][0, :, int(slots["env"][0, j])]
        assert c.binding is not None and events[c.binding.step, c.binding.final]
        assert first_success_step(events, np.asarray(slots["final"][0, j]), tr.cfg.env.delta) >= 0
    if oracle == "diverse":
        assert texts and all(t in load_pool().texts() for t in texts)
    if oracle == "compound":
        assert "collect sapling then collect wood" in texts
    tr.close()


def _main(argv):
    from agents.pqn import recipe

    return recipe.pqn_main(argv)


def test_bad_oracle_settings_stop_the_run_before_it_writes_anything(tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        _main(["smoke", "--run-dir", str(run), "--oir.oracle", "paraphrase"])  # tyro: not a choice
    assert exit_.value.code == 2
    assert _main(["smoke", "--run-dir", str(run), "--oir.oracle", "diverse"]) == 2
    assert "oir.oracle='diverse': oracle 'diverse' needs event-bound grounding" in capsys.readouterr().err
    wood = json.loads(resources.files("oir_gym.data").joinpath("oracle_pool.json").read_text())["events"]["collect_wood"]
    verbatim = _pool_file(tmp_path, collect_wood={**wood, "wordings": ["Gather some timber."]})
    base = ["smoke", "--run-dir", str(run), "--oir.oracle", "diverse", "--oir.grounding", "bound"]
    assert _main([*base, "--oir.oracle-pool", str(verbatim)]) == 2
    assert re.search(r"oir.oracle_pool: .*pool.json: wording 'Gather some timber.' \(collect_wood\) is the evaluation "
                     "string", capsys.readouterr().err)
    close = _pool_file(tmp_path, collect_wood={**wood, "wordings": ["gather up some timber"]})
    assert _main([*base, "--oir.oracle-pool", str(close)]) == 2  # the cosine check, with the run's encoder
    assert "wording 'gather up some timber' (collect_wood) has cosine" in capsys.readouterr().err
    assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()
    assert _main(["smoke", "--run-dir", str(run), "--oir.oracle", "tasks", "--oir.relabeler", "llm"]) == 2
    assert "needs run.method oir and oir.relabeler rules or both" in capsys.readouterr().err


def test_a_compound_of_unknown_events_stops_the_run_before_it_writes_anything(tmp_path, capsys):
    """An ordered compound ("sequence") of a user's evaluation file naming an unknown event: the
    command line stops with the file, the entry and the name, before the run folder is written."""
    sets = tmp_path / "sets.json"
    sets.write_text(json.dumps({"sets": {"mine": [
        {"text": "drink first, then chop a tree", "sequence": ["collect_drink", "collect_wood"]},
        {"text": "chop a tree, then build a bench", "sequence": ["collect_wood", "place_tabel"]}]}}))
    run = tmp_path / "run"
    assert _main(["smoke", "--run-dir", str(run), "--oir.oracle", "compound", "--oir.grounding", "bound",
                  "--eval.instruction-files", str(sets)]) == 2
    err = capsys.readouterr().err
    assert "sets.json" in err and "unknown achievement 'place_tabel'" in err, err
    assert not run.exists() or not any(run.iterdir())


#: the variants trained through the command line in the default suite: the plain labels and the
#: pool's wordings (labels unknown to the evaluation sets); the others' rows are checked above and
#: their command-line runs are -m slow (each is the same plumbing with other label texts)
CLI_DEFAULT = ("canonical", "diverse")


@pytest.mark.parametrize("oracle", [o if o in CLI_DEFAULT else pytest.param(o, marks=pytest.mark.slow) for o in ORACLES])
def test_each_variant_trains_end_to_end_through_the_command_line(tmp_path, oracle, smoke_run, pqn_main):
    """CI's run of each variant: the PQN command line trains the smoke preset's 4 updates with the
    variant's relabeler (bound grounding), then the final evaluation (held-out and ordered sets, 1
    episode) and the run's final files, with no periodic evaluation or checkpoint. The same programs
    as the session's smoke run (``smoke_run`` is requested so the compilation cache holds them): the
    total steps stay the preset's, since the epsilon and learning-rate schedules are constants of the
    rollout and update programs (fewer steps compile both anew). The whole runs are -m slow below."""
    run = tmp_path / "run"
    assert pqn_main(["smoke", "--run-dir", str(run), "--no-progress", "--oir.oracle", oracle,
                     "--oir.grounding", "bound", "--eval.every", "1000", "--run.checkpoint-every", "1000"]) == 0
    assert json.loads((run / "complete.json").read_text())["update"] == 4
    assert json.loads((run / "config.json").read_text())["oir"]["oracle"] == oracle
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    final = json.loads((run / "eval_final.json").read_text())[0]
    assert {"original", "heldout", "ordered", "ordered_reverse"} <= set(final)
    offered = json.loads((run / "instructions.json").read_text())["items"]
    if oracle == "diverse":  # whatever the random policy did, it was named by pool wordings only
        assert all(i["text"] in load_pool().texts() for i in offered)


@pytest.mark.slow  # a whole smoke run of its own configuration per variant: 1-2.5 min each on 2 cores
@pytest.mark.parametrize("oracle", ORACLES)
def test_smoke_run_of_each_variant(tmp_path, oracle):
    """A whole smoke run (4 updates, the final evaluation with the held-out and ordered sets, a
    checkpoint) per variant. The default suite trains each variant (4 updates) through the command
    line above (the session smoke run's programs) and checks each variant's relabeling."""
    run = tmp_path / "run"
    # no periodic evaluation: the final one (its own program) is the one that reads the new sets
    assert _main(["smoke", "--run-dir", str(run), "--no-progress", "--oir.oracle", oracle, "--oir.grounding", "bound",
                  "--eval.every", "1000", "--run.checkpoint-every", "1000"]) == 0
    assert json.loads((run / "config.json").read_text())["oir"]["oracle"] == oracle
    final = json.loads((run / "eval_final.json").read_text())[0]
    assert {"original", "simple", "complex", "heldout", "ordered", "ordered_reverse"} <= set(final)
    assert "order_gain" in final["ordered"]["control"] and "retention_learned" in final["heldout"]
    offered = json.loads((run / "instructions.json").read_text())["items"]
    if oracle == "diverse":  # whatever the random policy did, it was named by pool wordings only
        assert all(i["text"] in load_pool().texts() for i in offered)


def test_the_sb3_trainer_takes_the_same_oracle_flag(encoder):
    pytest.importorskip("stable_baselines3")
    from agents.sb3 import models as sb3_agents
    from agents.sb3.trainer import SB3

    def cfg(*argv):
        return SB3.parse(list(argv)).config.validate()

    assert cfg("--oir.oracle", "diverse", "--oir.grounding", "bound").oir.oracle == "diverse"
    with pytest.raises(ValueError, match="oracle='diverse': oracle 'diverse' needs event-bound grounding"):
        cfg("--oir.oracle", "diverse")
    with pytest.raises(ValueError, match="needs run.method oir and oir.relabeler rules or both"):
        cfg("--oir.oracle", "tasks", "--oir.relabeler", "llm")
    with pytest.raises(SystemExit):
        SB3.parse(["--oir.oracle", "paraphrase"])
    rl = sb3_agents.make_relabeler("rules", k=8, encoder=encoder, grounding="bound", oracle="diverse", seed=3)
    (res,) = rl.relabel([traj_of(STEPS, DONES)])
    assert res.candidates and all(c.text in load_pool().texts() for c in res.candidates)
    assert [c.text for c in res.candidates] == [l.text for l in oracle_labels(traj_of(STEPS, DONES), "diverse", seed=3)]
    rl.close()


def test_the_final_evaluation_adds_its_sets_and_episodes_and_the_table_must_hold_them(tmp_path):
    from agents.pqn.config import preset
    from agents.pqn.trainer import Trainer

    cfg = preset("smoke").replace(**{"eval.final_episodes": 3, "eval.instruction_files": (
        str(ROOT / "oir_gym" / "data" / "example_instruction_sets.json"),)})
    tr = Trainer(cfg, tmp_path / "a", log=lambda s: None)
    assert tr.eval_cfg.set_names == ("original", "simple", "complex", "own_words", "compound")
    assert tr.final_eval_cfg.set_names == ("original", "simple", "complex", "heldout", "ordered", "ordered_reverse",
                                           "own_words", "compound")
    assert (tr.eval_cfg.episodes, tr.final_eval_cfg.episodes) == (1, 3)
    assert [tr.registry.text(r) for r in tr.final_rows] == tr.final_texts  # every final instruction has its row
    assert set(tr.all_eval_texts) >= set(tr.final_texts) | set(tr.eval_texts)
    tr.close()
    # a table of 256 rows (runs made before the final sets) cannot hold them and the buffers: refused
    # at construction, not halfway through training
    with pytest.raises(ValueError, match=r"env.table_capacity=256 holds too few rows .* \(--eval.final-sets"):
        Trainer(cfg.replace(**{"env.table_capacity": 256}), tmp_path / "b", log=lambda s: None)
    tr = Trainer(cfg.replace(**{"env.table_capacity": 256, "eval.final_sets": ()}), tmp_path / "c", log=lambda s: None)
    assert tr.final_texts == tr.eval_texts
    tr.close()
