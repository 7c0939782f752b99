"""Numbers from metrics rows and evaluation dicts: pooled curves, per-seed summaries, markdown tables."""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from oir_gym.metrics import bootstrap_ci, mean_and_stderr

EVAL_METRICS = ("mean_success_rate", "num_completed", "aggregate_score")
#: Set-level metrics of the evaluation's control (``eval/control/<set>/<metric>``; see oir_gym.evaluation).
CONTROL_METRICS = ("gain", "gain_neutral", "mismatched_mean_success_rate", "neutral_mean_success_rate")


def eval_curves(metrics: list[dict], set_name: str = "original", seed_keys: bool = True):
    """``steps, {metric: [n_points, n_seeds]}`` from evaluation rows of one run."""
    pts = [r for r in metrics if any(k.startswith(f"eval/{set_name}/") or k.startswith(f"seed0/eval/{set_name}/")
                                      for k in r)]
    steps = np.array([r["env_steps"] for r in pts])
    out = {}
    for m in EVAL_METRICS:
        vals = []
        for r in pts:
            seeds = sorted(k for k in r if k.endswith(f"/eval/{set_name}/{m}") and k.startswith("seed"))
            vals.append([r[k] for k in seeds] if seeds and seed_keys else [r.get(f"eval/{set_name}/{m}", np.nan)])
        out[m] = np.array(vals, dtype=float)
    return steps, out


def pooled_curves(runs: Sequence[list[dict]], set_name: str = "original"):
    """Evaluation curves of several runs of one method, pooled as seeds.

    ``runs`` holds the metrics rows of each run (:func:`read_jsonl`). Runs are cut to the number of
    evaluation points they all have (a run stopped early shortens the pool).

    Returns:
        ``steps [n_points], {metric: [n_points, n_seeds]}`` (seeds of all the runs side by side).
    """
    series = [eval_curves(rows, set_name) for rows in runs]
    n = min((len(s[0]) for s in series), default=0)
    if n == 0:
        return np.zeros(0), {m: np.zeros((0, 0)) for m in EVAL_METRICS}
    return series[0][0][:n], {m: np.concatenate([s[1][m][:n] for s in series], axis=1) for m in EVAL_METRICS}


def curve_means(runs: Sequence[list[dict]], set_name: str = "original", min_step: float = 0.0,
                max_step: float = float("inf")) -> dict[str, np.ndarray]:
    """Each seed's mean over its periodic evaluations: a normalised area under the learning curve.

    One end-of-run evaluation is a single noisy point (4 episodes per instruction move a rate in
    steps of 0.25); the mean over every evaluation of the run summarises the whole curve with far
    less noise, and rewards learning early as well as ending high.

    Args:
        runs: metrics rows of each run of one method (pooled as seeds, see :func:`pooled_curves`).
        set_name: the instruction set.
        min_step, max_step: keep the evaluation points between these env steps (inclusive), e.g.
            ``max_step`` to compare a short run with the early part of long ones.

    Returns:
        ``{metric: [n_seeds]}``.

    Raises:
        ValueError: when no evaluation point is left.
    """
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
    """``steps [n_points], values [n_points, n_seeds]`` of one logged evaluation metric of one run.

    ``key`` is a metric key such as ``"eval/original/mean_success_rate"`` or
    ``"eval/control/original/gain"``; per-seed values (``seed<s>/<key>``) are used where the run
    logged them, else the run-level value (one column).
    """
    pts = [r for r in rows if key in r or f"seed0/{key}" in r]
    if not pts:
        return np.zeros(0), np.zeros((0, 0))
    steps = np.array([r["env_steps"] for r in pts])
    vals = []
    for r in pts:
        seeds = [k for k in r if k.startswith("seed") and k.partition("/")[2] == key]
        seeds.sort(key=lambda k: int(k.split("/")[0][4:]))
        vals.append([r[k] for k in seeds] if seeds else [r[key]])
    if len({len(v) for v in vals}) > 1:
        raise ValueError(f"'{key}' has a different number of seeds at different evaluations")
    return steps, np.array(vals, dtype=float).reshape(len(pts), -1)


