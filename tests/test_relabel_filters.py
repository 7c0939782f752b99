"""Candidate filters: normalisation, forbidden movement words, lengths, de-duplication."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.relabel.filters import CandidateFilter, near_duplicate_mask, normalise


@pytest.mark.parametrize("text", [
    "move to the tree", "Moving left", "explore the map", "exploration of caves", "navigate to the lake",
    "go to the water", "going to the cow", "go towards the zombie", "walk to the table", "wander around",
    "travel north", "head to the forest", "heading towards stone", "roam the plains", "run from the zombie",
    "approach the cow", "return to the table", "proceed to the furnace",
])
def test_forbidden_words_dropped(text):
    kept, dropped = CandidateFilter().filter([text])
    assert kept == [] and dropped == {"forbidden_word": 1}


@pytest.mark.parametrize("text", [
    "go to sleep", "remove nothing", "improve the sword", "collect wood", "place a crafting table",
    "kill and eat a cow", "make a stone pickaxe", "drink the water", "wake up", "eat beef",
])
def test_allowed_instructions_kept(text):
    kept, dropped = CandidateFilter().filter([text])
    assert kept == [text] and not dropped


def test_normalisation_and_exact_dedup():
    kept, dropped = CandidateFilter().filter([
        "  Collect   WOOD. ", "collect wood", '"collect wood"', "- collect wood", "1. Place Table!", "place\ttable",
    ])
    assert kept == ["collect wood", "place table"]
    assert dropped == {"duplicate": 4}


def test_lengths_empty_garbage():
    f = CandidateFilter(max_chars=20, max_words=3)
    kept, dropped = f.filter(["", "   ", "...", "Instruction", "123 456", "collect wood from the tree", "a b c d",
                              "collect \x07wood", "collect \ufffd wood", 42, "he", "eat cow"])
    assert kept == ["eat cow"]
    assert dropped == {"empty": 3, "placeholder": 1, "no_letters": 1, "too_long": 2, "non_printable": 2,
                       "not_a_string": 1, "too_short": 1}


def test_extra_forbidden_patterns():
    f = CandidateFilter(extra_forbidden=[r"\bfind\b"])
    assert f.filter(["find water", "drink water"])[0] == ["drink water"]


def test_near_duplicate_mask_greedy():
    e = np.array([[1, 0, 0], [0.99, 0.141, 0], [0, 1, 0], [0, 0.96, 0.28]], np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    assert near_duplicate_mask(e, 0.95).tolist() == [True, False, True, False]
    assert near_duplicate_mask(e, 0.999).tolist() == [True, True, True, True]
    assert near_duplicate_mask(np.zeros((0, 3)), 0.9).tolist() == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_normalise_idempotent_and_filter_output_clean(text):
    once = normalise(text)
    assert normalise(once) == once
    f = CandidateFilter()
    kept, _ = f.filter([text])
    assert all(f.is_clean(k) for k in kept)


@pytest.mark.parametrize("text, reason", [
    ("die", "harmful"), ("take damage from the zombie", "harmful"), ("lose all health", "harmful"),
    ("walk into lava", "forbidden_word"), ("jump into the lava", "harmful"), ("do nothing", "idle"), ("wait", "idle"),
])
def test_harmful_and_idle_instructions_are_dropped_with_a_reason(text, reason):
    from oir_gym.relabel.filters import CandidateFilter

    kept, dropped = CandidateFilter().filter([text, "collect wood"])
    assert kept == ["collect wood"]
    assert dropped[reason] == 1


def test_defeating_mobs_is_not_mistaken_for_self_harm():
    from oir_gym.relabel.filters import CandidateFilter

    kept, _ = CandidateFilter().filter(["defeat zombie", "kill a skeleton", "wait for the zombie then defeat it"])
    assert kept == ["defeat zombie", "kill a skeleton", "wait for the zombie then defeat it"]
