"""The caption vocabulary: Craftax-Classic transition events and their phrasings.

All phrasings live in ``oir_gym/data/captions.json``; event ids are positions in that file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

NUM_ACHIEVEMENTS = 22


@dataclass(frozen=True)
class CaptionVocabulary:
    """Events (``event_names``, ``achievement_of_event``: Craftax index or -1) and every phrasing,
    flattened (``phrases``; ``phrase_event[j]`` is the event of ``phrases[j]``); ``progress_events``
    are labels only, never evaluated."""

    event_names: tuple[str, ...]
    achievement_of_event: tuple[int, ...]
    phrases: tuple[str, ...]
    phrase_event: np.ndarray
    progress_events: tuple[int, ...] = ()

    @property
    def num_events(self) -> int:
        return len(self.event_names)

    def canonical(self, event: int | str) -> str:
        """The first (canonical) phrasing of an event, e.g. ``"collect wood"``."""
        idx = self.event_id(event) if isinstance(event, str) else int(event)
        return self.phrases[int(np.flatnonzero(self.phrase_event == idx)[0])]

    def event_id(self, name: str) -> int:
        try:
            return self.event_names.index(name)
        except ValueError:
            raise KeyError(f"unknown event {name!r}; known events: {', '.join(self.event_names)}") from None

    def phrases_of(self, event: int | str) -> list[str]:
        idx = self.event_id(event) if isinstance(event, str) else int(event)
        return [p for p, e in zip(self.phrases, self.phrase_event) if e == idx]


@lru_cache(maxsize=1)
def load_vocabulary() -> CaptionVocabulary:
    """Load the packaged caption vocabulary (cached)."""
    raw = json.loads(resources.files("oir_gym.data").joinpath("captions.json").read_text())
    names, achs, phrases, owner, progress = [], [], [], [], []
    for i, ev in enumerate(raw["events"]):
        names.append(ev["name"])
        if ev.get("progress", False):
            progress.append(i)
        achs.append(-1 if ev["achievement"] is None else int(ev["achievement"]))
        phrases += ev["phrases"]
        owner += [i] * len(ev["phrases"])
    return CaptionVocabulary(tuple(names), tuple(achs), tuple(phrases), np.asarray(owner, dtype=np.int32),
                             tuple(progress))


VOCAB = load_vocabulary()
EVENT_NAMES: tuple[str, ...] = VOCAB.event_names
NUM_EVENTS: int = VOCAB.num_events
#: Ids of the progress events (labels only: never evaluated, never among the 22 achievements).
PROGRESS_EVENTS: tuple[int, ...] = VOCAB.progress_events
#: Achievement names in Craftax order (achievement index -> event name).
ACHIEVEMENT_NAMES: tuple[str, ...] = tuple(
    VOCAB.event_names[VOCAB.achievement_of_event.index(a)] for a in range(NUM_ACHIEVEMENTS)
)