def last_evals_means(runs: Sequence[list[dict]], key: str, k: int = 5, max_step: float = float("inf")) -> np.ndarray:
    """Each seed's mean over its last ``k`` evaluations of ``key`` (up to ``max_step`` env steps).

    A steadier end-of-run summary than the final point alone (one evaluation of 4 episodes per
    instruction moves a rate in steps of 0.25), still about the end of training, unlike
    :func:`curve_means`. Each run keeps its own last ``k`` points (all of them when it has fewer:
    :func:`last_evals_count` says how many); the seeds of all the runs are pooled.

    Returns:
        ``[n_seeds]``; empty when no run logged ``key``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out = []
    for rows in runs:
        steps, vals = metric_points(rows, key)
        vals = vals[steps <= max_step]
        if len(vals):
            out.append(vals[-k:].mean(axis=0))
    return np.concatenate(out) if out else np.zeros(0)


def last_evals_count(runs: Sequence[list[dict]], key: str, k: int = 5, max_step: float = float("inf")) -> int:
    """How many evaluations :func:`last_evals_means` averages: ``k``, or fewer where a run has fewer (the
    smallest over the runs that logged ``key``; 0 when none did)."""
    counts = [int((metric_points(rows, key)[0] <= max_step).sum()) for rows in runs]
    counts = [c for c in counts if c]
    return min([k, *counts]) if counts else 0


def final_values(results: Sequence[dict], set_name: str, metric: str) -> np.ndarray:
    """Per-seed values of one metric from evaluation dicts (:meth:`EvalResult.to_dict`, one per seed).

    ``metric`` is one of :data:`EVAL_METRICS`, or ``"control/<m>"`` for a control metric (NaN for a
    seed without it: an evaluation made before the control existed, or a set without a mismatched
    condition).
    """
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
    """Distinct ``names``: the built-in sets first, then the others as found."""
    from oir_gym.instructions import SET_NAMES

    seen = dict.fromkeys(names)
    return [s for s in SET_NAMES if s in seen] + [s for s in seen if s not in SET_NAMES]


def final_and_last_table(finals: dict[str, Sequence[dict]], runs: dict[str, Sequence[list[dict]]],
                         sets: Sequence[str] = ("original", "simple", "complex"), k: int = 5,
                         max_step: float = float("inf")) -> str:
    """Markdown table: per method and set, the final point beside the mean of the last ``k`` evaluations.

    Cells are the mean over seeds with its 95% percentile bootstrap interval over seeds
    (:func:`oir_gym.metrics.bootstrap_ci`); "last: evaluations" is how many evaluations the last-k
    mean holds (fewer than ``k`` for a short run). Columns for the instruction-following gain (asked -
    mismatched, :mod:`oir_gym.evaluation`) are added when some run has it.

    Args:
        finals: per method, the per-seed evaluation dicts of the final point (``eval_final.json``).
        runs: per method, the metrics rows of each run (the periodic evaluations).
        k: how many of the last evaluations to average.
        max_step: ignore evaluations after this many env steps.
    """
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
    """Markdown table of the evaluation's control at the final point, per method and set.

    Success when asked for the achievement, under the mismatched and the neutral instruction, and the
    two gains with their 95% bootstrap intervals over seeds. Empty string when no evaluation has a control.
    """
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
    """``mean ± s.e.`` over seeds of the three evaluation metrics, as table cells."""
    cells = []
    for k in EVAL_METRICS:
        mean, se = mean_and_stderr(np.asarray(per_seed[k], dtype=float))
        cells.append(f"{mean:.3f} ± {se:.3f}" if k != "num_completed" else f"{mean:.1f} ± {se:.1f}")
    return " | ".join(cells)


def final_table(results: dict[str, list[dict]], sets: Sequence[str] = ("original", "simple", "complex")) -> str:
    """Markdown table: per method and set, mean +- s.e. over seeds of the three metrics.

    ``results[method]`` is the list of per-seed evaluation dicts of ``eval_final.json``.
    """
    lines = ["| method | set | mean success rate | completed instructions | aggregate score |", "|---|---|---|---|---|"]
    for m, seeds in results.items():
        for s in sets:
            if s not in seeds[0]:
                continue
            lines.append(f"| {m} | {s} | {_metric_cells({k: [r[s][k] for r in seeds] for k in EVAL_METRICS})} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- wall clock
def cumulative_time(rows: Sequence[dict], exclude_eval: bool = False) -> np.ndarray:
    """Wall-clock seconds of each metrics row since the run first started, across resumes.

    A row's ``time`` counts from the start of the process that wrote it (compile included); a
    resumed process starts again from 0, so each drop adds the previous row's time as an offset.
    (The time a process spent after its last row, e.g. its final checkpoint, is not counted.)
    ``exclude_eval``: training time only, less the periodic evaluations before each row (a row's
    ``time/eval_s`` is the evaluation run after its ``time`` was taken; rows written before that
    column existed count as 0).
    """
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
    """Evaluation points of several runs of one method against wall clock.

    Returns ``times [n], steps [n], values [n, seeds]``: at each evaluation point (the runs are cut
    to the points they all have, as in :func:`pooled_curves`) the mean wall-clock seconds of the
    runs (runs made side by side on different cards), the env steps, and every seed's value.
    """
    per = []
    for rows in runs:
        t = cumulative_time(rows, exclude_eval)
        idx = [i for i, r in enumerate(rows) if any(k.startswith(f"eval/{set_name}/") or
                                                    k.startswith(f"seed0/eval/{set_name}/") for k in r)]
        per.append(t[idx])
    steps, curves = pooled_curves(runs, set_name)
    n = len(steps)
    times = np.mean([p[:n] for p in per], axis=0) if n else np.zeros(0)
    return times, steps, curves[metric]


def time_to_target_table(runs: dict[str, Sequence[list[dict]]], target: float, budget_s: float,
                         set_name: str = "original") -> str:
    """Markdown: per method, the first evaluation whose seed-mean success reaches ``target`` (its
    wall clock, its training time without the periodic evaluations, and env steps) and the best
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


