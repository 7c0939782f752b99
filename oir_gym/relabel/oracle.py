"""Oracle relabelers: rule labels read off a trajectory's true events, in the variants of :data:`ORACLES`.

Each label names only events that happened and carries the event(s) it is bound to (``grounding="bound"`` pays
it at its event); each variant is a pure function of the events and a seed (docs/relabeling.md, "Oracle relabelers").
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, VOCAB
from oir_gym.prerequisites import related_achievements
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.trajectory import Trajectory
from oir_gym.validation import check_int, check_real, check_str, read_json_file

#: The oracle variants, in the order of the ladder.
ORACLES: tuple[str, ...] = ("canonical", "diverse", "tasks", "compound", "noisy", "mixed", "progress")

#: Variants that read the wording pool; the cosine reward cannot pay its wordings, so they need event-bound grounding.
USES_POOL: tuple[str, ...] = ("diverse", "noisy", "mixed")

#: ``mixed``: the probability that an achievement label takes a pool wording.
MIXED_POOL_SHARE = 0.5

#: Fewest wordings per achievement event a pool must give.
MIN_WORDINGS = 15

#: A pool wording must stay below this cosine similarity to every evaluation string.
MAX_EVAL_COSINE = 0.85

#: The packaged wording pool.
PACKAGED_POOL = "oracle_pool.json"

_IS_ACHIEVEMENT = tuple(VOCAB.achievement_of_event[e] >= 0 for e in range(len(EVENT_NAMES)))
#: The achievement event ids, ascending.
ACHIEVEMENT_EVENTS = tuple(e for e in range(len(EVENT_NAMES)) if _IS_ACHIEVEMENT[e])

#: Ordered event pairs with a natural combined instruction; each wording pays on its second event only (tested).
RULE_PAIRS: dict[tuple[str, str], str] = {
    ("fall_asleep", "wake_up"): "sleep and wake up",
    ("attack_cow", "eat_cow"): "kill and eat a cow",
    ("attack_zombie", "defeat_zombie"): "fight and defeat a zombie",
    ("attack_skeleton", "defeat_skeleton"): "fight and defeat a skeleton",
}

# separate random streams per draw, so that one variant's draws never shift another's
_STREAM_DIVERSE, _STREAM_NOISE, _STREAM_COMPOUND, _STREAM_MIXED = 1, 2, 3, 4


@dataclass(frozen=True)
class Label:
    """One oracle label: its text, the event completing it (``final``), an earlier one it needs (``pre``, or -1)."""

    text: str
    final: int
    pre: int = -1

    def __post_init__(self) -> None:
        check_str("text", self.text)
        check_int("final", self.final, minimum=0, maximum=len(EVENT_NAMES) - 1)
        check_int("pre", self.pre, minimum=-1, maximum=len(EVENT_NAMES) - 1)


@dataclass(frozen=True)
class WordingPool:
    """Wordings per achievement event (event id -> wordings) and where they came from."""

    wordings: Mapping[int, tuple[str, ...]]
    source: str

    def owner(self) -> dict[str, int]:
        return {w: e for e, ws in self.wordings.items() for w in ws}

    def texts(self) -> list[str]:
        return [w for ws in self.wordings.values() for w in ws]


def expand_grammar(spec: Mapping[str, Any]) -> list[str]:
    """One event's pool wordings: each ``verb object modifier`` of its grammar, then its ``wordings``."""
    out: list[str] = []
    if any(k in spec for k in ("verbs", "objects", "modifiers")):
        parts = [spec.get(k, [""]) or [""] for k in ("verbs", "objects", "modifiers")]
        for combo in itertools.product(*parts):
            out.append(" ".join(" ".join(p.split()) for p in combo if p.strip()))
    out += [" ".join(w.split()) for w in spec.get("wordings", [])]
    return list(dict.fromkeys(w for w in out if w))


