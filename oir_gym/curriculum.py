"""The step after relabeling (the paper's Alg. 1): rows to train on, buffer inserts, bindings.

A result's group (buffer) is its trajectory's ``meta["seed"]``, its age ``now - meta["update"]`` (0 when
absent). The curriculum records no buffer return: a 1/0 hindsight return would rank every grounded
candidate as solved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np

from oir_gym.buffer import InstructionBuffer
from oir_gym.diversity import echo_share, instruction_diversity, paying_event
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.validation import check_choice, check_int, check_real

__all__ = ["OFFER_METRICS", "CurriculumConfig", "InstructionCurriculum", "Offer", "Row", "balanced_choice"]

#: the keys every :attr:`Offer.metrics` holds (both trainers log them per metrics row)
OFFER_METRICS = ("relabel/rows", "relabel/grounded_frac", "relabel/new_instructions", "relabel/llm_offer_share")

GROUNDING = ("cosine", "bound")


@dataclass(frozen=True)
class CurriculumConfig:
    """Settings of :class:`InstructionCurriculum`; ValueError for a bad value."""

    k: int  # relabeled copies per trajectory (with balance, the slots each trajectory fills)
    balance: bool = False  # spread each trajectory's k rows over instructions (balanced_choice)
    keep_ungrounded: bool = False  # also buffer candidates that paid no reward on their trajectory (Alg. 1)
    grounding: str = "cosine"  # "bound": register each text a buffer took with its candidate's binding
    delta: float = 0.8  # the env's cosine threshold (which event a text pays on, for diversity())
    fixed_texts: tuple[str, ...] = ORIGINAL_INSTRUCTIONS  # texts never bound
    llm: bool = False  # the results include an LLM's: report what its instructions reached
    prompt_examples: tuple[str, ...] = ()  # the LLM prompt's few-shot answers (diversity/llm_echo_share)

    def __post_init__(self) -> None:
        check_int("k", self.k, minimum=1, hint=" (relabeled copies per trajectory)")
        check_choice("grounding", self.grounding, GROUNDING)
        check_real("delta", self.delta, low=-1.0, high=1.0, hint=" (a cosine threshold)")
        object.__setattr__(self, "fixed_texts", tuple(self.fixed_texts))
        object.__setattr__(self, "prompt_examples", tuple(self.prompt_examples))


class Row(NamedTuple):
    """One relabeled copy to train on: its candidate on its trajectory, ``age`` updates old."""

    age: int
    trajectory: Any
    candidate: Any


@dataclass(frozen=True)
class Offer:
    """What one :meth:`InstructionCurriculum.apply` did, per group: ``rows`` to train on, texts ``offered``
    to its buffer and ``inserted`` by it; and the call's ``relabel/*`` ``metrics``."""

    rows: list[list[Row]]
    offered: list[list[str]]
    inserted: list[list[str]]
    metrics: dict[str, float]


def balanced_choice(candidates: Sequence[Sequence[str]], k: int) -> list[list[str]]:
    """Per trajectory (its candidate texts), up to ``k`` texts: round by round each takes, of its candidates
    not yet taken, the one with the fewest rows so far (ties: the candidate's order)."""
    counts: Counter = Counter()
    chosen: list[list[str]] = [[] for _ in candidates]
    for _ in range(k):
        for i, cands in enumerate(candidates):
            left = [c for c in cands if c not in chosen[i]]
            if left:
                pick = min(left, key=lambda c: counts[c])  # min keeps the first of equal counts
                chosen[i].append(pick)
                counts[pick] += 1
    return chosen


