"""Tests of the evaluation instruction sets (paper Appendix A)."""

from __future__ import annotations

import json

import pytest

from oir_gym.captions import ACHIEVEMENT_NAMES
from oir_gym.instructions import (
    ORIGINAL_INSTRUCTIONS,
    SET_NAMES,
    EvalInstruction,
    UnknownInstructionSetError,
    get_instruction_set,
    load_instruction_sets,
)

# The paper's Appendix A list, verbatim and in order.
PAPER_ORIGINALS = (
    "collect wood", "place table", "eat cow", "collect sapling", "collect drink",
    "make wooden pickaxe", "make wooden sword", "place plant", "defeat zombie", "collect stone",
    "place stone", "eat plant", "defeat skeleton", "make stone pickaxe", "make stone sword",
    "wake up", "place furnace", "collect coal", "collect iron", "collect diamond",
    "make iron pickaxe", "make iron sword",
)


def test_original_instructions_match_paper():
    assert ORIGINAL_INSTRUCTIONS == PAPER_ORIGINALS


def test_sets_shape_and_order():
    sets = load_instruction_sets()
    assert tuple(sets) == SET_NAMES
    assert [e.achievement_index for e in sets["original"]] == list(range(22))
    for name in ("simple", "complex"):
        assert len(sets[name]) == 66
        assert [e.achievement_index for e in sets[name]] == [i for i in range(22) for _ in range(3)]
    for name, items in sets.items():
        assert all(isinstance(e, EvalInstruction) and e.set_name == name and e.text.strip() for e in items)
    all_texts = [e.text for items in sets.values() for e in items]
    assert len(set(all_texts)) == len(all_texts)  # no text is reused across sets or achievements


def test_paper_printed_variants_verbatim():
    sets = load_instruction_sets()

    def variants(ach, name):
        return [e.text for e in sets[name] if e.achievement == ach]

    assert variants("place_table", "simple") == [
        "A construction bench is needed; deploy one.",
        "The floor is a good spot for a new making-area.",
        "Time to set up the workbench.",
    ]
    assert variants("eat_cow", "complex")[0] == "To stave off hunger, prepare and then consume the animal parts."
    assert variants("collect_sapling", "complex")[2] == "Environmental small tree starts are yours for the taking."
    assert variants("collect_drink", "simple")[2] == "H2O for later consumption should be gathered."
    assert variants("make_wood_pickaxe", "complex") == [
        "The crafting table is where a digging implement of wood is made.",
        "Combine tree-based planks and sticks for a new mining tool.",
        "Construct a digging utensil; lumber components are required.",
    ]


def test_eval_instruction_is_frozen_and_names_achievement():
    e = get_instruction_set("original")[5]
    assert e.achievement == "make_wood_pickaxe" and e.text == "make wooden pickaxe"
    with pytest.raises(AttributeError):
        e.text = "x"  # type: ignore[misc]


def test_returned_lists_are_fresh():
    get_instruction_set("simple").clear()
    assert len(get_instruction_set("simple")) == 66


@pytest.mark.parametrize("exc", [KeyError, ValueError])
def test_unknown_set_name(exc):
    with pytest.raises(exc, match="valid names: original, simple, complex"):
        get_instruction_set("hard")


def _entry(ach="collect_wood", **kw):
    e = {"achievement": ach, "original": "collect wood", "simple": ["get wood"], "complex": ["chop a tree"]}
    e.update(kw)
    return e


def test_user_file_subset_sorted(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"instructions": [
        _entry("eat_cow", original="eat a cow", simple=["s1", "s2"]),
        _entry("collect_wood"),
    ]}))
    sets = load_instruction_sets(path)
    assert [e.text for e in sets["original"]] == ["collect wood", "eat a cow"]
    assert [(e.text, e.achievement_index) for e in sets["simple"]] == [("get wood", 0), ("s1", 2), ("s2", 2)]
    # A bare list is accepted too.
    path.write_text(json.dumps([_entry()]))
    assert get_instruction_set("complex", path) == [EvalInstruction("chop a tree", 0, "complex")]


@pytest.mark.parametrize(
    "content,match",
    [([_entry("collect_gold")], "unknown achievement 'collect_gold'.*collect_wood"),
     ([_entry(), _entry()], "more than once"),
     ([{"achievement": "collect_wood", "original": "x"}], "missing key"),
     ([_entry(simple=[])], "'simple' must be a non-empty list"),
     ([_entry(complex=["ok", " "])], "'complex' must be a non-empty list"),
     ([_entry(original="")], "'original' must be a non-empty string"),
     ({"instructions": []}, "non-empty list"),
     (["not an object"], "expected an object")],
)
def test_user_file_errors(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match):
        load_instruction_sets(path)


def test_user_file_invalid_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_instruction_sets(path)


def test_achievement_names_cover_craftax():
    assert len(ACHIEVEMENT_NAMES) == len(ORIGINAL_INSTRUCTIONS) == 22
