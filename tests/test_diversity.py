"""Novelty share and distinct wordings per event (oir_gym.diversity)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oir_gym.captions import EVENT_NAMES, NUM_EVENTS
from oir_gym.diversity import NOVELTY_BAR, instruction_diversity, paying_event
from oir_gym.grounding import indicator_row

WOOD = EVENT_NAMES.index("collect_wood")


def test_counts_novel_wordings_and_wordings_per_event():
    d = instruction_diversity(
        ["collect wood", "chop down a tree for logs", "gather timber", "collect wood", "dance"],
        [1.0, 0.77, 0.6, 1.0, 0.3], [WOOD, WOOD, WOOD, WOOD, -1])
    assert d.instructions == 4 and d.novel == 3 and d.novelty_share == pytest.approx(0.75)
    assert d.wordings_per_event == {"collect_wood": 3} and d.mean_wordings_per_event == 3.0
    assert d.flat()["diversity/novelty_share"] == pytest.approx(0.75)


def test_rules_only_wordings_are_not_novel_and_empty_is_zero():
    assert instruction_diversity(["collect wood"], [1.0], [WOOD]).novelty_share == 0.0
    empty = instruction_diversity([], [], [])
    assert empty.novelty_share == 0.0 and empty.mean_wordings_per_event == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        instruction_diversity(["a"], [], [])


def test_paying_event_bound_and_cosine():
    assert paying_event(indicator_row(WOOD, NUM_EVENTS), 0.9) == WOOD
    row = np.full(NUM_EVENTS, 0.2, np.float32)
    assert paying_event(row, 0.9) == -1
    row[3] = 0.95
    assert paying_event(row, 0.9) == 3


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.floats(-1, 1), st.integers(-1, NUM_EVENTS - 1)),
                max_size=20))
def test_share_is_a_fraction_of_distinct_texts(items):
    texts, cos, ev = zip(*items) if items else ((), (), ())
    d = instruction_diversity(list(texts), list(cos), list(ev))
    assert d.instructions == len(set(texts)) and 0 <= d.novel <= d.instructions
    assert 0.0 <= d.novelty_share <= 1.0
    assert sum(d.wordings_per_event.values()) <= d.instructions
    assert NOVELTY_BAR == 0.8


SEGMENTS_EXAMPLES = ["chop down a tree for logs", "put down a crafting bench", "whittle a digging tool from logs",
                     "chop down a tree for logs then put down a crafting bench", "quench your thirst at the lake",
                     "fill your belly with cattle meat", "get out of bed in the morning",
                     "take down a cow then fill your belly with its meat"]


def test_the_segments_prompt_names_its_example_answers_and_a_template_without_any_names_none():
    from oir_gym.relabel.prompts import load_template, parse_template

    assert load_template("segments").examples() == SEGMENTS_EXAMPLES
    assert load_template("paper").examples() == []
    custom = parse_template('Segments:\n{{trajectory}}\nAnswer: {"Mid-Level": ["a", "b"], "High-Level": ["a then b"]}\n'
                           'Answer: not json\nAnswer: {"Mid-Level": ["a"], "Analysis": "x"}')
    assert custom.examples() == ["a", "b", "a then b"]


def test_copies_of_the_prompt_examples_are_echoes_and_the_models_own_words_are_not():
    from oir_gym.diversity import ECHO_BAR, echo_share, prompt_echo

    # as the 270M model wrote them on the GPU (results/gpu_h200x2_fast_llm_delta)
    for copy in ("get out of bed in tthe morning", "chop down a tree fop", "fill your belsly with its meat",
                 "Quench  your thirst at the LAKE"):
        assert prompt_echo(copy, SEGMENTS_EXAMPLES) >= ECHO_BAR, copy
    for own in ("collect stone then defeat zombie", "build a workbench", "collect wood", "eat the cow"):
        assert prompt_echo(own, SEGMENTS_EXAMPLES) < ECHO_BAR, own
    assert prompt_echo("anything", []) == 0.0
    assert echo_share(["chop down a tree fop", "chop down a tree fop", "collect wood"], SEGMENTS_EXAMPLES) == 0.5
    assert echo_share([], SEGMENTS_EXAMPLES) == 0.0


@given(st.text(max_size=40), st.lists(st.text(max_size=40), max_size=4))
def test_prompt_echo_is_a_similarity_in_0_1_that_is_1_for_an_example_itself(text, examples):
    from oir_gym.diversity import prompt_echo

    v = prompt_echo(text, examples)
    assert 0.0 <= v <= 1.0
    assert prompt_echo(text, examples + [text]) == 1.0
    assert prompt_echo(text, examples) == prompt_echo(text.upper(), examples) or not text.isascii()