def load_pool(path: Optional[str | os.PathLike] = None) -> WordingPool:
    """Read and check a wording pool file (default: the packaged ``oracle_pool.json``, whose schema it follows);
    raises ``ValueError`` naming the file and the event or wording for anything that breaks it."""
    if path is None:
        return _packaged_pool()
    return _parse_pool(read_json_file(path, "wording pool", f"oir_gym/data/{PACKAGED_POOL}"), str(path))


@lru_cache(maxsize=1)
def _packaged_pool() -> WordingPool:
    text = resources.files("oir_gym.data").joinpath(PACKAGED_POOL).read_text()
    return _parse_pool(json.loads(text), f"oir_gym/data/{PACKAGED_POOL}")


def _parse_pool(raw: Any, source: str) -> WordingPool:
    events = raw.get("events") if isinstance(raw, dict) else None
    if not isinstance(events, dict):
        raise ValueError(f"{source}: expected {{\"events\": {{event name: {{\"verbs\", \"objects\", \"modifiers\", "
                         "\"wordings\"}}}}}}")
    wordings: dict[int, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for name, spec in events.items():
        if name not in EVENT_NAMES:
            raise ValueError(f"{source}: unknown event {name!r}; the pool names achievement events: "
                             f"{', '.join(ACHIEVEMENT_NAMES)}")
        if not _IS_ACHIEVEMENT[EVENT_NAMES.index(name)]:
            raise ValueError(f"{source}: event {name!r} is not one of the 22 achievements; the pool names "
                             f"achievement events only: {', '.join(ACHIEVEMENT_NAMES)}")
        if not isinstance(spec, dict) or not all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                                 for k, v in spec.items() if not k.startswith("_")):
            raise ValueError(f"{source}: event {name!r}: expected an object of string lists (verbs, objects, "
                             "modifiers, wordings)")
        ws = expand_grammar(spec)
        if len(ws) < MIN_WORDINGS:
            raise ValueError(f"{source}: event {name!r} has {len(ws)} wordings; at least {MIN_WORDINGS} needed")
        for w in ws:
            if " then " in f" {w.lower()} ":
                raise ValueError(f"{source}: event {name!r}: wording {w!r} contains 'then' (reserved for ordered "
                                 "compounds \"A then B\")")
            if w in owner:
                raise ValueError(f"{source}: wording {w!r} is given for both {owner[w]!r} and {name!r}")
            owner[w] = name
        kept, why = CandidateFilter().filter(ws)
        if len(kept) < len(ws):
            dropped = next(w for w in ws if w not in kept)
            raise ValueError(f"{source}: event {name!r}: the relabeler's filter drops the wording {dropped!r} "
                             f"({', '.join(why)}); reword it")
        wordings[EVENT_NAMES.index(name)] = tuple(ws)
    missing = [a for a in ACHIEVEMENT_NAMES if EVENT_NAMES.index(a) not in wordings]
    if missing:
        raise ValueError(f"{source}: no wordings for the achievement event(s) {', '.join(missing)}")
    return WordingPool(wordings, source)


def evaluation_texts(files: Iterable[str | os.PathLike] = ()) -> list[str]:
    """Every evaluation string a pool must keep away from (packaged sets, the example file, ``files``)."""
    from oir_gym.instructions import load_instruction_file, load_instruction_sets

    texts = [i.text for items in load_instruction_sets().values() for i in items]
    example = resources.files("oir_gym.data").joinpath("example_instruction_sets.json")
    with resources.as_file(example) as path:
        for f in (path, *files):
            texts += [i.text for items in load_instruction_file(f).values() for i in items]
    return list(dict.fromkeys(texts))


