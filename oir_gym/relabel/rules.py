"""The rule relabeler: instructions read off the events of a trajectory, no LLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from oir_gym.captions import EVENT_NAMES, VOCAB
from oir_gym.relabel.oracle import (  # noqa: F401  (RULE_PAIRS: re-exported; defined beside the labelers)
    ACHIEVEMENT_EVENTS, RULE_PAIRS, USES_POOL, Label, WordingPool, check_oracle, episode_ids, first_occurrence_events,
    load_pool, oracle_labels, unique,
)
from oir_gym.trajectory import Trajectory

#: canonical caption -> event id, for reading "A then B" back (achievement events only).
_CANONICAL_EVENT: dict[str, int] = {VOCAB.canonical(e): e for e in ACHIEVEMENT_EVENTS}


def rule_events(text: str, pair_table: Optional[dict] = None) -> Optional[tuple[int, int]]:
    """``(pre, final)`` event ids of a rule instruction (a caption, ``"A then B"`` or a
    :data:`RULE_PAIRS` wording; ``pre = -1`` for a single event), or ``None``."""
    for (first, second), wording in (RULE_PAIRS if pair_table is None else pair_table).items():
        if text == wording:
            return EVENT_NAMES.index(first), EVENT_NAMES.index(second)
    first, sep, second = text.partition(" then ")
    if not sep:
        e = _CANONICAL_EVENT.get(text)
        return None if e is None else (-1, e)
    if first in _CANONICAL_EVENT and second in _CANONICAL_EVENT:
        return _CANONICAL_EVENT[first], _CANONICAL_EVENT[second]
    return None


def rule_final_event(text: str, pair_table: Optional[dict] = None) -> Optional[int]:
    """The event that completes a two-event rule instruction, or ``None`` for any other text (the
    relabeler refuses a compound whose cosine reward would pay on its first half)."""
    ev = rule_events(text, pair_table)
    return None if ev is None or ev[0] < 0 else ev[1]


@dataclass
class RuleBackend:
    """Instructions read off the events of a trajectory; deterministic given ``seed``, no LLM.

    ``oracle`` picks the variant (:mod:`oir_gym.relabel.oracle`; docs/relabeling.md): ``"canonical"``
    (the default) gives each achievement event's canonical caption in order of first occurrence,
    then the :data:`RULE_PAIRS` instructions whose two events happen in order in one episode.
    Every label carries the event(s) it names (:meth:`label_events`).

    Args:
        compounds: also give ``"A then B"`` for consecutive distinct achievement events of one
            episode (repeats collapsed), after the canonical captions.
        pairs, pair_table: give the pair instructions (default :data:`RULE_PAIRS`; canonical, tasks and compound).
        max_instructions: cap on the number returned (``None``: all).
        oracle: the variant, one of :data:`~oir_gym.relabel.oracle.ORACLES`.
        seed, pool: the per-trajectory draws' seed, the wording pool file (``None``: the packaged one).

    Raises ``ValueError`` for an unknown ``oracle`` or a bad ``pool`` file (naming it).
    """

    compounds: bool = False
    pairs: bool = True
    max_instructions: Optional[int] = None
    pair_table: dict = field(default_factory=lambda: dict(RULE_PAIRS))
    oracle: str = "canonical"
    seed: int = 0
    pool: Optional[str] = None

    def __post_init__(self) -> None:
        check_oracle(self.oracle)
        self._pool = load_pool(self.pool) if self.oracle in USES_POOL else None

    @property
    def wording_pool(self) -> Optional[WordingPool]:
        """The wording pool of ``diverse`` and ``noisy`` (``None`` for the other variants)."""
        return self._pool

    def vocabulary(self) -> list[str]:
        """Texts the labels are drawn from (captions, pair wordings, wording pool); composed labels
        may fall outside it."""
        texts = [VOCAB.canonical(e) for e in range(len(EVENT_NAMES))] + list(VOCAB.phrases)
        texts += list(self.pair_table.values()) if self.pairs else []
        texts += self._pool.texts() if self._pool is not None else []
        return list(dict.fromkeys(texts))

    def labels(self, traj: Trajectory) -> list[Label]:
        """The labels of one trajectory, each with the event(s) it is bound to."""
        table = self.pair_table if self.pairs else {}
        labels = oracle_labels(traj, self.oracle, seed=self.seed, pool=self._pool, pair_table=table)
        if self.compounds:
            n = len(first_occurrence_events(traj))  # after the captions, before the pair wordings
            labels = unique(labels[:n] + _consecutive_compounds(traj) + labels[n:])
        return labels[: self.max_instructions] if self.max_instructions else labels

    def label_events(self, traj: Trajectory) -> dict[str, tuple[int, int]]:
        """``{text: (pre, final)}`` of this trajectory's labels (``pre = -1`` for a single event)."""
        return {lab.text: (lab.pre, lab.final) for lab in self.labels(traj)}

    def instructions(self, traj: Trajectory) -> list[str]:
        """The rule instructions of one trajectory."""
        return [lab.text for lab in self.labels(traj)]

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[list[str]]:
        return [self.instructions(t) for t in trajectories]


def _consecutive_compounds(traj: Trajectory) -> list[Label]:
    episode, seq = episode_ids(traj), []
    ts, cs = np.nonzero(np.asarray(traj.events)[:, ACHIEVEMENT_EVENTS])  # time-major, then event id
    for t, c in zip(ts.tolist(), cs.tolist()):
        if not seq or seq[-1] != (ACHIEVEMENT_EVENTS[c], int(episode[t])):
            seq.append((ACHIEVEMENT_EVENTS[c], int(episode[t])))
    return [Label(f"{VOCAB.canonical(a)} then {VOCAB.canonical(b)}", b, a)
            for (a, ea), (b, eb) in zip(seq, seq[1:]) if ea == eb and a != b]
