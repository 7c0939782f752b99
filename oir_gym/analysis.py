"""Plots and tables from run directories (``metrics.jsonl``, ``eval_*.json``).

Works on any run directory written by ``examples/train_pqn.py`` or ``examples/train_sb3.py``;
several runs (seeds, methods) are aggregated as mean +- standard error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from oir_gym.metrics import mean_and_stderr

EVAL_METRICS = ("mean_success_rate", "num_completed", "aggregate_score")


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


def plot_learning_curves(runs: dict[str, Sequence[str | Path]], out: str | Path, set_name: str = "original") -> Path:
    """Eval metrics vs env steps, one line per method, s.e. bands over seeds (runs and in-run seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for label, dirs in runs.items():
        series = []
        for d in dirs:
            steps, curves = eval_curves(read_jsonl(Path(d) / "metrics.jsonl"), set_name)
            series.append((steps, curves))
        if not series or len(series[0][0]) == 0:
            continue
        n = min(len(s[0]) for s in series)
        steps = series[0][0][:n]
        for ax, m in zip(axes, EVAL_METRICS):
            stacked = np.concatenate([s[1][m][:n] for s in series], axis=1)  # [n, seeds]
            mean, se = mean_and_stderr(stacked.T, axis=0)
            mean, se = np.atleast_1d(mean), np.atleast_1d(se)
            ax.plot(steps, mean, label=label)
            ax.fill_between(steps, mean - se, mean + se, alpha=0.2)
    for ax, m in zip(axes, EVAL_METRICS):
        ax.set_title(f"{m.replace('_', ' ')} ({set_name})")
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_training(metrics: list[dict], out: str | Path) -> Path:
    """Loss, epsilon, training success and throughput vs env steps for one run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("loss", "train/success_rate", "train/reward_per_step", "epsilon", "sps") if any(k in r for r in metrics)]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    axes = np.atleast_1d(axes)
    rows = [r for r in metrics if "env_steps" in r]
    for ax, k in zip(axes, keys):
        pts = [(r["env_steps"], r[k]) for r in rows if k in r]
        ax.plot(*zip(*pts))
        ax.set_title(k)
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def plot_instruction_bars(results: dict[str, Iterable[dict]], out: str | Path, set_name: str = "original") -> Path:
    """Per-instruction success rates, one bar group per instruction, one bar per method.

    ``results[method]`` is a list of evaluation dicts (one per seed) as written by
    :meth:`oir_gym.evaluation.EvalResult.to_dict`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(results)
    first = next(iter(results.values()))
    first = list(first)
    texts = first[0][set_name]["texts"]
    fig, ax = plt.subplots(figsize=(max(10, len(texts) * 0.6), 4.5))
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(texts))
    for i, m in enumerate(methods):
        rates = np.array([r[set_name]["rates"] for r in results[m]])
        mean, se = mean_and_stderr(rates, axis=0)
        ax.bar(x + i * width, np.atleast_1d(mean), width, yerr=np.atleast_1d(se) if len(rates) > 1 else None, label=m)
    ax.set_xticks(x + width * (len(methods) - 1) / 2)
    ax.set_xticklabels(texts, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)