class InstructionCurriculum:
    """The step after relabeling over one buffer per group and the instruction ``registry``;
    ``register(texts, bindings)`` (default ``registry.rows``) registers bound texts."""

    def __init__(self, buffers: Sequence[InstructionBuffer], registry: Any, config: CurriculumConfig, *,
                 register: Optional[Callable[[list[str], list[Any]], Any]] = None) -> None:
        if not buffers or not all(isinstance(b, InstructionBuffer) for b in buffers):
            raise TypeError("buffers must be a non-empty sequence of oir_gym.InstructionBuffer (one per group)")
        if not isinstance(config, CurriculumConfig):
            raise TypeError(f"config must be a CurriculumConfig, got {type(config).__name__}")
        self.buffers = list(buffers)
        self.registry = registry
        self.config = config
        self._register = register or (lambda texts, bindings: registry.rows(texts, bindings=bindings))
        #: every text offered to a buffer: (best cosine to any caption phrasing, paying event, source)
        self.offered: dict[str, tuple[float, int, str]] = {}
        self.offers_llm = 0
        self.offers_total = 0
        #: the LLM's candidates that became rows, and its texts the buffers took, over the run
        self.llm_rows = 0
        self.llm_buffered = 0

    # ------------------------------------------------------------ the step
    def apply(self, results: Sequence[Any], now: int = 0, rows_per_group: Optional[int] = None) -> Offer:
        """Choose the rows (at most ``rows_per_group``) from ``results``, insert into the buffers, bind, count;
        ValueError before any insert if a chosen candidate lacks ``emb``, ``final_row`` or ``pre_row``."""
        cfg = self.config
        G = len(self.buffers)
        by_group: list[list[Row]] = [[] for _ in range(G)]
        grouped: list[list[Any]] = [[] for _ in range(G)]
        for r in results:
            grouped[self._group(r, G)].append(r)
        for g, rs in enumerate(grouped):
            if cfg.balance:  # K per trajectory, spread over instructions (first grounded candidate per text)
                firsts: list[dict] = [{} for _ in rs]
                for f, r in zip(firsts, rs):
                    for c in r.candidates:
                        if c.grounded:
                            f.setdefault(c.text, c)
                picks = balanced_choice([list(f) for f in firsts], cfg.k)
                for r, f, texts_r in zip(rs, firsts, picks):
                    by_group[g] += [Row(self._age(r, now), r.trajectory, f[t]) for t in texts_r]
            else:
                for r in rs:
                    by_group[g] += [Row(self._age(r, now), r.trajectory, c) for c in r.candidates]
        # grounded candidates first (they carry reward), then older rollouts (LLM answers)
        rows = [sorted(rs, key=lambda x: (not x.candidate.grounded, -x.age))[:rows_per_group] for rs in by_group]
        for c in (row.candidate for rs in rows for row in rs):
            if c.emb is None or c.final_row is None or c.pre_row is None:
                raise ValueError(f"relabeled candidate {c.text!r} carries no embedding or grounding rows (emb, "
                                 "final_row, pre_row): use oir_gym.relabel.HindsightRelabeler, whose candidates carry them")
        metrics = {"relabel/rows": sum(map(len, rows)) / G,
                   "relabel/grounded_frac": float(np.mean([c.grounded for r in results for c in r.candidates] or [0.0]))}
        # an ungrounded text's return 0 would rank it ahead of every learnable one in the buffer
        grounded = [{c.text for r in rs for c in r.candidates if c.grounded} for rs in grouped]
        offered, inserted, offers = [], [], []
        llm_buffered = 0
        for g, buf in enumerate(self.buffers):
            first: dict[str, Any] = {}  # text -> the first chosen candidate with it (source, binding)
            for row in rows[g]:
                first.setdefault(row.candidate.text, row.candidate)
            cands = [t for t in first if cfg.keep_ungrounded or t in grounded[g]]
            written = buf.insert(cands) if cands else []
            llm_buffered += sum(first[t].source == "llm" for t in written if t in first)
            if cfg.grounding == "bound" and written:
                # only what the buffer took (new episodes draw from it); a text's first binding wins
                self._register(written, [None if t in cfg.fixed_texts else first[t].binding for t in written])
            offered.append(cands)
            inserted.append(written)
            offers += [first[t] for t in cands]
        metrics.update(self._count_offers(offers))
        if cfg.llm:
            llm_rows = sum(row.candidate.source == "llm" for rs in rows for row in rs)
            self.llm_rows += llm_rows
            self.llm_buffered += llm_buffered
            metrics.update({"relabel/llm_rows": float(llm_rows), "relabel/llm_buffered": float(llm_buffered),
                            "relabel/llm_rows_total": float(self.llm_rows),
                            "relabel/llm_buffered_total": float(self.llm_buffered)})
        return Offer(rows, offered, inserted, metrics)

    @staticmethod
    def _group(result: Any, groups: int) -> int:
        g = int(result.trajectory.meta.get("seed", 0))
        if not 0 <= g < groups:
            raise ValueError(f"a result's trajectory has meta['seed']={g}, but the curriculum holds {groups} "
                             "buffer(s): give each group (seed) its own buffer")
        return g

    @staticmethod
    def _age(result: Any, now: int) -> int:
        return int(now - result.trajectory.meta.get("update", now))

    def _count_offers(self, offers: Sequence[Any]) -> dict[str, float]:
        """Record this call's offers (one per group and text): LLM share, new texts, their cosine and event."""
        new = [c for c in dict((c.text, c) for c in offers).values() if c.text not in self.offered]
        if new:
            # the registry's cosine, not final_row (an indicator row for a bound candidate)
            best = self.registry.similarity_to_events(np.stack([c.emb for c in new])).max(axis=-1)
            for c, b in zip(new, best):
                self.offered[c.text] = (float(b), paying_event(c.final_row, self.config.delta), c.source)
        n_llm = sum(c.source == "llm" for c in offers)
        self.offers_llm += n_llm
        self.offers_total += len(offers)
        return {"relabel/llm_offer_share": n_llm / len(offers) if offers else 0.0,
                "relabel/new_instructions": float(len(new))}

    # ------------------------------------------------------------ reports and state
    def diversity(self) -> dict[str, float]:
        """``diversity/*`` of every text offered so far (:mod:`oir_gym.diversity`) and the run's offer totals."""
        texts = list(self.offered)
        stats = instruction_diversity(texts, [self.offered[t][0] for t in texts], [self.offered[t][1] for t in texts])
        out = {**stats.flat(), "relabel/llm_offer_share_total": self.offers_llm / max(self.offers_total, 1),
               "relabel/offers_total": float(self.offers_total)}
        if self.config.llm:
            llm = [t for t in texts if self.offered[t][2] == "llm"]
            out["diversity/llm_instructions"] = float(len(llm))
            out["diversity/llm_echo_share"] = echo_share(llm, self.config.prompt_examples)
        return out

    def report(self) -> dict[str, Any]:
        """The run so far: offers (all, the LLM's), distinct texts offered, the LLM's rows and buffer texts."""
        return {"offers": self.offers_total, "offers_llm": self.offers_llm, "distinct_offered": len(self.offered),
                "rows_in_batch": self.llm_rows, "into_buffer": self.llm_buffered}

    def state_dict(self) -> dict[str, Any]:
        """JSON state for checkpoints (the buffers and the registry keep their own)."""
        return {"llm": self.offers_llm, "total": self.offers_total, "llm_rows": self.llm_rows,
                "llm_buffered": self.llm_buffered,
                "texts": [[t, c, e, src] for t, (c, e, src) in self.offered.items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offers_llm, self.offers_total = int(state.get("llm", 0)), int(state.get("total", 0))
        self.llm_rows, self.llm_buffered = int(state.get("llm_rows", 0)), int(state.get("llm_buffered", 0))
        self.offered = {str(t): (float(c), int(e), str(src)) for t, c, e, src in state.get("texts", [])}
