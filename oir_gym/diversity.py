"""How far relabeled instructions go beyond the caption phrasings (RQ3, issue: novelty measure).

Two numbers per run, both pure functions of the instructions offered to the buffer:

* **novelty share**: the fraction of distinct instructions whose best cosine to any caption
  phrasing is below ``NOVELTY_BAR`` (0.8): wordings the caption vocabulary does not hold. The rule
  relabeler scores 0 (it emits canonical captions); a relabeler that only copies captions too.
* **distinct wordings per event**: for each event that instructions pay on (their binding's final
  event, or under cosine grounding the event of their best caption above delta), how many
  distinct texts name it.

And one for an LLM relabeler: its **prompt echo**, the share of its instructions that are copies of
the prompt's few-shot answers, exact or with a few characters changed (a small model at a sampling
temperature writes "get out of bed in tthe morning"). Such instructions are the template's wording,
not the model's.
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
#: From this character similarity (difflib ratio) to a few-shot answer of the prompt an LLM
#: instruction counts as a copy of it ("chop down a tree fop" against "chop down a tree for logs": 0.84).
ECHO_BAR = 0.8


@dataclass
class DiversityStats:
    """Novelty of a set of instructions.

    Attributes:
        instructions: distinct instructions considered.
        novel: how many are below :data:`NOVELTY_BAR` to every caption phrasing.
        novelty_share: ``novel / instructions`` (0 when empty).
        wordings_per_event: event name -> number of distinct texts paying on it.
    """

    instructions: int
    novel: int
    novelty_share: float
    wordings_per_event: dict[str, int] = field(default_factory=dict)

    @property
    def mean_wordings_per_event(self) -> float:
        """Mean over the events named at least once (0 when none)."""
        v = list(self.wordings_per_event.values())
        return float(np.mean(v)) if v else 0.0

    def flat(self, prefix: str = "diversity/") -> dict[str, float]:
        """Scalars for a metrics row."""
        return {f"{prefix}instructions": float(self.instructions), f"{prefix}novelty_share": self.novelty_share,
                f"{prefix}events_named": float(len(self.wordings_per_event)),
                f"{prefix}wordings_per_event": self.mean_wordings_per_event}


def instruction_diversity(texts: Sequence[str], best_caption_cos: Sequence[float],
                          events: Sequence[int], bar: float = NOVELTY_BAR) -> DiversityStats:
    """Novelty share and distinct wordings per event.

    Args:
        texts: instructions (repeats are counted once; the first occurrence's values are used).
        best_caption_cos: per text, its best cosine to any caption phrasing.
        events: per text, the event it pays on, or -1 (none).
        bar: novelty threshold (strict ``<``).
    """
    if not (len(texts) == len(best_caption_cos) == len(events)):
        raise ValueError(f"texts, best_caption_cos and events differ in length: "
                         f"{len(texts)}, {len(best_caption_cos)}, {len(events)}")
    seen: dict[str, tuple[float, int]] = {}
    for t, c, e in zip(texts, best_caption_cos, events):
        seen.setdefault(t, (float(c), int(e)))
    novel = sum(c < bar for c, _ in seen.values())
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


def echo_share(texts: Sequence[str], examples: Sequence[str], bar: float = ECHO_BAR) -> float:
    """Share of the distinct ``texts`` that copy one of ``examples`` (:func:`prompt_echo` >= ``bar``); 0 when empty."""
    distinct = list(dict.fromkeys(texts))
    if not distinct:
        return 0.0
    return sum(prompt_echo(t, examples) >= bar for t in distinct) / len(distinct)
