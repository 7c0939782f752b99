"""The relabeling pipeline's stages, one at a time, without threads or a relabeler.

Each stage of :mod:`oir_gym.relabel.pipeline` is called with plain inputs (synthetic
trajectories, hand-written LLM answers as :class:`Proposal` objects, the real sentence encoder
where grounding needs it) and its output is checked, failure paths included.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from oir_gym.captions import VOCAB
from oir_gym.relabel.composite import Proposal
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.pipeline import (
    Answers, Grounded, Merged, PromptPlan, ground, merge_rules, plan_prompts, read_answers, select,
)
from oir_gym.relabel.results import Candidate
from oir_gym.relabel.rules import RuleBackend
from oir_gym.relabel.segments import behaviour_key
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory


def wtp(shift: int = 0, seed: int = 0):
    return make_trajectory([(t + shift, e) for t, e in WOOD_TABLE_PICKAXE], 64, seed=seed)


IDLE = make_trajectory([], 64, seed=1)


def render(t):
    return f"prompt {behaviour_key(t, 'behaviour')}", 0, 7


def test_plan_prompts_sends_one_prompt_per_uncached_eventful_behaviour():
    trajs = [wtp(), wtp(shift=3, seed=2), IDLE, make_trajectory([(4, "collect_drink")], 64)]
    cached_key = behaviour_key(trajs[3], "behaviour")
    plan = plan_prompts(trajs, use_llm=True, skip_idle=True, key_of=lambda t: behaviour_key(t, "behaviour"),
                        lookup=lambda k: ["drink water"] if k == cached_key else None, render=render)
    assert plan.prompts[0] is not None and plan.prompts[1] is None  # the same behaviour: one prompt
    assert plan.prompts[2] is None and not plan.eligible[2]  # idle: not asked
    assert plan.cached[3] == ["drink water"] and plan.prompts[3] is None
    assert plan.tokens == [7, 0, 0, 0]
    assert plan.counts == Counter(trajectories=4, cache_misses=1, batch_dedup=1, skipped_idle=1, cache_hits=1)
    rules_only = plan_prompts(trajs, use_llm=False, skip_idle=True, key_of=render, lookup=render, render=render)
    assert rules_only.asked is None and rules_only.counts["rules_only"] == 4


def _plan(prompts, keys=None, cached=None):
    n = len(prompts)
    return PromptPlan(keys or [f"k{i}" for i in range(n)], [True] * n, cached or [None] * n, prompts, [0] * n)


def test_read_answers_parses_shares_and_refuses_unusable_answers():
    good = json.dumps({"Mid-Level": ["collect wood", "collect wood", "place a table"], "High-Level": []})
    plan = _plan(["p0", None, "p2"], keys=["a", "a", "b"])
    ans = read_answers(plan, [Proposal([good]), Proposal(), Proposal(["no json here at all ??"])], CandidateFilter())
    assert ans.llm[0] == ans.llm[1] == ["collect wood", "place a table"]  # shared by the same key
    assert ans.errors[2].startswith("UnusableAnswer") and ans.llm[2] == []
    assert ans.to_cache == [("a", ["collect wood", "place a table"])]  # the unusable answer is asked again
    assert ans.asked == [0, 2] and ans.counts["errors"] == 1
    assert not ans.dropped[1]  # parse drops counted once per prompt, not per sharer


def test_read_answers_while_closing_counts_the_cut_call_not_as_an_error():
    plan = _plan(["p0", "p1"])
    ans = read_answers(plan, [Proposal(error="BackendError: stopped"), Proposal(['{"Mid-Level": ["sleep"]}'])],
                       CandidateFilter(), closing=True)
    assert ans.errors == [None, None] and ans.asked == [1] and ans.counts["closed_in_flight"] == 1
    failed = read_answers(plan, [Proposal(error="BackendError: stopped"), Proposal()], CandidateFilter())
    assert failed.errors[0] == "BackendError: stopped" and failed.errors[1].startswith("UnusableAnswer")
    assert failed.counts["errors"] == 2 and failed.asked == [0, 1]


def _answers(llm, errors):
    n = len(llm)
    return Answers(llm, errors, [Counter() for _ in range(n)], [], [])


def test_merge_rules_appends_rules_and_falls_back_on_a_failed_answer():
    trajs = [wtp(), wtp(seed=3)]
    rb = RuleBackend()
    answers = _answers([["collect wood", "make a sword"], []], [None, "BackendError: down"])
    m = merge_rules(trajs, answers, [[], []], rules_of=rb.instructions, use_rules=False, fallback="rules",
                    candidate_filter=CandidateFilter())
    assert m.items[0] == [("collect wood", "llm"), ("make a sword", "llm")]  # no rules beside the LLM
    assert m.fallbacks == [None, "rules"] and m.items[1] and all(src == "rules" for _, src in m.items[1])
    both = merge_rules(trajs, answers, [rb.instructions(t) for t in trajs], rules_of=rb.instructions,
                       use_rules=True, fallback="none", candidate_filter=CandidateFilter())
    assert both.items[0][:2] == m.items[0] and ("collect wood", "rules") not in both.items[0]
    assert both.dropped[0]["duplicate"] == 1  # "collect wood" from both sources: the LLM's kept
    assert both.fallbacks == [None, None]


def test_ground_cosine_and_bound_on_the_real_encoder(encoder):
    traj = wtp()
    items = Merged([[("collect wood", "llm"), ("collect diamond", "llm"), ("collect wood then place table", "rules"),
                     ("place table then collect wood", "rules")]], [None], [Counter()])
    phrases = np.asarray(encoder.encode(list(VOCAB.phrases)), np.float32)

    def enc(texts):
        return np.asarray(encoder.encode(texts), np.float32) if texts else np.zeros((0, phrases.shape[1]), np.float32)

    (cos,) = ground([traj], items, encode=enc, phrase_emb=phrases, mode="cosine", delta=0.9, bind_threshold=0.5)
    by = {c.text: c for c in cos.candidates}
    assert by["collect wood"].grounded and by["collect wood"].first_step == 5
    assert not by["collect diamond"].grounded and by["collect diamond"].first_step == -1
    (bound,) = ground([traj], items, encode=enc, phrase_emb=phrases, mode="bound", delta=0.9, bind_threshold=0.5)
    texts = [c.text for c in bound.candidates]
    assert "collect diamond" not in texts and bound.dropped["unbound"] >= 1  # it did not happen
    wood = next(c for c in bound.candidates if c.text == "collect wood then place table")
    assert wood.binding is not None and wood.binding.step == 12  # the pair, paid at place_table


def _cand(text, grounded, emb):
    return Candidate(text, "llm", 3 if grounded else -1, grounded, 0.5, None, np.asarray(emb, np.float32))


def test_select_drops_near_duplicates_then_keeps_grounded_first_up_to_k():
    e1, e2, e3 = np.eye(3, dtype=np.float32)
    g = Grounded([_cand("a", False, e1), _cand("b", True, e2), _cand("b'", True, e2), _cand("c", True, e3)],
                 Counter())
    sel = select(g, k=3, keep_ungrounded=True, dedup_threshold=0.95)
    assert [c.text for c in sel.scored] == ["a", "b", "c"] and sel.dropped == Counter(near_duplicate=1)
    assert [c.text for c in sel.chosen] == ["b", "c", "a"]
    assert [c.text for c in select(g, k=3, keep_ungrounded=False, dedup_threshold=0.95).chosen] == ["b", "c"]
    assert [c.text for c in select(g, k=1, keep_ungrounded=True, dedup_threshold=0.95).chosen] == ["b"]
    one = select(Grounded([_cand("a", True, e1)], Counter()), k=2, keep_ungrounded=True, dedup_threshold=0.95)
    assert "near_duplicate" not in one.dropped  # nothing compared
