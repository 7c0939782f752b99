"""Textual observations (paper appendix format) and action text."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import A, B, Scene

from oir_gym.craftax_compat import ACTION_NAMES
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.craftax_compat import BLOCK_NAMES, MOB_NAMES
from oir_gym.text import FACING_NAMES, action_text, batch_text, describe, format_text, parse_observation


def features(window=None, facing=B.GRASS.value, mobs=(), inventory=None, vitals=(9, 9, 9, 9), sleeping=False):
    """Hand-made text features of one state (host side, no JAX)."""
    w = np.full((7, 7), B.GRASS.value) if window is None else np.asarray(window)
    rel = np.array([m[1] for m in mobs] or np.zeros((0, 2)), dtype=np.int64).reshape(-1, 2)
    return {
        "window": w,
        "facing": np.int32(facing),
        "mob_rel": rel,
        "mob_alive": np.array([m[2] if len(m) > 2 else True for m in mobs], bool),
        "mob_kind": np.array([m[0] for m in mobs], np.int64),
        "inventory": np.zeros(12, np.int32) if inventory is None else np.asarray(inventory),
        "vitals": np.asarray(vitals),
        "sleeping": np.bool_(sleeping),
    }


def test_format_text_empty_world():
    assert format_text(features()) == (
        "Facing: grass; Nearby: nothing; Inventory: empty; "
        "Status: health 9, food 9, drink 9, energy 9, sleeping no"
    )


def test_format_text_groups_sorts_and_filters():
    w = np.full((7, 7), B.SAND.value)
    w[3, 3] = B.STONE.value  # the player's own tile (distance 0) is never listed
    w[3, 4] = B.WATER.value
    w[2, 2] = B.TREE.value  # diagonal: Chebyshev distance 1
    w[1, 3] = B.TREE.value  # distance 2, repeated name listed once
    w[5, 1] = B.TREE.value
    w[0, 6] = B.IRON.value  # distance 3
    w[6, 0] = B.PATH.value  # ground: not listed
    mobs = [
        (0, (3, 0)),  # zombie at distance 3
        (1, (-2, 1)),  # cow at distance 2
        (2, (1, 1)),  # skeleton at distance 1
        (1, (5, 0)),  # cow outside the 7x7 window
        (0, (1, 0), False),  # dead zombie
        (3, (0, 2)),  # arrow at distance 2
    ]
    inv = [3, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 2]
    text = format_text(features(w, facing=B.WATER.value, mobs=mobs, inventory=inv, vitals=(5, 4, 3, 2), sleeping=True))
    assert text == (
        "Facing: water; Nearby: [1] skeleton, tree, water [2] arrow, cow, tree [3] iron, zombie; "
        "Inventory: wood 3, coal 1, wood pickaxe 1, iron sword 2; "
        "Status: health 5, food 4, drink 3, energy 2, sleeping yes"
    )


def test_text_of_hand_built_states(venv):
    """``batch_text`` of Craftax states built by editing generated worlds."""
    sc = Scene(venv)
    # env 0: the docstring's kind of scene
    sc.block(0, (0, 1), B.TREE).block(0, (-1, 0), B.WATER).block(0, (2, 2), B.STONE).block(0, (-3, 3), B.CRAFTING_TABLE)
    sc.block(0, (4, 0), B.DIAMOND)  # outside the window
    sc.mob(0, "cows", 0, (0, -2)).mob(0, "zombies", 1, (3, -1)).mob(0, "zombies", 2, (0, 4))
    sc.inventory(0, wood=2, sapling=1, wood_pickaxe=1)
    sc.set(0, player_food=8, player_drink=7, player_energy=6)
    # env 1: nothing around
    # env 2: facing a cow, asleep
    sc.mob(2, "cows", 1, (0, 1)).set(2, is_sleeping=True, player_health=3)
    # env 3: at the top edge of the map, facing out of it
    sc.cs.map[3, 0:4, 1:10] = B.SAND.value
    sc.set(3, player_position=(0, 5), player_direction=A.UP.value)
    sc.apply()
    texts, facing = batch_text(venv._state.env.craftax)
    assert texts[0] == (
        "Facing: tree; Nearby: [1] tree, water [2] cow, stone [3] crafting table, zombie; "
        "Inventory: wood 2, sapling 1, wood pickaxe 1; "
        "Status: health 9, food 8, drink 7, energy 6, sleeping no"
    )
    assert texts[1] == "Facing: sand; Nearby: nothing; Inventory: empty; Status: health 9, food 9, drink 9, energy 9, sleeping no"
    assert texts[2] == "Facing: cow; Nearby: [1] cow; Inventory: empty; Status: health 3, food 9, drink 9, energy 9, sleeping yes"
    assert texts[3].startswith("Facing: out of bounds; Nearby: nothing; Inventory: empty;")
    assert [FACING_NAMES[f] for f in facing] == ["tree", "sand", "cow", "out of bounds"]
    assert action_text(A.DO.value, facing[0]) == "interact with tree"
    assert action_text(A.DO.value, facing[2]) == "interact with cow"


@pytest.mark.parametrize("action,facing,expected", [
    (A.NOOP.value, None, "noop"),
    (A.LEFT.value, None, "move left"),
    (A.RIGHT.value, B.TREE.value, "move right"),
    (A.UP.value, None, "move up"),
    (A.DOWN.value, None, "move down"),
    (A.DO.value, B.TREE.value, "interact with tree"),
    (A.DO.value, B.WATER.value, "interact with water"),
    (A.DO.value, B.CRAFTING_TABLE.value, "interact with crafting table"),
    (A.DO.value, 17, "interact with zombie"),
    (A.DO.value, None, "do"),
    (A.SLEEP.value, None, "sleep"),
    (A.PLACE_TABLE.value, None, "place table"),
    (A.MAKE_WOOD_PICKAXE.value, None, "make wood pickaxe"),
    (A.MAKE_IRON_SWORD.value, None, "make iron sword"),
    (np.int64(A.DO.value), np.int32(B.STONE.value), "interact with stone"),
])
def test_action_text(action, facing, expected):
    assert action_text(action, facing) == expected


def test_action_text_covers_every_action_and_rejects_others():
    texts = [action_text(a) for a in range(len(ACTION_NAMES))]
    assert len(set(texts)) == len(ACTION_NAMES) == 17
    for bad in (-1, 17, 100):
        with pytest.raises(ValueError, match=r"outside \[0, 16\]"):
            action_text(bad)


@settings(max_examples=150, deadline=None)
@given(window=st.lists(st.integers(0, len(BLOCK_NAMES) - 1), min_size=49, max_size=49),
       facing=st.integers(0, len(FACING_NAMES) - 1),
       mobs=st.lists(st.tuples(st.integers(0, len(MOB_NAMES) - 1), st.tuples(st.integers(-4, 4), st.integers(-4, 4)),
                               st.booleans()), max_size=6),
       inventory=st.lists(st.integers(0, 9), min_size=12, max_size=12),
       vitals=st.tuples(*[st.integers(0, 9)] * 4), sleeping=st.booleans())
def test_describe_reads_from_the_arrays_what_the_text_says(window, facing, mobs, inventory, vitals, sleeping):
    """The values the ELLM rules read (``describe``, from the arrays) equal what the text
    observation says (``parse_observation`` of ``format_text``), for any state's features."""
    f = features(np.asarray(window).reshape(7, 7), facing, mobs, inventory, vitals, sleeping)
    o = describe(f)
    assert o.text == format_text(f)
    assert parse_observation(o.text) == o
