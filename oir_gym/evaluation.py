"""The evaluation protocol of the paper (Sec. 5), shared by the PQN and SB3 agents, plus a control.

Every instruction of the chosen sets (``original``, ``simple``, ``complex``; see
:mod:`oir_gym.instructions`; and any user sets, :attr:`EvalConfig.instruction_files`) is given to
``episodes`` envs; the policy acts greedily for a fixed ``horizon`` (the env's cosine termination is
off, so reward shaping cannot end an episode early); an episode succeeds when the instruction's
ground-truth Craftax achievement (or all of its achievements; for an ordered "X then Y", X strictly
before Y; within the instruction's own horizon if it has one) happens before the horizon or the
player's death. Every episode keeps a record of the first step of each achievement and of each
achievement after each other one (:data:`RECORD_SHAPE`), from which everything is scored. Metrics
per set: per-instruction success rate, mean success rate, number of completed instructions,
aggregate score, and the paraphrase retention of sets of single-achievement wordings
(:meth:`EvalResult.retention`).

**Control** (``EvalConfig.control``, on by default). Success alone cannot tell instruction
following from a fixed routine that happens to complete some achievements. Every episode records
all 22 achievement flags, so the success of achievement A is also read where the agent was asked
for something else:

* *mismatched*: in the episodes of the instruction of the same set paired with A by
  :func:`mismatch_pairing` (a fixed derangement of the set's achievements that never pairs an
  achievement with one of its prerequisites or consequences: asked for "place table", an agent
  must collect wood, so "collect wood" is never paired with "place table");
* *neutral*: in ``episodes`` extra episodes under :data:`NEUTRAL_TEXT` (an instruction that names
  no task; see ``docs/evaluation.md`` for the choice).

The instruction-following gain of an instruction is success(A | asked for A) - success(A | the
mismatched instruction); the neutral gain is reported beside it. An ordered instruction "X then Y"
whose reverse "Y then X" is evaluated too (the packaged ``ordered`` and ``ordered_reverse`` sets)
also gets its order gain: its success minus the success of X-before-Y in the episodes asked "Y then X".
A policy that ignores its instruction has gains near 0 whatever it completes. The mismatched
condition costs no episode; the neutral one ``episodes`` more envs in all.

Two drivers: :func:`evaluate_jax` runs everything in one jitted ``lax.scan`` (PQN), and
:func:`evaluate_python_policy` steps an :class:`~oir_gym.vector_env.InstructionCraftax` from Python
for any policy object (SB3 agents).

Evaluation worlds come from :func:`eval_key`: the run's seed, the seed's index inside a vmapped
run and the update, so that the seeds of a run, and runs of different seeds, meet different worlds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from oir_gym import functional as F
from oir_gym.captions import ACHIEVEMENT_NAMES, NUM_ACHIEVEMENTS
from oir_gym.instructions import (
    PACKAGED_SET_NAMES, SET_NAMES, EvalInstruction, load_instruction_files, load_instruction_sets,
)
from oir_gym.metrics import LEARNED_THRESHOLD, control_summary, following_gain, paraphrase_retention, summarize
from oir_gym.prerequisites import PREREQUISITES, related_achievements  # noqa: F401  (PREREQUISITES: re-exported)
from oir_gym.validation import check_bool, check_int, check_str, check_str_sequence

#: The neutral instruction of the control: it names no task, and the sentence encoder puts it far
#: from every evaluation instruction (max cosine 0.25) and every caption phrasing (max 0.33), so it
#: neither points at an achievement nor could be paid by the cosine reward. "do nothing in
#: particular" would be a poor choice: cosine 0.85 to the caption "do nothing" (docs/evaluation.md).
NEUTRAL_TEXT = "no instruction"

#: Set name of the neutral episodes in :func:`eval_instructions` (':' is not allowed in user set names).
NEUTRAL_SET = "control:neutral"

#: Salt of the evaluation keys: keeps evaluation worlds apart from anything else made from the seed.
EVAL_KEY_SALT = 0x0E7A1


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings.

    Attributes:
        sets: packaged instruction sets to evaluate (any of
            :data:`~oir_gym.instructions.PACKAGED_SET_NAMES`; default the paper's three; user set
            names are accepted too, to fix their order). Every set of ``instruction_files``
            is evaluated as well; ``sets=()`` with files evaluates only the files' sets.
        episodes: episodes per instruction (1-32 measured; see ``docs/benchmarks.md`` for the cost).
        horizon: steps per episode (the paper does not state one; we document ours).
        instruction_files: user files of named sets (``docs/evaluation.md``), read and checked when
            the config is made, so a bad file stops a run before training or evaluation starts.
        control: also measure each achievement under a mismatched and a neutral instruction.
        neutral_text: the neutral instruction of the control.
    """

    sets: tuple[str, ...] = SET_NAMES
    episodes: int = 2
    horizon: int = 300
    instruction_files: tuple[str, ...] = ()
    control: bool = True
    neutral_text: str = NEUTRAL_TEXT
    _user_sets: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        files = self.instruction_files
        # one path is a list of one (the trainers pass a path or several); one set name is not
        files = (files,) if isinstance(files, (str, os.PathLike)) else files
        object.__setattr__(self, "instruction_files", check_str_sequence("instruction_files", files, paths=True))
        object.__setattr__(self, "sets", check_str_sequence("sets", self.sets))
        check_int("episodes", self.episodes, minimum=1)
        check_int("horizon", self.horizon, minimum=1)
        check_bool("control", self.control)
        check_str("neutral_text", self.neutral_text)
        user = load_instruction_files(self.instruction_files)
        object.__setattr__(self, "_user_sets", user)
        for s in self.sets:
            if s not in PACKAGED_SET_NAMES and s not in user:
                raise ValueError(f"unknown instruction set {s!r}; expected some of {PACKAGED_SET_NAMES}"
                                 + (f" or of the files' sets {tuple(user)}" if user else ""))
        if not self.set_names:
            raise ValueError("no instruction set to evaluate: give sets or instruction_files")

    @property
    def set_names(self) -> tuple[str, ...]:
        """Every evaluated set, in order: ``sets``, then the files' other sets."""
        return tuple(dict.fromkeys((*self.sets, *self._user_sets)))

    def instruction_sets(self) -> dict[str, list[EvalInstruction]]:
        """``{set name: [EvalInstruction, ...]}`` of every evaluated set."""
        builtin = load_instruction_sets()
        return {s: list(self._user_sets[s] if s in self._user_sets else builtin[s]) for s in self.set_names}


