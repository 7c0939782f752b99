"""Prompt budget: a busy trajectory's ``segments`` prompt is compacted to ``max_prompt_tokens``.

A 128-step trajectory with an event on nearly every step renders about 120 segment lines, 1,300-1,400
Gemma tokens (a token per digit of the step ranges); with the template that is the 1,600-1,760-token
prompt that made Gemma 3 270M answer with the few-shot examples whatever the trajectory was
(docs/relabeling.md, "Prompt length"). Unit tests here; the real tokenizer and model at the end
(marked ``llm``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest_llm import gguf_path, tf_backend  # noqa: F401 - pytest fixtures
from oir_gym.captions import EVENT_NAMES
from oir_gym.relabel import HindsightRelabeler, load_template, segments, segments_text
from oir_gym.relabel.config import DEFAULT_MAX_PROMPT_TOKENS
from oir_gym.relabel.segments import BACKGROUND_EVENTS, MAX_LEVEL, behaviour_key, compact_text
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from oir_gym.relabel.tokens import approx_token_count
from oir_gym.trajectory import Trajectory
from relabel_config import relabel_config

ACH = ("collect_wood", "collect_sapling", "collect_drink", "place_plant", "eat_cow", "place_table")
NOISE = ("search_grass", "take_damage", "hit_hard_block", "attack_cow", "collect_wood", "collect_sapling")


def busy_trajectory(seed: int = 0, length: int = 128) -> Trajectory:
    """Short episodes ended by an achievement, background events on most other steps: what a
    partly trained agent's most eventful trajectories look like."""
    rng = np.random.default_rng(seed)
    ev = np.zeros((length, len(EVENT_NAMES)), bool)
    dones = np.zeros(length, bool)
    actions = rng.integers(0, 17, length)
    t = 0
    while t < length:
        end = min(length - 1, t + int(rng.integers(3, 25)))
        for s in range(t, end):
            for _ in range(1 + int(rng.random() < 0.5)):
                if rng.random() < 0.95:
                    ev[s, EVENT_NAMES.index(str(rng.choice(NOISE)))] = True
        ev[end, EVENT_NAMES.index(str(rng.choice(ACH)))] = True
        dones[end] = True
        t = end + 1
    return Trajectory("collect wood", ev, actions, dones)


def _events(traj: Trajectory, level: int) -> set[str]:
    return {lab for s in segments(traj, level) if not s.idle for lab in s.label.split(", ")}


def test_levels_shrink_and_keep_the_achievements():
    traj = busy_trajectory()
    lens = [approx_token_count(segments_text(traj, level=lv)) for lv in range(MAX_LEVEL + 1)]
    assert lens == sorted(lens, reverse=True) and lens[-1] < lens[0] / 2
    achieved = {e.replace("_", " ") for e in ACH if traj.events[:, EVENT_NAMES.index(e)].any()}
    for lv in range(MAX_LEVEL + 1):
        names = _events(traj, lv)
        assert achieved <= names  # compaction never loses an achievement
        if lv >= 1:  # background events are idle steps from level 1 on
            assert not names & {"search the grass", "take damage", "hit a rock without the right pickaxe"}
    assert len(BACKGROUND_EVENTS) == 3


def test_level_renderings():
    ev = np.zeros((10, len(EVENT_NAMES)), bool)
    for t, e in ((1, "collect_wood"), (2, "search_grass"), (3, "collect_wood"), (5, "place_table"),
                 (7, "collect_wood")):
        ev[t, EVENT_NAMES.index(e)] = True
    dones = np.zeros(10, bool)
    dones[5] = True
    traj = Trajectory("x", ev, np.zeros(10, np.int32), dones)
    assert segments_text(traj, "; ") == (
        "0: wait; 1: collect wood; 2: search the grass; 3: collect wood; 4: wait; "
        "5: place table, episode ends; 6: wait; 7: collect wood; 8-9: wait")
    assert segments_text(traj, "; ", 1) == (
        "0: wait; 1: collect wood; 2: wait; 3: collect wood; 4: wait; 5: place table, episode ends; "
        "6: wait; 7: collect wood; 8-9: wait")
    # level 2: idle runs gone, wood merged across the idle step, the episode end kept
    assert segments_text(traj, "; ", 2) == (
        "1-3: collect wood (x2); 5: place table, episode ends; 7: collect wood")
    assert segments_text(traj, "; ", 3) == "1: collect wood (x3); 5: place table"
    # an episode that ends on an idle step keeps its end at level 2
    dones2 = np.zeros(10, bool)
    dones2[4] = True
    traj2 = Trajectory("x", ev, np.zeros(10, np.int32), dones2)
    assert "4: episode ends" in segments_text(traj2, "; ", 2)
    # the cache key never depends on compaction
    assert behaviour_key(traj) == "collect wood | search the grass | collect wood | place table | episode ends | collect wood"
    with pytest.raises(ValueError):
        segments(traj, MAX_LEVEL + 1)


