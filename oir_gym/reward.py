"""The cosine-threshold reward of the paper (Eq. 'rew'), as pure JAX functions.

Captions come from a finite vocabulary of events (:mod:`oir_gym.captions`), so an instruction's
similarity to every event is computed once when it is encoded (:func:`event_similarity`); a step's
similarity is the maximum over the events that happened in it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def event_similarity(instr_emb, phrase_emb, phrase_event, num_events: int):
    """``[..., E]`` float32 max cosine between unit-norm instruction embeddings ``[..., D]`` and the
    phrasings ``[P, D]`` of each event (``phrase_event [P]``); -1 for an event without phrases."""
    xp = jnp if isinstance(instr_emb, jax.Array) else np
    sims = instr_emb @ phrase_emb.T  # [..., P]
    out = xp.full(sims.shape[:-1] + (num_events,), -1.0, dtype=np.float32)
    for e in range(num_events):
        cols = np.flatnonzero(np.asarray(phrase_event) == e)
        if len(cols):
            m = sims[..., cols].max(axis=-1)
            out = out.at[..., e].set(m) if xp is jnp else _np_set(out, e, m)
    return out


def without_events(sims, events):
    """``sims [..., E]`` with the columns ``events`` set to -1 (the cosine reward leaves out the progress
    events, which are paid through event-bound grounding only)."""
    cols = list(events)
    if not cols:
        return sims
    if isinstance(sims, jax.Array):
        return sims.at[..., jnp.asarray(cols)].set(-1.0)
    out = np.array(sims, dtype=np.float32, copy=True)
    out[..., cols] = -1.0
    return out


def _np_set(out, e, m):
    out[..., e] = m
    return out


def step_match(events, instr_event_sim, delta):
    """True where a step's events ``[..., E]`` hold one whose similarity to the instruction is ``> delta``."""
    return jnp.any(jnp.logical_and(events, instr_event_sim > delta), axis=-1)


def step_similarity(events, instr_event_sim):
    """The step's caption similarity: max over the events that happened (-1 if none)."""
    return jnp.max(jnp.where(events, instr_event_sim, -1.0), axis=-1)


@jax.jit
def relabel_rewards(events, instr_event_sim, delta):
    """``(rewards [..., T] float32, terminations [..., T] bool)`` of events ``[..., T, E]`` under an
    instruction: 1 and True at every matching step (:func:`first_per_episode` keeps the first)."""
    match = step_match(events, instr_event_sim[..., None, :], delta)
    return match.astype(jnp.float32), match


def first_per_episode(matches, episode_starts):
    """``(first, after)`` bool ``[T, ...]``: the first of ``matches`` in each original episode (started
    at ``episode_starts``), and the steps after it in that episode (no target: the relabeled episode
    ended at its first success)."""
    matches = jnp.asarray(matches, bool)

    def body(seen, inp):
        m, start = inp
        seen = seen & ~start
        return seen | m, (m & ~seen, seen)

    _, (first, after) = jax.lax.scan(body, jnp.zeros(matches.shape[1:], bool),
                                     (matches, jnp.asarray(episode_starts, bool)))
    return first, after


def match_steps(events, instr_event_sim, delta) -> np.ndarray:
    """``[T]`` bool: the steps of a ``[T, E]`` trajectory where the instruction would be paid
    (:func:`step_match` on the host, numpy)."""
    sim = np.asarray(instr_event_sim)
    return np.any(np.asarray(events, dtype=bool) & (sim[None, :] > delta), axis=-1)


def first_success_step(events, instr_event_sim, delta):
    """Index of the first matching step of a ``[T, E]`` trajectory, or -1 if none (numpy)."""
    idx = np.flatnonzero(match_steps(events, instr_event_sim, delta))
    return int(idx[0]) if len(idx) else -1


def threshold_confusion(instr_event_sim, target_event, deltas) -> dict[str, np.ndarray]:
    """What the cosine reward of instructions ``[N, E]`` with own events ``target_event [N]`` pays for at
    each of ``deltas``: ``recall [D]`` (own event rewarded), ``wrong_per_instruction [D]`` (other events
    rewarded), ``any_wrong [D]`` and ``wrong [D, N, E]``."""
    sim = np.asarray(instr_event_sim, dtype=np.float32)
    tgt = np.asarray(target_event, dtype=np.int64)
    if sim.ndim != 2 or tgt.shape != (sim.shape[0],) or not len(tgt):
        raise ValueError(f"expected sims [N, E] and targets [N] with N >= 1, got {sim.shape} and {tgt.shape}")
    if np.any((tgt < 0) | (tgt >= sim.shape[1])):
        raise ValueError(f"target events must lie in [0, {sim.shape[1]}), got {tgt.tolist()}")
    d = np.asarray(deltas, dtype=np.float32).reshape(-1, 1, 1)
    fires = sim[None] > d  # [D, N, E]
    own = np.zeros(sim.shape, bool)
    own[np.arange(len(tgt)), tgt] = True
    wrong = fires & ~own[None]
    return {"recall": fires[:, own].mean(axis=1), "wrong_per_instruction": wrong.sum(axis=2).mean(axis=1),
            "any_wrong": wrong.any(axis=2).mean(axis=1), "wrong": wrong}
