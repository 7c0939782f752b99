"""The relabeling pipeline as plain functions over small dataclasses, called in this order by
:meth:`HindsightRelabeler.relabel <oir_gym.relabel.HindsightRelabeler.relabel>`: :func:`plan_prompts`, one
batched LLM call, :func:`read_answers`, :func:`merge_rules`, :func:`ground`, :func:`select`, :func:`assemble`.
No stage starts a thread, holds a lock or touches the relabeler's counters; each returns what it dropped and why.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from oir_gym.captions import NUM_EVENTS, VOCAB
from oir_gym.grounding import (
    Binding, bind, bind_ordered, episode_starts_from_dones, first_paid_step, indicator_row, no_precondition,
    split_ordered,
)
from oir_gym.relabel.composite import Proposal
from oir_gym.relabel.filters import CandidateFilter, near_duplicate_mask
from oir_gym.relabel.parse import parse_candidates
from oir_gym.relabel.results import Candidate, RelabelResult
from oir_gym.relabel.rules import rule_events, rule_final_event
from oir_gym.relabel.segments import is_idle
from oir_gym.reward import event_similarity, match_steps, without_events
from oir_gym.trajectory import Trajectory


@dataclass
class PromptPlan:
    """Which trajectories the LLM is asked about: per trajectory its cache key, whether the LLM may
    answer, the cached answer, the prompt it carries and its tokens; ``counts`` for the stats.
    """

    keys: list[Optional[str]]
    eligible: list[bool]
    cached: list[Optional[list[str]]]
    prompts: list[Optional[str]]
    tokens: list[int]
    counts: Counter = field(default_factory=Counter)

    @property
    def asked(self) -> list[Optional[str]]:
        """The prompts, or ``None`` when none is sent."""
        return self.prompts if any(p is not None for p in self.prompts) else None


def plan_prompts(trajs: Sequence[Trajectory], *, use_llm: bool, skip_idle: bool,
                 key_of: Callable[[Trajectory], str], lookup: Callable[[str], Optional[list[str]]],
                 render: Callable[[Trajectory], tuple[str, int, int]]) -> PromptPlan:
    """One prompt per distinct behaviour that is neither cached nor idle (``skip_idle``); ``lookup``: a key's
    cached answer or ``None``; ``render``: ``(prompt, compaction level, tokens)``."""
    n = len(trajs)
    keys: list[Optional[str]] = [key_of(t) for t in trajs] if use_llm else [None] * n
    eligible = [use_llm and not (skip_idle and is_idle(t)) for t in trajs]
    cached: list[Optional[list[str]]] = [None] * n
    prompts: list[Optional[str]] = [None] * n
    tokens = [0] * n
    owner: set[str] = set()  # keys that already carry a prompt in this batch
    counts = Counter(trajectories=n)
    if not use_llm:
        counts["rules_only"] += n
    for i, (t, key) in enumerate(zip(trajs, keys)):
        if not use_llm:
            break
        if not eligible[i]:
            counts["skipped_idle"] += 1
            continue
        hit = lookup(key)
        if hit is not None:
            cached[i] = hit
            counts["cache_hits"] += 1
        elif key in owner:
            counts["batch_dedup"] += 1  # same behaviour twice in one batch: one prompt
        else:
            owner.add(key)
            prompts[i], level, tokens[i] = render(t)
            counts["cache_misses"] += 1
            counts["prompts_compacted"] += level > 0
    return PromptPlan(keys, eligible, cached, prompts, tokens, counts)


@dataclass
class Answers:
    """The LLM's parsed, filtered candidates per trajectory, why it gave nothing usable (``errors``),
    the indices ``asked`` and the fresh answers ``to_cache``.
    """

    llm: list[list[str]]
    errors: list[Optional[str]]
    dropped: list[Counter]
    asked: list[int]
    to_cache: list[tuple[str, list[str]]]
    counts: Counter = field(default_factory=Counter)


def read_answers(plan: PromptPlan, proposals: Sequence[Proposal], candidate_filter: CandidateFilter, *,
                 closing: bool = False) -> Answers:
    """Parse each prompt's completions; trajectories that shared a prompt share its answer.

    An answer with nothing usable is an error, not cached. ``closing``: a failed call is the
    shutdown's doing, counted in ``closed_in_flight`` and treated as never asked.
    """
    n = len(plan.prompts)
    counts: Counter = Counter()
    prompts = list(plan.prompts)
    if closing:
        for i in range(n):
            if prompts[i] is not None and proposals[i].error is not None:
                counts["closed_in_flight"] += 1
                prompts[i] = None
    llm: list[list[str]] = [[] for _ in range(n)]
    dropped = [Counter() for _ in range(n)]
    errors: list[Optional[str]] = [None] * n
    fresh: dict[Optional[str], tuple[list[str], Counter, Optional[str]]] = {}
    to_cache: list[tuple[str, list[str]]] = []
    for i in range(n):
        if prompts[i] is None:
            continue
        err = proposals[i].error
        texts: list[str] = []
        reasons: Counter = Counter()
        if err is None:
            for raw in proposals[i].llm_raw:
                c, r = parse_candidates(raw, candidate_filter)
                texts.extend(c)
                reasons += r
            texts = list(dict.fromkeys(texts))
            if texts:
                to_cache.append((plan.keys[i], texts))
            else:  # garbage, or only filtered words: a failed answer (not cached: ask again)
                why = ", ".join(f"{k} {v}" for k, v in reasons.most_common(3)) or "empty"
                err = f"UnusableAnswer: nothing usable in the LLM's answer ({why})"
        fresh[plan.keys[i]] = (texts, reasons, err)
    for i in range(n):
        if plan.cached[i] is not None:
            llm[i] = plan.cached[i]
        elif plan.keys[i] in fresh and plan.eligible[i]:
            texts, reasons, err = fresh[plan.keys[i]]
            llm[i] = texts
            errors[i] = err
            if prompts[i] is not None:  # count parse drops once per prompt
                dropped[i] += reasons
        if errors[i] is not None:
            counts["errors"] += 1
    asked = [i for i in range(n) if prompts[i] is not None]
    return Answers(llm, errors, dropped, asked, to_cache, counts)


@dataclass
class Merged:
    """Candidate ``(text, source)`` pairs per trajectory (LLM first, then rules), exact duplicates removed."""

    items: list[list[tuple[str, str]]]
    fallbacks: list[Optional[str]]
    dropped: list[Counter]


def merge_rules(trajs: Sequence[Trajectory], answers: Answers, rules: Sequence[list[str]], *,
                rules_of: Callable[[Trajectory], list[str]], use_rules: bool, fallback: str,
                candidate_filter: CandidateFilter) -> Merged:
    """Append rule instructions (``rules``, or ``rules_of(traj)`` for the fallback) to the LLM's candidates:
    always with ``use_rules``, otherwise only when ``fallback="rules"`` and the LLM failed."""
    items_all: list[list[tuple[str, str]]] = []
    fallbacks: list[Optional[str]] = []
    dropped_all: list[Counter] = []
    for i, t in enumerate(trajs):
        dropped: Counter = Counter()
        failed = answers.errors[i] is not None
        items = [(c, "llm") for c in answers.llm[i]]
        rl = rules[i]
        if failed and fallback == "rules" and not rl:
            rl = rules_of(t)
        fb = "rules" if failed and rl and fallback == "rules" else None
        if rl and (use_rules or fb):
            kept, r = candidate_filter.filter(rl)
            dropped += r
            items += [(c, "rules") for c in kept]
        uniq: dict[str, str] = {}
        for text, src in items:
            uniq.setdefault(text, src)
        if len(uniq) < len(items):
            dropped["duplicate"] += len(items) - len(uniq)
        items_all.append(list(uniq.items()))
        fallbacks.append(fb)
        dropped_all.append(dropped)
    return Merged(items_all, fallbacks, dropped_all)


@dataclass
class Grounded:
    """One trajectory's grounded candidates and what grounding dropped (``premature`` or ``unbound``)."""

    candidates: list[Candidate]
    dropped: Counter


