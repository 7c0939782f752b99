"""Rebuild the plots and tables of docs/results.md from run files.

    python examples/analyze_runs.py --runs gt=results/gpu_h200_1e7/gt oir=results/gpu_h200_1e7/oir#000750 --out docs/img

``NAME=PREFIX`` reads ``PREFIX_metrics.jsonl`` and ``PREFIX_eval_final.json``, or a run directory's
``metrics.jsonl`` and ``eval_final.json``; ``NAME=PREFIX#TAG`` reads ``eval_TAG.json`` instead (the
periodic evaluation at update TAG; the curves then stop there). A repeated NAME pools its runs as
seeds. Each table's heading says what it holds; ``kept`` is the share of original-set success kept on a
paraphrase set.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


from oir_gym import analysis
from oir_gym.metrics import paraphrase_retention, t_interval, welch_interval


def _files(prefix: str) -> tuple[Path, Path]:
    prefix, _, tag = prefix.partition("#")
    tag = tag or "final"
    p = Path(prefix)
    if p.is_dir():
        return p / "metrics.jsonl", p / f"eval_{tag}.json"
    return Path(f"{prefix}_metrics.jsonl"), Path(f"{prefix}_eval_{tag}.json")


def _pairs(items) -> dict[str, list[str]]:
    """``NAME=PATH`` items -> ``{NAME: [PATH, ...]}``; a repeated NAME collects several paths."""
    out: dict[str, list[str]] = {}
    for it in items or []:
        if "=" not in it:
            raise SystemExit(f"expected NAME=PATH, got {it!r}")
        k, v = it.split("=", 1)
        out.setdefault(k, []).append(v)
    return out


def _existing(path: Path, what: str) -> Path:
    """``path``, or exit with a message naming what is there instead (e.g. the evaluation tags)."""
    if path.exists():
        return path
    if "eval_" in path.name:
        stem = path.name.split("eval_")[0]
        tags = sorted(q.name[len(stem) + 5:-5] for q in path.parent.glob(f"{stem}eval_*.json"))
        hint = f"evaluations there: {', '.join('#' + t for t in tags)}" if tags else "no evaluation file there"
    else:
        hint = "give NAME=PREFIX with PREFIX_metrics.jsonl, or NAME=RUN_DIR"
    raise SystemExit(f"analyze_runs: no {what} {path}; {hint}")


def load_evals(prefixes: list[str]) -> list[dict]:
    """Per-seed evaluation dicts of one or more runs, pooled (the seeds of all the runs)."""
    return [seed for prefix in prefixes
            for seed in json.loads(_existing(_files(prefix)[1], "evaluation file").read_text())]


def load_metrics(prefixes: list[str]) -> list[list[dict]]:
    """Metrics rows of each run of one method."""
    return [analysis.read_jsonl(_existing(_files(prefix)[0], "metrics file")) for prefix in prefixes]


def _upto_tag(prefixes: list[str], metrics: list[list[dict]]) -> list[list[dict]]:
    """Each run's rows up to its tagged update (``#000750``: updates <= 750; other tags: all rows)."""
    tags = [p.partition("#")[2] for p in prefixes]
    return [[r for r in rows if not t.isdigit() or r.get("update", 0) <= int(t)] for t, rows in zip(tags, metrics)]


PARAPHRASE_SETS = ("simple", "complex")  # the built-in rewordings of the original set's 22 instructions


def _t_cell(values, fmt: str = "{:.3f}") -> str:
    """``mean [low, high]``, the 95% t interval over seeds; ``-`` when a value is missing."""
    arr = np.asarray(values, dtype=float)
    return finite_t_cell(arr, fmt) if arr.size and np.isfinite(arr).all() else "-"


def _has_gain(finals: dict[str, list[dict]], sets) -> bool:
    return any(np.isfinite(analysis.final_values(seeds, s, "control/gain")).any()
               for seeds in finals.values() for s in sets)


