"""Plots and tables from run directories (``metrics.jsonl``, ``eval_*.json``).

Works on any run directory written by ``examples/train_pqn.py`` or ``examples/train_sb3.py``;
several runs (seeds, methods) are aggregated as mean +- standard error. The figures a researcher
looks at first (:func:`success_figure`, :func:`gain_figure`, :func:`relabeling_figure`,
:func:`training_figure`, :func:`instruction_bars_figure`) are pure functions of metrics rows (or
evaluation dicts) that return a matplotlib Figure; :func:`write_overview_plots` writes them
as PNGs into every run directory at the end of a run and for ``examples/analyze_runs.py``.
:func:`caption_frame` writes an instruction onto a video frame (``examples/record_video.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from oir_gym.metrics import bootstrap_ci, mean_and_stderr

EVAL_METRICS = ("mean_success_rate", "num_completed", "aggregate_score")
#: Set-level metrics of the evaluation's control (``eval/control/<set>/<metric>``; see oir_gym.evaluation).
CONTROL_METRICS = ("gain", "gain_neutral", "mismatched_mean_success_rate", "neutral_mean_success_rate")


def _figure(ncols: int = 1, figsize: tuple[float, float] = (7, 4)):
    """A figure of its own with ``ncols`` axes. Built from :class:`matplotlib.figure.Figure` with no
    pyplot: no global figure registry and no backend switch, so plotting from a notebook leaves its
    backend and figures alone."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(1, ncols)