def ground(trajs: Sequence[Trajectory], merged: Merged, *, encode: Callable[[list[str]], np.ndarray],
           phrase_emb: np.ndarray, mode: str, delta: float, bind_threshold: float,
           pair_table: Optional[dict] = None,
           rule_table: Optional[Callable[[Trajectory], Optional[dict[str, tuple[int, int]]]]] = None
           ) -> list[Grounded]:
    """Encode every candidate once and ground it on its trajectory (:mod:`oir_gym.grounding`).

    ``mode="cosine"``: paid from the first step with a caption above ``delta``; a two-event rule
    instruction paid before its final event is dropped (``premature``). ``mode="bound"``: bound to
    the event(s) it names (rule labels via ``rule_table`` / ``pair_table``); unbound ones are dropped.
    This runs before :func:`select`'s near-dedup, or a removed wording could shadow its valid reverse.
    """
    all_texts = list(dict.fromkeys(t for items in merged.items for t, _ in items))
    bound = mode == "bound"
    halves = [h for t in all_texts for h in (split_ordered(t) or ())] if bound else []
    known = set(all_texts)
    enc_texts = all_texts + [h for h in dict.fromkeys(halves) if h not in known]
    emb_all = encode(enc_texts)
    row = {t: j for j, t in enumerate(enc_texts)}
    sim_all = (
        np.asarray(event_similarity(emb_all, phrase_emb, VOCAB.phrase_event, NUM_EVENTS))
        if len(enc_texts) else np.zeros((0, NUM_EVENTS), np.float32)
    )
    if not bound:  # the cosine reward's rows: progress events are paid through bound grounding only
        sim_all = without_events(sim_all, VOCAB.progress_events)
    half_sims = {h: sim_all[row[h]] for h in halves}
    no_pre = no_precondition(NUM_EVENTS)
    out = []
    for traj, items in zip(trajs, merged.items):
        starts = episode_starts_from_dones(traj.dones)
        dropped: Counter = Counter()
        bindings: dict[str, Binding] = {}
        if bound:
            table = rule_table(traj) if rule_table is not None and any(src == "rules" for _, src in items) else None
            for t, src in items:
                b = bind_candidate(t, src, sim_all[row[t]], traj, starts, half_sims, delta=delta,
                                   bind_threshold=bind_threshold, pair_table=pair_table, rule_table=table)
                if b is not None:
                    bindings[t] = b
            kept = [(t, src) for t, src in items if t in bindings]
            reason = "unbound"
        else:
            kept = [(t, src) for t, src in items
                    if not (src == "rules" and premature(traj.events, t, sim_all[row[t]], delta, pair_table))]
            reason = "premature"
        if len(kept) < len(items):
            dropped[reason] += len(items) - len(kept)
        happened = traj.events.any(axis=0)
        cands = []
        for text, src in kept:
            r = row[text]
            sim = sim_all[r]
            best = min(1.0, float(sim[happened].max())) if happened.any() else -1.0
            if bound:
                b = bindings[text]
                final, pre = b.rows(NUM_EVENTS)
                cands.append(Candidate(text, src, b.step, True, best, b, emb_all[r], final, pre))
            else:
                step = first_paid_step(traj.events, sim, no_pre, starts, delta)
                cands.append(Candidate(text, src, step, step >= 0, best, None, emb_all[r], sim, no_pre))
        out.append(Grounded(cands, dropped))
    return out