def t_summary_table(finals: dict[str, list[dict]], runs: dict[str, list[list[dict]]], sets: list[str],
                    k: int = 5, max_step: float = float("inf")) -> str:
    """Per method and set, 95% t intervals over seeds of the final, last-``k`` and whole-run success and more."""
    has_gain = _has_gain(finals, sets)
    head = (f"| method | set | seeds | final: success | last {k}: success | whole run: success | final: completed "
            "| final: aggregate | final: kept vs original |")
    if has_gain:
        head += f" final: gain | last {k}: gain |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for m, seeds in finals.items():
        original = analysis.final_values(seeds, "original", "mean_success_rate")
        for s in sets:
            final = analysis.final_values(seeds, s, "mean_success_rate")
            if np.isnan(final).all():
                continue
            rows = runs.get(m, [])
            last = analysis.last_evals_means(rows, f"eval/{s}/mean_success_rate", k, max_step)
            try:
                whole = analysis.curve_means(rows, s, max_step=max_step)["mean_success_rate"]
            except (ValueError, KeyError):  # no periodic evaluation of this set
                whole = []
            with np.errstate(divide="ignore", invalid="ignore"):
                kept = _t_cell(final / original) if s in PARAPHRASE_SETS else "-"
            row = (f"| {m} | {s} | {len(final)} | {_t_cell(final)} | {_t_cell(last)} | {_t_cell(whole)} | "
                   f"{_t_cell(analysis.final_values(seeds, s, 'num_completed'), '{:.1f}')} | "
                   f"{_t_cell(analysis.final_values(seeds, s, 'aggregate_score'))} | {kept} |")
            if has_gain:
                gain_last = analysis.last_evals_means(rows, f"eval/control/{s}/gain", k, max_step)
                row += (f" {_t_cell(analysis.final_values(seeds, s, 'control/gain'), '{:+.3f}')} |"
                        f" {_t_cell(gain_last, '{:+.3f}')} |")
            lines.append(row)
    return "\n".join(lines)