def _save(fig, out: str | Path) -> Path:
    """Lay out and write a figure (every plot of this module is written the same way)."""
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return Path(out)


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file; for repeated ``update`` values (a resumed run) the last row wins."""
    rows: dict[int, dict] = {}
    extra: list[dict] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        if "update" in r:
            rows[int(r["update"])] = r
        else:
            extra.append(r)
    return [rows[k] for k in sorted(rows)] + extra


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """Rows (dicts with possibly different keys) as a CSV file with the union of keys."""
    import csv

    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return Path(path)


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


def metrics_path(run: str | Path) -> Path:
    """``run/metrics.jsonl`` for a run directory; a ``.jsonl`` file is taken as it is."""
    p = Path(run)
    return p / "metrics.jsonl" if p.is_dir() else p


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
    from oir_gym.instructions import SET_NAMES

    seen = dict.fromkeys(s for seeds in results.values() for r in seeds for s in r)
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


def plot_learning_curves(runs: dict[str, Sequence[str | Path | list[dict]]], out: str | Path,
                         set_name: str = "original") -> Path:
    """Eval metrics vs env steps, one line per method, s.e. bands over seeds (runs and in-run seeds).

    ``runs[method]`` lists run directories, ``metrics.jsonl`` files or metrics rows already read
    (:func:`read_jsonl`); several are pooled as seeds.
    """
    fig, axes = _figure(3, (15, 4))
    for label, paths in runs.items():
        steps, curves = pooled_curves([d if isinstance(d, list) else read_jsonl(metrics_path(d)) for d in paths],
                                      set_name)
        if len(steps) == 0:
            continue
        for ax, m in zip(axes, EVAL_METRICS):
            stacked = curves[m]  # [n, seeds]
            mean, se = mean_and_stderr(stacked.T, axis=0)
            mean, se = np.atleast_1d(mean), np.atleast_1d(se)
            ax.plot(steps, mean, marker="o", label=label)
            ax.fill_between(steps, mean - se, mean + se, alpha=0.2)
    for ax, m in zip(axes, EVAL_METRICS):
        ax.set_title(f"{m.replace('_', ' ')} ({set_name})")
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(fig, out)


#: Below this many points a line also marks each point: a one-point series (an SB3 smoke run logs its
#: loss once) draws nothing without a marker.
MARKER_BELOW = 40


def _marker(n: int) -> str | None:
    return "." if n < MARKER_BELOW else None


def training_figure(metrics: list[dict]):
    """Loss, training success, epsilon and throughput vs env steps for one run, one axes per logged key
    (titled with it); a short series is drawn with a marker on every point. Rows that log none of the
    keys give one axes with a note saying so."""
    keys = [k for k in ("loss", "train/success_rate", "train/reward_per_step", "curriculum/unpayable_step_frac",
                        "epsilon", "sps") if any(k in r and "env_steps" in r for r in metrics)]
    fig, axes = _grid(max(len(keys), 1), max(len(keys), 1), (4.0, 3.2))
    if not keys:
        _note(axes[0], "no training metrics logged (loss, train/success_rate, epsilon, sps)")
    rows = [r for r in metrics if "env_steps" in r]
    for ax, k in zip(axes, keys):
        steps, vals = zip(*[(r["env_steps"], r[k]) for r in rows if k in r])
        ax.plot(steps, vals, marker=_marker(len(steps)))
        ax.set_title(k)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    return fig


def plot_training(metrics: list[dict], out: str | Path) -> Path:
    """Write :func:`training_figure` to ``out``."""
    return _save(training_figure(metrics), out)


def instruction_bars_figure(results: dict[str, Iterable[dict]], set_name: str = "original",
                            episodes: int | None = None):
    """Per-instruction success rates, one bar group per instruction, one bar per method, titled with the
    set, its number of instructions, the seeds per method and (when given) the episodes per instruction.

    ``results[method]`` is a list of evaluation dicts (one per seed) as written by
    :meth:`oir_gym.evaluation.EvalResult.to_dict`. Results without ``set_name`` (a run that
    evaluated only the sets of its instruction files: ``--eval.sets`` empty) plot their first set.
    """
    results = {m: list(r) for m, r in results.items()}
    methods = list(results)
    first = results[methods[0]]
    if set_name not in first[0]:
        set_name = next(iter(first[0]))
    texts = first[0][set_name]["texts"]
    fig, ax = _figure(1, (max(10, len(texts) * 0.6), 4.5))
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(texts))
    for i, m in enumerate(methods):
        rates = np.array([r[set_name]["rates"] for r in results[m]])
        mean, se = mean_and_stderr(rates, axis=0)
        ax.bar(x + i * width, np.atleast_1d(mean), width, yerr=np.atleast_1d(se) if len(rates) > 1 else None,
               label=f"{m} ({len(rates)} seed{'s' * (len(rates) != 1)})")
    ax.set_xticks(x + width * (len(methods) - 1) / 2)
    ax.set_xticklabels(texts, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    eps = f", {episodes} episode{'s' * (episodes != 1)} per instruction" if episodes is not None else ""
    n = len(texts)
    ax.set_title(f"success per instruction: set '{set_name}' ({n} instruction{'s' * (n != 1)}{eps})")
    return fig


def plot_instruction_bars(results: dict[str, Iterable[dict]], out: str | Path, set_name: str = "original",
                          episodes: int | None = None) -> Path:
    """Write :func:`instruction_bars_figure` to ``out``."""
    return _save(instruction_bars_figure(results, set_name, episodes), out)


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


def read_instruction_list(path: str | Path) -> list[str]:
    """Instruction texts of a run's ``instructions.json`` / ``goals.json`` (or a plain JSON list)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data.get("items", [])
    return [d["text"] if isinstance(d, dict) else str(d) for d in data]


