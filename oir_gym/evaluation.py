"""The evaluation protocol of the paper (Sec. 5) plus its control (``docs/evaluation.md``), shared by the
agents: :func:`evaluate_jax` runs it in one jitted scan (PQN), :func:`evaluate_python_policy` for any policy (SB3).
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
from oir_gym.captions import NUM_ACHIEVEMENTS
from oir_gym.instructions import (
    PACKAGED_SET_NAMES, SET_NAMES, EvalInstruction, load_instruction_files, load_instruction_sets,
)
from oir_gym.metrics import LEARNED_THRESHOLD, control_summary, following_gain, paraphrase_retention, summarize
from oir_gym.prerequisites import PREREQUISITES, related_achievements  # noqa: F401  (PREREQUISITES: re-exported)
from oir_gym.validation import check_bool, check_int, check_str, check_str_sequence

#: The neutral instruction of the control: it names no task (the choice: docs/evaluation.md).
NEUTRAL_TEXT = "no instruction"

#: Set name of the neutral episodes (':' is not allowed in user set names).
NEUTRAL_SET = "control:neutral"

#: Keeps evaluation worlds apart from anything else made from the seed.
EVAL_KEY_SALT = 0x0E7A1


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings: ``sets`` (packaged or user set names; every set of ``instruction_files`` is
    evaluated too), ``episodes`` per instruction, ``horizon`` steps, ``control`` (also measure each
    achievement under a mismatched and the ``neutral_text`` instruction). ValueError for a bad value or file."""

    sets: tuple[str, ...] = SET_NAMES
    episodes: int = 2
    horizon: int = 300
    instruction_files: tuple[str, ...] = ()
    control: bool = True
    neutral_text: str = NEUTRAL_TEXT
    _user_sets: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        files = self.instruction_files
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
    """``EvalConfig(instruction_files=..., **kwargs)``, a trainer's evaluation config; ValueError for a bad file."""
    return EvalConfig(instruction_files=instruction_files, **kwargs)