def t_control_table(finals: dict[str, list[dict]], sets: list[str]) -> str:
    """The control at the final point with both gains' 95% t intervals over seeds (empty: no control)."""
    lines = ["| method | set | seeds | asked | mismatched | neutral | gain (asked - mismatched) | gain (asked - neutral) |",
             "|---|---|---|---|---|---|---|---|"]
    for m, seeds in finals.items():
        for s in sets:
            neutral = analysis.final_values(seeds, s, "control/neutral_mean_success_rate")
            if np.isnan(neutral).any():
                continue
            asked = analysis.final_values(seeds, s, "mean_success_rate")
            mism = analysis.final_values(seeds, s, "control/mismatched_mean_success_rate")
            mism_cell = "-" if np.isnan(mism).any() else f"{mism.mean():.3f}"
            lines.append(f"| {m} | {s} | {len(asked)} | {asked.mean():.3f} | {mism_cell} | {neutral.mean():.3f} | "
                         f"{_t_cell(analysis.final_values(seeds, s, 'control/gain'), '{:+.3f}')} | "
                         f"{_t_cell(analysis.final_values(seeds, s, 'control/gain_neutral'), '{:+.3f}')} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def finite_t_cell(values, fmt: str = "{:.3f}") -> str:
    """``mean [low, high]``, the 95% t interval over the finite values; ``-`` when none; ``(n of m seeds)``."""
    arr = np.asarray(values, dtype=float)
    ok = arr[np.isfinite(arr)]
    if ok.size == 0:
        return "-"
    low, high = t_interval(ok)
    ci = "n/a" if np.isnan(low) else f"{fmt.format(low)}, {fmt.format(high)}"
    missing = f" ({ok.size} of {arr.size} seeds)" if ok.size < arr.size else ""
    return f"{fmt.format(ok.mean())} [{ci}]{missing}"


def welch_cell(values, baseline, fmt: str = "{:+.3f}") -> str:
    """``diff [low, high]``, the Welch t interval over the finite values of each arm; ``-`` with fewer than 2."""
    a, b = np.asarray(values, float), np.asarray(baseline, float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if a.size < 2 or b.size < 2:
        return "-"
    d, low, high = welch_interval(a, b)
    return f"{fmt.format(d)} [{fmt.format(low)}, {fmt.format(high)}]"


def diff_cell(values, baseline, fmt: str = "{:+.3f}") -> str:
    """``; vs base: `` and :func:`welch_cell`, or ``""`` without a ``baseline``."""
    return "" if baseline is None else f"; vs base: {welch_cell(values, baseline, fmt)}"


def seed_retention(result: dict, set_name: str) -> float:
    """One seed's paraphrase retention on ``set_name`` (NaN where it is undefined)."""
    if "original" not in result or set_name not in result or set_name == "original":
        return float("nan")
    o, p = result["original"], result[set_name]
    if not p["achievements"] or min(p["achievements"]) < 0:
        return float("nan")
    return paraphrase_retention(o["rates"], o["achievements"], p["rates"], p["achievements"])


def retention_table(finals: dict[str, list[dict]], sets, baseline: str | None = None) -> str:
    """Per method and set: final success, paraphrase retention and gain, each with ``baseline``'s difference."""
    has_gain = _has_gain(finals, sets)
    head = "| method | set | seeds | mean success rate | paraphrase retention |" + (
        " gain (asked - mismatched) |" if has_gain else "")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def columns(seeds: list[dict], s: str):
        return (analysis.final_values(seeds, s, "mean_success_rate"), [seed_retention(r, s) for r in seeds],
                analysis.final_values(seeds, s, "control/gain"))

    for m, seeds in finals.items():
        for s in sets:
            success, retention, gain = columns(seeds, s)
            if np.isnan(success).all():
                continue
            base = columns(finals[baseline], s) if baseline is not None and m != baseline else (None, None, None)
            ret = "-" if s == "original" or np.isnan(retention).all() else \
                finite_t_cell(retention) + diff_cell(retention, base[1])
            row = f"| {m} | {s} | {len(seeds)} | {finite_t_cell(success)}{diff_cell(success, base[0])} | {ret} |"
            if has_gain:
                row += f" {finite_t_cell(gain, '{:+.3f}')}{diff_cell(gain, base[2])} |"
            lines.append(row)
    return "\n".join(lines)


def order_table(finals: dict[str, list[dict]], baseline: str | None = None) -> str | None:
    """Per method: ordered-set success, its reverse-order control and the order gain (``None``: no ordered set)."""
    if not any("ordered" in r for seeds in finals.values() for r in seeds):
        return None
    lines = ["| method | seeds | \"X then Y\" success | \"Y then X\" success | X before Y when asked \"Y then X\" | "
             "order gain |", "|---|---|---|---|---|---|"]
    for m, seeds in finals.items():
        fwd = analysis.final_values(seeds, "ordered", "mean_success_rate")
        if np.isnan(fwd).all():
            continue
        rev = analysis.final_values(seeds, "ordered_reverse", "mean_success_rate")
        crossed = analysis.final_values(seeds, "ordered", "control/reverse_mean_success_rate")
        gain = analysis.final_values(seeds, "ordered", "control/order_gain")
        base = None
        if baseline is not None and m != baseline:
            base = analysis.final_values(finals[baseline], "ordered", "control/order_gain")
        lines.append(f"| {m} | {len(seeds)} | {finite_t_cell(fwd)} | {finite_t_cell(rev)} | {finite_t_cell(crossed)} | "
                     f"{finite_t_cell(gain, '{:+.3f}')}{diff_cell(gain, base)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="NAME=PREFIX per method")
    p.add_argument("--ablation", nargs="*", help="VALUE=PREFIX for the delta ablation")
    p.add_argument("--tsne", nargs="*", help="NAME=instructions.json|goals.json")
    p.add_argument("--out", default="docs/img")
    p.add_argument("--table-only", action="store_true", help="print the tables, write no plots")
    p.add_argument("--interval", choices=("bootstrap", "t"), default="bootstrap",
                   help="t: the summary table with 95%% t intervals over seeds instead of bootstrap intervals")
    p.add_argument("--last-k", type=int, default=5, help="the last evaluations averaged beside the final point")
    p.add_argument("--curve-max-step", type=float, default=float("inf"),
                   help="the whole-run tables keep evaluations up to this many env steps")
    p.add_argument("--time-target", type=float, default=None,
                   help="also tabulate and plot mean success (original) against wall clock, with this target line")
    p.add_argument("--time-budget", type=float, default=900.0,
                   help="with --time-target: the best success within this many seconds (default 900)")
    p.add_argument("--baseline", default=None, metavar="NAME",
                   help="the retention and ordered tables also give each method's difference to this one's")
    args = p.parse_args(argv)
    if args.last_k < 1:
        p.error(f"--last-k must be >= 1, got {args.last_k}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = _pairs(args.runs)
    if args.baseline is not None and args.baseline not in runs:
        p.error(f"--baseline {args.baseline!r} is not one of the --runs names {sorted(runs)}")
    finals = {name: load_evals(prefixes) for name, prefixes in runs.items()}
    metrics = {name: load_metrics(prefixes) for name, prefixes in runs.items()}
    if not args.table_only:
        for s in ("original", "simple", "complex"):
            analysis.plot_learning_curves(metrics, out / f"curves_{s}.png", s)
        analysis.plot_instruction_bars(finals, out / "instruction_success.png")
        analysis.write_overview_plots(metrics, out)  # success.png (every set), gain.png, relabeling.png
    sets = analysis.set_names(finals)
    print("## Evaluation (mean ± s.e. over seeds)\n")
    print(analysis.final_table(finals, sets=sets))
    upto = "" if args.curve_max_step == float("inf") else f" up to {args.curve_max_step:,.0f} env steps"
    print(f"\n## Mean over the periodic evaluations of the whole run{upto} (mean ± s.e. over seeds)\n")
    print(analysis.curve_mean_table(metrics, sets=sets, max_step=args.curve_max_step))
    windows = {name: _upto_tag(runs[name], rows) for name, rows in metrics.items()}
    if args.interval == "t":
        print(f"\n## Summary: final point, last {args.last_k} evaluations and whole run{upto} "
              "(mean [95% t interval over seeds])\n")
        print(t_summary_table(finals, windows, sets, k=args.last_k, max_step=args.curve_max_step))
        control = t_control_table(finals, sets)
    else:
        print(f"\n## Final point and mean of the last {args.last_k} evaluations{upto} "
              "(mean [95% bootstrap CI over seeds])\n")
        print(analysis.final_and_last_table(finals, windows, sets=sets, k=args.last_k, max_step=args.curve_max_step))
        control = analysis.control_table(finals, sets=sets)
    if control:
        print("\n## Instruction following at the final point: success of an achievement when asked for it, for "
              f"another one (mismatched) and with the neutral instruction (mean over seeds; gains with 95% {args.interval} "
              "interval)\n")
        print(control)
    print("\n## Paraphrase retention at the final point: success and retention on the learned achievements "
          "(original success >= 0.25) (mean [95% t interval over seeds])\n")
    print(retention_table(finals, sets, args.baseline))
    order = order_table(finals, args.baseline)
    if order:
        print("\n## Ordered compounds at the final point (mean [95% t interval over seeds])\n")
        print(order)
    if args.time_target is not None:
        print("\n## Time to target: mean success (original) against wall clock, compile included\n")
        print(analysis.time_to_target_table(metrics, args.time_target, args.time_budget))
        if not args.table_only:
            analysis.plot_time_to_target(metrics, out / "time_to_target.png", args.time_target)
    if args.ablation:
        abl = {v: load_evals(prefixes) for v, prefixes in _pairs(args.ablation).items()}
        if not args.table_only:
            analysis.plot_metric_vs_param(abl, out / "delta_ablation.png")
        print("\n## Delta ablation\n")
        print(analysis.final_table({f"delta={k}": v for k, v in abl.items()}, sets=("original",)))
    if args.tsne and not args.table_only:
        groups = {name: list(dict.fromkeys(t for f in files for t in analysis.read_instruction_list(f)))
                  for name, files in _pairs(args.tsne).items()}
        analysis.plot_tsne(groups, out / "tsne.png")
    if not args.table_only:
        print(f"\nplots in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