def plot_tsne(groups: dict[str, Sequence[str]], out: str | Path, encoder=None, seed: int = 0,
              reference: Sequence[str] | None = None) -> Path:
    """t-SNE of instruction embeddings, one colour per group (e.g. OIR vs ELLM), with the 22
    achievements (``reference``, default :data:`oir_gym.instructions.ORIGINAL_INSTRUCTIONS`) marked."""
    from sklearn.manifold import TSNE

    from oir_gym.encoder import get_encoder
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

    enc = encoder or get_encoder()
    reference = list(reference or ORIGINAL_INSTRUCTIONS)
    names, texts = [], []
    for g, ts in list(groups.items()) + [("achievements", reference)]:
        for t in dict.fromkeys(ts):
            names.append(g)
            texts.append(t)
    if len(texts) < 5:
        raise ValueError(f"need at least 5 instructions for a t-SNE, got {len(texts)}")
    emb = enc.encode(texts)
    xy = TSNE(n_components=2, perplexity=min(30, max(2, len(texts) // 4)), random_state=seed, init="pca").fit_transform(emb)
    fig, ax = _figure(1, (7, 6))
    for g in dict.fromkeys(names):
        idx = [i for i, n in enumerate(names) if n == g]
        marker, size = ("*", 120) if g == "achievements" else ("o", 18)
        ax.scatter(xy[idx, 0], xy[idx, 1], s=size, marker=marker, label=f"{g} ({len(idx)})", alpha=0.8)
    ax.legend()
    ax.set_title("instructions in embedding space (t-SNE)")
    return _save(fig, out)


def plot_metric_vs_param(values: dict[str, list[dict]], out: str | Path, set_name: str = "original",
                         xlabel: str = "delta") -> Path:
    """Final metrics (mean +- s.e. over seeds) against a swept parameter (e.g. the delta ablation)."""
    xs = list(values)
    fig, axes = _figure(3, (13, 3.6))
    for ax, k in zip(axes, EVAL_METRICS):
        stats = [mean_and_stderr(np.array([r[set_name][k] for r in values[x]], dtype=float)) for x in xs]
        ax.errorbar(range(len(xs)), [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=4)
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs)
        ax.set_xlabel(xlabel)
        ax.set_title(f"{k.replace('_', ' ')} ({set_name})")
        ax.grid(alpha=0.3)
    return _save(fig, out)


def plot_threshold_confusion(curves: dict[str, dict[str, Sequence[float]]], deltas: Sequence[float],
                             out: str | Path) -> Path:
    """Recall and wrongly rewarded events against delta, one line per instruction set.

    ``curves[set_name]`` holds the ``recall`` and ``wrong_per_instruction`` arrays of
    :func:`oir_gym.reward.threshold_confusion`.
    """
    fig, axes = _figure(2, (10, 3.6))
    titles = {"recall": "own event rewarded (fraction of instructions)",
              "wrong_per_instruction": "other events rewarded (per instruction)"}
    for ax, (key, title) in zip(axes, titles.items()):
        for name, c in curves.items():
            ax.plot(deltas, c[key], marker="o", label=name)
        ax.set_xlabel("delta")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend()
    return _save(fig, out)


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


def plot_time_to_target(runs: dict[str, Sequence[list[dict]]], out: str | Path, target: float | None = None,
                        set_name: str = "original") -> Path:
    """Mean success (over seeds, s.e. band) against wall-clock seconds, one line per method."""
    fig, ax = _figure(1, (7, 4))
    for name, rs in runs.items():
        times, _, vals = time_curves(rs, set_name)
        if len(times) == 0:
            continue
        mean, se = mean_and_stderr(vals.T, axis=0)
        mean, se = np.atleast_1d(mean), np.atleast_1d(se)
        ax.plot(times / 60, mean, marker=".", label=name)
        ax.fill_between(times / 60, mean - se, mean + se, alpha=0.2)
    if target is not None:
        ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target:.2f}")
    ax.set_xlabel("wall clock (min, compile included)")
    ax.set_ylabel(f"mean success ({set_name})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


# ----------------------------------------------------------------------------- the plots a run writes
#: Evaluation success of a set (``eval/<set>/mean_success_rate``, per seed ``seed<s>/eval/...``).
_SUCCESS_KEY = re.compile(r"^(?:seed\d+/)?eval/([^/]+)/mean_success_rate$")
#: The instruction-following gain of a set's control (asked - mismatched; ``oir_gym.evaluation``).
_GAIN_KEY = re.compile(r"^(?:seed\d+/)?eval/control/([^/]+)/gain$")

#: Where the relabeling panel reads each quantity, in order of preference: ``(key, how, what)``.
#: ``how`` is ``"value"`` (logged per update) or ``"increment"`` (a running count, differenced).
RELABEL_ROWS = (("relabel/rows", "value", "PQN: rows per seed"),
                ("relabel/rows_added", "increment", "SB3: transitions per metrics row"))
RELABEL_NOVELTY = (("relabel/new_instructions", "value", "texts offered to a buffer for the first time"),
                   ("ellm/distinct_goals", "increment", "goals proposed for the first time"),
                   ("relabel/buffer_inserted", "increment", "SB3: texts written to the buffer per metrics row"))


def _ordered_sets(runs: Iterable[list[dict]], pattern: re.Pattern) -> list[str]:
    """Set names some key of some row matches, the built-in sets first, then the others as found."""
    from oir_gym.instructions import SET_NAMES

    seen = dict.fromkeys(m.group(1) for rows in runs for r in rows for k in r if (m := pattern.match(k)))
    return [s for s in SET_NAMES if s in seen] + [s for s in seen if s not in SET_NAMES]


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


def save_figure(fig, out: str | Path) -> Path:
    """Lay out a figure and write it (PNG by ``out``'s suffix); returns ``out`` as a Path."""
    return _save(fig, out)


def _grid(n: int, ncols: int = 3, cell: tuple[float, float] = (4.6, 3.4)):
    """A pyplot-free figure with ``n`` axes, ``ncols`` to a row (see :func:`_figure`)."""
    from matplotlib.figure import Figure

    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig = Figure(figsize=(cell[0] * ncols, cell[1] * nrows))
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def _band(ax, steps: np.ndarray, vals: np.ndarray, label: str, color: str | None = None, ls: str = "-") -> None:
    """The mean over the columns of ``vals [n, k]`` (seeds or runs) as a line, ± its standard error as a
    band when k > 1; points where some column is NaN (nothing logged there) are left out."""
    keep = np.isfinite(vals).all(axis=1)
    steps, vals = np.asarray(steps)[keep], vals[keep]
    if len(steps) == 0:
        return
    mean, se = mean_and_stderr(vals.T, axis=0)
    mean, se = np.atleast_1d(mean), np.atleast_1d(se)
    (line,) = ax.plot(steps, mean, marker=_marker(len(steps)), label=label, color=color, ls=ls)
    if vals.shape[1] > 1:
        ax.fill_between(steps, mean - se, mean + se, alpha=0.2, color=line.get_color())


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey", wrap=True)


def _per_set_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str], key: str,
                    ylim: tuple[float, float] | None, ylabel: str, title: str):
    """One axes per set, one line per method (mean over seeds, ± s.e. band), y fixed to ``ylim``
    (None: :func:`symmetric_limits` of what each axes holds)."""
    fig, axes = _grid(len(sets))
    for ax, s in zip(axes, sets):
        for i, (label, rows) in enumerate(runs.items()):  # a method keeps its colour on every axes
            steps, vals = pooled_points(rows, key.format(s))
            if len(steps):
                _band(ax, steps, vals, f"{label} ({vals.shape[1]} seed{'s' * (vals.shape[1] != 1)})", f"C{i}")
        if ylim is None or ylim[0] < 0:
            ax.axhline(0, color="grey", lw=0.8, ls="--", label="_zero")
        if not [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]:
            _note(ax, "not evaluated")
        ax.set_title(s)
        ax.set_xlabel("env steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    for ax in axes:  # each set on its own scale: a set's small gains stay readable beside another's large ones
        ax.set_ylim(*(ylim or symmetric_limits([ax])))
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=11)
    return fig


#: The smallest half-span of :func:`symmetric_limits`: gains of a few hundredths stay readable without
#: noise of 0.001 filling the frame.
MIN_HALF_SPAN = 0.1


def symmetric_limits(axes, min_half: float = MIN_HALF_SPAN, cap: float = 1.0) -> tuple[float, float]:
    """``(-h, h)`` around 0 that holds every line and band drawn on ``axes`` with a 10% margin: ``h`` at
    least ``min_half`` and at most ``cap`` (a gain lies in [-1, 1]), rounded up to a multiple of 0.05."""
    top = 0.0
    for ax in axes:
        for ln in ax.get_lines():
            if not ln.get_label().startswith("_"):
                y = np.asarray(ln.get_ydata(), dtype=float)
                top = max(top, float(np.nanmax(np.abs(y), initial=0.0)))
        for coll in ax.collections:  # the ± s.e. bands
            for path in coll.get_paths():
                y = path.vertices[:, 1]
                top = max(top, float(np.nanmax(np.abs(y[np.isfinite(y)]), initial=0.0)))
    half = min(cap, max(min_half, np.ceil(top * 1.1 / 0.05 - 1e-9) * 0.05))
    return -float(half), float(half)


def success_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str] | None = None):
    """Mean success rate over training on every evaluated set, each on a y axis fixed to [0, 1].

    Args:
        runs: per method, the metrics rows of each run (:func:`read_jsonl`), pooled as seeds.
        sets: the sets, one axes each; default every set the rows evaluated (:func:`evaluated_sets`).

    Returns:
        A :class:`matplotlib.figure.Figure` (no pyplot): x env steps, one line per method, the mean
        over seeds with a ± standard-error band.

    Raises:
        ValueError: when no set is evaluated in the rows.
    """
    sets = list(sets) if sets is not None else evaluated_sets(r for rs in runs.values() for r in rs)
    if not sets:
        raise ValueError("no evaluation in these metrics rows (no eval/<set>/mean_success_rate key)")
    return _per_set_figure(runs, sets, "eval/{}/mean_success_rate", (0.0, 1.0), "mean success rate",
                           "success on every evaluated set (mean over seeds, band ± s.e.)")