def check_pool(pool: WordingPool, eval_texts: Sequence[str], encoder: Any = None,
               max_cosine: float = MAX_EVAL_COSINE) -> None:
    """Raise ``ValueError`` for a pool wording that is an evaluation string, or (with ``encoder``) at
    least ``max_cosine`` similar to one: the evaluation must stay held out.
    """
    def norm(t: str) -> str:
        return " ".join(t.lower().strip(" .!?").split())

    owner = pool.owner()
    evals = {norm(t): t for t in eval_texts}
    for w in owner:
        if norm(w) in evals:
            raise ValueError(f"{pool.source}: wording {w!r} ({EVENT_NAMES[owner[w]]}) is the evaluation string "
                             f"{evals[norm(w)]!r}; remove or reword it (a relabeler must not train on evaluation strings)")
    if encoder is None or not eval_texts:
        return
    words = list(owner)
    sim = np.asarray(encoder.encode(words), np.float32) @ np.asarray(encoder.encode(list(eval_texts)), np.float32).T
    i, j = np.unravel_index(int(np.argmax(sim)), sim.shape)
    if sim[i, j] >= max_cosine:
        raise ValueError(f"{pool.source}: wording {words[i]!r} ({EVENT_NAMES[owner[words[i]]]}) has cosine "
                         f"{sim[i, j]:.3f} to the evaluation string {list(eval_texts)[j]!r}, at or above "
                         f"{max_cosine}; reword it so the evaluation stays held out")


@dataclass(frozen=True)
class NoiseProfile:
    """The ``noisy`` oracle's error rates, applied per label in order: ``drop`` it, else ``echo`` a prompt
    few-shot answer (``echo_examples``), else a ``wrong`` event's pool wording bound to its own event.
    """

    drop: float
    echo: float
    wrong: float
    echo_examples: Mapping[int, str]
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        for k in ("drop", "echo", "wrong"):
            check_real(k, getattr(self, k), low=0, high=1)
        if self.echo + self.wrong > 1:
            raise ValueError(f"echo + wrong = {self.echo + self.wrong:g} must be <= 1 (they are exclusive outcomes)")


@dataclass(frozen=True)
class OracleSettings:
    """``oir_gym/data/oracle.json``: the ``tasks`` events and the ``noisy`` profile."""

    task_events: tuple[int, ...]
    noise: NoiseProfile


@lru_cache(maxsize=1)
def load_settings() -> OracleSettings:
    """The packaged oracle settings (``oir_gym/data/oracle.json``), checked."""
    src = "oir_gym/data/oracle.json"
    raw = json.loads(resources.files("oir_gym.data").joinpath("oracle.json").read_text())
    tasks = []
    for name in raw["task_events"]:
        if name not in EVENT_NAMES or _IS_ACHIEVEMENT[EVENT_NAMES.index(name)]:
            raise ValueError(f"{src}: task event {name!r} is not a non-achievement event of the vocabulary")
        if not CandidateFilter().filter([VOCAB.canonical(name)])[0]:
            raise ValueError(f"{src}: task event {name!r}: the relabeler's filter drops its caption "
                             f"{VOCAB.canonical(name)!r}")
        tasks.append(EVENT_NAMES.index(name))
    n = raw["noise"]
    rates = {k: float(n[k]) for k in ("drop", "echo", "wrong")}
    if not all(0 <= v <= 1 for v in rates.values()) or rates["echo"] + rates["wrong"] > 1:
        raise ValueError(f"{src}: noise rates must be probabilities with echo + wrong <= 1, got {rates}")
    echo = {}
    for name, text in raw["echo_examples"].items():
        if name not in ACHIEVEMENT_NAMES:
            raise ValueError(f"{src}: echo example of unknown achievement {name!r}")
        echo[EVENT_NAMES.index(name)] = text
    return OracleSettings(tuple(tasks), NoiseProfile(**rates, echo_examples=echo, sources=dict(n.get("sources", {}))))


def check_oracle(oracle: str, grounding: Optional[str] = None) -> None:
    """Raise ValueError for an unknown variant, or one the grounding cannot pay (the one rule)."""
    if oracle not in ORACLES:
        raise ValueError(f"unknown oracle relabeler {oracle!r}; expected one of {', '.join(ORACLES)}")
    if grounding is not None and grounding != "bound" and oracle in USES_POOL:
        raise ValueError(f"oracle {oracle!r} needs event-bound grounding (grounding='bound', --oir.grounding bound): "
                         f"its wordings are chosen far from the captions, so the cosine reward ({grounding!r}) "
                         "would pay them nowhere")