def related(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether two targets (achievement-index tuples) share an achievement or one needs the other."""
    return any(related_achievements(x, y) for x in a for y in b)


def mismatch_pairing(targets: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], tuple[int, ...]]:
    """``{target: partner}``, the control's fixed derangement of the distinct targets (docs/evaluation.md);
    empty for fewer than 2 distinct targets."""
    return dict(_pairing(tuple(sorted(set(tuple(t) for t in targets)))))


@lru_cache(maxsize=64)
def _pairing(uniq: tuple[tuple[int, ...], ...]) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    from scipy.optimize import linear_sum_assignment

    n = len(uniq)
    if n < 2:
        return ()
    big = n + 1  # more than the worst allowed assignment (n related pairs)
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
    """Per instruction, the index of the one given in its mismatched condition: the k-th instruction of
    target A gets the (k mod m)-th of the m of its partner's; ``None`` for fewer than 2 distinct targets."""
    pairing = mismatch_pairing(targets)
    if not pairing:
        return None
    by_target: dict[tuple[int, ...], list[int]] = {}
    rank = []
    for i, t in enumerate(targets):
        rank.append(len(by_target.setdefault(tuple(t), [])))
        by_target[tuple(t)].append(i)
    partners = [by_target[pairing[tuple(t)]] for t in targets]
    return [p[r % len(p)] for p, r in zip(partners, rank)]


def eval_key(seed: int, index: int = 0, update: int = 0) -> jax.Array:
    """The key of one evaluation (worlds, policy noise) of a run's ``seed``, its ``index`` and ``update``."""
    key = jax.random.PRNGKey(EVAL_KEY_SALT)
    for name, v in (("seed", seed), ("index", index), ("update", update)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= int(v) < 2**32:
            raise ValueError(f"eval_key: {name} must be an integer in [0, 2**32), got {v!r}")
        key = jax.random.fold_in(key, int(v))
    return key


def eval_keys(seed: int, num_seeds: int, update: int = 0) -> jax.Array:
    """``[num_seeds, 2]`` keys of :func:`eval_key` for the seeds ``0..num_seeds-1`` of a run."""
    return jnp.stack([eval_key(seed, s, update) for s in range(num_seeds)])


#: An episode's int32 record: row 0, the first step of each achievement (-1: never); row ``1 + a``,
#: column ``b``, the first step of ``b`` with ``a`` done at an earlier step. Steps after death do not count.
RECORD_SHAPE: tuple[int, int] = (1 + NUM_ACHIEVEMENTS, NUM_ACHIEVEMENTS)


def _outcomes(records: np.ndarray, target: tuple[int, ...], ordered: bool, horizon: int) -> np.ndarray:
    """``[episodes]`` success of ``target`` from records within ``horizon`` steps."""
    step = records[:, 1 + target[0], target[1]] if ordered else records[:, 0, list(target)]
    ok = (step >= 0) & (step < horizon)
    return ok if ordered else ok.all(axis=1)


@dataclass
class ControlResult:
    """The control conditions of one set, aligned with its instructions (fields: docs/evaluation.md)."""

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
    """Per-set results aligned with ``texts[set]``: ``rates``, ``achievements`` (-1 for one scored by
    several, ``targets``), ``ordered`` and the ``control`` conditions (when run)."""

    texts: dict[str, list[str]] = field(default_factory=dict)
    achievements: dict[str, list[int]] = field(default_factory=dict)
    rates: dict[str, np.ndarray] = field(default_factory=dict)
    targets: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    control: dict[str, ControlResult] = field(default_factory=dict)
    ordered: dict[str, list[bool]] = field(default_factory=dict)

    def summary(self) -> dict[str, dict[str, float]]:
        return {s: summarize(r) for s, r in self.rates.items()}

    def retention(self, learned: float = LEARNED_THRESHOLD) -> dict[str, dict[str, float | int | None]]:
        """``{set: {"retention": value or None, "learned": n}}`` of every single-achievement set vs ``original``."""
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
        """Per set: :func:`oir_gym.metrics.control_summary`, plus ``order_gain`` and ``reverse_mean_success_rate``."""
        out = {}
        for s, c in self.control.items():
            out[s] = control_summary(self.rates[s], c.mismatched_rates, c.neutral_rates)
            gains = c.order_gains(self.rates[s])
            if gains is not None and np.isfinite(gains).any():
                out[s]["order_gain"] = float(np.nanmean(gains))
                out[s]["reverse_mean_success_rate"] = float(np.nanmean(c.reverse_rates))
        return out

    def flat_metrics(self) -> dict[str, float]:
        """``{"eval/original/mean_success_rate": ..., "eval/control/original/gain": ...}`` for logging."""
        out = {f"eval/{s}/{k}": float(v) for s, m in self.summary().items() for k, v in m.items()}
        for s, m in self.retention().items():
            if m["retention"] is not None:
                out[f"eval/{s}/retention"] = float(m["retention"])
            out[f"eval/{s}/retention_learned"] = float(m["learned"])
        out.update({f"eval/control/{s}/{k}": float(v) for s, m in self.control_summary().items() for k, v in m.items()})
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
        """Summary, control and retention tables, and per-instruction tables (not for paraphrase sets)."""
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


def _plan(cfg: EvalConfig) -> tuple[list[str], list[int], list[str], list[EvalInstruction]]:
    plan = [(s, ins) for s, items in cfg.instruction_sets().items() for ins in items]
    if cfg.control:
        plan.append((NEUTRAL_SET, EvalInstruction(cfg.neutral_text, -1, NEUTRAL_SET)))
    items = [ins for _, ins in plan]
    return [i.text for i in items], [i.achievement_index for i in items], [s for s, _ in plan], items


def eval_instructions(cfg: EvalConfig) -> tuple[list[str], list[int], list[str]]:
    """Texts, achievement indices and set names of every instruction an evaluation gives (last: the neutral one)."""
    texts, achs, sets, _ = _plan(cfg)
    return texts, achs, sets


def eval_result(cfg: EvalConfig, texts, achs, sets, achieved: np.ndarray) -> EvalResult:
    """The result from :func:`eval_instructions` (cfg) and instruction-major ``achieved``: records
    ``[n * episodes, 23, 22]`` or flags ``[n * episodes, 22]`` (not for ordered instructions)."""
    p_texts, _, p_sets, items = _plan(cfg)
    if list(texts) != p_texts or list(sets) != p_sets:
        raise ValueError("texts and sets must be eval_instructions(cfg) of this config")
    n = len(texts) * cfg.episodes
    rec = np.asarray(achieved)
    if rec.shape == (n, NUM_ACHIEVEMENTS):
        if any(ins.ordered for ins in items):
            raise ValueError("ordered instructions (\"X then Y\") are scored from episode records [n, 23, 22] "
                             "(make_jax_evaluator's output), not from bare achievement flags")
        flags = rec.astype(bool)
        rec = np.full((n, *RECORD_SHAPE), -1, np.int32)
        rec[:, 0] = np.where(flags, 0, -1)  # all at step 0: no order known
    elif rec.shape != (n, *RECORD_SHAPE):
        raise ValueError(f"achieved must be [n_instructions * episodes, {NUM_ACHIEVEMENTS}] = "
                         f"[{n}, {NUM_ACHIEVEMENTS}] flags or [{n}, {RECORD_SHAPE[0]}, {RECORD_SHAPE[1]}] records, "
                         f"got {rec.shape}")
    per = rec.reshape(len(texts), cfg.episodes, *RECORD_SHAPE)

    def rate(episodes: int, ins: EvalInstruction) -> float:
        h = min(cfg.horizon, ins.horizon or cfg.horizon)
        return float(_outcomes(per[episodes], ins.targets, ins.ordered, h).mean())

    neutral = p_sets.index(NEUTRAL_SET) if cfg.control else None
    # the first evaluated instruction of each ordered target (reversed: the first one wins), to find reverses
    by_order = {ins.targets: i for i, ins in reversed(list(enumerate(items))) if ins.ordered}
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


def eval_params(params: F.EnvParams, rows: np.ndarray, achievements: Sequence[int]) -> F.EnvParams:
    """Evaluation copy of env params: no termination on success, rows mapped to achievements."""
    table = params.table
    ach = jnp.asarray(table.achievement).at[jnp.asarray(rows)].set(jnp.asarray(achievements, jnp.int32))
    return params.replace(table=table.replace(achievement=ach), terminate_on_success=False)


def make_jax_evaluator(policy_step: Callable, init_carry: Callable, num_envs: int, horizon: int,
                       obs_mode: str = "paper"):
    """A jitted ``evaluate(key, policy_params, env_params, pinned_rows) -> records [num_envs, 23, 22]``;
    ``policy_step(policy_params, carry, obs, done, key) -> (carry, actions)``, ``init_carry(num_envs) -> carry``."""

    def evaluate(key, policy_params, env_params, pinned):
        k_reset, k_run = jax.random.split(key)
        obs, bstate = F.batch_reset(k_reset, env_params, num_envs, 1, pinned, obs_mode)

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


def evaluator_args(key, policy_params, env_params: F.EnvParams, rows: np.ndarray, cfg: EvalConfig, achs) -> tuple:
    """The arguments of a :func:`make_jax_evaluator` evaluator for :func:`eval_instructions` at table ``rows``."""
    if len(rows) != len(achs):
        raise ValueError(f"{len(rows)} rows for {len(achs)} instructions: register eval_instructions(cfg) and pass "
                         "their rows")
    return key, policy_params, eval_params(env_params, rows, achs), jnp.repeat(jnp.asarray(rows, jnp.int32),
                                                                               cfg.episodes)


def _jax_achieved(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray, cfg: EvalConfig,
                  achs) -> np.ndarray:
    return np.asarray(evaluator(*evaluator_args(key, policy_params, env_params, rows, cfg, achs)))


def evaluate_jax(evaluator, key, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                 cfg: EvalConfig, texts, achs, sets) -> EvalResult:
    """Run a :func:`make_jax_evaluator` evaluator on :func:`eval_instructions` (cfg) at their table ``rows``."""
    achieved = _jax_achieved(evaluator, key, policy_params, env_params, rows, cfg, achs)
    return eval_result(cfg, texts, achs, sets, achieved)


def evaluate_jax_seeds(evaluator, keys, policy_params, env_params: F.EnvParams, rows: np.ndarray,
                       cfg: EvalConfig, texts, achs, sets) -> list[EvalResult]:
    """:func:`evaluate_jax` for several policies: ``evaluator`` vmapped over key and policy parameters, which
    have a leading policy axis."""
    achieved = _jax_achieved(evaluator, keys, policy_params, env_params, rows, cfg, achs)
    return [eval_result(cfg, texts, achs, sets, a) for a in achieved]


def evaluate_python_policy(policy: Callable, cfg: EvalConfig = EvalConfig(), seed: int = 0,
                           env_kwargs: dict | None = None) -> EvalResult:
    """Evaluate ``policy(obs, state, episode_start) -> (actions, state)`` (``state``: its own, ``None`` at
    first) on a fresh :class:`InstructionCraftax` made with ``env_kwargs``."""
    from oir_gym.vector_env import InstructionCraftax

    texts, achs, sets = eval_instructions(cfg)
    n = len(texts) * cfg.episodes
    env = InstructionCraftax(num_envs=n, terminate_on_success=False, max_episode_steps=cfg.horizon + 1,
                             seed=seed, **(env_kwargs or {}))
    env.register_instructions(texts, achs)
    env_texts = [t for t in texts for _ in range(cfg.episodes)]
    obs, _ = env.reset(seed=seed, options={"instruction": env_texts})
    alive = np.ones(n, bool)
    records = np.full((n, *RECORD_SHAPE), -1, np.int32)
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
