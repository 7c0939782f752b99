"""Evaluation metrics of the paper (Sec. 5, "Evaluation Metrics"), as pure numpy functions.

Success rates are fractions in ``[0, 1]`` (not percentages), one per instruction:

* mean success rate: arithmetic mean of the rates;
* number of completed instructions: how many rates are ``> 0``;
* aggregate score: ``exp(mean(log(1 + s))) - 1``, a geometric-style mean that rewards progress
  on low-success instructions. By Jensen's inequality it lies in ``[0, mean success rate]``, with
  equality iff all rates are equal.

Seeds are aggregated with :func:`mean_and_stderr` (the paper's shaded areas are standard errors)
and, for confidence intervals, :func:`t_interval` (Student's t interval of the mean) or
:func:`bootstrap_ci` (scipy's percentile bootstrap); the difference of two arms' means with
:func:`welch_interval`.

Paraphrase retention (:func:`paraphrase_retention`): over the achievements a policy has learned
(success on the original wording at least :data:`LEARNED_THRESHOLD`), the mean of its success on a
paraphrase set's wordings of the achievement divided by its success on the original wording:
1 when paraphrases are followed as well as the original, 0 when not at all.

The control of the evaluation (:mod:`oir_gym.evaluation`) adds the instruction-following gain
(:func:`following_gain`, :func:`control_summary`): per instruction, its achievement's success rate
when asked for it minus the rate when asked for something else (a mismatched instruction, or the
neutral one). A policy that ignores its instruction has gains near 0 whatever it achieves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def _rates_array(rates: Any) -> np.ndarray:
    arr = np.asarray(rates, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"rates must be a 1-D array of per-instruction success rates, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("rates must contain at least one instruction")
    if np.isnan(arr).any():
        raise ValueError("rates must not contain NaN")
    if (arr < 0).any() or (arr > 1).any():
        bad = arr[(arr < 0) | (arr > 1)][0]
        hint = " (percentages? pass fractions)" if 1 < bad <= 100 else ""
        raise ValueError(f"success rates must lie in [0, 1], got {bad!r}{hint}")
    return arr


def _check_outcomes(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == bool:
        return arr.astype(np.float64)
    arr = arr.astype(np.float64)
    if np.isnan(arr).any():
        raise ValueError(f"{what} must not contain NaN")
    if not np.isin(arr, (0.0, 1.0)).all():
        raise ValueError(f"{what} must be booleans or 0/1, got a value {arr[~np.isin(arr, (0.0, 1.0))][0]!r}")
    return arr


def success_rates(successes: Mapping[str, Sequence[bool]] | np.ndarray | Sequence[Sequence[bool]]) -> np.ndarray:
    """Per-instruction success rates from per-episode outcomes.

    Args:
        successes: either ``{instruction: [bool per episode]}`` (rates in the mapping's order;
            episode counts may differ) or an array ``[n_instructions, n_episodes]`` of bool / 0-1.

    Returns:
        float64 array ``[n_instructions]`` in ``[0, 1]``.
    """
    if isinstance(successes, Mapping):
        if not successes:
            raise ValueError("successes must contain at least one instruction")
        out = []
        for name, eps in successes.items():
            arr = _check_outcomes(eps, f"successes[{name!r}]").reshape(-1)
            if arr.size == 0:
                raise ValueError(f"successes[{name!r}] has no episodes")
            out.append(arr.mean())
        return np.asarray(out, dtype=np.float64)
    arr = _check_outcomes(successes, "successes")
    if arr.ndim != 2:
        raise ValueError(f"successes must be a mapping or a 2-D [n_instructions, n_episodes] array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"successes needs >= 1 instruction and >= 1 episode, got shape {arr.shape}")
    return arr.mean(axis=1)


def mean_success_rate(rates: Any) -> float:
    """Arithmetic mean of per-instruction success rates."""
    return float(_rates_array(rates).mean())


def num_completed(rates: Any, eps: float = 0.0) -> int:
    """Number of instructions with success rate strictly greater than ``eps`` (paper: ``> 0``)."""
    return int((_rates_array(rates) > eps).sum())


def aggregate_score(rates: Any) -> float:
    """``exp(mean(log(1 + s))) - 1`` over per-instruction success rates ``s``."""
    # log1p/expm1 keep precision for tiny rates, where the score is what distinguishes methods.
    return float(np.expm1(np.mean(np.log1p(_rates_array(rates)))))


def summarize(rates: Any) -> dict[str, float | int]:
    """All three paper metrics: ``mean_success_rate``, ``num_completed``, ``aggregate_score``."""
    arr = _rates_array(rates)
    return {
        "mean_success_rate": mean_success_rate(arr),
        "num_completed": num_completed(arr),
        "aggregate_score": aggregate_score(arr),
    }


def mean_and_stderr(values: Any, axis: int = 0) -> tuple[Any, Any]:
    """Mean and standard error of the mean over seeds.

    Args:
        values: per-seed values, seeds along ``axis`` (e.g. ``[n_seeds]`` or ``[n_seeds, n_evals]``).
        axis: the seed axis.

    Returns:
        ``(mean, stderr)`` with ``stderr = std(ddof=1) / sqrt(n)``; floats for 1-D input, arrays
        otherwise. With a single seed the standard error is reported as 0 (no spread observed)
        rather than NaN, so curves can still be plotted.
    """
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 0 or arr.shape[axis] == 0:
        raise ValueError(f"values must have at least one seed along axis {axis}, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("values must be finite (no NaN or inf)")
    n = arr.shape[axis]
    mean = arr.mean(axis=axis)
    stderr = arr.std(axis=axis, ddof=1) / np.sqrt(n) if n > 1 else np.zeros_like(mean)
    if np.ndim(mean) == 0:
        return float(mean), float(stderr)
    return mean, stderr


def following_gain(asked: Any, control: Any) -> np.ndarray:
    """Per-instruction instruction-following gain: ``asked - control``, in ``[-1, 1]``.

    Args:
        asked: success rate of each instruction's achievement when the agent is asked for it.
        control: success rate of the same achievement when asked for something else (the
            mismatched or the neutral instruction), aligned with ``asked``.
    """
    a, c = _rates_array(asked), _rates_array(control)
    if a.shape != c.shape:
        raise ValueError(f"asked and control rates must be aligned, got {a.size} and {c.size} instructions")
    return a - c


def control_summary(asked: Any, mismatched: Any | None, neutral: Any) -> dict[str, float]:
    """Set-level control metrics.

    Returns:
        ``gain`` (mean of :func:`following_gain` against the mismatched condition, the headline:
        "success(A | asked for A) - success(A | asked for something else)") and
        ``mismatched_mean_success_rate``, both absent when ``mismatched`` is None (a set with one
        achievement has no mismatched instruction); ``gain_neutral`` and ``neutral_mean_success_rate``.
        The mean gain equals the difference of the mean success rates.
    """
    out: dict[str, float] = {}
    if mismatched is not None:
        out["gain"] = float(following_gain(asked, mismatched).mean())
        out["mismatched_mean_success_rate"] = mean_success_rate(mismatched)
    out["gain_neutral"] = float(following_gain(asked, neutral).mean())
    out["neutral_mean_success_rate"] = mean_success_rate(neutral)
    return out


def bootstrap_ci(values: Any, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                 statistic: Callable[..., Any] = np.mean) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of a statistic over seeds (``scipy.stats.bootstrap``).

    The percentile method, as rliable uses, is well defined for the few seeds RL runs have (BCa
    breaks down on 3 values); with n seeds only ``n**n`` resamples exist, so with 3 seeds the
    interval is close to the range of the seeds: read it as such. Deterministic given ``seed``.

    Args:
        values: one value per seed (1-D, finite).

    Returns:
        ``(low, high)``; ``(nan, nan)`` for a single seed (no interval without spread to resample).
    """
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array of per-seed values, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("values must be finite (no NaN or inf)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if arr.size < 2:
        return float("nan"), float("nan")
    if np.all(arr == arr[0]):  # no spread: every resample gives the same value
        v = float(statistic(arr))
        return v, v
    kwargs: dict[str, Any] = dict(confidence_level=confidence, n_resamples=n_resamples, method="percentile")
    try:
        res = stats.bootstrap((arr,), statistic, rng=np.random.default_rng(seed), **kwargs)
    except TypeError:  # scipy < 1.15 names the generator random_state
        res = stats.bootstrap((arr,), statistic, random_state=np.random.default_rng(seed), **kwargs)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def t_interval(values: Any, confidence: float = 0.95) -> tuple[float, float]:
    """Student's t confidence interval of the mean over seeds: ``mean -+ t_{n-1} * std(ddof=1) / sqrt(n)``.

    With the 3 seeds RL runs often have, the t quantile (4.30 at 95%) makes the interval about 4.3
    standard errors wide on each side: unlike the percentile bootstrap (:func:`bootstrap_ci`), which
    cannot leave the range of the seeds, it does not understate how little 3 values say.

    Args:
        values: one value per seed (1-D, finite).
        confidence: the interval's coverage, in ``(0, 1)``.

    Returns:
        ``(low, high)``; ``(nan, nan)`` for a single seed (no spread to estimate), ``(v, v)`` when
        every seed has the same value ``v``.
    """
    from scipy import stats

    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array of per-seed values, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("values must be finite (no NaN or inf)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if arr.size < 2:
        return float("nan"), float("nan")
    mean = float(arr.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size))
    return mean - half, mean + half


#: Success on an achievement's original instruction from which it counts as learned (paraphrase retention).
LEARNED_THRESHOLD = 0.25


def paraphrase_retention(original_rates: Any, original_achievements: Sequence[int], rates: Any,
                         achievements: Sequence[int], learned: float = LEARNED_THRESHOLD) -> float:
    """How much of its success on learned achievements a policy keeps when they are paraphrased.

    For each achievement ``a`` learned on the original set (``original_rates`` at ``a`` >=
    ``learned``) that the paraphrase set asks for: the mean success of the set's instructions of
    ``a`` divided by the original success of ``a``; the mean of those ratios (each learned
    achievement weighs the same, however many paraphrases it has). A ratio can exceed 1 (a
    paraphrase followed better than the original wording).

    Args:
        original_rates: per-instruction success on the original set (one instruction per achievement).
        original_achievements: the achievement index of each original instruction.
        rates: per-instruction success on the paraphrase set.
        achievements: the achievement index of each paraphrase instruction (several per achievement allowed).
        learned: the original success from which an achievement counts as learned (> 0).

    Returns:
        The retention, or NaN when no learned achievement is asked for in the paraphrase set.

    Raises:
        ValueError: rates outside [0, 1], misaligned inputs, an achievement twice in the original
            set, or ``learned`` outside (0, 1].
    """
    o, r = _rates_array(original_rates), _rates_array(rates)
    oa, ra = [int(a) for a in original_achievements], [int(a) for a in achievements]
    if len(oa) != o.size or len(ra) != r.size:
        raise ValueError(f"rates and achievements must be aligned: original {o.size} rates for {len(oa)} "
                         f"achievements, paraphrases {r.size} rates for {len(ra)} achievements")
    if len(set(oa)) != len(oa):
        raise ValueError("original_achievements: an achievement appears twice (the original set has one "
                         "instruction per achievement)")
    if not 0 < learned <= 1:
        raise ValueError(f"learned={learned} must be in (0, 1]")
    base = dict(zip(oa, o.tolist()))
    ratios = []
    for a in dict.fromkeys(ra):
        if base.get(a, 0.0) >= learned:
            para = float(np.mean([x for x, b in zip(r.tolist(), ra) if b == a]))
            ratios.append(para / base[a])
    return float(np.mean(ratios)) if ratios else float("nan")


def welch_interval(values: Any, baseline: Any, confidence: float = 0.95) -> tuple[float, float, float]:
    """Difference of two arms' means over seeds, ``mean(values) - mean(baseline)``, with Welch's t
    interval (unequal variances; Welch-Satterthwaite degrees of freedom).

    Args:
        values, baseline: one value per seed of each arm (1-D, finite, at least 2 each).

    Returns:
        ``(difference, low, high)``; ``low == high == difference`` when neither arm varies.
    """
    a, b = np.asarray(values, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    for name, arr in (("values", a), ("baseline", b)):
        if arr.ndim != 1 or arr.size < 2:
            raise ValueError(f"{name} must be a 1-D array of at least 2 per-seed values, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} must be finite (no NaN or inf)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    diff = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return diff, diff, diff
    from scipy import stats

    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, df) * np.sqrt(va + vb))
    return diff, diff - half, diff + half