def gain_figure(runs: dict[str, Sequence[list[dict]]], sets: Sequence[str] | None = None):
    """The instruction-following gain over training (success when asked for an achievement minus success
    when asked for another one, ``eval/control/<set>/gain``; docs/evaluation.md), one axes per set, with
    a dashed line at 0 (a policy that ignores its instruction). The y axis is symmetric around 0 and
    scaled to each set's data (:func:`symmetric_limits`: at least ±0.1, at most ±1), so gains of a few
    hundredths are not flattened.

    Args:
        runs: per method, the metrics rows of each run, pooled as seeds.
        sets: default every set whose evaluation has the control's gain (:func:`gain_sets`).

    Raises:
        ValueError: when no evaluation in the rows has the control.
    """
    sets = list(sets) if sets is not None else gain_sets(r for rs in runs.values() for r in rs)
    if not sets:
        raise ValueError("no instruction-following gain in these metrics rows (no eval/control/<set>/gain key: "
                         "the evaluation ran without its control, see docs/evaluation.md)")
    return _per_set_figure(runs, sets, "eval/control/{}/gain", None, "gain (asked - mismatched)",
                           "instruction-following gain (mean over seeds, band ± s.e.)")


def _series(rows: list[dict], key: str, how: str) -> tuple[np.ndarray, np.ndarray]:
    """``steps, values`` of one per-update metric of a run (``how="increment"``: a running count's steps;
    where the count dropped, a resumed process that counts from 0 again, its value is the step)."""
    pts = [(r["env_steps"], float(r[key])) for r in rows if key in r and "env_steps" in r]
    if not pts:
        return np.zeros(0), np.zeros(0)
    steps, vals = (np.asarray(a, dtype=float) for a in zip(*pts))
    if how == "increment":
        step = np.diff(vals, prepend=0.0)
        vals = np.where(step < 0, vals, step)
    return steps, vals