def trajectory_rng(traj: Trajectory, seed: int, stream: int) -> np.random.Generator:
    """The random stream ``stream`` of one trajectory, keyed by ``seed`` and the trajectory's identity
    (the same draws in any process, batch or order).
    """
    check_int("seed", seed)
    check_int("stream", stream)
    ev = zlib.crc32(np.packbits(np.asarray(traj.events, bool)).tobytes())
    dn = zlib.crc32(np.packbits(np.asarray(traj.dones, bool)).tobytes())
    meta = traj.meta or {}
    key = [int(seed) & 0xFFFFFFFF, stream, int(meta.get("seed", 0)) & 0xFFFFFFFF,
           int(meta.get("update", 0)) & 0xFFFFFFFF, int(traj.env_id) & 0xFFFFFFFF, ev, dn]
    return np.random.default_rng(key)


def episode_ids(traj: Trajectory) -> np.ndarray:
    """Per step, the index of its episode within ``traj``."""
    return np.cumsum(np.concatenate([[0], np.asarray(traj.dones[:-1], dtype=np.int64)]))


def achievement_sequence(traj: Trajectory) -> list[tuple[int, int, int]]:
    """``(event, episode, step)`` of the achievement events in time order, first step per episode."""
    episode = episode_ids(traj)
    seq, seen = [], set()
    # only the achievement columns: moving and waiting fill most steps, and a loop over them is slow
    ts, cs = np.nonzero(np.asarray(traj.events)[:, ACHIEVEMENT_EVENTS])  # time-major, then event id
    for t, c in zip(ts.tolist(), cs.tolist()):
        e = ACHIEVEMENT_EVENTS[c]
        if (e, int(episode[t])) not in seen:
            seen.add((e, int(episode[t])))
            seq.append((e, int(episode[t]), t))
    return seq


def first_occurrence_events(traj: Trajectory, events: Optional[Iterable[int]] = None) -> list[int]:
    """The achievement events of ``traj`` (or those of ``events``) in order of first occurrence."""
    cols = list(ACHIEVEMENT_EVENTS) if events is None else sorted(set(events))
    ev = np.asarray(traj.events)[:, cols]
    happened = np.flatnonzero(ev.any(axis=0))
    first = ev.argmax(axis=0)
    return [cols[i] for i in sorted(happened.tolist(), key=lambda i: (int(first[i]), cols[i]))]


def pair_labels(traj: Trajectory, pair_table: Mapping[tuple[str, str], str]) -> list[Label]:
    """The natural pair wordings ("sleep and wake up") whose events happened in order in one episode."""
    ev, episode = np.asarray(traj.events), episode_ids(traj)
    out = []
    for (first, second), text in pair_table.items():
        i, j = EVENT_NAMES.index(first), EVENT_NAMES.index(second)
        # each episode's first occurrence of the first event; a second event after it in its episode
        earliest: dict[int, int] = {}
        for t in np.flatnonzero(ev[:, i]).tolist():
            earliest.setdefault(int(episode[t]), t)
        if any(earliest.get(int(episode[t]), t) < t for t in np.flatnonzero(ev[:, j]).tolist()):
            out.append(Label(text, j, i))
    return out


def compound_labels(traj: Trajectory, seed: int = 0) -> list[Label]:
    """``"A then B"`` for ordered pairs of unrelated achievement events of one episode, in random order."""
    out = []
    for (a, ea, ta), (b, eb, tb) in itertools.permutations(achievement_sequence(traj), 2):
        # any occurrence of B after A's first counts (B's first may come before A)
        if ea != eb or a == b or related_achievements(VOCAB.achievement_of_event[a], VOCAB.achievement_of_event[b]):
            continue
        later = np.flatnonzero(traj.events[ta + 1:, b])
        if len(later) and not np.asarray(traj.dones[ta:ta + 1 + int(later[0])], bool).any():
            out.append(Label(f"{VOCAB.canonical(a)} then {VOCAB.canonical(b)}", b, a))
    order = trajectory_rng(traj, seed, _STREAM_COMPOUND).permutation(len(out))
    return [out[i] for i in order]


