"""Compress a trajectory into event segments ("0-4: move; 5: collect wood; 7-8: place table").

The trajectory view of the ``segments`` prompt and the basis of the relabel cache key. A step's label
is the canonical captions of its events (idle and progress events left out), else ``"move"`` or
``"wait"``; equal labels and consecutive idle steps merge into runs ``"a-b: label"``, an episode end
closes a run. Compaction levels 1-3 (:func:`compact_text`) are described in docs/relabeling.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oir_gym.captions import EVENT_NAMES, VOCAB
from oir_gym.trajectory import Trajectory

MOVE = "move"
WAIT = "wait"
_MOVE_EVENT = EVENT_NAMES.index("move")
_NOOP_EVENT = EVENT_NAMES.index("noop")
_IDLE_EVENTS = (_MOVE_EVENT, _NOOP_EVENT) + tuple(VOCAB.progress_events)
_MOVE_ACTIONS = (1, 2, 3, 4)
EPISODE_END = "episode ends"
#: Side-effect events no instruction should ask for: compaction level 1 and above renders them idle.
BACKGROUND_EVENTS: tuple[int, ...] = tuple(
    EVENT_NAMES.index(e) for e in ("hit_hard_block", "search_grass", "take_damage"))
#: Compaction levels of :func:`segments_text` / :func:`compact_text` (0: none).
MAX_LEVEL = 3

#: Craftax-Classic action names by id (the DO action is named after the faced object when known).
ACTION_NAMES: tuple[str, ...] = (
    "noop", "left", "right", "up", "down", "do", "sleep", "place_stone", "place_table",
    "place_furnace", "place_plant", "make_wood_pickaxe", "make_stone_pickaxe",
    "make_iron_pickaxe", "make_wood_sword", "make_stone_sword", "make_iron_sword",
)


@dataclass(frozen=True)
class Segment:
    """A run of consecutive steps with the same label (``start``/``end`` inclusive)."""

    start: int
    end: int
    label: str
    events: tuple[int, ...]  # event ids of the label (empty for move/wait runs)
    episode_end: bool = False
    count: int = 0  # occurrences of the label when compaction merged runs (0: the run's length)

    @property
    def occurrences(self) -> int:
        """How many times the label happened: the merged count, else the run's length."""
        return self.count or self.end - self.start + 1

    @property
    def idle(self) -> bool:
        """True for move/wait runs (nothing but position changes or idling)."""
        return not self.events

    def render(self) -> str:
        span = f"{self.start}" if self.start == self.end else f"{self.start}-{self.end}"
        if self.idle and self.episode_end and self.label == "":
            return f"{span}: {EPISODE_END}"
        label = f"{self.label} (x{self.occurrences})" if not self.idle and self.occurrences > 1 else self.label
        return f"{span}: {label}, {EPISODE_END}" if self.episode_end else f"{span}: {label}"


def step_label(traj: Trajectory, t: int, background: bool = True) -> tuple[str, tuple[int, ...]]:
    """The label of step ``t`` and the (non-idle) event ids it is made of (``background=False``:
    :data:`BACKGROUND_EVENTS` count as idle)."""
    ids = tuple(int(e) for e in np.flatnonzero(traj.events[t])
                if e not in _IDLE_EVENTS and (background or e not in BACKGROUND_EVENTS))
    if ids:
        return ", ".join(VOCAB.canonical(e) for e in ids), ids
    moved = bool(traj.events[t, _MOVE_EVENT]) or (
        not traj.events[t, _NOOP_EVENT] and int(traj.actions[t]) in _MOVE_ACTIONS
    )
    return (MOVE if moved else WAIT), ()


def segments(traj: Trajectory, level: int = 0) -> list[Segment]:
    """Run-length segments of a trajectory (see the module docstring), compacted to ``level``."""
    if not 0 <= int(level) <= MAX_LEVEL:
        raise ValueError(f"compaction level must be in 0..{MAX_LEVEL}, got {level!r}")
    out = _runs(traj, background=level < 1)
    if level >= 2:
        out = _merge_events(out)
    if level >= 3:
        out = _distinct(out)
    return out


