"""Tests of the evaluation instruction sets (paper Appendix A)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

import oir_gym.instructions
from oir_gym.prerequisites import related_achievements
from oir_gym.captions import ACHIEVEMENT_NAMES
from oir_gym.instruction_registry import MAX_INSTRUCTION_CHARS
from oir_gym.instructions import (
    MAX_TEXT_CHARS,
    ORIGINAL_INSTRUCTIONS,
    PACKAGED_SET_NAMES,
    SET_NAMES,
    EvalInstruction,
    UnknownInstructionSetError,
    get_instruction_set,
    load_instruction_file,
    load_instruction_files,
    load_instruction_sets,
    validate_instruction,
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
    assert tuple(sets) == PACKAGED_SET_NAMES and PACKAGED_SET_NAMES[:3] == SET_NAMES
    assert [e.achievement_index for e in sets["original"]] == list(range(22))
    for name in ("simple", "complex"):
        assert len(sets[name]) == 66
        assert [e.achievement_index for e in sets[name]] == [i for i in range(22) for _ in range(3)]
    assert [e.achievement_index for e in sets["heldout"]] == [i for i in range(22) for _ in range(2)]
    # the ordered set: >= 20 pairs of unrelated achievements, its control the same pairs reversed, 300 steps
    assert len(sets["ordered"]) >= 20 and len(sets["ordered"]) == len(sets["ordered_reverse"])
    for fwd, rev in zip(sets["ordered"], sets["ordered_reverse"]):
        assert fwd.ordered and rev.ordered and fwd.targets == rev.targets[::-1] and len(fwd.targets) == 2
        assert not related_achievements(*fwd.targets) and fwd.horizon == rev.horizon == 300
        a, b = (ORIGINAL_INSTRUCTIONS[i] for i in fwd.targets)
        assert (fwd.text, rev.text) == (f"{a} then {b}", f"{b} then {a}")
    assert len({frozenset(e.targets) for e in sets["ordered"]}) == len(sets["ordered"])
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


# --------------------------------------------------------------------------- user files of named sets


def _named(tmp_path, content, name="user.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_named_sets_file_loads_in_file_order_with_single_and_several_achievements(tmp_path):
    path = _named(tmp_path, {"description": "my sets", "_note": "ignored", "sets": {
        "tools": [{"text": "  make a   wooden pickaxe ", "achievement": "make_wood_pickaxe"},
                  {"text": "chop a tree", "achievements": ["collect_wood"]}],
        "combo": [{"text": "table then sword", "achievements": ["make_wood_sword", "place_table"]}]}})
    sets = load_instruction_file(path)
    assert list(sets) == ["tools", "combo"]
    assert sets["tools"] == [EvalInstruction("make a wooden pickaxe", 5, "tools"), EvalInstruction("chop a tree", 0, "tools")]
    combo = sets["combo"][0]
    assert combo == EvalInstruction("table then sword", -1, "combo", (1, 6))
    assert combo.targets == (1, 6) and combo.achievement == "place_table+make_wood_sword"
    assert load_instruction_files([path]) == sets


def test_the_packaged_per_achievement_schema_is_a_valid_user_file_but_its_names_are_taken(tmp_path):
    packaged = Path(oir_gym.instructions.__file__).parent / "data" / "instructions.json"
    assert load_instruction_file(packaged) == load_instruction_sets()
    with pytest.raises(ValueError, match=r"instructions.json: set 'original': duplicate set name \(a built-in set\)"):
        load_instruction_files([packaged])
    assert MAX_TEXT_CHARS == MAX_INSTRUCTION_CHARS  # the loader refuses what the env's registry would refuse


def _entry_file(tmp_path, entry, set_name="mine"):
    return _named(tmp_path, {"sets": {set_name: [{"text": "collect wood", "achievement": "collect_wood"}, entry]}})


@pytest.mark.parametrize("entry,match", [
    ({"text": "dig gold", "achievement": "collect_gold"},
     r"entry 1 \('dig gold'\): field 'achievement': unknown achievement 'collect_gold'; known achievements: "
     r"collect_wood, place_table"),
    ({"text": "x", "achievements": ["eat_cow", "collect_gold"]},
     r"entry 1 \('x'\): field 'achievements': unknown achievement 'collect_gold'"),
    ({"text": "", "achievement": "eat_cow"}, r"entry 1: field 'text': empty text"),
    ({"text": " \n\t ", "achievement": "eat_cow"}, r"entry 1: field 'text': empty text"),
    ({"text": 3, "achievement": "eat_cow"}, r"entry 1: field 'text': expected a non-empty string, got int 3"),
    ({"text": ["eat"], "achievement": "eat_cow"}, r"entry 1: field 'text': expected a non-empty string, got list"),
    ({"text": "eat", "achievement": 2}, r"entry 1 \('eat'\): field 'achievement': expected an achievement name \(a string\), got int 2"),
    ({"text": "eat", "achievement": None}, r"entry 1 \('eat'\): field 'achievement': expected an achievement name \(a string\), got null"),
    ({"text": "eat", "achievements": "eat_cow"}, r"entry 1 \('eat'\): field 'achievements': expected a non-empty list of achievement names, got string"),
    ({"text": "eat", "achievements": []}, r"entry 1 \('eat'\): field 'achievements': expected a non-empty list"),
    ({"text": "eat", "achievements": ["eat_cow", "eat_cow"]}, r"entry 1 \('eat'\): field 'achievements': an achievement is listed twice"),
    ({"text": "eat"}, r"entry 1 \('eat'\): give exactly one of the fields 'achievement' \(a name\), 'achievements'"),
    ({"text": "eat", "sequence": ["eat_cow"]}, r"entry 1 \('eat'\): field 'sequence': expected two achievement names"),
    ({"text": "eat", "sequence": ["eat_cow", "eat_cows"]}, r"entry 1 \('eat'\): field 'sequence': unknown achievement 'eat_cows'"),
    ({"text": "eat", "achievement": "eat_cow", "horizon": 0}, r"entry 1 \('eat'\): field 'horizon': expected a number of steps >= 1"),
    ({"text": "eat", "achievement": "eat_cow", "achievements": ["eat_cow"]}, r"entry 1 \('eat'\): give exactly one of the fields"),
    ({"achievement": "eat_cow"}, r"entry 1: field 'text' is missing"),
    ({"text": "eat", "achievment": "eat_cow"}, r"entry 1: unknown field 'achievment'"),
    ("eat a cow", r"entry 1: expected an object .*, got string"),
    ({"text": "collect  wood", "achievement": "collect_wood"}, r"entry 1 \('collect wood'\): field 'text': the same text as entry 0"),
    ({"text": "x" * 501, "achievement": "eat_cow"}, r"entry 1: field 'text': 501 characters, more than the 500 allowed"),
])
def test_bad_entries_name_the_file_the_set_the_entry_and_the_field(tmp_path, entry, match):
    path = _entry_file(tmp_path, entry)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": set 'mine', " + match):
        load_instruction_file(path)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_instruction_files([path])  # what the trainers call


@pytest.mark.parametrize("content,match", [
    ('{"sets": {"a": [{"text": "chop", "achievement": "collect_wood"}], '
     '"a": [{"text": "dig", "achievement": "collect_stone"}]}}', r"set 'a': duplicate set name \(given twice in this file\)"),
    ('{"sets": {"a": [{"text": "chop", "text": "dig", "achievement": "collect_wood"}]}}',
     r"set 'a', entry 0: field 'text' is given twice"),
    ({"sets": {"original": [{"text": "chop", "achievement": "collect_wood"}]}}, r"set 'original': duplicate set name \(reserved"),
    ({"sets": {"control": [{"text": "chop", "achievement": "collect_wood"}]}}, r"set 'control': duplicate set name \(reserved"),
    ({"sets": {"my set": [{"text": "chop", "achievement": "collect_wood"}]}}, r"set 'my set': a set name is 1-64 letters"),
    ({"sets": {"a:b": [{"text": "chop", "achievement": "collect_wood"}]}}, r"set 'a:b': a set name is"),
    ({"sets": {"a": []}}, r"set 'a': expected a non-empty list of entries, got list"),
    ({"sets": {"a": {"text": "chop"}}}, r"set 'a': expected a non-empty list of entries, got object"),
    ({"sets": []}, r"field 'sets': expected a non-empty object \{set name: \[entries\]\}, got list"),
    ({"sets": {}}, r"field 'sets': expected a non-empty object"),
    ({"sets": {"a": [{"text": "chop", "achievement": "collect_wood"}]}, "set": 1}, r"unknown top-level field 'set'"),
    ({"tasks": []}, r"expected an object \{\"sets\": .*got object with fields \['tasks'\]"),
    ("3", r"expected an object .*got int"),
    ("{not json", r"not valid JSON"),
])
def test_bad_files_name_the_file_and_what_is_wrong(tmp_path, content, match):
    path = _named(tmp_path, content)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ": " + match):
        load_instruction_file(path)


def test_a_deeply_nested_file_is_an_error_naming_the_file(tmp_path):
    """A RecursionError from Python's JSON reader used to escape without the file's name."""
    for loader in (load_instruction_file, load_instruction_sets):
        path = _named(tmp_path, '{"sets": ' + "[" * 100_000 + "]" * 100_000 + "}", f"deep_{loader.__name__}.json")
        with pytest.raises(ValueError, match=re.escape(str(path)) + ": nested too deeply"):
            loader(path)


@pytest.mark.parametrize("text", ["collect\x00 wood", "\x1b[31mcollect wood", "collect wood\x7f"])
def test_a_control_character_in_an_instruction_is_refused_everywhere(tmp_path, text, encoder):
    """A NUL byte (or another control character) in an instruction was accepted; it is refused by the
    one rule every instruction follows: in files, the env's instructions and reset's options."""
    from oir_gym.vector_env import InstructionCraftax

    path = _named(tmp_path, {"sets": {"mine": [{"text": text, "achievement": "collect_wood"}]}})
    with pytest.raises(ValueError, match=re.escape(str(path)) + r": set 'mine', entry 0: field 'text': holds the "
                                                                r"control character"):
        load_instruction_file(path)
    with pytest.raises(ValueError, match=r"instructions\[1\]: holds the control character"):
        InstructionCraftax(num_envs=2, instructions=["collect wood", text], encoder=encoder)
    packaged = json.loads(resources.files("oir_gym.data").joinpath("instructions.json").read_text())
    packaged["instructions"][0]["simple"][0] = text
    with pytest.raises(ValueError, match=r"'simple': holds the control character"):
        load_instruction_sets(_named(tmp_path, packaged, "per_achievement.json"))
    assert validate_instruction("collect\t wood \n") == "collect wood"  # whitespace is collapsed, not refused


def test_duplicate_set_names_across_files_and_against_the_built_in_sets(tmp_path):
    a = _named(tmp_path, {"sets": {"food": [{"text": "eat a cow", "achievement": "eat_cow"}]}}, "a.json")
    b = _named(tmp_path, {"sets": {"tools": [{"text": "make a sword", "achievement": "make_wood_sword"}],
                                   "food": [{"text": "eat", "achievement": "eat_plant"}]}}, "b.json")
    with pytest.raises(ValueError, match=re.escape(f"{b}: set 'food': duplicate set name (already defined in {a})")):
        load_instruction_files([a, b])
    with pytest.raises(ValueError, match=re.escape(f"{a}: set 'food': duplicate set name (a built-in set)")):
        load_instruction_files([a], builtin=("original", "food"))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'none.json'}: cannot read the instruction file")):
        load_instruction_files([a, tmp_path / "none.json"])
    assert list(load_instruction_files(str(a))) == ["food"]  # one path as a string


def test_the_packaged_example_file_loads_and_evaluates():
    from oir_gym.evaluation import EvalConfig, eval_instructions

    path = Path(oir_gym.instructions.__file__).parent / "data" / "example_instruction_sets.json"
    sets = load_instruction_files([path])
    assert list(sets) == ["own_words", "compound"]
    assert all(len(e.targets) == 2 for e in sets["compound"])
    texts, _, names = eval_instructions(EvalConfig(sets=(), instruction_files=(str(path),)))
    assert len(texts) == 10 + 1 and names.count("own_words") == 7


def test_no_held_out_evaluation_wording_is_a_few_shot_example_of_a_packaged_prompt():
    """The paraphrase sets and the example user file measure wordings the agent was not given: an
    LLM relabeler copies its prompt's examples into the buffer (seen on the GPU), so none of them
    may be one. The 22 original instructions are the paper's own phrasings and may appear."""
    from oir_gym.instructions import SET_NAMES, get_instruction_set, load_instruction_file

    held_out = {i.text.lower() for s in SET_NAMES if s != "original" for i in get_instruction_set(s)}
    example = Path(__file__).resolve().parents[1] / "oir_gym" / "data" / "example_instruction_sets.json"
    held_out |= {i.text.lower() for items in load_instruction_file(example).values() for i in items}
    prompts = sorted((Path(__file__).resolve().parents[1] / "oir_gym" / "data" / "prompts").glob("*.txt"))
    assert prompts
    for p in prompts:
        quoted = set(re.findall(r'"([^"]+)"', p.read_text().lower()))
        assert not (quoted & held_out), (p.name, sorted(quoted & held_out))


