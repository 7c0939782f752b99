"""Rule relabeler, trajectory segments, prompt templates and prompt lengths."""

from __future__ import annotations

import pytest

from oir_gym.relabel import RuleBackend, behaviour_key, count_tokens, load_template, segments_text
from oir_gym.relabel.prompts import output_schema, parse_template
from oir_gym.relabel.tokens import approx_token_count
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory, random_trajectories
from oir_gym.trajectory import Trajectory


def wood_table_pickaxe(length: int = 128, **kw) -> Trajectory:
    return make_trajectory(WOOD_TABLE_PICKAXE, length, **kw)


def test_rules_wood_table_pickaxe_exact():
    # canonical (the default) names single events; "A then B" of consecutive events only on request
    assert RuleBackend().instructions(wood_table_pickaxe()) == ["collect wood", "place table", "make wood pickaxe"]
    assert RuleBackend(compounds=True).instructions(wood_table_pickaxe()) == [
        "collect wood", "place table", "make wood pickaxe",
        "collect wood then place table", "place table then make wood pickaxe",
    ]


def test_rules_pairs_and_episode_boundaries():
    steps = [[]] * 3 + [["fall_asleep"]] + [["noop"]] * 3 + [["wake_up"]] + [["collect_wood"]] + [[]] + [["place_table"]]
    traj = Trajectory.from_event_names("x", steps, dones=[False] * 8 + [True] + [False] * 2)
    out = RuleBackend(compounds=True).instructions(traj)
    # wake_up and collect_wood are consecutive in one episode; collect_wood -> place_table crosses a reset
    assert out == ["wake up", "collect wood", "place table", "wake up then collect wood", "sleep and wake up"]
    assert RuleBackend().instructions(traj) == ["wake up", "collect wood", "place table", "sleep and wake up"]
    assert RuleBackend(compounds=False, pairs=False).instructions(traj) == ["wake up", "collect wood", "place table"]
    assert RuleBackend(max_instructions=2).instructions(traj) == ["wake up", "collect wood"]


def test_rules_idle_and_non_achievement_events():
    traj = Trajectory.from_event_names("x", [["move"], ["attack_cow"], ["noop"], ["eat_cow"]])
    assert RuleBackend().instructions(traj) == ["eat cow", "kill and eat a cow"]
    assert RuleBackend().instructions(Trajectory.from_event_names("x", [["move"]] * 5)) == []


def test_segments_text_and_key():
    traj = wood_table_pickaxe(length=30, texts=False)
    assert segments_text(traj, "; ") == (
        "0-4: move; 5-6: collect wood (x2); 7-8: move; 9: collect wood; 10-11: move; 12: place table; "
        "13: wait; 14: make wood pickaxe; 15-29: move"
    )
    assert behaviour_key(traj) == "collect wood x2 | collect wood | place table | make wood pickaxe"
    # same behaviour, different timing and filler -> same key
    other = make_trajectory([(t + 7, e) for t, e in WOOD_TABLE_PICKAXE], 60, seed=3, texts=False)
    assert behaviour_key(other) == behaviour_key(traj)
    steps = [["move"], ["noop"], ["collect_wood"], ["noop"], ["take_damage", "die"], ["move"], [], []]
    ended = Trajectory.from_event_names("x", steps, dones=[0, 0, 0, 0, 1, 0, 0, 0])
    assert segments_text(ended, "; ") == (
        "0-1: move; 2: collect wood; 3: wait; 4: take damage, die, episode ends; 5-7: move")
    assert behaviour_key(ended) == "collect wood | take damage, die | episode ends"


def test_behaviour_key_modes():
    steps = [["collect_wood"], ["collect_wood"], ["move"], ["collect_wood"], ["noop"], ["place_table"], []]
    traj = Trajectory.from_event_names("x", steps)
    assert behaviour_key(traj) == "collect wood x2 | collect wood | place table"
    assert behaviour_key(traj, "events") == "collect wood | place table"
    assert behaviour_key(traj, "segments") == "0-1: collect wood (x2) | 2: move | 3: collect wood | 4: wait | 5: place table | 6: wait"
    with pytest.raises(ValueError):
        behaviour_key(traj, "nope")