def _runs(traj: Trajectory, background: bool) -> list[Segment]:
    out: list[Segment] = []
    cur: list | None = None  # [start, label, ids]

    def close(end: int, episode_end: bool = False) -> None:
        out.append(Segment(cur[0], end, cur[1], cur[2], episode_end))

    for t in range(len(traj)):
        label, ids = step_label(traj, t, background)
        if cur is not None:
            same = (not ids and not cur[2]) or (ids and label == cur[1])
            if not same:
                close(t - 1)
                cur = None
            elif not ids and label == MOVE:
                cur[1] = MOVE  # an idle run that moved at least once is a "move" run
        if cur is None:
            cur = [t, label, ids]
        if bool(traj.dones[t]):
            close(t, episode_end=True)
            cur = None
    if cur is not None:
        close(len(traj) - 1)
    return out


def _merge_events(segs: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segs:
        n = s.occurrences
        if s.idle:
            if s.episode_end:
                out.append(Segment(s.end, s.end, "", (), True))
            continue
        last = out[-1] if out else None
        if last is not None and not last.idle and not last.episode_end and last.label == s.label:
            out[-1] = Segment(last.start, s.end, s.label, s.events, s.episode_end, last.occurrences + n)
        else:
            out.append(Segment(s.start, s.end, s.label, s.events, s.episode_end, n))
    return out


def _distinct(segs: list[Segment]) -> list[Segment]:
    merged: dict[str, Segment] = {}
    for s in (s for s in segs if not s.idle):
        old = merged.get(s.label)
        start, n = (s.start, 0) if old is None else (old.start, old.count)
        merged[s.label] = Segment(start, start, s.label, s.events, False, n + s.occurrences)
    return list(merged.values())


def segments_text(traj: Trajectory, sep: str = "\n", level: int = 0) -> str:
    """Rendered segments, one per line by default, compacted to ``level``."""
    return sep.join(s.render() for s in segments(traj, level))


def compact_text(traj: Trajectory, fits, sep: str = "\n") -> tuple[str, int]:
    """The least compacted segments text for which ``fits(text)`` is true, and its level; when none fits,
    the most leading lines of the last level that fit (at least one) and ``"..."``, level ``MAX_LEVEL + 1``."""
    text = ""
    for level in range(MAX_LEVEL + 1):
        text = segments_text(traj, sep, level)
        if fits(text):
            return text, level
    lines = text.split(sep)
    if len(lines) <= 1:
        return text, MAX_LEVEL + 1
    cut = lambda m: sep.join(lines[:m] + ["..."])  # noqa: E731
    lo, hi = 1, len(lines) - 1  # the answer is the largest m in [lo, hi] that fits, else lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(cut(mid)):
            lo = mid
        else:
            hi = mid - 1
    return cut(lo), MAX_LEVEL + 1


KEY_MODES = ("behaviour", "events", "segments")


def behaviour_key(traj: Trajectory, mode: str = "behaviour") -> str:
    """The relabeler's cache key: ``"segments"`` (segment text, timing included), ``"behaviour"`` (ordered
    non-idle labels with run counts and episode ends), ``"events"`` (no counts, repeats across idle steps
    collapsed); lower-cased, single-spaced, ``""`` when all idle."""
    if mode not in KEY_MODES:
        raise ValueError(f"cache key mode must be one of {KEY_MODES}, got {mode!r}")
    if mode == "segments":
        return " | ".join(" ".join(s.render().lower().split()) for s in segments(traj))
    parts: list[str] = []
    for s in segments(traj):
        if not s.idle:
            n = s.end - s.start + 1
            part = s.label + (f" x{n}" if n > 1 and mode == "behaviour" else "")
            if not (mode == "events" and parts and parts[-1] == part):
                parts.append(part)
        if s.episode_end:
            parts.append(EPISODE_END)
    return " | ".join(" ".join(p.lower().split()) for p in parts)


def is_idle(traj: Trajectory) -> bool:
    """True when nothing but moving/waiting (and episode resets) happened."""
    return all(s.idle for s in segments(traj))
