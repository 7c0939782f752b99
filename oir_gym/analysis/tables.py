"""Numbers from metrics rows and evaluation dicts: pooled curves, per-seed summaries, markdown tables."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from oir_gym.metrics import bootstrap_ci, mean_and_stderr

EVAL_METRICS = ("mean_success_rate", "num_completed", "aggregate_score")
#: Set-level metrics of the evaluation's control (``eval/control/<set>/<metric>``; see oir_gym.evaluation).
CONTROL_METRICS = ("gain", "gain_neutral", "mismatched_mean_success_rate", "neutral_mean_success_rate")


def _is_eval(row: dict, set_name: str) -> bool:
    return any(k.startswith((f"eval/{set_name}/", f"seed0/eval/{set_name}/")) for k in row)


def eval_curves(metrics: list[dict], set_name: str = "original"):
    """``steps, {metric: [n_points, n_seeds]}`` from evaluation rows of one run."""
    pts = [r for r in metrics if _is_eval(r, set_name)]
    out = {}
    for m in EVAL_METRICS:
        seeds = [sorted(k for k in r if k.endswith(f"/eval/{set_name}/{m}") and k.startswith("seed")) for r in pts]
        out[m] = np.array([[r[k] for k in ks] if ks else [r.get(f"eval/{set_name}/{m}", np.nan)]
                           for r, ks in zip(pts, seeds)], dtype=float)
    return np.array([r["env_steps"] for r in pts]), out


def pooled_curves(runs: Sequence[list[dict]], set_name: str = "original"):
    """``steps [n_points], {metric: [n_points, n_seeds]}`` of the metrics rows of several runs of one
    method, their seeds side by side, cut to the evaluation points they all have."""
    series = [eval_curves(rows, set_name) for rows in runs]
    n = min((len(s[0]) for s in series), default=0)
    if n == 0:
        return np.zeros(0), {m: np.zeros((0, 0)) for m in EVAL_METRICS}
    return series[0][0][:n], {m: np.concatenate([s[1][m][:n] for s in series], axis=1) for m in EVAL_METRICS}


def curve_means(runs: Sequence[list[dict]], set_name: str = "original", min_step: float = 0.0,
                max_step: float = float("inf")) -> dict[str, np.ndarray]:
    """``{metric: [n_seeds]}``: each seed's mean over its evaluations in ``[min_step, max_step]`` env steps
    (a normalised area under the learning curve); ValueError when no point is left."""
    steps, curves = pooled_curves(runs, set_name)
    keep = (steps >= min_step) & (steps <= max_step)
    if not keep.any():
        raise ValueError(f"no '{set_name}' evaluation between {min_step:g} and {max_step:g} env steps in these runs")
    return {m: curves[m][keep].mean(axis=0) for m in EVAL_METRICS}


def curve_mean_table(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str] = ("original", "simple", "complex"),
                     min_step: float = 0.0, max_step: float = float("inf")) -> str:
    """Markdown table of :func:`curve_means` per method and set: mean +- s.e. over seeds."""
    lines = ["| method | set | evaluations | mean success rate | completed instructions | aggregate score |",
             "|---|---|---|---|---|---|"]
    for m, rows in runs.items():
        for s in sets:
            steps, _ = pooled_curves(rows, s)
            n = int(((steps >= min_step) & (steps <= max_step)).sum())
            if n == 0:
                continue
            per_seed = curve_means(rows, s, min_step, max_step)
            lines.append(f"| {m} | {s} | {n} | {_metric_cells(per_seed)} |")
    return "\n".join(lines)


def metric_points(rows: list[dict], key: str):
    """``steps [n_points], values [n_points, n_seeds]`` of one logged metric ``key`` of one run (per-seed
    ``seed<s>/<key>`` where logged)."""
    pts = [r for r in rows if key in r or f"seed0/{key}" in r]
    if not pts:
        return np.zeros(0), np.zeros((0, 0))
    steps = np.array([r["env_steps"] for r in pts])
    vals = []
    for r in pts:
        seeds = sorted((k for k in r if k.startswith("seed") and k.partition("/")[2] == key),
                       key=lambda k: int(k.split("/")[0][4:]))
        vals.append([r[k] for k in seeds] if seeds else [r[key]])
    if len({len(v) for v in vals}) > 1:
        raise ValueError(f"'{key}' has a different number of seeds at different evaluations")
    return steps, np.array(vals, dtype=float).reshape(len(pts), -1)


def last_evals_means(runs: Sequence[list[dict]], key: str, k: int = 5, max_step: float = float("inf")) -> np.ndarray:
    """``[n_seeds]``: each seed's mean over its run's last ``k`` evaluations of ``key`` up to ``max_step``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    points = [metric_points(rows, key) for rows in runs]
    out = [v[s <= max_step][-k:].mean(axis=0) for s, v in points if len(v[s <= max_step])]
    return np.concatenate(out) if out else np.zeros(0)