def premature(events: np.ndarray, text: str, sim: np.ndarray, delta: float, pair_table: Optional[dict] = None) -> bool:
    """True for a two-event rule instruction the reward pays where its final event did not happen."""
    final = rule_final_event(text, pair_table)
    if final is None:
        return False
    paid = match_steps(events, sim, delta)
    return bool((paid & ~np.asarray(events[:, final], bool)).any())


def bind_candidate(text: str, src: str, sim: np.ndarray, traj: Trajectory, starts: np.ndarray,
                   half_sims: dict[str, np.ndarray], *, delta: float, bind_threshold: float,
                   pair_table: Optional[dict] = None,
                   rule_table: Optional[dict[str, tuple[int, int]]] = None) -> Optional[Binding]:
    """The binding of candidate ``text`` on ``traj`` (``grounding="bound"``), or ``None``."""
    if src == "rules":
        ev = rule_table.get(text) if rule_table is not None else rule_events(text, pair_table)
        if ev is None:
            return None
        pre, final = ev
        step = first_paid_step(traj.events, indicator_row(final, NUM_EVENTS), indicator_row(pre, NUM_EVENTS),
                               starts, delta)
        return Binding(final=final, pre=pre, step=step) if step >= 0 else None
    halves = split_ordered(text)
    if halves is not None:
        return bind_ordered(half_sims[halves[0]], half_sims[halves[1]], traj.events, starts,
                            threshold=bind_threshold)
    return bind(sim, traj.events, threshold=bind_threshold)


