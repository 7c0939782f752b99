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
