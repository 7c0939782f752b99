"""Rebuild the plots and tables of docs/results.md from run files.

    python examples/analyze_runs.py --runs gt=results/gpu_h100_1e6/gt cosine=... --out docs/img

Each ``NAME=PREFIX`` points at ``PREFIX_metrics.jsonl`` and ``PREFIX_eval_final.json`` (the flat
layout kept in ``results/``) or at a run directory holding ``metrics.jsonl`` and
``eval_final.json``. ``--ablation`` takes ``VALUE=PREFIX`` pairs for the delta ablation and
``--tsne NAME=FILE`` instruction lists (``instructions.json`` / ``goals.json`` of a run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oir_gym import analysis  # noqa: E402


def _files(prefix: str) -> tuple[Path, Path]:
    p = Path(prefix)
    if p.is_dir():
        return p / "metrics.jsonl", p / "eval_final.json"
    return Path(f"{prefix}_metrics.jsonl"), Path(f"{prefix}_eval_final.json")


def _pairs(items):
    out = {}
    for it in items or []:
        if "=" not in it:
            raise SystemExit(f"expected NAME=PATH, got {it!r}")
        k, v = it.split("=", 1)
        out[k] = v
    return out


def _as_run_dir(prefix: str, tmp: Path, name: str) -> Path:
    metrics, _ = _files(prefix)
    d = tmp / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text(metrics.read_text())
    return d


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="NAME=PREFIX per method")
    p.add_argument("--ablation", nargs="*", help="VALUE=PREFIX for the delta ablation")
    p.add_argument("--tsne", nargs="*", help="NAME=instructions.json|goals.json")
    p.add_argument("--out", default="docs/img")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = _pairs(args.runs)
    finals = {name: json.loads(_files(prefix)[1].read_text()) for name, prefix in runs.items()}
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {name: [_as_run_dir(prefix, Path(tmp), name)] for name, prefix in runs.items()}
        for s in ("original", "simple", "complex"):
            analysis.plot_learning_curves(dirs, out / f"curves_{s}.png", s)
    analysis.plot_instruction_bars(finals, out / "instruction_success.png")
    print("## Final evaluation (mean ± s.e. over seeds)\n")
    print(analysis.final_table(finals))
    if args.ablation:
        abl = {v: json.loads(_files(prefix)[1].read_text()) for v, prefix in _pairs(args.ablation).items()}
        analysis.plot_metric_vs_param(abl, out / "delta_ablation.png")
        print("\n## Delta ablation\n")
        print(analysis.final_table({f"delta={k}": v for k, v in abl.items()}, sets=("original",)))
    if args.tsne:
        groups = {}
        for name, f in _pairs(args.tsne).items():
            groups[name] = analysis.read_instruction_list(f)
        analysis.plot_tsne(groups, out / "tsne.png")
    print(f"\nplots in {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