@dataclass
class Selection:
    """One trajectory's kept candidates (``chosen``), those after near-dedup (``scored``) and drops."""

    chosen: list[Candidate]
    scored: list[Candidate]
    dropped: Counter

    @property
    def grounded(self) -> list[Candidate]:
        """The scored candidates that are grounded."""
        return [c for c in self.scored if c.grounded]


def select(grounded: Grounded, *, k: int, keep_ungrounded: bool, dedup_threshold: float) -> Selection:
    """Drop near-duplicates, then keep up to ``k``: grounded first, then ungrounded if ``keep_ungrounded``."""
    cands = list(grounded.candidates)
    dropped: Counter = Counter()
    if len(cands) > 1:
        keep = near_duplicate_mask(np.stack([c.emb for c in cands]), dedup_threshold)
        dropped["near_duplicate"] += int((~keep).sum())
        cands = [c for c, kk in zip(cands, keep) if kk]
    good = [c for c in cands if c.grounded]
    chosen = good + ([c for c in cands if not c.grounded] if keep_ungrounded else [])
    return Selection(chosen[:k], cands, dropped)


def assemble(trajs: Sequence[Trajectory], ids: Sequence[int], plan: PromptPlan, answers: Answers, merged: Merged,
             grounded: Sequence[Grounded], chosen: Sequence[Selection]) -> tuple[list[RelabelResult], Counter,
                                                                                 list[Counter]]:
    """One :class:`RelabelResult` per trajectory, the batch's counters and each trajectory's drops."""
    s = plan.counts + answers.counts
    results, dropped = [], []
    for i, (traj, g, sel) in enumerate(zip(trajs, grounded, chosen)):
        d = answers.dropped[i] + merged.dropped[i] + g.dropped + sel.dropped
        for c in (merged.dropped[i], g.dropped, sel.dropped):  # keep reasons counted as 0 (Counter + drops them)
            for key in c:
                d.setdefault(key, 0)
        dropped.append(d)
        res = RelabelResult(
            trajectory=traj, candidates=sel.chosen, request_id=ids[i], num_scored=len(sel.scored),
            num_grounded=len(sel.grounded), dropped=d, cache_hit=plan.cached[i] is not None,
            error=answers.errors[i], fallback=merged.fallbacks[i], prompt_tokens=plan.tokens[i],
        )
        results.append(res)
        s["candidates_scored"] += len(sel.scored)
        s["candidates_grounded"] += len(sel.grounded)
        s["candidates_kept"] += len(res.candidates)
        s["candidates_kept_grounded"] += len(res.grounded)
        s["candidates_kept_llm"] += sum(c.source == "llm" for c in res.candidates)
        s["candidates_llm"] += sum(c.source == "llm" for c in sel.scored)
        s["candidates_rules"] += sum(c.source == "rules" for c in sel.scored)
        s["fallbacks"] += merged.fallbacks[i] is not None
    return results, s, dropped