#: Evaluation success of a set (``eval/<set>/mean_success_rate``, per seed ``seed<s>/eval/...``).
_SUCCESS_KEY = re.compile(r"^(?:seed\d+/)?eval/([^/]+)/mean_success_rate$")
#: The instruction-following gain of a set's control (asked - mismatched; ``oir_gym.evaluation``).
_GAIN_KEY = re.compile(r"^(?:seed\d+/)?eval/control/([^/]+)/gain$")

def _ordered_sets(runs: Iterable[list[dict]], pattern: re.Pattern) -> list[str]:
    """Set names some key of some row matches, the built-in sets first, then the others as found."""
    return _builtin_first(m.group(1) for rows in runs for r in rows for k in r if (m := pattern.match(k)))


def evaluated_sets(runs: Iterable[list[dict]]) -> list[str]:
    """Every instruction set the runs' metrics rows hold an evaluation of (``eval/<set>/mean_success_rate``):
    the built-in sets first, then user sets (``compound``, ``own_words``...) in the order they appear."""
    return _ordered_sets(runs, _SUCCESS_KEY)


def gain_sets(runs: Iterable[list[dict]]) -> list[str]:
    """The sets whose evaluation logged the instruction-following gain (``eval/control/<set>/gain``)."""
    return _ordered_sets(runs, _GAIN_KEY)


def pooled_points(runs: Sequence[list[dict]], key: str):
    """``steps [n], values [n, seeds]`` of one logged metric (:func:`metric_points`) over several runs
    of one method, their seeds side by side; cut to the points every run has (none when one lacks it)."""
    series = [metric_points(rows, key) for rows in runs]
    n = min((len(s) for s, _ in series), default=0)
    if n == 0:
        return np.zeros(0), np.zeros((0, 0))
    return series[0][0][:n], np.concatenate([v[:n] for _, v in series], axis=1)

