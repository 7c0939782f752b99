"""Evaluation metrics of the paper (Sec. 5, "Evaluation Metrics"), as pure numpy functions.

Success rates are fractions in ``[0, 1]`` (not percentages), one per instruction:

* mean success rate: arithmetic mean of the rates;
* number of completed instructions: how many rates are ``> 0``;
* aggregate score: ``exp(mean(log(1 + s))) - 1``, a geometric-style mean that rewards progress
  on low-success instructions. By Jensen's inequality it lies in ``[0, mean success rate]``, with
  equality iff all rates are equal.

Seeds are aggregated with :func:`mean_and_stderr` (the paper's shaded areas are standard errors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
