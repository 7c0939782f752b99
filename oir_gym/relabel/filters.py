"""Candidate filters: normalise, drop forbidden/empty/over-long/garbage answers, de-duplicate.

Every dropped candidate is counted under a reason (``forbidden_word``, ``too_long``...). The
forbidden words follow the paper's prompt: no movement or exploration instructions (never grounded
by an event caption). Nothing here raises.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np

#: Regexes (matched case-insensitively on the normalised text) of movement/exploration wording.
FORBIDDEN_PATTERNS: tuple[str, ...] = (
    r"\bmov(?:e|es|ed|ing|ement)\b",
    r"\bexplor\w*",
    r"\bnavigat\w*",
    r"\bgo(?:es|ing)?\s+to\b(?!\s+(?:sleep|bed)\b)",  # "go to sleep" is an event, not a position
    r"\bgo(?:es|ing)?\s+(?:towards?|around|back|left|right|up|down|north|south|east|west|near)\b",
    r"\bwalk\w*",
    r"\bwander\w*",
    r"\btravel\w*",
    r"\bhead(?:s|ed|ing)?\s+(?:to|towards?|for|over)\b",
    r"\broam\w*",
    r"\b(?:run|runs|running|ran)\b",
    r"\bapproach\w*",
    r"\bproceed\w*\s+to\b",
    r"\bstep\s+(?:to|towards?|forward|back)\b",
    r"\breturn(?:s|ed|ing)?\s+to\b",
    r"\brelocat\w*",
    r"\bwalk\b",
)
#: Instructions that would reward self-harm (damage and death are grounded events).
HARMFUL_PATTERNS: tuple[str, ...] = (
    r"\bdie[sd]?\b", r"\bdying\b", r"\bdeath\b", r"\bkill(?:s|ed|ing)?\s+(?:yourself|myself|the player|the agent)\b",
    r"\b(?:take|takes|taking|took)\s+damage\b", r"\bget(?:s|ting)?\s+hurt\b", r"\blos(?:e|es|ing|t)\s+(?:all\s+)?health\b",
    r"\blava\b",
)
#: Idle instructions: grounded by almost every trajectory (the "noop" event), they teach nothing.
IDLE_PATTERNS: tuple[str, ...] = (r"^(?:do nothing|stand still|wait|idle|stay still|stay idle|noop|no-op)$",)
#: Normalised answers that are template echoes, not instructions.
PLACEHOLDERS = frozenset({
    "...", "\u2026", "instruction", "instructions", "none", "n/a", "na", "null", "mid-level",
    "high-level", "analysis", "completed instructions", "string", "todo", "tbd",
})
_WS = re.compile(r"\s+")
_LEAD = re.compile(r"^(?:[-*\u2022+>]+|\d{1,2}[.)]|[a-z][.)](?=\s))\s*")
_EDGE = "\"'`\u201c\u201d\u2018\u2019 .,;:!*_()[]{}<>"


def _bad_char(c: str) -> bool:
    cat = unicodedata.category(c)
    return (cat[0] == "C" and c not in "\t\n\r") or c == "\ufffd"


def normalise(text: str) -> str:
    """Canonical form of a candidate: NFKC, lower case, single spaces, no bullets/quotes/trailing
    punctuation. Idempotent (applied until it stops changing)."""
    prev, s = None, text
    for _ in range(4):
        if s == prev:
            break
        prev = s
        s = _LEAD.sub("", _WS.sub(" ", unicodedata.normalize("NFKC", s).lower()).strip()).strip(_EDGE)
    return s


@dataclass
class CandidateFilter:
    """Text-level filter (no embeddings): length bounds (characters after normalisation, words) and
    regexes of forbidden wording (``forbidden`` plus ``extra_forbidden``)."""

    max_chars: int = 100
    min_chars: int = 3
    max_words: int = 16
    forbidden: Sequence[str] = FORBIDDEN_PATTERNS
    extra_forbidden: Sequence[str] = ()
    _re: re.Pattern = field(init=False, repr=False)
    #: raw text -> (normalised text, drop reason or None): rule texts repeat in every batch
    _memo: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    #: texts remembered before the memo starts over (LLM answers rarely repeat)
    MEMO_SIZE = 4096

    def __post_init__(self) -> None:
        self._re = re.compile("|".join(f"(?:{p})" for p in (*self.forbidden, *self.extra_forbidden)), re.I)
        self._harm = re.compile("|".join(f"(?:{p})" for p in HARMFUL_PATTERNS), re.I)
        self._idle = re.compile("|".join(f"(?:{p})" for p in IDLE_PATTERNS), re.I)

    def check(self, text: str) -> Optional[str]:
        """The drop reason for an already normalised candidate, or ``None`` if it is kept."""
        if not text:
            return "empty"
        if any(_bad_char(c) for c in text):
            return "non_printable"
        if text in PLACEHOLDERS:
            return "placeholder"
        if not any(c.isalpha() for c in text):
            return "no_letters"
        if len(text) > self.max_chars:
            return "too_long"
        if len(text) < self.min_chars:
            return "too_short"
        if len(text.split()) > self.max_words:
            return "too_long"
        if self._re.search(text):
            return "forbidden_word"
        if self._harm.search(text):
            return "harmful"
        if self._idle.search(text):
            return "idle"
        return None

    def filter(self, texts: Iterable[object]) -> tuple[list[str], Counter]:
        """Normalise, drop and exactly de-duplicate (order kept). Returns ``(kept, dropped)``."""
        kept: list[str] = []
        seen: set[str] = set()
        dropped: Counter = Counter()
        for raw in texts:
            if not isinstance(raw, str):
                dropped["not_a_string"] += 1
                continue
            hit = self._memo.get(raw)
            if hit is None:
                if any(_bad_char(c) for c in raw if c not in " \t\n\r"):
                    hit = (raw, "non_printable")  # checked before NFKC could hide it
                else:
                    t = normalise(raw)
                    hit = (t, self.check(t))
                if len(self._memo) >= self.MEMO_SIZE:
                    self._memo.clear()
                self._memo[raw] = hit
            t, reason = hit
            if reason is None and t in seen:
                reason = "duplicate"
            if reason:
                dropped[reason] += 1
                continue
            seen.add(t)
            kept.append(t)
        return kept, dropped

    def is_clean(self, text: str) -> bool:
        """True for a string the filter would keep unchanged (used by property tests)."""
        return normalise(text) == text and self.check(text) is None


def near_duplicate_mask(embeddings: np.ndarray, threshold: float = 0.95) -> np.ndarray:
    """``[n]`` bool mask of the kept items: item ``i`` is dropped when its cosine with an earlier
    kept item (unit-norm embeddings) is ``>= threshold``."""
    emb = np.asarray(embeddings, dtype=np.float32)
    n = len(emb)
    keep = np.ones(n, dtype=bool)
    if n < 2:
        return keep
    sims = emb @ emb.T
    for i in range(1, n):
        prev = np.flatnonzero(keep[:i])
        if len(prev) and float(sims[i, prev].max()) >= threshold:
            keep[i] = False
    return keep