def test_compact_text_picks_the_least_compaction_that_fits():
    traj = busy_trajectory(1)
    full = segments_text(traj)
    assert compact_text(traj, lambda t: True) == (full, 0)
    for lv in range(1, MAX_LEVEL + 1):
        limit = approx_token_count(segments_text(traj, level=lv))
        text, got = compact_text(traj, lambda t: approx_token_count(t) <= limit)
        assert got <= lv and approx_token_count(text) <= limit
    text, got = compact_text(traj, lambda t: approx_token_count(t) <= 12)  # below level 3: lines cut
    assert got == MAX_LEVEL + 1 and text.endswith("...") and approx_token_count(text) <= 12


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 50), limit=st.integers(1, 200))
def test_cutting_lines_keeps_the_most_lines_that_fit_with_few_token_counts(seed, limit):
    """The line cut is a binary search: the same text as cutting one line at a time (the most lines
    under the budget, at least one), with O(log lines) token counts instead of one per line."""
    traj = busy_trajectory(seed % 5, length=64 + seed)
    fits = lambda t: approx_token_count(t) <= limit  # noqa: E731
    last = segments_text(traj, level=MAX_LEVEL)
    lines = last.split("\n")
    want = None  # the one-line-at-a-time rule
    if fits(last):
        want = None  # fits before any cut: compared by level below
    else:
        want = "\n".join(lines[:1] + ["..."])
        for m in range(len(lines) - 1, 0, -1):
            if fits("\n".join(lines[:m] + ["..."])):
                want = "\n".join(lines[:m] + ["..."])
                break
    calls = []
    text, level = compact_text(traj, lambda t: calls.append(t) or fits(t))
    if want is None:
        assert level <= MAX_LEVEL and fits(text)
    else:
        assert (text, level) == (want, MAX_LEVEL + 1)
        assert len(calls) <= MAX_LEVEL + 1 + int(np.ceil(np.log2(max(len(lines), 2)))) + 1


def test_template_budget():
    tpl = load_template("segments")
    traj = busy_trajectory()
    full = tpl.render(traj)
    assert tpl.render_fit(traj) == (full, 0)
    prompt, level = tpl.render_fit(traj, 4, 500, approx_token_count)
    assert level > 0 and approx_token_count(prompt) <= 500 and prompt.startswith(full.split("Segments:")[0])
    short = make_trajectory(WOOD_TABLE_PICKAXE, 40, texts=False)
    assert tpl.render_fit(short, 4, 500, approx_token_count) == (tpl.render(short), 0)
    paper = load_template("paper")  # the per-timestep view is never compacted
    assert paper.render_fit(short, 4, 10, approx_token_count) == (paper.render(short), 0)


class Echo:
    """An LLM that answers every prompt with one fixed instruction and counts tokens like Gemma
    (one token per digit)."""

    token_method = "test"

    def __init__(self):
        self.prompts: list[str] = []

    def count_tokens(self, text: str) -> int:
        return approx_token_count(text) + sum(len(w) - 1 for w in text.split() if w.rstrip(":").replace("-", "").isdigit())

    def generate(self, prompts, n=1, *, schema=None):
        self.prompts += prompts
        return [['{"Mid-Level": ["chop down a tree for logs"], "High-Level": []}'] * n for _ in prompts]


def test_relabeler_compacts_long_prompts_only():
    llm = Echo()
    busy, calm = busy_trajectory(), make_trajectory(WOOD_TABLE_PICKAXE, 128, texts=False)
    rl = HindsightRelabeler(relabel_config(k=4, cache_size=0, isolate=False, max_prompt_tokens=600), llm=llm)
    res = rl.relabel([busy, calm])
    assert rl.max_prompt_tokens == 600 and all(r.error is None for r in res)
    assert res[0].prompt_tokens <= 600 and llm.count_tokens(llm.prompts[0]) == res[0].prompt_tokens
    assert llm.prompts[1] == rl.template.render(calm)  # a short prompt is sent as it was
    assert rl.stats()["prompts_compacted"] == 1
    assert rl.render_prompt(busy) == llm.prompts[0]

    off = HindsightRelabeler(relabel_config(k=4, cache_size=0, isolate=False, max_prompt_tokens=None), llm=Echo())
    assert off.render_prompt(busy) == off.template.render(busy)
    assert HindsightRelabeler(relabel_config("rules")).max_prompt_tokens == DEFAULT_MAX_PROMPT_TOKENS
    for bad in (0, -5, 1.5, "768"):
        with pytest.raises(ValueError, match="max_prompt_tokens"):
            HindsightRelabeler(relabel_config("rules", max_prompt_tokens=bad))


@pytest.mark.llm
@pytest.mark.slow  # loads the offline Gemma (~20 s); the compaction itself is checked above without it
def test_gemma_prompt_within_budget(tf_backend):  # noqa: F811
    """The real tokenizer: a busy trajectory's prompt (about 1,500 Gemma tokens in full) is sent
    within the default budget, and the model's answer is used."""
    traj = busy_trajectory()
    assert tf_backend.count_tokens(load_template("segments").render(traj)) > 1200
    rl = HindsightRelabeler(relabel_config(k=4, cache_size=0, isolate=False, grounding="bound"), llm=tf_backend)
    (res,) = rl.relabel([traj])
    assert 0 < res.prompt_tokens <= DEFAULT_MAX_PROMPT_TOKENS
    assert res.error is None and rl.stats()["prompts_compacted"] == 1


def test_the_llm_prompt_budget_reaches_the_relabeler_from_the_config():
    from agents.run.config import LLMConfig, RelabelSettings
    from agents.run.relabeling import make_relabeler

    for budget, expected in ((300, 300), (0, None)):
        r = make_relabeler("llm", RelabelSettings(k=2), LLMConfig(backend="transformers", max_prompt_tokens=budget))
        try:
            assert r.llm.max_prompt_tokens == expected
        finally:
            r.close()
