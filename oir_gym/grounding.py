"""Grounding: at which steps of a trajectory an instruction is paid (docs/relabeling.md).

Every instruction owns two ``[E]`` rows of the instruction table: a step pays where an event with
``final[e] > delta`` happens, after (earlier in the same episode) an event with ``pre[e] > delta`` if
any (all ``-1``: no precondition). Under ``"cosine"`` grounding ``final`` holds cosines to the captions;
under ``"bound"`` both rows are indicators (:data:`BOUND` at the bound event). :func:`ordered_step`
(JAX) and :func:`paid_steps` (numpy) are the rule's two twins; tests check that they agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

GROUNDING_MODES = ("cosine", "bound")

#: A bound event's value in a table row: above every delta in (-1, 1], so it pays under any delta.
BOUND = 2.0

#: Separators read as "first A, then B" in a relabeled instruction (checked in this order).
ORDERED_SEPARATORS = (", and then ", " and then ", ", then ", " then ", "; then ")


@dataclass(frozen=True)
class Binding:
    """The event(s) an instruction was accomplished with on its source trajectory: ``final`` completes it,
    ``pre`` must happen earlier in the same episode (-1: none), ``step`` is where ``final`` happened."""

    final: int
    pre: int = -1
    step: int = -1

    def rows(self, num_events: int) -> tuple[np.ndarray, np.ndarray]:
        """``(final_row, pre_row)`` indicator rows of this binding."""
        return indicator_row(self.final, num_events), indicator_row(self.pre, num_events)

    def to_list(self) -> list[int]:
        return [int(self.final), int(self.pre), int(self.step)]

    @classmethod
    def from_list(cls, v: Sequence[int]) -> "Binding":
        if len(v) != 3:
            raise ValueError(f"a binding is [final, pre, step], got {list(v)!r}")
        return cls(int(v[0]), int(v[1]), int(v[2]))


def indicator_row(event: int, num_events: int) -> np.ndarray:
    """``[E]`` row with :data:`BOUND` at ``event`` and ``-1`` elsewhere (all ``-1`` if ``event < 0``)."""
    row = np.full((num_events,), -1.0, np.float32)
    if event >= num_events:
        raise ValueError(f"event id {event} outside [0, {num_events})")
    if event >= 0:
        row[event] = BOUND
    return row


def no_precondition(num_events: int, batch: tuple[int, ...] = ()) -> np.ndarray:
    """``pre`` rows meaning "no earlier event needed"."""
    return np.full(batch + (num_events,), -1.0, np.float32)


# ------------------------------------------------------------------------------------ the rule
def ordered_step(events, final_row, pre_row, pre_seen, delta):
    """One step of the rule (JAX, any batch shape): ``events``, the rows ``[..., E]``, ``pre_seen`` ``[...]``
    (the precondition happened earlier in this episode), strict threshold ``delta``. Returns ``(match,
    pre_seen_after)``; a precondition seen at this step counts from the next step on."""
    hit_final = jnp.any(events & (final_row > delta), axis=-1)
    pre_hit = events & (pre_row > delta)
    has_pre = jnp.any(pre_row > delta, axis=-1)
    match = hit_final & (~has_pre | pre_seen)
    return match, pre_seen | jnp.any(pre_hit, axis=-1)


def paid_steps_jax(events, final_row, pre_row, episode_starts, delta):
    """``[T, ...]`` bool, the paid steps (JAX, time first): ``events`` ``[T, ..., E]``, rows ``[..., E]``,
    ``episode_starts`` ``[T, ...]`` (where the precondition resets)."""
    events = jnp.asarray(events, bool)
    starts = jnp.asarray(episode_starts, bool)

    def body(seen, inp):
        ev, start = inp
        m, seen = ordered_step(ev, final_row, pre_row, seen & ~start, delta)
        return seen, m

    _, match = jax.lax.scan(body, jnp.zeros(starts.shape[1:], bool), (events, starts))
    return match


def paid_steps(events, final_row, pre_row, episode_starts, delta) -> np.ndarray:
    """Numpy twin of :func:`paid_steps_jax` for one ``[T, E]`` trajectory: ``[T]`` bool."""
    ev = np.asarray(events, dtype=bool)
    final = np.asarray(final_row) > delta
    pre = np.asarray(pre_row) > delta
    hit_final = np.any(ev & final[None], axis=-1)
    if not pre.any():
        return hit_final
    pre_hit = np.any(ev & pre[None], axis=-1)
    starts = np.asarray(episode_starts, dtype=bool)
    out = np.zeros(len(ev), bool)
    seen = False
    for t in range(len(ev)):
        seen = seen and not starts[t]
        out[t] = hit_final[t] and seen
        seen = seen or pre_hit[t]
    return out


def first_paid_step(events, final_row, pre_row, episode_starts, delta) -> int:
    """Index of the first paid step of a ``[T, E]`` trajectory, or -1 (numpy)."""
    idx = np.flatnonzero(paid_steps(events, final_row, pre_row, episode_starts, delta))
    return int(idx[0]) if len(idx) else -1


# ------------------------------------------------------------------------------------ binding
def episode_starts_from_dones(dones) -> np.ndarray:
    """``[T]`` bool: the first step of each episode of a segment whose step ``t`` ended if ``dones[t]``."""
    d = np.asarray(dones, dtype=bool)
    return np.concatenate([[True], d[:-1]]) if len(d) else np.zeros(0, bool)


def bind(sim, events, *, threshold: float, window: Optional[tuple[int, int]] = None) -> Optional[Binding]:
    """The binding to the event of ``events`` ``[T, E]`` (within steps ``window = (start, stop)``) that the
    instruction's ``sim`` ``[E]`` is highest for, if at least ``threshold``, at its first step; else ``None``."""
    ev = np.asarray(events, dtype=bool)
    lo, hi = (0, len(ev)) if window is None else (max(0, window[0]), min(len(ev), window[1]))
    if hi <= lo:
        return None
    happened = ev[lo:hi].any(axis=0)
    s = np.where(happened, np.asarray(sim, np.float32), -np.inf)
    e = int(np.argmax(s))
    if not np.isfinite(s[e]) or s[e] < threshold:
        return None
    return Binding(final=e, step=lo + int(np.flatnonzero(ev[lo:hi, e])[0]))


