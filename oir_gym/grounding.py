"""Grounding: at which steps of a trajectory an instruction is paid, in two modes.

Every instruction owns two rows of the instruction table, both ``[E]`` (one value per caption
event):

* ``final``: the step pays where an event with ``final[e] > delta`` happens;
* ``pre``: if any ``pre[e] > delta``, such an event must have happened at an *earlier* step of the
  same episode first (an ordered pair: "collect wood then place table" pays at the table placed
  after the wood). All ``-1``: no precondition.

Modes (``GROUNDING_MODES``):

``"cosine"`` (the paper's rule)
    ``final`` holds the instruction's cosine similarity to each event's caption phrasings
    (:func:`oir_gym.reward.event_similarity`), ``pre`` is empty. An instruction is paid wherever a
    caption matches it above ``delta``; free wording only pays when it is close to a caption.

``"bound"`` (event-bound, an extension)
    A relabeled instruction is bound to the event(s) that happened where it was accomplished on
    the trajectory it was proposed for (:func:`bind`, :func:`bind_ordered`), found by a looser
    semantic match (the best event that happened, above ``bind_threshold``) or given exactly (rule
    instructions). Its rows become indicators (:data:`BOUND` at the bound event, ``-1``
    elsewhere), so the same on-device gather-and-compare pays it exactly at its event, whatever its
    wording. Compounds bind to an ordered pair (``pre``, ``final``).

The rule itself has one definition per side: :func:`ordered_step` (one step, JAX: the env and the
scan of :func:`paid_steps_jax` use it) and its numpy twin :func:`paid_steps` (host: the relabeler
and the SB3 callback); tests check that the two agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

GROUNDING_MODES = ("cosine", "bound")

#: The value of a bound event in a table row: above every threshold delta in (-1, 1], so a bound
#: instruction pays at its event under any delta (cosines never exceed 1).
BOUND = 2.0

#: Separators read as "first A, then B" in a relabeled instruction (checked in this order).
ORDERED_SEPARATORS = (", and then ", " and then ", ", then ", " then ", "; then ")


@dataclass(frozen=True)
class Binding:
    """The event(s) an instruction was accomplished with on its source trajectory.

    Attributes:
        final: event id whose occurrence completes the instruction.
        pre: event id that must happen earlier in the same episode, or -1 (none).
        step: step of the source trajectory where ``final`` happened (after ``pre``, if any).
    """

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
    """One step of the grounding rule (JAX; any leading batch shape).

    Args:
        events: ``[..., E]`` bool, the events of this step.
        final_row, pre_row: ``[..., E]`` the instruction's rows.
        pre_seen: ``[...]`` bool, the precondition event already happened earlier in this episode.
        delta: threshold (strict ``>``).

    Returns:
        ``(match, pre_seen_after)``: whether this step pays, and the flag for the next step (the
        precondition seen at this step counts only from the next step on).
    """
    hit_final = jnp.any(events & (final_row > delta), axis=-1)
    pre_hit = events & (pre_row > delta)
    has_pre = jnp.any(pre_row > delta, axis=-1)
    match = hit_final & (~has_pre | pre_seen)
    return match, pre_seen | jnp.any(pre_hit, axis=-1)


def paid_steps_jax(events, final_row, pre_row, episode_starts, delta):
    """The steps where the instruction is paid along a trajectory (JAX, time first).

    Args:
        events: ``[T, ..., E]`` bool.
        final_row, pre_row: ``[..., E]``.
        episode_starts: ``[T, ...]`` bool, the first step of each episode (the precondition resets).
        delta: threshold.

    Returns:
        ``[T, ...]`` bool.
    """
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
    """Bind an instruction to the event of a trajectory it names, or ``None``.

    Among the events that happened on the trajectory (within ``window = (start, stop)`` steps when
    the LLM named a segment), the one the instruction is most similar to, if that similarity is at
    least ``threshold``; the binding's step is that event's first occurrence there.

    Args:
        sim: ``[E]`` the instruction's cosine similarity to each event's phrasings.
        events: ``[T, E]`` bool.
        threshold: the loosest similarity accepted (well below the reward's delta: the binding,
            not the wording, decides where the instruction pays).
        window: optional ``(start, stop)`` step range to look in.
    """
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
    """Bind "A then B" to an event pair that happened in this order in one episode, or ``None``.

    Among ordered pairs ``(a at t1, b at t2 > t1, same episode)`` with both similarities at least
    ``threshold``, the pair with the highest summed similarity; its step is the first such ``t2``.
    """
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
