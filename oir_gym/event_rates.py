"""How often events happen in training, the rates Craftax's baselines log (pure numpy): ``per_1k``,
occurrences per 1,000 env steps, and ``episode_frac``, the share of finished episodes in which the event
happened (:class:`EpisodeEvents` carries running episodes from one rollout to the next, not across a resume).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, PROGRESS_EVENTS

#: The events whose training rates the trainers log: the 22 achievements (Craftax order), then progress events.
RATE_EVENTS: tuple[int, ...] = tuple(EVENT_NAMES.index(a) for a in ACHIEVEMENT_NAMES) + tuple(PROGRESS_EVENTS)
RATE_NAMES: tuple[str, ...] = tuple(EVENT_NAMES[e] for e in RATE_EVENTS)


def per_1k_steps(events: np.ndarray) -> np.ndarray:
    """``[num_events]`` occurrences per 1,000 env steps of ``events`` (``[T, E, num_events]`` bool)."""
    ev = np.asarray(events, dtype=bool)
    if ev.ndim != 3:
        raise ValueError(f"events must be [T, E, num_events], got shape {ev.shape}")
    steps = ev.shape[0] * ev.shape[1]
    return ev.sum(axis=(0, 1)) * (1000.0 / max(steps, 1))


class EpisodeEvents:
    """Per env, which events its running episode has had; per rollout, the finished episodes' shares."""

    def __init__(self, num_envs: int, num_events: int) -> None:
        self.seen = np.zeros((int(num_envs), int(num_events)), dtype=bool)

    def update(self, events: np.ndarray, dones: np.ndarray) -> tuple[np.ndarray, int]:
        """Add one rollout (``[T, E, num_events]`` events, ``[T, E]`` dones; a step's events belong
        to the episode it ends) and return ``(count, episodes)``: for each event, in how many of the
        ``episodes`` that finished in this rollout it happened."""
        ev = np.asarray(events, dtype=bool)
        dn = np.asarray(dones, dtype=bool)
        if ev.shape[1:] != self.seen.shape or dn.shape != ev.shape[:2]:
            raise ValueError(f"events {ev.shape} and dones {dn.shape} do not match {self.seen.shape[0]} envs "
                             f"x {self.seen.shape[1]} events")
        count = np.zeros(self.seen.shape[1], dtype=np.int64)
        episodes = 0
        for t in range(ev.shape[0]):
            self.seen |= ev[t]
            ended = dn[t]
            if ended.any():
                count += self.seen[ended].sum(axis=0)
                episodes += int(ended.sum())
                self.seen[ended] = False
        return count, episodes


def rate_metrics(names: Sequence[str], per_1k: np.ndarray, count: np.ndarray, episodes: int,
                 prefix: str = "") -> dict[str, float]:
    """Metric keys ``{prefix}rate/{name}`` (per 1,000 steps) and ``{prefix}episode_rate/{name}`` (share
    of finished episodes; left out when none finished) for each event name."""
    out: dict[str, float] = {}
    for i, name in enumerate(names):
        # rounded: hundreds of these keys per row fill metrics.jsonl otherwise
        out[f"{prefix}rate/{name}"] = round(float(per_1k[i]), 3)
        if episodes:
            out[f"{prefix}episode_rate/{name}"] = round(float(count[i] / episodes), 4)
    return out


class RateWindow:
    """Training rates of :data:`RATE_EVENTS` of ``num_envs`` envs over the steps added since the last reset."""

    def __init__(self, num_envs: int) -> None:
        self.episodes = EpisodeEvents(num_envs, len(RATE_EVENTS))
        self.reset()

    def reset(self) -> None:
        """Start a new window (the envs' running episodes carry on)."""
        self.occurrences = np.zeros(len(RATE_EVENTS), np.int64)
        self.steps = 0
        self.count = np.zeros(len(RATE_EVENTS), np.int64)
        self.finished = 0

    def add(self, events: np.ndarray, dones: np.ndarray) -> None:
        """Steps of every env: ``[..., num_envs, num_events]`` events (every event id; leading axes are
        time, none for one step) and ``[..., num_envs]`` dones."""
        ev = np.asarray(events, dtype=bool)[..., list(RATE_EVENTS)]
        ev = ev.reshape((-1,) + ev.shape[-2:])
        dn = np.asarray(dones, dtype=bool).reshape(ev.shape[:2])
        self.occurrences += ev.sum(axis=(0, 1))
        self.steps += ev.shape[0] * ev.shape[1]
        c, n = self.episodes.update(ev, dn)
        self.count += c
        self.finished += n

    def metrics(self, reset: bool = False, prefix: str = "") -> dict[str, float]:
        """:func:`pooled_metrics` of this window alone."""
        out = pooled_metrics([self], prefix)
        if reset:
            self.reset()
        return out


def pooled_metrics(windows: Sequence[RateWindow], prefix: str = "") -> dict[str, float]:
    """:func:`rate_metrics` over the steps and finished episodes of ``windows`` together (empty before
    any step): occurrences per 1,000 of all their env steps, shares of all their finished episodes."""
    steps = sum(w.steps for w in windows)
    if not steps:
        return {}
    occurrences = sum(w.occurrences for w in windows)
    return rate_metrics(RATE_NAMES, occurrences * (1000.0 / steps), sum(w.count for w in windows),
                        sum(w.finished for w in windows), prefix)