def bind_ordered(sim_first, sim_then, events, episode_starts, *, threshold: float) -> Optional[Binding]:
    """Bind "A then B" to the pair ``(a at t1, b at t2 > t1, same episode)``, both similarities at least
    ``threshold``, with the highest sum (step: the first such ``t2``), or ``None``."""
    ev = np.asarray(events, dtype=bool)
    if not len(ev):
        return None
    episode = np.cumsum(np.asarray(episode_starts, dtype=bool)) - 1
    sa, sb = np.asarray(sim_first, np.float32), np.asarray(sim_then, np.float32)
    best: Optional[tuple[float, int, int, int]] = None
    for a in np.flatnonzero((sa >= threshold) & ev.any(axis=0)):
        for b in np.flatnonzero((sb >= threshold) & ev.any(axis=0)):
            if a == b:
                continue
            ta = np.flatnonzero(ev[:, a])
            tb = np.flatnonzero(ev[:, b])
            ok = [t2 for t2 in tb if np.any((ta < t2) & (episode[ta] == episode[t2]))]
            if ok:
                score = float(sa[a] + sb[b])
                if best is None or score > best[0] or (score == best[0] and ok[0] < best[3]):
                    best = (score, int(a), int(b), int(ok[0]))
    if best is None:
        return None
    return Binding(final=best[2], pre=best[1], step=best[3])


def split_ordered(text: str) -> Optional[tuple[str, str]]:
    """``("A", "B")`` for an instruction worded "A then B" (see :data:`ORDERED_SEPARATORS`), else ``None``."""
    low = text.lower()
    for sep in ORDERED_SEPARATORS:
        i = low.find(sep)
        if i > 0:
            a, b = text[:i].strip(" ,;"), text[i + len(sep):].strip(" ,;")
            a = re.sub(r"^(first|firstly)\s*,?\s+", "", a, flags=re.IGNORECASE)
            if a and b:
                return a, b
    return None


def verify(binding: Binding, events, episode_starts, delta: float = 0.9) -> bool:
    """Whether a binding holds on a trajectory: its final event happens at ``binding.step`` and
    the rule pays there (after its ``pre`` event in the same episode, if any)."""
    ev = np.asarray(events, dtype=bool)
    if not (0 <= binding.step < len(ev)) or not ev[binding.step, binding.final]:
        return False
    final, pre = binding.rows(ev.shape[1])
    return bool(paid_steps(ev, final, pre, episode_starts, delta)[binding.step])
