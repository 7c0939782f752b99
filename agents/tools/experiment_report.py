"""The tables and verdicts of the pre-registered experiments, rebuilt from their run folders.

    python -m agents.tools.experiment_report mixed results/mixed_arm      # docs/experiments/mixed-arm.md
    python -m agents.tools.experiment_report stone results/stone_tier     # docs/experiments/stone-tier.md
    python -m agents.tools.experiment_report stone results/stone_tier --plot docs/img/stone_tier.png

A folder holds one run directory per process, ``<arm>_s<first seed>``, each with ``eval_final.json`` and
``metrics.jsonl(.gz)``. Arm differences are 95% Welch t intervals with the seed and with the process as the
unit; pooled success counts use Fisher's exact test.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from agents.tools.analyze_runs import finite_t_cell, welch_cell
from oir_gym.analysis.runs import metrics_path, read_jsonl
from oir_gym.metrics import welch_interval

#: The wooden tier's achievements (the stone tier's prerequisites).
WOODEN_TIER = ("collect wood", "place table", "make wooden pickaxe", "make wooden sword")


def arm_runs(root: str | Path) -> dict[str, list[Path]]:
    """``arm -> its process folders`` (``<arm>_s<first seed>``) under ``root``, in name order."""
    arms: dict[str, list[Path]] = {}
    for run in sorted(p for p in Path(root).iterdir() if p.is_dir() and re.fullmatch(r".+_s\d+", p.name)):
        arms.setdefault(run.name.rsplit("_s", 1)[0], []).append(run)
    if not arms:
        raise FileNotFoundError(f"{root}: no run folders named <arm>_s<seed>")
    return arms


def load_arms(root: str | Path) -> dict[str, list[list[dict]]]:
    """``arm -> [per process: [per seed: evaluation dict]]`` of the run folders under ``root``."""
    return {arm: [json.loads((run / "eval_final.json").read_text()) for run in runs]
            for arm, runs in arm_runs(root).items()}


def arm_metrics(root: str | Path) -> dict[str, list[list[dict]]]:
    """``arm -> [per process: its metrics rows]`` (``metrics.jsonl`` or ``metrics.jsonl.gz``), read once."""
    return {arm: [read_jsonl(metrics_path(run)) for run in runs] for arm, runs in arm_runs(root).items()}


def set_success(seed: dict, set_name: str, text: str | None = None) -> float:
    """Mean success of one seed on a set, or its success rate on one instruction of it."""
    s = seed[set_name]
    return float(s["mean_success_rate"] if text is None else s["rates"][s["texts"].index(text)])


def per_seed(arm: list[list[dict]], fn) -> tuple[np.ndarray, np.ndarray]:
    """``fn(seed)`` per seed (all processes pooled) and per process (the mean of its seeds)."""
    procs = [np.array([fn(s) for s in proc], float) for proc in arm]
    return np.concatenate(procs), np.array([p.mean() for p in procs])


def comparison_table(arms: dict, pairs: list[tuple[str, str]], measures: list[tuple[str, object]]) -> str:
    """Per measure: each arm's mean [95% t], then each pair's difference by seed and by process."""
    names = list(arms)
    head = ["measure", *[f"{a} ({sum(len(p) for p in arms[a])} seeds)" for a in names],
            *[f"{a} - {b} (seeds)" for a, b in pairs], *[f"{a} - {b} (processes)" for a, b in pairs]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, fn in measures:
        vals = {a: per_seed(arms[a], fn) for a in names}
        cells = [finite_t_cell(vals[a][0]) for a in names]
        cells += [welch_cell(vals[a][0], vals[b][0]) for a, b in pairs]
        cells += [welch_cell(vals[a][1], vals[b][1]) for a, b in pairs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


MIXED_SETS = ("original", "simple", "complex", "heldout", "own_words", "ordered")


def mixed_verdict(arms: dict) -> str:
    """The primary endpoint of docs/experiments/mixed-arm.md: mixed - canonical on heldout."""
    held = {a: per_seed(arms[a], lambda s: set_success(s, "heldout"))[0] for a in ("mixed", "canonical")}
    orig = {a: per_seed(arms[a], lambda s: set_success(s, "original"))[0] for a in ("mixed", "canonical")}
    d, low, high = welch_interval(held["mixed"], held["canonical"])
    guard = float(orig["mixed"].mean() - orig["canonical"].mean())
    verdict = "support" if low > 0 and guard >= -0.03 else "refute" if high < 0.02 else "inconclusive"
    return (f"primary (heldout, mixed - canonical, seeds): {d:+.3f} [{low:+.3f}, {high:+.3f}]; "
            f"original-set guard {guard:+.3f}: **{verdict}**")


def mixed_report(root: str | Path) -> str:
    arms = load_arms(root)
    arms = {a: arms[a] for a in ("canonical", "mixed", "diverse", "gt") if a in arms}
    measures = [(f"{s} success", (lambda s: lambda seed: set_success(seed, s))(s)) for s in MIXED_SETS]
    measures += [(f"{s} gain", (lambda s: lambda seed: float(seed[s]["control"]["gain"]))(s))
                 for s in ("original", "heldout")]
    pairs = [("mixed", "canonical"), ("diverse", "canonical"), ("diverse", "gt")]
    return mixed_verdict(arms) + "\n\n" + comparison_table(arms, pairs, measures)


STONE_TEXTS = ("collect stone", "place stone", "make stone pickaxe")


def final_episodes(root: str | Path) -> int:
    """The episodes per instruction of the final evaluation, the same in every run under ``root``."""
    n = {json.loads((run / "config.json").read_text())["eval"]["final_episodes"]
         for runs in arm_runs(root).values() for run in runs}
    if len(n) != 1:
        raise ValueError(f"{root}: runs with different eval.final_episodes {sorted(n)}")
    return int(n.pop())


def pooled_counts(arm: list[list[dict]], text: str, episodes: int) -> tuple[int, int]:
    """Successes and episodes of one original-set instruction, pooled over an arm's seeds."""
    succ = sum(int(round(set_success(seed, "original", text) * episodes)) for proc in arm for seed in proc)
    return succ, episodes * sum(len(proc) for proc in arm)