def last_evals_count(runs: Sequence[list[dict]], key: str, k: int = 5, max_step: float = float("inf")) -> int:
    """How many evaluations :func:`last_evals_means` averages (the fewest over the runs that logged ``key``)."""
    counts = [int((metric_points(rows, key)[0] <= max_step).sum()) for rows in runs]
    counts = [c for c in counts if c]
    return min([k, *counts]) if counts else 0


def final_values(results: Sequence[dict], set_name: str, metric: str) -> np.ndarray:
    """Per-seed values of one of :data:`EVAL_METRICS` or ``"control/<m>"`` from evaluation dicts (NaN: absent)."""
    if metric.startswith("control/"):
        m = metric.split("/", 1)[1]
        return np.array([float(r[set_name].get("control", {}).get(m, np.nan)) if set_name in r else np.nan
                         for r in results])
    return np.array([float(r[set_name][metric]) if set_name in r else np.nan for r in results])


def ci_cell(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """``mean [low, high]`` with the 95% percentile bootstrap interval over seeds; ``-`` when absent."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0 or np.isnan(arr).any():
        return "-"
    low, high = bootstrap_ci(arr)
    ci = "n/a" if np.isnan(low) else f"{fmt.format(low)}, {fmt.format(high)}"
    return f"{fmt.format(arr.mean())} [{ci}]"


def set_names(results: dict[str, Sequence[dict]]) -> list[str]:
    """Every set some method's evaluation dicts hold: the built-in ones first, then user sets, in order."""
    return _builtin_first(s for seeds in results.values() for r in seeds for s in r)


def _builtin_first(names: Iterable[str]) -> list[str]:
    from oir_gym.instructions import SET_NAMES

    seen = dict.fromkeys(names)
    return [s for s in SET_NAMES if s in seen] + [s for s in seen if s not in SET_NAMES]


def final_and_last_table(finals: dict[str, Sequence[dict]], runs: dict[str, Sequence[list[dict]]],
                         sets: Sequence[str] = ("original", "simple", "complex"), k: int = 5,
                         max_step: float = float("inf")) -> str:
    """Markdown table: per method and set, the final point (``finals``: per-seed evaluation dicts) beside
    the mean of the last ``k`` evaluations of ``runs``, as :func:`ci_cell`; gain columns with the control."""
    gain_key = "eval/control/{}/gain"
    has_gain = any(np.isfinite(final_values(seeds, s, "control/gain")).any() for seeds in finals.values() for s in sets) \
        or any(len(last_evals_means(rows, gain_key.format(s), k, max_step)) for rows in runs.values() for s in sets)
    head = f"| method | set | seeds | final: mean success rate | last: evaluations | last {k}: mean success rate |"
    if has_gain:
        head += f" final: gain | last {k}: gain |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, seeds in finals.items():
        for s in sets:
            final = final_values(seeds, s, "mean_success_rate")
            if np.isnan(final).all():
                continue
            key = f"eval/{s}/mean_success_rate"
            last = last_evals_means(runs.get(m, []), key, k, max_step)
            n_last = last_evals_count(runs.get(m, []), key, k, max_step)
            row = f"| {m} | {s} | {len(final)} | {ci_cell(final)} | {n_last} | {ci_cell(last)} |"
            if has_gain:
                row += (f" {ci_cell(final_values(seeds, s, 'control/gain'), '{:+.3f}')} |"
                        f" {ci_cell(last_evals_means(runs.get(m, []), gain_key.format(s), k, max_step), '{:+.3f}')} |")
            lines.append(row)
    return "\n".join(lines)


def control_table(finals: dict[str, Sequence[dict]], sets: Sequence[str] = ("original", "simple", "complex")) -> str:
    """Markdown table of the final evaluation's control per method and set; empty without a control."""
    lines = ["| method | set | asked | mismatched | neutral | gain (asked - mismatched) | gain (asked - neutral) |",
             "|---|---|---|---|---|---|---|"]
    for m, seeds in finals.items():
        for s in sets:
            neutral = final_values(seeds, s, "control/neutral_mean_success_rate")
            if np.isnan(neutral).any():
                continue
            asked = final_values(seeds, s, "mean_success_rate")
            mism = final_values(seeds, s, "control/mismatched_mean_success_rate")
            mism_cell = "-" if np.isnan(mism).any() else f"{mism.mean():.3f}"
            lines.append(f"| {m} | {s} | {asked.mean():.3f} | {mism_cell} | {neutral.mean():.3f} | "
                         f"{ci_cell(final_values(seeds, s, 'control/gain'), '{:+.3f}')} | "
                         f"{ci_cell(final_values(seeds, s, 'control/gain_neutral'), '{:+.3f}')} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def _metric_cells(per_seed: dict[str, Sequence[float]]) -> str:
    stats = {k: mean_and_stderr(np.asarray(per_seed[k], dtype=float)) for k in EVAL_METRICS}
    return " | ".join(f"{m:.1f} ± {se:.1f}" if k == "num_completed" else f"{m:.3f} ± {se:.3f}"
                      for k, (m, se) in stats.items())


def final_table(results: dict[str, list[dict]], sets: Sequence[str] = ("original", "simple", "complex")) -> str:
    """Markdown table: per method and set, mean +- s.e. over the per-seed evaluation dicts ``results[method]``."""
    lines = ["| method | set | mean success rate | completed instructions | aggregate score |", "|---|---|---|---|---|"]
    for m, seeds in results.items():
        for s in sets:
            if s not in seeds[0]:
                continue
            lines.append(f"| {m} | {s} | {_metric_cells({k: [r[s][k] for r in seeds] for k in EVAL_METRICS})} |")
    return "\n".join(lines)


def cumulative_time(rows: Sequence[dict], exclude_eval: bool = False) -> np.ndarray:
    """Wall-clock seconds of each metrics row since the run first started, across resumes; ``exclude_eval``
    leaves out the periodic evaluations (``time/eval_s``)."""
    out, offset, last, last_value, evals = [], 0.0, 0.0, 0.0, 0.0
    for r in rows:
        t = float(r.get("time", np.nan))
        if t < last:  # a resumed process: its clock starts again
            offset += last_value
            evals = 0.0
        last, last_value = t, t - (evals if exclude_eval else 0.0)
        out.append(offset + last_value)
        evals += float(r.get("time/eval_s", 0.0))
    return np.asarray(out)


def time_curves(runs: Sequence[list[dict]], set_name: str = "original", metric: str = "mean_success_rate",
                exclude_eval: bool = False):
    """``times [n], steps [n], values [n, seeds]`` at the evaluation points of :func:`pooled_curves`."""
    per = [cumulative_time(rows, exclude_eval)[[i for i, r in enumerate(rows) if _is_eval(r, set_name)]]
           for rows in runs]
    steps, curves = pooled_curves(runs, set_name)
    n = len(steps)
    times = np.mean([p[:n] for p in per], axis=0) if n else np.zeros(0)
    return times, steps, curves[metric]


def time_to_target_table(runs: dict[str, Sequence[list[dict]]], target: float, budget_s: float,
                         set_name: str = "original") -> str:
    """Markdown: per method, the first evaluation whose seed-mean success reaches ``target`` and the best
    seed-mean success within ``budget_s`` seconds of wall clock."""
    lines = [f"| run | seeds | first eval >= {target:.2f} (wall s; training s without evaluations; env steps per "
             f"seed) | best within {budget_s:.0f} s wall (success, at s) | last eval (success, wall s) |",
             "|---|---|---|---|---|"]
    for name, rs in runs.items():
        times, steps, vals = time_curves(rs, set_name)
        train_times, _, _ = time_curves(rs, set_name, exclude_eval=True)
        if len(times) == 0:
            lines.append(f"| {name} | 0 | no evaluation | | |")
            continue
        mean = np.nanmean(vals, axis=1)
        hit = np.flatnonzero(mean >= target)
        first = (f"{times[hit[0]]:.0f} s; {train_times[hit[0]]:.0f} s; {steps[hit[0]]:,.0f}" if len(hit)
                 else "not reached")
        inside = np.flatnonzero(times <= budget_s)
        best = (f"{mean[inside].max():.3f} at {times[inside[np.argmax(mean[inside])]]:.0f} s" if len(inside)
                else "no evaluation")
        lines.append(f"| {name} | {vals.shape[1]} | {first} | {best} | {mean[-1]:.3f}, {times[-1]:.0f} s |")
    return "\n".join(lines)


_SUCCESS_KEY = re.compile(r"^(?:seed\d+/)?eval/([^/]+)/mean_success_rate$")
_GAIN_KEY = re.compile(r"^(?:seed\d+/)?eval/control/([^/]+)/gain$")


def _ordered_sets(runs: Iterable[list[dict]], pattern: re.Pattern) -> list[str]:
    return _builtin_first(m.group(1) for rows in runs for r in rows for k in r if (m := pattern.match(k)))


def evaluated_sets(runs: Iterable[list[dict]]) -> list[str]:
    """Every set the runs' rows hold an evaluation of, the built-in sets first, then user sets as found."""
    return _ordered_sets(runs, _SUCCESS_KEY)


def gain_sets(runs: Iterable[list[dict]]) -> list[str]:
    """The sets whose evaluation logged the instruction-following gain (``eval/control/<set>/gain``)."""
    return _ordered_sets(runs, _GAIN_KEY)


def pooled_points(runs: Sequence[list[dict]], key: str):
    """:func:`metric_points` of several runs of one method, seeds side by side, cut to the shortest."""
    return pool_series([metric_points(rows, key) for rows in runs])


def pool_series(series: Sequence[tuple[np.ndarray, np.ndarray]]):
    """``(steps, values)`` pairs side by side: ``steps [n], values [n, columns]``, cut to the shortest."""
    n = min((len(s) for s, _ in series), default=0)
    if n == 0:
        return np.zeros(0), np.zeros((0, 0))
    return series[0][0][:n], np.concatenate([v[:n].reshape(n, -1) for _, v in series], axis=1)

