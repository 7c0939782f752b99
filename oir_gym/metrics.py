"""Evaluation metrics of the paper (Sec. 5) as numpy functions of per-instruction success rates in ``[0, 1]``.

Mean success rate, number of completed instructions (rate ``> 0``) and the aggregate score
``exp(mean(log(1 + s))) - 1``; seed statistics (:func:`mean_and_stderr`, :func:`t_interval`,
:func:`bootstrap_ci`, :func:`welch_interval`); paraphrase retention and the control's
instruction-following gain (``docs/evaluation.md``).
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
    """Per-instruction success rates ``[n_instructions]`` from ``{instruction: [bool per episode]}``
    or an ``[n_instructions, n_episodes]`` array of bool / 0-1."""
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
    return float(np.expm1(np.mean(np.log1p(_rates_array(rates)))))


def summarize(rates: Any) -> dict[str, float | int]:
    """All three paper metrics: ``mean_success_rate``, ``num_completed``, ``aggregate_score``."""
    arr = _rates_array(rates)
    return {"mean_success_rate": mean_success_rate(arr), "num_completed": num_completed(arr),
            "aggregate_score": aggregate_score(arr)}


def mean_and_stderr(values: Any, axis: int = 0) -> tuple[Any, Any]:
    """``(mean, std(ddof=1) / sqrt(n))`` over the seeds along ``axis``; floats for 1-D input. One seed
    has a standard error of 0 (not NaN), so its curve can still be plotted."""
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
    """Per-instruction gain ``asked - control``: success of each instruction's achievement when asked for
    it minus when asked for something else (mismatched or neutral), aligned."""
    a, c = _rates_array(asked), _rates_array(control)
    if a.shape != c.shape:
        raise ValueError(f"asked and control rates must be aligned, got {a.size} and {c.size} instructions")
    return a - c


def control_summary(asked: Any, mismatched: Any | None, neutral: Any) -> dict[str, float]:
    """Set-level ``gain`` and ``mismatched_mean_success_rate`` (absent when ``mismatched`` is None),
    ``gain_neutral`` and ``neutral_mean_success_rate``."""
    out: dict[str, float] = {}
    if mismatched is not None:
        out["gain"] = float(following_gain(asked, mismatched).mean())
        out["mismatched_mean_success_rate"] = mean_success_rate(mismatched)
    out["gain_neutral"] = float(following_gain(asked, neutral).mean())
    out["neutral_mean_success_rate"] = mean_success_rate(neutral)
    return out


def _per_seed(values: Any, confidence: float) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"values must be a non-empty 1-D array of per-seed values, got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("values must be finite (no NaN or inf)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return arr


def bootstrap_ci(values: Any, confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0,
                 statistic: Callable[..., Any] = np.mean) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of a statistic over per-seed ``values``
    (``scipy.stats.bootstrap``; with 3 seeds close to their range); ``(nan, nan)`` for one seed."""
    from scipy import stats

    arr = _per_seed(values, confidence)
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
    """Student's t interval ``(low, high)`` of the mean of per-seed ``values``:
    ``mean -+ t_{n-1} * std(ddof=1) / sqrt(n)``; ``(nan, nan)`` for one seed."""
    from scipy import stats

    arr = _per_seed(values, confidence)
    if arr.size < 2:
        return float("nan"), float("nan")
    mean = float(arr.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, arr.size - 1) * arr.std(ddof=1) / np.sqrt(arr.size))
    return mean - half, mean + half


#: Success on an achievement's original instruction from which it counts as learned (paraphrase retention).
LEARNED_THRESHOLD = 0.25


def paraphrase_retention(original_rates: Any, original_achievements: Sequence[int], rates: Any,
                         achievements: Sequence[int], learned: float = LEARNED_THRESHOLD) -> float:
    """Mean over the achievements learned on the original set (success >= ``learned``) that the
    paraphrase set asks for of paraphrase success / original success; NaN when there is none.

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
    ratios = [float(np.mean([x for x, b in zip(r.tolist(), ra) if b == a])) / base[a]
              for a in dict.fromkeys(ra) if base.get(a, 0.0) >= learned]
    return float(np.mean(ratios)) if ratios else float("nan")


def welch_interval(values: Any, baseline: Any, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean(values) - mean(baseline), low, high)`` with Welch's t interval over per-seed values
    (at least 2 each); ``low == high`` when neither arm varies."""
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