def eval_config(instruction_files: Sequence[str | os.PathLike] | str | os.PathLike = (), **kwargs: Any) -> EvalConfig:
    """The evaluation config of a trainer: ``EvalConfig(instruction_files=..., **kwargs)``.

    What both trainers call with their ``eval.instruction_files`` (a list of paths, possibly empty);
    raises ValueError for a bad file before anything else runs.
    """
    return EvalConfig(instruction_files=instruction_files, **kwargs)  # one path or several: __post_init__ sorts it out


# ----------------------------------------------------------------------------- the control pairing


def related(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two targets (tuples of achievement indices) share an achievement, or one needs the other
    (:data:`~oir_gym.prerequisites.PREREQUISITES`)."""
    return any(related_achievements(x, y) for x in a for y in b)


def mismatch_pairing(targets: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The fixed derangement of the control: for each distinct target, the target whose instruction stands in.

    Among all derangements of the distinct targets (sorted), those with the fewest :func:`related`
    pairs; among them, the one that gives the first target the partner nearest after it (in that
    order, cyclically), then the second, and so on. Well defined whatever solver finds the optimum.
    For the 22 achievements no pair is related (the table is in ``docs/evaluation.md``).

    Args:
        targets: achievement-index tuples (repeats allowed: one per instruction).

    Returns:
        ``{target: partner}``, a permutation without fixed points; empty for fewer than 2 distinct targets.
    """
    return dict(_pairing(tuple(sorted(set(tuple(t) for t in targets)))))


@lru_cache(maxsize=64)
def _pairing(uniq: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    from scipy.optimize import linear_sum_assignment

    n = len(uniq)
    if n < 2:
        return ()
    big = n + 1  # any assignment using a forbidden cell costs more than the worst allowed one (n related pairs)
    cost = np.array([[big if i == j else int(related(uniq[i], uniq[j])) for j in range(n)] for i in range(n)])

    def optimum(c: np.ndarray) -> int:
        r, k = linear_sum_assignment(c)
        return int(c[r, k].sum())

    best = optimum(cost)  # the fewest related pairs: unique, unlike the assignment a solver returns
    for i in range(n):  # fix each row to its nearest following partner that keeps the optimum
        for d in range(1, n):
            j = (i + d) % n
            if cost[i, j] >= big:
                continue
            trial = cost.copy()
            trial[i, :], trial[:, j] = big, big
            trial[i, j] = cost[i, j]
            if optimum(trial) == best:
                cost = trial
                break
    return tuple((uniq[i], uniq[int(np.flatnonzero(cost[i] < big)[0])]) for i in range(n))


def mismatch_partners(targets: Sequence[tuple[int, ...]]) -> list[int] | None:
    """For each instruction of a set, the instruction of the same set given in its mismatched condition.

    The k-th instruction of target A is paired with the (k mod m)-th of target B =
    :func:`mismatch_pairing` (A), m being B's number of instructions (e.g. a paraphrase of
    "collect wood" with the paraphrase of its partner at the same position). ``None`` when the set
    has fewer than 2 distinct targets (no mismatched instruction exists).
    """
    pairing = mismatch_pairing(targets)
    if not pairing:
        return None
    by_target: dict[tuple[int, ...], list[int]] = {}
    rank = []
    for i, t in enumerate(targets):
        rank.append(len(by_target.setdefault(tuple(t), [])))
        by_target[tuple(t)].append(i)
    out = []
    for i, t in enumerate(targets):
        others = by_target[pairing[tuple(t)]]
        out.append(others[rank[i] % len(others)])
    return out


# ----------------------------------------------------------------------------- evaluation keys


def eval_key(seed: int, index: int = 0, update: int = 0) -> jax.Array:
    """The key of one evaluation: it fixes the worlds (and the policy's noise, if any).

    Args:
        seed: the run's seed (``cfg.seed``).
        index: the seed's index inside a run that trains several seeds side by side (vmapped).
        update: the update at which the policy is evaluated (each evaluation of a run meets new
            worlds; runs of the same seed meet the same ones at the same update).
    """
    key = jax.random.PRNGKey(EVAL_KEY_SALT)
    for name, v in (("seed", seed), ("index", index), ("update", update)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= int(v) < 2**32:
            raise ValueError(f"eval_key: {name} must be an integer in [0, 2**32), got {v!r}")
        key = jax.random.fold_in(key, int(v))
    return key


def eval_keys(seed: int, num_seeds: int, update: int = 0) -> jax.Array:
    """``[num_seeds, 2]`` keys of :func:`eval_key` for the seeds ``0..num_seeds-1`` of a run (for
    :func:`evaluate_jax_seeds`)."""
    return jnp.stack([eval_key(seed, s, update) for s in range(num_seeds)])


# ----------------------------------------------------------------------------- episode records

#: Layout of an evaluation episode's record (what :func:`make_jax_evaluator` returns per env): an
#: int32 ``[1 + 22, 22]`` array. Row 0: the first step (0-based) at which each achievement happened,
#: -1 if it never did; row ``1 + a``, column ``b``: the first step at which ``b`` happened with ``a``
#: already done at an earlier step, -1 if never ("a then b"). Steps after the player's death do not count.
RECORD_SHAPE: tuple[int, int] = (1 + NUM_ACHIEVEMENTS, NUM_ACHIEVEMENTS)


def records_from_achieved(achieved: np.ndarray) -> np.ndarray:
    """Records ``[n, 23, 22]`` from bare achievement flags ``[n, 22]`` (every achievement at step 0,
    no order known): enough to score single and unordered instructions, not ordered ones."""
    achieved = np.asarray(achieved, bool)
    rec = np.full((achieved.shape[0], *RECORD_SHAPE), -1, np.int32)
    rec[:, 0] = np.where(achieved, 0, -1)
    return rec


def _outcomes(records: np.ndarray, target: tuple[int, ...], ordered: bool = False,
              horizon: int | None = None) -> np.ndarray:
    """``[episodes]`` success of ``target`` from ``[episodes, 23, 22]`` records: all its achievements
    (or, ``ordered``, its first strictly before its second), within ``horizon`` steps if given."""
    h = np.iinfo(np.int32).max if horizon is None else horizon
    if ordered:
        step = records[:, 1 + target[0], target[1]]
        return (step >= 0) & (step < h)
    first = records[:, 0, list(target)]
    return ((first >= 0) & (first < h)).all(axis=1)


# ----------------------------------------------------------------------------- results


@dataclass
class ControlResult:
    """The control conditions of one set, aligned with the set's instructions.

    Attributes:
        mismatched_texts: the instruction given in the mismatched condition of each instruction
            (``None`` when the set has fewer than 2 distinct targets).
        mismatched_rates: success of each instruction's achievement(s) under that instruction.
        neutral_text: the neutral instruction.
        neutral_rates: success of each instruction's achievement(s) under the neutral instruction.
        reverse_texts: for an ordered instruction "X then Y", the evaluated instruction that asks
            "Y then X" (``None`` where there is none or for unordered instructions; the whole list
            ``None`` when no instruction of the set has one).
        reverse_rates: success of "X then Y" (X before Y) in the episodes of that reverse
            instruction (NaN where there is none): the order-following gain of an instruction is
            its rate minus this one.
    """

    mismatched_texts: list[str] | None
    mismatched_rates: np.ndarray | None
    neutral_text: str
    neutral_rates: np.ndarray
    reverse_texts: list[str | None] | None = None
    reverse_rates: np.ndarray | None = None

    def order_gains(self, rates: np.ndarray) -> np.ndarray | None:
        """Per instruction: its rate minus :attr:`reverse_rates` (NaN without a reverse instruction)."""
        return None if self.reverse_rates is None else np.asarray(rates, float) - self.reverse_rates


@dataclass
class EvalResult:
    """Per-set results. ``rates[set]`` is a ``[n_instructions]`` array aligned with ``texts[set]``.

    ``achievements[set]`` holds each instruction's achievement index (-1 for one scored by
    several, listed in ``targets[set]``; ``ordered[set]`` marks the "X then Y" ones);
    ``control[set]`` the control conditions (when run).
    """

    texts: dict[str, list[str]] = field(default_factory=dict)
    achievements: dict[str, list[int]] = field(default_factory=dict)
    rates: dict[str, np.ndarray] = field(default_factory=dict)
    targets: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    control: dict[str, ControlResult] = field(default_factory=dict)
    ordered: dict[str, list[bool]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        return {s: summarize(r) for s, r in self.rates.items()}

    def retention(self, learned: float = LEARNED_THRESHOLD) -> dict[str, dict[str, float | int | None]]:
        """Paraphrase retention of every set whose instructions each name one achievement, against
        the ``original`` set (:func:`oir_gym.metrics.paraphrase_retention`): ``{set: {"retention":
        value or None (no achievement learned), "learned": number of learned achievements}}``;
        empty without the ``original`` set."""
        if "original" not in self.rates:
            return {}
        o_rates, o_achs = self.rates["original"], self.achievements["original"]
        n_learned = int(sum(r >= learned for r, a in zip(o_rates, o_achs) if a >= 0))
        out: dict[str, dict[str, float | int | None]] = {}
        for s in self.rates:
            achs = self.achievements[s]
            if s == "original" or not achs or min(achs) < 0:
                continue
            v = paraphrase_retention(o_rates, o_achs, self.rates[s], achs, learned=learned)
            out[s] = {"retention": None if np.isnan(v) else float(v), "learned": n_learned}
        return out

    def control_summary(self) -> dict[str, dict[str, float]]:
        """Per set: ``gain`` (mean over instructions of asked - mismatched), ``gain_neutral``, and the
        mean success rates of the two control conditions (:func:`oir_gym.metrics.control_summary`);
        for a set of ordered instructions whose reverse instructions were evaluated too,
        ``order_gain`` (mean over them of asked - the same order's success when asked the reverse)."""
        out = {}
        for s, c in self.control.items():
            out[s] = control_summary(self.rates[s], c.mismatched_rates, c.neutral_rates)
            gains = c.order_gains(self.rates[s])
            if gains is not None and np.isfinite(gains).any():
                out[s]["order_gain"] = float(np.nanmean(gains))
                out[s]["reverse_mean_success_rate"] = float(np.nanmean(c.reverse_rates))
        return out

    def flat_metrics(self) -> dict[str, float]:
        """``{"eval/original/mean_success_rate": ..., "eval/control/original/gain": ...,
        "eval/simple/retention": ...}`` for logging (a retention is left out where no achievement is learned)."""
        out = {}
        for s, m in self.summary().items():
            for k, v in m.items():
                out[f"eval/{s}/{k}"] = float(v)
        for s, m in self.retention().items():
            if m["retention"] is not None:
                out[f"eval/{s}/retention"] = float(m["retention"])
            out[f"eval/{s}/retention_learned"] = float(m["learned"])
        for s, m in self.control_summary().items():
            for k, v in m.items():
                out[f"eval/control/{s}/{k}"] = float(v)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{set: {texts, achievements, rates, <summary>, [targets], [control]}}``."""
        out: dict[str, Any] = {}
        control = self.control_summary()
        retention = self.retention()
        for s in self.rates:
            d = {"texts": self.texts[s], "achievements": [int(a) for a in self.achievements[s]],
                 "rates": [float(x) for x in self.rates[s]], **self.summary()[s]}
            if any(len(t) > 1 for t in self.targets.get(s, [])):
                d["targets"] = [[int(a) for a in t] for t in self.targets[s]]
            if any(self.ordered.get(s, [])):
                d["ordered"] = [bool(o) for o in self.ordered[s]]
            if s in retention:
                d["retention"], d["retention_learned"] = retention[s]["retention"], retention[s]["learned"]
            if s in self.control:
                c = self.control[s]
                mism = c.mismatched_rates
                d["control"] = {
                    "mismatched_texts": c.mismatched_texts,
                    "mismatched_rates": None if mism is None else [float(x) for x in mism],
                    "neutral_text": c.neutral_text,
                    "neutral_rates": [float(x) for x in c.neutral_rates],
                    "gain_per_instruction": None if mism is None else
                    [float(x) for x in following_gain(self.rates[s], mism)],
                    "gain_neutral_per_instruction": [float(x) for x in following_gain(self.rates[s], c.neutral_rates)],
                    **control[s],
                }
                if c.reverse_rates is not None:
                    gains = c.order_gains(self.rates[s])
                    d["control"]["reverse_texts"] = c.reverse_texts
                    d["control"]["reverse_rates"] = [None if np.isnan(x) else float(x) for x in c.reverse_rates]
                    d["control"]["order_gain_per_instruction"] = [None if np.isnan(x) else float(x) for x in gains]
            out[s] = d
        return out

    def to_markdown(self) -> str:
        """Summary table, the control table (when run), and the per-instruction tables of the original
        set and of every user set (the built-in paraphrase sets, 66 instructions each, only in the summary)."""
        lines = ["| set | mean success rate | completed instructions | aggregate score |", "|---|---|---|---|"]
        for s, m in self.summary().items():
            lines.append(f"| {s} | {m['mean_success_rate']:.3f} | {m['num_completed']} / {len(self.rates[s])} | {m['aggregate_score']:.3f} |")
        control = self.control_summary()
        if control:
            lines += ["", "Control: success of each instruction's achievement when asked for it, for the paired "
                      "other achievement (mismatched) and with the neutral instruction; gain = asked - control.", "",
                      "| set | asked | mismatched | neutral | gain (asked - mismatched) | gain (asked - neutral) |",
                      "|---|---|---|---|---|---|"]
            for s, c in control.items():
                mism = f"{c['mismatched_mean_success_rate']:.3f}" if "gain" in c else "-"
                gain = f"{c['gain']:+.3f}" if "gain" in c else "- (one achievement only)"
                lines.append(f"| {s} | {self.summary()[s]['mean_success_rate']:.3f} | {mism} | "
                             f"{c['neutral_mean_success_rate']:.3f} | {gain} | {c['gain_neutral']:+.3f} |")
            order = {s: c for s, c in control.items() if "order_gain" in c}
            if order:
                lines += ["", "Order: success of \"X then Y\" when asked for it and when asked \"Y then X\"; "
                          "order gain = asked - reversed.", "", "| set | asked | reversed | order gain |",
                          "|---|---|---|---|"]
                lines += [f"| {s} | {self.summary()[s]['mean_success_rate']:.3f} | "
                          f"{c['reverse_mean_success_rate']:.3f} | {c['order_gain']:+.3f} |" for s, c in order.items()]
        retention = self.retention()
        if retention:
            lines += ["", f"Paraphrase retention: over the achievements learned on the original set (success >= "
                      f"{LEARNED_THRESHOLD}), mean of paraphrase success / original success.", "",
                      "| set | retention | learned achievements |", "|---|---|---|"]
            lines += [f"| {s} | {'-' if m['retention'] is None else format(m['retention'], '.3f')} | {m['learned']} |"
                      for s, m in retention.items()]
        for s in self.rates:
            if s in ("simple", "complex", "heldout"):  # paraphrase sets: in the summary only
                continue
            if s != "original":
                lines += ["", f"Set {s}, per instruction:"]
            c = self.control.get(s)
            if c is not None and c.mismatched_rates is not None:
                lines += ["", "| instruction | success rate | mismatched (instruction given) | neutral |", "|---|---|---|---|"]
                lines += [f"| {t} | {r:.2f} | {m:.2f} ({mt}) | {n:.2f} |" for t, r, m, mt, n in
                          zip(self.texts[s], self.rates[s], c.mismatched_rates, c.mismatched_texts, c.neutral_rates)]
            else:
                lines += ["", "| instruction | success rate |", "|---|---|"]
                lines += [f"| {t} | {r:.2f} |" for t, r in zip(self.texts[s], self.rates[s])]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the instructions of an evaluation


def _plan(cfg: EvalConfig) -> tuple[list[str], list[int], list[str], list[EvalInstruction]]:
    texts, achs, sets, items_ = [], [], [], []
    for s, items in cfg.instruction_sets().items():
        for ins in items:
            texts.append(ins.text)
            achs.append(ins.achievement_index)
            sets.append(s)
            items_.append(ins)
    if cfg.control:
        texts.append(cfg.neutral_text)
        achs.append(-1)
        sets.append(NEUTRAL_SET)
        items_.append(EvalInstruction(cfg.neutral_text, -1, NEUTRAL_SET))
    return texts, achs, sets, items_


def eval_instructions(cfg: EvalConfig) -> tuple[list[str], list[int], list[str]]:
    """Texts, achievement indices and set names of every instruction an evaluation gives, in order.

    With ``cfg.control`` the last one is the neutral instruction (set :data:`NEUTRAL_SET`,
    achievement -1). Register all of them (``registry.rows(texts, achs)``): their rows are the
    ``rows`` of :func:`evaluate_jax`.
    """
    texts, achs, sets, _ = _plan(cfg)
    return texts, achs, sets


def eval_result(cfg: EvalConfig, texts, achs, sets, achieved: np.ndarray) -> EvalResult:
    """Per-set rates (and the control) from the records of every episode.

    Args:
        cfg: the evaluation config; ``texts, achs, sets`` must be :func:`eval_instructions` (cfg).
        achieved: instruction-major, one row per episode: the records ``[n_instructions * episodes,
            23, 22]`` of :func:`make_jax_evaluator` (see :data:`RECORD_SHAPE`), or bare achievement
            flags ``[n_instructions * episodes, 22]`` (which achievements happened before the horizon
            or the player's death; not enough for ordered instructions).
    """
    p_texts, _, p_sets, items = _plan(cfg)
    if list(texts) != p_texts or list(sets) != p_sets:
        raise ValueError("texts and sets must be eval_instructions(cfg) of this config")
    n = len(texts) * cfg.episodes
    rec = np.asarray(achieved)
    if rec.shape == (n, NUM_ACHIEVEMENTS):
        if any(ins.ordered for ins in items):
            raise ValueError("ordered instructions (\"X then Y\") are scored from episode records [n, 23, 22] "
                             "(make_jax_evaluator's output), not from bare achievement flags")
        rec = records_from_achieved(rec)
    elif rec.shape != (n, *RECORD_SHAPE):
        raise ValueError(f"achieved must be [n_instructions * episodes, {NUM_ACHIEVEMENTS}] = "
                         f"[{n}, {NUM_ACHIEVEMENTS}] flags or [{n}, {RECORD_SHAPE[0]}, {RECORD_SHAPE[1]}] records, "
                         f"got {rec.shape}")
    per = rec.reshape(len(texts), cfg.episodes, *RECORD_SHAPE)

    def rate(episodes: int, ins: EvalInstruction) -> float:
        """Success of ``ins`` (its achievements, its order, its horizon) in the episodes of instruction ``episodes``."""
        h = min(cfg.horizon, ins.horizon or cfg.horizon)
        return float(_outcomes(per[episodes], ins.targets, ins.ordered, h).mean())

    neutral = p_sets.index(NEUTRAL_SET) if cfg.control else None
    # "Y then X" of every evaluated ordered instruction "X then Y" (the first one asked, in plan order)
    by_order = {}
    for i, ins in enumerate(items):
        if ins.ordered:
            by_order.setdefault(ins.targets, i)
    res = EvalResult()
    for s in cfg.set_names:
        idx = [i for i, x in enumerate(sets) if x == s]
        mine = [items[i] for i in idx]
        tg = [ins.targets for ins in mine]
        res.texts[s] = [texts[i] for i in idx]
        res.achievements[s] = [achs[i] for i in idx]
        res.targets[s] = tg
        res.ordered[s] = [ins.ordered for ins in mine]
        res.rates[s] = np.array([rate(i, ins) for i, ins in zip(idx, mine)])
        if neutral is None:
            continue
        partners = mismatch_partners(tg)
        rev = [by_order.get(ins.targets[::-1]) if ins.ordered else None for ins in mine]
        has_rev = any(r is not None for r in rev)
        res.control[s] = ControlResult(
            mismatched_texts=None if partners is None else [texts[idx[j]] for j in partners],
            mismatched_rates=None if partners is None else
            np.array([rate(idx[j], ins) for j, ins in zip(partners, mine)]),
            neutral_text=texts[neutral],
            neutral_rates=np.array([rate(neutral, ins) for ins in mine]),
            reverse_texts=[None if r is None else texts[r] for r in rev] if has_rev else None,
            reverse_rates=np.array([np.nan if r is None else rate(r, ins) for r, ins in zip(rev, mine)])
            if has_rev else None,
        )
    return res


# ----------------------------------------------------------------------------- the JAX driver


def eval_params(params: F.EnvParams, rows: np.ndarray, achievements: Sequence[int]) -> F.EnvParams:
    """Evaluation copy of env params: no termination on success, rows mapped to achievements."""
    table = params.table
    ach = jnp.asarray(table.achievement).at[jnp.asarray(rows)].set(jnp.asarray(achievements, jnp.int32))
    return params.replace(table=table.replace(achievement=ach), terminate_on_success=False)


def make_jax_evaluator(policy_step: Callable, init_carry: Callable, num_envs: int, horizon: int,
                       obs_mode: str = "paper", pool_size: int | None = None):
    """Build a jitted ``evaluate(key, policy_params, env_params, pinned_rows) -> records [num_envs, 23, 22]``.

    ``records[e]`` (:data:`RECORD_SHAPE`): the first step of each achievement in env ``e``, and of
    each achievement after each other one, before the horizon or the player's death (every
    achievement is recorded, so the control reads other instructions' episodes, and the order of
    any two achievements can be read).

    Args:
        policy_step: ``(policy_params, carry, obs, done, key) -> (carry, actions)``, batched,
            greedy (the caller decides how greedy).
        init_carry: ``(num_envs) -> carry``.
        pool_size: worlds pre-generated for resets; an evaluation never resets an env, so 1 by
            default (the envs' own worlds do not depend on it).
    """

    def evaluate(key, policy_params, env_params, pinned):
        k_reset, k_run = jax.random.split(key)
        obs, bstate = F.batch_reset(k_reset, env_params, num_envs, pool_size or 1, pinned, obs_mode)

        def body(c, xs):
            obs, bstate, carry, alive, first, after, done_prev = c
            k, t = xs
            k_pol, k_env = jax.random.split(k)
            carry, actions = policy_step(policy_params, carry, obs, done_prev, k_pol)
            obs, bstate, _, term, trunc, info, _ = F.batch_step(
                k_env, bstate, actions, env_params, obs_mode=obs_mode, autoreset=False
            )
            now = info.achievements & alive[:, None]
            done_before = first >= 0  # achievements of earlier steps only: "a then b" needs a strictly first
            after = jnp.where((after < 0) & done_before[:, :, None] & now[:, None, :], t, after)
            first = jnp.where((first < 0) & now, t, first)
            alive = alive & ~term
            return (obs, bstate, carry, alive, first, after, jnp.zeros_like(term)), None

        init = (obs, bstate, init_carry(num_envs), jnp.ones(num_envs, bool),
                jnp.full((num_envs, NUM_ACHIEVEMENTS), -1, jnp.int32),
                jnp.full((num_envs, NUM_ACHIEVEMENTS, NUM_ACHIEVEMENTS), -1, jnp.int32), jnp.ones(num_envs, bool))
        final, _ = jax.lax.scan(body, init, (jax.random.split(k_run, horizon), jnp.arange(horizon, dtype=jnp.int32)))
        return jnp.concatenate([final[4][:, None, :], final[5]], axis=1)

    return jax.jit(evaluate)


def _jax_achieved(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray, cfg: EvalConfig,
                  achs) -> np.ndarray:
    if len(rows) != len(achs):
        raise ValueError(f"{len(rows)} rows for {len(achs)} instructions: register eval_instructions(cfg) and pass "
                         "their rows")
    pinned = jnp.repeat(jnp.asarray(rows, jnp.int32), cfg.episodes)
    return np.asarray(evaluator(key, policy_params, eval_params(env_params, rows, achs), pinned))


def evaluate_jax(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                 cfg: EvalConfig, texts, achs, sets) -> EvalResult:
    """Run a :func:`make_jax_evaluator` evaluator on the instructions (``rows`` in the table).

    ``texts, achs, sets`` are :func:`eval_instructions` (cfg); ``key`` is best made by :func:`eval_key`.
    """
    achieved = _jax_achieved(evaluator, key, policy_params, env_params, rows, cfg, achs)
    return eval_result(cfg, texts, achs, sets, achieved)


def evaluate_jax_seeds(evaluator, keys, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                       cfg: EvalConfig, texts, achs, sets) -> list[EvalResult]:
    """Like :func:`evaluate_jax` for several policies in one program, one result per policy.

    ``evaluator`` is a :func:`make_jax_evaluator` evaluator vmapped over its key and policy
    parameters (``jax.jit(jax.vmap(ev, in_axes=(0, 0, None, None)))``, built once and kept:
    the evaluation is a long sequential scan, so policies side by side cost about what one
    does); ``keys`` (:func:`eval_keys` of the run's seed) and the leaves of ``policy_params`` have a
    leading policy axis.
    """
    achieved = _jax_achieved(evaluator, keys, policy_params, env_params, rows, cfg, achs)
    return [eval_result(cfg, texts, achs, sets, a) for a in achieved]


# ----------------------------------------------------------------------------- the Python driver


def evaluate_python_policy(policy: Callable, cfg: EvalConfig = EvalConfig(), seed: int = 0,
                           env_kwargs: dict | None = None) -> EvalResult:
    """Evaluate any Python policy on a fresh :class:`InstructionCraftax` (the SB3 agents' driver).

    Not SB3's ``evaluate_policy`` (a mean episode return): this runs the protocol above.

    Args:
        policy: ``policy(obs: dict[str, np.ndarray], state, episode_start: np.ndarray) ->
            (actions, state)``; ``state`` is whatever the policy keeps (e.g. LSTM states),
            ``None`` at the start.
        seed: seeds the worlds (derive it from the run's seed).
        env_kwargs: extra keyword arguments of the env (``obs_mode``, ``encoder``...).
    """
    from oir_gym.vector_env import InstructionCraftax

    texts, achs, sets = eval_instructions(cfg)
    n = len(texts) * cfg.episodes
    env = InstructionCraftax(num_envs=n, terminate_on_success=False, max_episode_steps=cfg.horizon + 1,
                             seed=seed, **(env_kwargs or {}))
    env.register_instructions(texts, achs)
    env_texts = [t for t in texts for _ in range(cfg.episodes)]
    obs, _ = env.reset(seed=seed, options={"instruction": env_texts})
    alive = np.ones(n, bool)
    records = np.full((n, *RECORD_SHAPE), -1, np.int32)  # the JAX driver's records (RECORD_SHAPE)
    first, after = records[:, 0], records[:, 1:]
    state, start = None, np.ones(n, bool)
    for t in range(cfg.horizon):
        actions, state = policy(obs, state, start)
        obs, _, term, trunc, info = env.step(np.asarray(actions))
        now = np.asarray(info["achievements"], bool) & alive[:, None]
        after[(after < 0) & (first >= 0)[:, :, None] & now[:, None, :]] = t
        first[(first < 0) & now] = t
        alive &= ~(term | trunc)
        start = np.zeros(n, bool)
        if not alive.any():
            break
    env.close()
    return eval_result(cfg, texts, achs, sets, records)
