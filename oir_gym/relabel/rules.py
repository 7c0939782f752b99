"""The rule relabeler: instructions read off the events of a trajectory, no LLM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from oir_gym.captions import EVENT_NAMES, VOCAB
from oir_gym.trajectory import Trajectory

#: Ordered event pairs with a natural combined instruction ("sleep and wake up"). Each wording must
#: pay (cosine > 0.9) on its second event and not on its first, or its reward would land before the
#: task is done ("collect a sapling and plant it" matched collecting the sapling; tested).
RULE_PAIRS: dict[tuple[str, str], str] = {
    ("fall_asleep", "wake_up"): "sleep and wake up",
    ("attack_cow", "eat_cow"): "kill and eat a cow",
    ("attack_zombie", "defeat_zombie"): "fight and defeat a zombie",
    ("attack_skeleton", "defeat_skeleton"): "fight and defeat a skeleton",
}


def rule_events(text: str, pair_table: Optional[dict] = None) -> Optional[tuple[int, int]]:
    """``(pre, final)`` event ids of a rule instruction (``pre = -1`` for a single event), or ``None``.

    ``"collect wood"`` -> ``(-1, collect_wood)``; ``"collect wood then place table"`` ->
    ``(collect_wood, place_table)``; a :data:`RULE_PAIRS` wording (``"sleep and wake up"``) -> its
    two events. Event-bound grounding binds rule instructions through it.
    """
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
    """The event that completes a two-event rule instruction, or ``None`` for any other text.

    ``"collect wood then place table"`` -> the id of ``place_table``; a :data:`RULE_PAIRS` wording
    (``"sleep and wake up"``) -> its second event. The relabeler uses it to refuse a rule
    instruction whose reward would land before the task is done: some compounds score above delta
    against their *first* event's captions ("collect stone then place stone" against "collect
    stone": 0.914), and the cosine reward would then pay on the first half.
    """
    ev = rule_events(text, pair_table)
    return None if ev is None or ev[0] < 0 else ev[1]


#: canonical caption -> event id, for reading "A then B" back (achievement events only).
_CANONICAL_EVENT: dict[str, int] = {
    VOCAB.canonical(e): e for e in range(len(EVENT_NAMES)) if VOCAB.achievement_of_event[e] >= 0
}


#: per event id: whether it is an achievement event (the rule instructions name only those)
_IS_ACHIEVEMENT = tuple(VOCAB.achievement_of_event[e] >= 0 for e in range(len(EVENT_NAMES)))


@dataclass
class RuleBackend:
    """Instructions read off the events of a trajectory; deterministic, no LLM.

    Produces, in this order:

    1. each achievement event's canonical caption, in order of first occurrence
       (``"collect wood"``, ``"place table"``...);
    2. ``"A then B"`` for consecutive distinct achievement events of the same episode
       (repeats of one event collapse first: wood, wood, table -> ``"collect wood then place table"``);
    3. pair instructions of :data:`RULE_PAIRS` (``"sleep and wake up"``) when the first event is
       followed by the second in the same episode.

    Args:
        compounds: emit the ``"A then B"`` instructions.
        pairs: emit the :data:`RULE_PAIRS` instructions.
        max_instructions: cap on the number returned (``None``: all).
    """

    compounds: bool = True
    pairs: bool = True
    max_instructions: Optional[int] = None
    pair_table: dict = field(default_factory=lambda: dict(RULE_PAIRS))

    def instructions(self, traj: Trajectory) -> list[str]:
        """The rule instructions of one trajectory."""
        out: list[str] = []
        ach = _IS_ACHIEVEMENT
        episode = np.cumsum(np.concatenate([[0], np.asarray(traj.dones[:-1], dtype=np.int64)]))
        seq: list[tuple[int, int]] = []  # (event id, episode) of achievement events in time order
        ts, es = np.nonzero(np.asarray(traj.events))  # time-major: the order of the events in time
        for t, e in zip(ts.tolist(), es.tolist()):
            if ach[e] and (not seq or seq[-1] != (e, int(episode[t]))):
                seq.append((e, int(episode[t])))
        for e, _ in seq:
            out.append(VOCAB.canonical(e))
        if self.compounds:
            for (a, ea), (b, eb) in zip(seq, seq[1:]):
                if ea == eb and a != b:
                    out.append(f"{VOCAB.canonical(a)} then {VOCAB.canonical(b)}")
        if self.pairs:
            for (first, second), text in self.pair_table.items():
                i, j = EVENT_NAMES.index(first), EVENT_NAMES.index(second)
                t_first = np.flatnonzero(traj.events[:, i])
                t_second = np.flatnonzero(traj.events[:, j])
                if any(((t_second > t0) & (episode[t_second] == episode[t0])).any() for t0 in t_first):
                    out.append(text)
        out = list(dict.fromkeys(out))
        return out[: self.max_instructions] if self.max_instructions else out

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[list[str]]:
        return [self.instructions(t) for t in trajectories]