def test_an_ordered_block_of_related_or_unknown_achievements_is_refused(tmp_path):
    """The per-achievement schema's ordered pairs: a prerequisite pair (whose order the game decides)
    or an unknown achievement stops the load with the file, the pair and the field named."""
    packaged = json.loads((Path(oir_gym.instructions.__file__).parent / "data" / "instructions.json").read_text())

    def write(pairs):
        path = tmp_path / "sets.json"
        path.write_text(json.dumps({**packaged, "ordered": {"horizon": 300, "pairs": pairs}}))
        return path

    pair = {"first": "collect_wood", "then": "place_table", "text": "wood then table", "reverse": "table then wood"}
    with pytest.raises(ValueError, match=r"sets.json: 'ordered', pair 0: 'collect_wood' and 'place_table' are the "
                                         r"same achievement or one is a prerequisite"):
        load_instruction_sets(write([pair]))
    with pytest.raises(ValueError, match=r"pair 0: field 'then': unknown achievement 'place_tabel'"):
        load_instruction_sets(write([{**pair, "then": "place_tabel"}]))
    with pytest.raises(ValueError, match=r"pair 1: the pair 'collect_drink', 'collect_wood' is listed twice"):
        ok = {**pair, "first": "collect_wood", "then": "collect_drink"}
        load_instruction_sets(write([ok, {**ok, "first": "collect_drink", "then": "collect_wood"}]))
    with pytest.raises(ValueError, match=r"'ordered': field 'horizon': expected a number of steps >= 1"):
        path = tmp_path / "h.json"
        path.write_text(json.dumps({**packaged, "ordered": {**packaged["ordered"], "horizon": 0}}))
        load_instruction_sets(path)
    sets = load_instruction_sets(write([{**pair, "then": "collect_drink"}]))
    assert [e.text for e in sets["ordered"]] == ["wood then table"] and sets["ordered_reverse"][0].targets == (4, 0)
