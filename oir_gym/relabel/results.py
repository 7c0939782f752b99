"""What the relabeler hands back: scored candidates per trajectory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional, Self

import numpy as np

from oir_gym.grounding import Binding
from oir_gym.trajectory import Trajectory


@dataclass(frozen=True)
class Candidate:
    """One relabeled instruction for one trajectory.

    Attributes:
        text: the normalised instruction.
        source: ``"llm"`` or ``"rules"``.
        first_step: first step whose events match the instruction (the env's reward), or ``-1``.
        grounded: ``first_step >= 0``: relabeling the trajectory with it yields a reward.
        similarity: best cosine with an event that happened (``-1`` when none did).
        binding: the event(s) it is bound to (event-bound grounding), or ``None``.
        emb: ``[D]`` its sentence embedding (the policy input).
        final_row, pre_row: ``[E]`` its grounding rows (:mod:`oir_gym.grounding`): cosine
            similarities, or the indicator rows of ``binding``.
    """

    text: str
    source: str
    first_step: int
    grounded: bool
    similarity: float
    binding: Optional[Binding] = None
    emb: Optional[np.ndarray] = field(default=None, compare=False, repr=False)
    final_row: Optional[np.ndarray] = field(default=None, compare=False, repr=False)
    pre_row: Optional[np.ndarray] = field(default=None, compare=False, repr=False)


@dataclass
class RelabelResult:
    """Relabeling of one trajectory.

    Attributes:
        trajectory: the trajectory that was relabeled (the same object).
        candidates: up to ``k`` kept candidates, grounded ones first.
        request_id: id returned by :meth:`HindsightRelabeler.submit` (sync calls number them too).
        num_scored, num_grounded: candidates that reached grounding, and how many were grounded.
        dropped: candidates dropped, by reason.
        cache_hit: the LLM answer came from the cache.
        error: why the LLM gave nothing (``None`` if it answered or was not asked).
        fallback: ``"rules"`` (rules replaced a failed LLM call) or ``"overflow"`` (the queue was full).
        prompt_tokens: prompt length of this trajectory's LLM call (0 when none was made).
    """

    trajectory: Trajectory
    candidates: list[Candidate]
    request_id: int = -1
    num_scored: int = 0
    num_grounded: int = 0
    dropped: Counter = field(default_factory=Counter)
    cache_hit: bool = False
    error: Optional[str] = None
    fallback: Optional[str] = None
    prompt_tokens: int = 0

    @property
    def instructions(self) -> list[str]:
        """The kept instruction texts."""
        return [c.text for c in self.candidates]

    @property
    def grounded(self) -> list[Candidate]:
        """The kept candidates that are grounded in this trajectory."""
        return [c for c in self.candidates if c.grounded]


class Closing:
    """``with relabeler:`` closes it at the end."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
