"""The trajectory record handed from the environment to relabelers (host side, numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from oir_gym.captions import EVENT_NAMES, VOCAB


@dataclass
class Trajectory:
    """One environment's trajectory segment.

    Attributes:
        instruction: the instruction the agent was following when the segment started.
        events: ``[T, E]`` bool, event ``e`` (:data:`oir_gym.captions.EVENT_NAMES`) happened in transition ``t``.
        actions: ``[T]`` int Craftax actions.
        dones: ``[T]`` bool, True where the original episode ended at step ``t``.
        texts, action_texts: optional per-step textual observations (before step ``t``) and action texts.
        env_id: index of the environment that produced it.
    """

    instruction: str
    events: np.ndarray
    actions: np.ndarray
    dones: Optional[np.ndarray] = None
    texts: Optional[list[str]] = None
    action_texts: Optional[list[str]] = None
    env_id: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.events = np.asarray(self.events, dtype=bool)
        self.actions = np.asarray(self.actions, dtype=np.int32)
        if self.events.ndim != 2 or self.events.shape[1] != len(EVENT_NAMES):
            raise ValueError(f"events must be [T, {len(EVENT_NAMES)}] bool, got shape {self.events.shape}")
        if self.actions.shape != (self.events.shape[0],):
            raise ValueError(f"actions must be [T={self.events.shape[0]}], got shape {self.actions.shape}")
        if self.dones is None:
            self.dones = np.zeros(len(self.actions), dtype=bool)
        self.dones = np.asarray(self.dones, dtype=bool)

    def __len__(self) -> int:
        return int(self.events.shape[0])

    def event_names_at(self, t: int) -> list[str]:
        """Names of the events that happened at step ``t``."""
        return [EVENT_NAMES[e] for e in np.flatnonzero(self.events[t])]

    def captions_at(self, t: int) -> list[str]:
        """Canonical captions of the events at step ``t``."""
        return [VOCAB.canonical(int(e)) for e in np.flatnonzero(self.events[t])]

    @classmethod
    def from_event_names(cls, instruction: str, steps: list[list[str]], **kw) -> "Trajectory":
        """Build a trajectory from per-step lists of event names (handy in tests and docs)."""
        ev = np.zeros((len(steps), len(EVENT_NAMES)), dtype=bool)
        for t, names in enumerate(steps):
            ev[t, [VOCAB.event_id(n) for n in names]] = True
        actions = kw.pop("actions", np.zeros(len(steps), dtype=np.int32))
        return cls(instruction=instruction, events=ev, actions=actions, **kw)
