"""The LLM-output parser: a corpus of malformed and hostile completions, plus property tests."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.parse import MAX_ITEMS, parse_candidates, parse_completion

PAPER_ANSWER = """{
  "Analysis": "Chopped tree first, then set up crafting table, finally make wood pickaxe.",
  "Completed Instructions": {
    "Mid-Level": ["collect wood from tree", "place crafting table", "make a wood pickaxe", "sleep and wake up"],
    "High-Level": ["Prepare to collect stone", "collect tools to mine stone and coal"]
  }
}"""

# (raw completion, expected candidates in order)
CORPUS = [
    pytest.param(PAPER_ANSWER, ["collect wood from tree", "place crafting table", "make a wood pickaxe",
                                "sleep and wake up", "prepare to collect stone",
                                "collect tools to mine stone and coal"], id="paper-format"),
    pytest.param('{"Mid-Level": ["collect wood"], "High-Level": ["collect wood then place a table"]}',
                 ["collect wood", "collect wood then place a table"], id="segments-format"),
    pytest.param('<think>The agent maybe {"Mid-Level": ["hallucinated"]}</think>\n{"Mid-Level": ["collect wood"], "High-Level": []}',
                 ["collect wood"], id="qwen3-think"),
    pytest.param('reasoning without opening tag</think>{"Mid-Level": ["drink water"]}', ["drink water"], id="think-close-only"),
    pytest.param('<think>still thinking when cut off {"Mid-Level": ["collect wood"', [], id="unclosed-think"),
    pytest.param('Here you go:\n```json\n{"Mid-Level": ["eat cow", "drink water"], "High-Level": []}\n```\nDone!',
                 ["eat cow", "drink water"], id="code-fence"),
    pytest.param('```\n["collect stone", "place stone"]\n```', ["collect stone", "place stone"], id="fence-no-lang"),
    pytest.param('Sure! The agent did things. {"Mid-Level": ["collect sapling"], "High-Level": []} Hope this helps {not json}',
                 ["collect sapling"], id="prose-around"),
    pytest.param('{"Mid-Level": ["collect wood", "place table",], "High-Level": ["make a wood pickaxe",],}',
                 ["collect wood", "place table", "make a wood pickaxe"], id="trailing-commas"),
    pytest.param("{'Mid-Level': ['collect wood', 'place table'], 'High-Level': ['make a wood pickaxe']}",
                 ["collect wood", "place table", "make a wood pickaxe"], id="single-quotes"),
    pytest.param("{'Mid-Level': ['collect wood'], 'ok': True, 'none': None}", ["collect wood"], id="python-literals"),
    pytest.param('{"Analysis": "wood", "Completed Instructions": {"Mid-Level": ["collect wood", "place ta',
                 ["collect wood"], id="truncated-in-string"),
    pytest.param('{"Mid-Level": ["collect wood", "place table"], "High-Level": ["collect wood then',
                 ["collect wood", "place table"], id="truncated-second-list"),
    pytest.param('{"Mid-Level": ["collect wood",', ["collect wood"], id="truncated-after-comma"),
    pytest.param("- collect wood\n- place table\n* walk to the tree\n1. drink water\nThat is all.",
                 ["collect wood", "place table", "drink water"], id="bullets"),
    pytest.param('["collect wood", "eat cow"]', ["collect wood", "eat cow"], id="flat-list"),
    pytest.param('{"instructions": [{"instruction": "collect wood"}, {"text": "eat cow"}]}',
                 ["collect wood", "eat cow"], id="list-of-dicts"),
    pytest.param('{"Completed Instructions": ["collect wood", "place table"]}', ["collect wood", "place table"], id="flat-under-key"),
    pytest.param('{"Mid-Level": ["...", "...", "Mid-Level"], "High-Level": ["..."]}', [], id="template-echo"),
    pytest.param('{"Mid-Level": ["Collect   WOOD.", "collect wood", "  collect wood  "]}', ["collect wood"], id="case-space-dupes"),
    pytest.param('{"Mid-Level": ["move to the tree", "explore the area", "navigate to water", "go to the cow", '
                 '"wander around", "head to the lake", "roam", "run away from zombie", "go to sleep"]}',
                 ["go to sleep"], id="forbidden-words"),
    pytest.param('{"Mid-Level": ["collect wood\\u0000", "\\u0007beep", "place table"]}', ["place table"], id="control-chars"),
    pytest.param("", [], id="empty"),
    pytest.param("   \n\t ", [], id="whitespace"),
    pytest.param(None, [], id="none"),
    pytest.param(12345, [], id="int"),
    pytest.param(b'{"Mid-Level": ["collect wood"]}', ["collect wood"], id="bytes-json"),
    pytest.param(bytes(range(256)) * 8, [], id="binary-garbage"),
    pytest.param("[" * 50_000 + "]" * 50_000, [], id="deep-nesting"),
    pytest.param('{"Mid-Level": [' + ", ".join(['"collect wood"'] * 5000) + "]}", ["collect wood"], id="repetition-loop"),
    pytest.param("I cannot help with that.", [], id="refusal"),
    pytest.param('{"Mid-Level": ["' + "a" * 5000 + '", "eat plant"]}', ["eat plant"], id="over-long-item"),
    pytest.param('{"Mid-Level": [["nested", "collect coal"]], "High-Level": {"x": ["mine iron"]}}',
                 ["nested", "collect coal", "mine iron"], id="nested-lists"),
]


@pytest.mark.parametrize("raw,expected", CORPUS)
def test_corpus(raw, expected):
    cands, reasons = parse_candidates(raw)
    assert cands == expected, reasons
    filt = CandidateFilter()
    assert all(filt.is_clean(c) for c in cands)


def test_mid_and_high_lists_are_separated():
    out = parse_completion(PAPER_ANSWER)
    assert out.mid == ["collect wood from tree", "place crafting table", "make a wood pickaxe", "sleep and wake up"]
    assert out.high == ["Prepare to collect stone", "collect tools to mine stone and coal"]
    assert out.flat == []
    salvaged = parse_completion('{"Completed Instructions": {"Mid-Level": ["a b"], "High-Level": ["c d", "e')
    assert salvaged.mid == ["a b"] and salvaged.high == ["c d"]
    assert salvaged.reasons["salvaged_json"] == 1


def test_reasons_are_counted():
    _, r = parse_candidates('{"Mid-Level": ["walk to tree", "collect wood", "collect wood", ""]}')
    assert r["forbidden_word"] == 1 and r["duplicate"] == 1 and r["empty"] == 1
    _, r = parse_candidates("x" * 100_000)
    assert r["input_capped"] == 1 and r["no_instructions_found"] == 1
    _, r = parse_candidates("<think>never ends")
    assert r["unclosed_think"] == 1


def test_huge_input_is_fast_and_capped():
    raw = '{"Mid-Level": ["collect wood"], "High-Level": ["' + "loop " * 2_000_000
    t0 = time.perf_counter()
    cands, reasons = parse_candidates(raw)
    assert time.perf_counter() - t0 < 2.0
    assert cands == ["collect wood"] and reasons["input_capped"] == 1


def test_item_cap():
    raw = json.dumps({"Mid-Level": [f"collect wood {i}" for i in range(1000)]})
    assert len(parse_completion(raw).all) <= MAX_ITEMS


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=400), st.binary(max_size=400)))
def test_random_text_never_raises_and_outputs_are_filtered(raw):
    filt = CandidateFilter()
    cands, reasons = parse_candidates(raw, filt)
    parsed = parse_completion(raw)
    # nothing is lost silently: every parsed item is kept or counted once under a drop reason
    assert sum(reasons.values()) - sum(parsed.reasons.values()) == len(parsed.all) - len(cands)
    assert isinstance(raw, str) or reasons["binary_input"] == 1
    assert all(isinstance(c, str) and filt.is_clean(c) for c in cands)
    assert len(set(cands)) == len(cands)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(
        st.sampled_from(["Mid-Level", "High-Level", "Analysis", "Completed Instructions", "x"]), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_json_values, st.integers(min_value=0, max_value=400), st.sampled_from(["", "```json\n", "<think>x</think>", "Answer: "]))
def test_truncated_json_never_raises(value, cut, prefix):
    raw = prefix + json.dumps(value)
    raw = raw[: max(0, len(raw) - cut)]
    filt = CandidateFilter()
    cands, _ = parse_candidates(raw, filt)
    assert all(filt.is_clean(c) for c in cands)