def _pooled_series(rows_list: Sequence[list[dict]], key: str, how: str = "value"):
    """:func:`_series` of several runs, ``steps [n], values [n, runs]``, cut to the shortest run."""
    series = [_series(rows, key, how) for rows in rows_list]
    n = min((len(s) for s, _ in series), default=0)
    if n == 0:
        return np.zeros(0), np.zeros((0, 0))
    return series[0][0][:n], np.stack([v[:n] for _, v in series], axis=1)


def _first_logged(rows_list: Sequence[list[dict]], specs) -> tuple[str, str, str] | None:
    """The first ``(key, how, what)`` of ``specs`` that every run logged."""
    for spec in specs:
        if rows_list and all(any(spec[0] in r for r in rows) for rows in rows_list):
            return spec
    return None


#: Per-update LLM keys of the PQN trainer's background relabeler (agents/pqn/oir_method.py).
LLM_IN_TIME, LLM_STALE, LLM_PENDING = "relabel/llm_results", "relabel/llm_stale", "relabel/llm_pending"
LLM_LATENCY, LLM_CALLS = "relabel/llm_latency_mean_s", "relabel/llm_calls"
GROUNDED_FRAC = "relabel/grounded_frac"


def has_relabeling(runs: Iterable[list[dict]]) -> bool:
    """Whether some run logged a quantity of the relabeling panel (:func:`relabeling_figure`)."""
    keys = ({k for k, _, _ in RELABEL_ROWS + RELABEL_NOVELTY}
            | {"relabel/llm_offer_share", "ellm/pinned_frac", GROUNDED_FRAC, LLM_IN_TIME, LLM_LATENCY})
    return any(k in r for rows in runs for r in rows for k in keys)


