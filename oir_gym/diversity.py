"""How far relabeled instructions go beyond the caption phrasings (RQ3): the **novelty share** (distinct
instructions whose best cosine to every caption phrasing is below :data:`NOVELTY_BAR`), **distinct
wordings per event** they pay on, and for an LLM its **prompt echo** (the share copying the prompt's
few-shot answers, exactly or with a few characters changed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from oir_gym.captions import EVENT_NAMES

#: Below this best cosine to every caption phrasing an instruction counts as novel wording.
NOVELTY_BAR = 0.8
#: From this difflib ratio to a few-shot answer an LLM instruction is a copy ("chop down a tree fop": 0.84).
ECHO_BAR = 0.8


@dataclass
class DiversityStats:
    """Novelty of ``instructions`` distinct texts: ``novel`` of them below :data:`NOVELTY_BAR`,
    ``novelty_share`` (0 when empty), ``wordings_per_event`` (event name -> distinct texts paying on it)."""

    instructions: int
    novel: int
    novelty_share: float
    wordings_per_event: dict[str, int] = field(default_factory=dict)

    @property
    def mean_wordings_per_event(self) -> float:
        """Mean over the events named at least once (0 when none)."""
        v = list(self.wordings_per_event.values())
        return float(np.mean(v)) if v else 0.0

    def flat(self) -> dict[str, float]:
        """Scalars for a metrics row."""
        return {"diversity/instructions": float(self.instructions), "diversity/novelty_share": self.novelty_share,
                "diversity/events_named": float(len(self.wordings_per_event)),
                "diversity/wordings_per_event": self.mean_wordings_per_event}


def instruction_diversity(texts: Sequence[str], best_caption_cos: Sequence[float],
                          events: Sequence[int]) -> DiversityStats:
    """Novelty share and distinct wordings per event of ``texts`` (repeats count once, at their first
    values), given per text its best cosine to any caption phrasing and the event it pays on (-1: none)."""
    if not (len(texts) == len(best_caption_cos) == len(events)):
        raise ValueError(f"texts, best_caption_cos and events differ in length: "
                         f"{len(texts)}, {len(best_caption_cos)}, {len(events)}")
    seen: dict[str, tuple[float, int]] = {}
    for t, c, e in zip(texts, best_caption_cos, events):
        seen.setdefault(t, (float(c), int(e)))
    novel = sum(c < NOVELTY_BAR for c, _ in seen.values())
    per_event: dict[str, set[str]] = defaultdict(set)
    for t, (_, e) in seen.items():
        if e >= 0:
            per_event[EVENT_NAMES[e]].add(t)
    n = len(seen)
    return DiversityStats(n, int(novel), novel / n if n else 0.0,
                          {k: len(v) for k, v in sorted(per_event.items())})


def paying_event(final_row: np.ndarray, delta: float) -> int:
    """The event an instruction pays on: its bound event, or its best caption's event above delta, else -1."""
    row = np.asarray(final_row, np.float32)
    e = int(np.argmax(row))
    return e if row[e] > delta else -1


def prompt_echo(text: str, examples: Sequence[str]) -> float:
    """Highest character similarity (``difflib.SequenceMatcher`` ratio, case-folded, 0-1) of
    ``text`` to any of ``examples`` (0 when there are none); from :data:`ECHO_BAR` on, a copy."""
    a = " ".join(text.lower().split())
    return max((SequenceMatcher(None, a, " ".join(e.lower().split())).ratio() for e in examples), default=0.0)


def echo_share(texts: Sequence[str], examples: Sequence[str]) -> float:
    """Share of the distinct ``texts`` that copy one of ``examples`` (:func:`prompt_echo` >= :data:`ECHO_BAR`)."""
    distinct = list(dict.fromkeys(texts))
    if not distinct:
        return 0.0
    return sum(prompt_echo(t, examples) >= ECHO_BAR for t in distinct) / len(distinct)