def mixed_labels(traj: Trajectory, pool: WordingPool, seed: int = 0,
                 pair_table: Optional[Mapping[tuple[str, str], str]] = None) -> list[Label]:
    """The ``canonical`` labels with each achievement text a pool wording with probability :data:`MIXED_POOL_SHARE`."""
    rng = trajectory_rng(traj, seed, _STREAM_MIXED)
    out = []
    for e in first_occurrence_events(traj):
        u = rng.random(2)
        ws = pool.wordings[e]
        out.append(Label(ws[int(u[1] * len(ws))] if u[0] < MIXED_POOL_SHARE else VOCAB.canonical(e), e))
    return out + pair_labels(traj, RULE_PAIRS if pair_table is None else pair_table)


def corrupt(labels: Sequence[Label], pool: WordingPool, noise: NoiseProfile, rng: np.random.Generator) -> list[Label]:
    """``labels`` with the errors of ``noise``, each label independently; repeated texts keep their first binding."""
    examples = list(dict.fromkeys(noise.echo_examples.values()))
    achievements = sorted(pool.wordings)
    out: list[Label] = []
    for lab in labels:
        u = rng.random(4)
        if u[0] < noise.drop:
            continue
        if u[1] < noise.echo:
            text = noise.echo_examples.get(lab.final) or examples[int(u[3] * len(examples))]
        elif u[1] < noise.echo + noise.wrong:
            others = [e for e in achievements if e != lab.final]
            ws = pool.wordings[others[int(u[2] * len(others))]]
            text = ws[int(u[3] * len(ws))]
        else:
            text = lab.text
        out.append(Label(text, lab.final, lab.pre))
    return unique(out)


def unique(labels: Iterable[Label]) -> list[Label]:
    """``labels`` without repeated texts: the first label of a text (and its binding) wins."""
    first: dict[str, Label] = {}
    for lab in labels:
        first.setdefault(lab.text, lab)
    return list(first.values())


def oracle_labels(traj: Trajectory, oracle: str, *, seed: int = 0, pool: Optional[WordingPool] = None,
                  pair_table: Optional[Mapping[tuple[str, str], str]] = None,
                  settings: Optional[OracleSettings] = None) -> list[Label]:
    """The labels of one trajectory by variant ``oracle`` (:data:`ORACLES`), without repeated texts."""
    check_oracle(oracle)
    check_int("seed", seed)
    pairs = RULE_PAIRS if pair_table is None else pair_table
    settings = settings or load_settings()
    if oracle == "mixed":
        return unique(mixed_labels(traj, pool or load_pool(), seed, pairs))
    if oracle in ("diverse", "noisy"):
        pool, rng = pool or load_pool(), trajectory_rng(traj, seed, _STREAM_DIVERSE)
        # each achievement event named by one of its pool wordings, drawn per trajectory
        labels = [Label(pool.wordings[e][int(rng.integers(len(pool.wordings[e])))], e)
                  for e in first_occurrence_events(traj)]
        if oracle == "diverse":
            return unique(labels)
        return corrupt(labels, pool, settings.noise, trajectory_rng(traj, seed, _STREAM_NOISE))
    # the rest: canonical captions of the achievements, the pairs, then the variant's own labels
    labels = [Label(VOCAB.canonical(e), e) for e in first_occurrence_events(traj)] + pair_labels(traj, pairs)
    if oracle == "compound":
        return unique(labels + compound_labels(traj, seed))
    extra = {"canonical": (), "tasks": settings.task_events, "progress": VOCAB.progress_events}[oracle]
    return unique(labels + [Label(VOCAB.canonical(e), e) for e in first_occurrence_events(traj, extra)])