def _logs(rows_list: Sequence[list[dict]], key: str) -> bool:
    return _first_logged(rows_list, [(key, "", "")]) is not None


def relabeling_figure(runs: dict[str, Sequence[list[dict]]]):
    """What relabeling put into training, per update, from the metrics the trainers log.

    Six axes against env steps, one line per method (mean over its runs, ± s.e. band):

    * relabeled rows per update (``relabel/rows``, per seed; older SB3 runs: relabeled transitions);
    * where the instructions come from: the share of an update's buffer offers from the rules and
      from the LLM (``relabel/llm_offer_share``; the LLM's line only with an LLM relabeler; updates
      without relabeled rows are left out), and for ELLM the share of envs pinned to a proposer goal
      (``ellm/pinned_frac``), y fixed to [0, 1];
    * novelty: instructions new to the run per update (``relabel/new_instructions``: texts offered to a
      buffer for the first time; ELLM: goals proposed for the first time), with the run's final
      novelty share beyond the caption phrasings (``diversity/novelty_share``) in the label when logged;
    * the grounded fraction: the share of an update's relabeled candidates whose instruction the env's
      reward function pays on their trajectory (``relabel/grounded_frac``), y fixed to [0, 1];
    * LLM answers per update: in time to train on (``relabel/llm_results``), too late (stale: the
      increments of the running count ``relabel/llm_stale``) and still queued (``relabel/llm_pending``);
    * LLM latency: the mean seconds per call so far (``relabel/llm_latency_mean_s``), from the first
      update with a call (``relabel/llm_calls`` > 0).

    A quantity a run did not log leaves its axes with a note saying so.

    Raises:
        ValueError: when no run logged any of them (:func:`has_relabeling`).
    """
    if not has_relabeling(r for rs in runs.values() for r in rs):
        raise ValueError("no relabeling metrics in these metrics rows (relabel/rows, relabel/llm_offer_share, "
                         "relabel/new_instructions, ellm/...): a run without relabeling")
    fig, axes = _grid(6, 3, (5.0, 3.6))
    ax_rows, ax_src, ax_new, ax_grounded, ax_llm, ax_latency = axes
    for i, (label, rows_list) in enumerate(runs.items()):
        c = f"C{i}"  # a method's colour on every axes; the sources differ by line style
        spec = _first_logged(rows_list, RELABEL_ROWS)
        if spec:
            _band(ax_rows, *_pooled_series(rows_list, spec[0], spec[1]), f"{label} ({spec[2]})", c)
        if _logs(rows_list, "relabel/llm_offer_share"):
            steps, llm = _pooled_series(rows_list, "relabel/llm_offer_share")
            _, relabeled = _pooled_series(rows_list, "relabel/rows")
            if relabeled.shape == llm.shape:  # an update without relabeled rows offered nothing
                llm = np.where(relabeled > 0, llm, np.nan)
            _band(ax_src, steps, 1.0 - llm, f"{label}: rules", c)
            if any(LLM_IN_TIME in r for rows in rows_list for r in rows):  # an LLM relabeler ran
                _band(ax_src, steps, llm, f"{label}: LLM", c, "--")
        if _logs(rows_list, "ellm/pinned_frac"):
            _band(ax_src, *_pooled_series(rows_list, "ellm/pinned_frac"), f"{label}: proposer", c, ":")
        spec = _first_logged(rows_list, RELABEL_NOVELTY)
        if spec:
            final = [r["diversity/novelty_share"] for rows in rows_list for r in rows if "diversity/novelty_share" in r]
            share = f"; final novelty share {np.mean(final):.2f}" if final else ""
            _band(ax_new, *_pooled_series(rows_list, spec[0], spec[1]), f"{label} ({spec[2]}{share})", c)
        if _logs(rows_list, GROUNDED_FRAC):
            _band(ax_grounded, *_pooled_series(rows_list, GROUNDED_FRAC), label, c)
        if _logs(rows_list, LLM_IN_TIME):
            _band(ax_llm, *_pooled_series(rows_list, LLM_IN_TIME), f"{label}: in time", c)
            if _logs(rows_list, LLM_STALE):
                _band(ax_llm, *_pooled_series(rows_list, LLM_STALE, "increment"), f"{label}: stale", c, "--")
            if _logs(rows_list, LLM_PENDING):
                _band(ax_llm, *_pooled_series(rows_list, LLM_PENDING), f"{label}: queued", c, ":")
        if _logs(rows_list, LLM_LATENCY):
            steps, latency = _pooled_series(rows_list, LLM_LATENCY)
            _, calls = _pooled_series(rows_list, LLM_CALLS)
            if calls.shape == latency.shape:  # a mean of no call is not a latency of 0 s
                latency = np.where(calls > 0, latency, np.nan)
            _band(ax_latency, steps, latency, label, c)
    titles = {ax_rows: ("relabeled rows per update", "rows", "relabel/rows"),
              ax_src: ("instructions by source (share per update)", "share",
                       "relabel/llm_offer_share or ellm/pinned_frac"),
              ax_new: ("novelty: new instructions per update", "instructions", "relabel/new_instructions"),
              ax_grounded: ("grounded fraction of relabeled candidates", "fraction", GROUNDED_FRAC),
              ax_llm: ("LLM answers per update: in time, stale, queued", "answers", LLM_IN_TIME),
              ax_latency: ("LLM latency (mean per call so far)", "seconds", LLM_LATENCY)}
    for ax, (title, ylabel, key) in titles.items():
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=7)
        else:
            _note(ax, f"not logged by this run ({key})")
    for ax in (ax_src, ax_grounded):
        ax.set_ylim(0.0, 1.05)  # a share of 1 stays visible above the frame's edge
    return fig


