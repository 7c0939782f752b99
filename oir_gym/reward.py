"""The cosine-threshold reward of the paper (Eq. 'rew'), as pure JAX functions.

A transition is described by the set of events that happened in it (see
:mod:`oir_gym.captions`); its caption embedding is compared with the instruction embedding.
Because every caption comes from a finite vocabulary, the similarity between an instruction and
every event is computed once, when the instruction is encoded (:func:`event_similarity`); the
per-step reward is then a gather and a comparison, never a sentence-encoder call.

When several events happen in one step, the step's similarity is the maximum over them (the
caption that best matches the instruction), which equals the paper's single-caption reward
whenever one event happens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def event_similarity(instr_emb, phrase_emb, phrase_event, num_events: int):
    """Max cosine between each instruction and each event's phrasings.

    Args:
        instr_emb: ``[..., D]`` unit-norm instruction embeddings.
        phrase_emb: ``[P, D]`` unit-norm phrase embeddings.
        phrase_event: ``[P]`` int event id of each phrase.
        num_events: number of events ``E``.

    Returns:
        ``[..., E]`` float32 similarities (``-1`` for an event without phrases).
    """
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
    """``sims`` (``[..., E]`` event similarities) with the columns ``events`` set to ``-1``.

    The cosine reward reads it with the progress events (``VOCAB.progress_events``) left out: they
    are labels only, paid through event-bound grounding, so no instruction's cosine reward changes
    with them at any delta. Binding an answer to an event still reads every event.
    """
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
    """True where a step's events contain one whose similarity to the instruction exceeds delta.

    Args:
        events: ``[..., E]`` bool, which events happened at this step.
        instr_event_sim: ``[..., E]`` similarity of the instruction to each event.
        delta: threshold; the comparison is strict (``> delta``), as in the paper.
    """
    return jnp.any(jnp.logical_and(events, instr_event_sim > delta), axis=-1)


def step_similarity(events, instr_event_sim):
    """The step's caption similarity: max over the events that happened (-1 if none)."""
    return jnp.max(jnp.where(events, instr_event_sim, -1.0), axis=-1)


@jax.jit
def relabel_rewards(events, instr_event_sim, delta):
    """Rewards and terminations of a trajectory segment under a (new) instruction.

    Reward 1 at every step where the instruction matches: ``rewards == terminations == match``.
    The paper pays the first match and ends the episode there; :func:`first_per_episode` keeps
    the first match of each original episode and marks the steps after it (the OIR batch does so).

    Args:
        events: ``[..., T, E]`` bool events of each transition.
        instr_event_sim: ``[..., E]`` similarity of the instruction to each event.
        delta: reward threshold (strict ``>``).

    Returns:
        ``(rewards [..., T] float32, terminations [..., T] bool)``.
    """
    match = step_match(events, instr_event_sim[..., None, :], delta)
    return match.astype(jnp.float32), match


def first_per_episode(matches, episode_starts):
    """The first match of each episode, and the steps after it in that episode (JAX, time first).

    A relabeled copy spans a rollout segment that may hold several original episodes. Under the
    paper's reward the relabeled instruction pays the first time it matches, and its episode ends
    there, so within one original episode only the first match is a success; the steps after it
    belong to no episode of the relabeled instruction (they continue the original world, next to
    the water that was just drunk) and carry no target.

    Args:
        matches: ``[T, ...]`` bool, the steps where the instruction matches (``relabel_rewards``).
        episode_starts: ``[T, ...]`` bool, the first step of each original episode (``reset``).

    Returns:
        ``(first [T, ...], after [T, ...])`` bool: the first match per episode, and the steps that
        follow one in the same episode.
    """
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
    """What the cosine reward would pay for, per threshold, before any training (numpy).

    For each instruction, the reward fires on every event whose similarity exceeds delta. This
    compares that set with the instruction's own (ground-truth) event: a low delta also pays for
    related or partial events ("attack zombie" for "defeat zombie"), a high one may miss
    paraphrased instructions altogether.

    Args:
        instr_event_sim: ``[N, E]`` similarity of each instruction to each event.
        target_event: ``[N]`` event id that each instruction asks for.
        deltas: thresholds to compare (strict ``>``, as the reward).

    Returns:
        ``recall [D]``: fraction of instructions whose own event is rewarded;
        ``wrong_per_instruction [D]``: mean number of other events rewarded;
        ``any_wrong [D]``: fraction of instructions with at least one other event rewarded;
        ``wrong [D, N, E]``: which other events each instruction rewards.
    """
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
    return {
        "recall": fires[:, own].mean(axis=1),  # own has one True per row: [D, N]
        "wrong_per_instruction": wrong.sum(axis=2).mean(axis=1),
        "any_wrong": wrong.any(axis=2).mean(axis=1),
        "wrong": wrong,
    }