def test_paper_template_reproduces_appendix():
    tpl = load_template("paper")
    assert tpl.view == "timesteps" and tpl.analysis
    text = tpl.render(wood_table_pickaxe(length=6))
    for needle in ("You are an expert Hindsight Instruction Relabeler for Minecraft agents.",
                   'Do NOT use the words "move", "explore", "navigate", "go to"',
                   '"Completed Instructions"', "0-4: move to tree", "What instruction is this trajectory following?",
                   "timestep 5: Facing: tree;", "agent takes action tree"):
        assert needle in text, needle
    assert "#|" not in text and "{{" not in text


def test_segments_template_and_custom(tmp_path):
    tpl = load_template("segments")
    assert tpl.view == "segments" and not tpl.analysis
    text = tpl.render(wood_table_pickaxe(), k=3)
    assert text.rstrip().endswith("Answer:") and "12: place table" in text and "at most 3 items" in text
    p = tmp_path / "mine.txt"
    p.write_text("#| view: timesteps\nSay what happened:\n{{trajectory}}\n")
    custom = load_template(str(p))
    assert custom.name == "mine" and custom.render(wood_table_pickaxe(length=2, texts=False)).startswith("Say")
    with pytest.raises(ValueError):
        parse_template("no placeholder")
    with pytest.raises(ValueError):
        load_template("nonexistent-template")


def test_schema_max_items():
    s = output_schema(3)
    assert s["properties"]["Mid-Level"]["maxItems"] == 3
    assert output_schema(2, analysis=True)["properties"]["Completed Instructions"]["properties"]["High-Level"]["maxItems"] == 2


def test_segments_prompt_is_a_tenth_of_paper_prompt():
    paper, seg = load_template("paper"), load_template("segments")
    for traj in random_trajectories(7, length=128, seed=1):
        assert traj.texts is not None and len(traj.texts) == 128
        n_paper = count_tokens(paper.render(traj)).n
        n_seg = count_tokens(seg.render(traj)).n
        assert n_seg * 10 <= n_paper, (n_seg, n_paper)


def test_count_tokens_labels_method():
    assert count_tokens("collect wood, then table.", tokenizer=None) == (6, "approx-regex")
    assert count_tokens("a b", tokenizer=lambda s: 42) == (42, "custom")
    assert count_tokens("a b").method in ("llama", "approx-regex")
    assert approx_token_count("") == 0


def test_rule_pair_wordings_pay_on_their_second_event_only(encoder):
    """A pair's reward must land when the task is done: "sleep and wake up" pays on waking, never on
    falling asleep. ("collect a sapling and plant it" paid on collecting the sapling and was removed.)"""
    import numpy as np

    from oir_gym.captions import EVENT_NAMES
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.relabel.rules import RULE_PAIRS

    registry = InstructionRegistry(encoder, capacity=1)
    sims = registry.similarity_to_events(encoder.encode(list(RULE_PAIRS.values())))
    for ((first, second), text), row in zip(RULE_PAIRS.items(), sims):
        assert row[EVENT_NAMES.index(second)] > 0.9, text
        assert row[EVENT_NAMES.index(first)] <= 0.9, text
        assert int(np.argmax(row)) == EVENT_NAMES.index(second), text


def test_default_prompt_examples_do_not_teach_caption_phrasings(encoder):
    """The few-shot answers of the default template are in the model's own words: each is below
    cosine 0.8 to every caption phrasing (the novelty bar of the run metrics), so a relabeler that
    imitates them proposes wordings the captions do not hold."""
    import json

    from importlib import resources

    from oir_gym.captions import VOCAB

    text = resources.files("oir_gym.data").joinpath("prompts/segments.txt").read_text()
    answers = [json.loads(line.split("Answer:", 1)[1]) for line in text.splitlines()
               if line.startswith("Answer: {")]
    assert len(answers) == 2
    wordings = [w for a in answers for w in a["Mid-Level"] + a["High-Level"]]
    sims = encoder.encode(wordings) @ encoder.encode(list(VOCAB.phrases)).T
    assert (sims.max(axis=1) < 0.8).all(), dict(zip(wordings, sims.max(axis=1).round(2)))