def fisher_p(a: tuple[int, int], b: tuple[int, int]) -> float:
    """Two-sided Fisher's exact p of successes/episodes ``a`` against ``b``."""
    from scipy.stats import fisher_exact

    return float(fisher_exact([[a[0], a[1] - a[0]], [b[0], b[1] - b[0]]])[1])


def stone_report(root: str | Path, metrics: dict[str, list[list[dict]]] | None = None) -> str:
    """The stone tier's tables; ``metrics``: :func:`arm_metrics` of ``root`` when already read."""
    arms, n = load_arms(root), final_episodes(root)
    lines = ["| instruction (original set) | canonical successes / episodes | progress successes / episodes | "
             "Fisher p |", "|---|---|---|---|"]
    primary = ""
    for text in STONE_TEXTS + WOODEN_TIER:
        c, p = pooled_counts(arms["canonical"], text, n), pooled_counts(arms["progress"], text, n)
        pv = fisher_p(p, c)
        lines.append(f"| {text} | {c[0]} / {c[1]} | {p[0]} / {p[1]} | {pv:.3g} |")
        if text == "collect stone":
            rate = p[0] / p[1]
            ok = rate >= 0.10 and p[0] / p[1] > c[0] / c[1] and pv < 0.05
            primary = (f"primary (collect stone, pooled): progress {p[0]}/{p[1]} = {rate:.3f}, canonical "
                       f"{c[0]}/{c[1]}, Fisher p = {pv:.3g}: **"
                       + ("support: progress labels open the stone tier" if ok else "not reached at this budget") + "**")
    guard = comparison_table({a: arms[a] for a in ("progress", "canonical")}, [("progress", "canonical")],
                             [("original success", lambda s: set_success(s, "original"))])
    return primary + "\n\n" + "\n".join(lines) + "\n\n" + guard + "\n\n" + rates_table(metrics or arm_metrics(root))


#: The events of the stone tier's chain whose training rates the report shows.
CHAIN_EVENTS = ("make_wood_pickaxe", "see_stone", "face_stone", "face_stone_with_pickaxe", "near_table_with_wood",
                "collect_stone", "place_stone", "near_table_with_wood_and_stone", "make_stone_pickaxe")


def rates_table(metrics: dict[str, list[list[dict]]], last: int = 100) -> str:
    """Training rate per 1,000 env steps of the chain's events, mean over each arm's last ``last`` updates."""
    rates = training_rates(metrics, CHAIN_EVENTS)
    arms = sorted(rates)
    lines = [f"| event (rate per 1,000 env steps, last {last} updates) | " + " | ".join(arms) + " |",
             "|---|" + "---|" * len(arms)]
    lines += [f"| {e} | " + " | ".join(f"{rates[a][e][1][-last:].mean():.4f}" for a in arms) + " |"
              for e in CHAIN_EVENTS]
    return "\n".join(lines)


def training_rates(metrics: dict[str, list[list[dict]]],
                   events: tuple[str, ...]) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """``arm -> event -> (env steps, the processes' mean training rate per 1,000 steps)``."""
    out: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for arm, run_rows in metrics.items():
        rows = [[r for r in rs if "rate/collect_wood" in r] for rs in run_rows]
        steps = np.array([r["env_steps"] for r in rows[0]], float)
        out[arm] = {e: (steps, np.mean([[r[f"rate/{e}"] for r in rs] for rs in rows], axis=0)) for e in events}
    return out


def plot_stone_tier(metrics: dict[str, list[list[dict]]], out: str | Path) -> Path:
    """The chain's training rates, one panel per arm, at ``out``; the learning curves at ``<out>_curves.png``."""
    from matplotlib.figure import Figure

    from oir_gym.analysis import plot_learning_curves, save_figure

    events = ("collect_wood", *(e for e in CHAIN_EVENTS if e != "near_table_with_wood_and_stone"))
    rates = training_rates(metrics, events)
    fig = Figure(figsize=(6 * len(rates), 4.5))
    axes = fig.subplots(1, len(rates), sharey=True, squeeze=False)
    for ax, (arm, ev) in zip(axes[0], sorted(rates.items())):
        for e in events:
            steps, r = ev[e]
            ax.plot(steps / 1e6, np.maximum(r, 1e-3), label=e)
        ax.set_yscale("log")
        ax.set_title(f"{arm}: training rates (mean of processes)")
        ax.set_xlabel("env steps per seed (M)")
    axes[0][0].set_ylabel("events per 1,000 env steps (floor 0.001)")
    axes[0][-1].legend(fontsize=7)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    plot_learning_curves(metrics, Path(out).with_name(Path(out).stem + "_curves.png"))
    return save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agents.tools.experiment_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", choices=("mixed", "stone"))
    ap.add_argument("root", help="the experiment's results folder")
    ap.add_argument("--plot", help="stone: write the training-rate curves to this PNG")
    args = ap.parse_args(argv)
    try:
        metrics = arm_metrics(args.root) if args.experiment == "stone" else None  # read once: tables and plots
        report = mixed_report(args.root) if metrics is None else stone_report(args.root, metrics)
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report)
    if args.plot and metrics is not None:
        print(f"wrote {plot_stone_tier(metrics, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