def write_overview_plots(runs: dict[str, Sequence[list[dict]]], out_dir: str | Path) -> list[Path]:
    """Write the figures a researcher looks at first into ``out_dir``: ``success.png``
    (:func:`success_figure`), ``gain.png`` when the evaluation has the control (:func:`gain_figure`),
    ``relabeling.png`` when some run relabels (:func:`relabeling_figure`). Returns the paths written."""
    out = Path(out_dir)
    every = [r for rs in runs.values() for r in rs]
    figures = {"success.png": success_figure if evaluated_sets(every) else None,
               "gain.png": gain_figure if gain_sets(every) else None,
               "relabeling.png": relabeling_figure if has_relabeling(every) else None}
    return [save_figure(make(runs), out / name) for name, make in figures.items() if make is not None]


# ----------------------------------------------------------------------------- video frames
def caption_frame(frame: np.ndarray, text: str, font_size: int | None = None) -> np.ndarray:
    """``frame`` with ``text`` written in white on a dark translucent band across its top.

    The frame keeps its size (the band covers the top rows of the view); the text wraps at word
    boundaries to the frame's width and is cut with ``...`` past a third of its height.

    Args:
        frame: an ``[H, W, 3]`` uint8 RGB image (an env's ``rgb_array`` render).
        text: the caption, e.g. the episode's instruction.
        font_size: pixels; default ``max(8, W // 20)`` (14 px on a 288-px frame).

    Returns:
        A new ``[H, W, 3]`` uint8 array.
    """
    from PIL import Image, ImageDraw, ImageFont

    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"frame must be an [H, W, 3] uint8 RGB image, got shape {arr.shape} and dtype {arr.dtype}")
    h, w = arr.shape[:2]
    size = font_size or max(8, w // 20)
    try:
        font = ImageFont.load_default(size=size)  # a scalable font (Pillow >= 10.1 with FreeType)
    except (TypeError, ImportError, OSError):
        font = ImageFont.load_default()
    img = Image.fromarray(arr).convert("RGBA")
    draw = ImageDraw.Draw(img)
    pad = max(2, size // 4)
    lines: list[str] = []
    for word in " ".join(text.split()).split(" "):
        if lines and draw.textlength(f"{lines[-1]} {word}", font=font) <= w - 2 * pad:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    line_h = size + pad
    max_lines = max(1, (h // 3) // line_h)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] += " ..."
    band = Image.new("RGBA", img.size, (0, 0, 0, 0))
    ImageDraw.Draw(band).rectangle([0, 0, w, len(lines) * line_h + pad], fill=(0, 0, 0, 170))
    img = Image.alpha_composite(img, band)
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * line_h), line, fill=(255, 255, 255, 255), font=font)
    return np.asarray(img.convert("RGB"))
