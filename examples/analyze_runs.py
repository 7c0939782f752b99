"""Rebuild the plots and tables of docs/results.md from run files.

    python examples/analyze_runs.py --runs gt=results/gpu_h200_1e7/gt oir=results/gpu_h200_1e7/oir#000750 --out docs/img

Each ``NAME=PREFIX`` points at ``PREFIX_metrics.jsonl`` and ``PREFIX_eval_final.json`` (the flat
layout kept in ``results/``) or at a run directory holding ``metrics.jsonl`` and
``eval_final.json``; ``NAME=PREFIX#TAG`` reads ``eval_TAG.json`` instead of ``eval_final.json``
(e.g. ``#000750``, the periodic evaluation at update 750, to compare runs at equal steps).
Besides the end-of-run table it prints each method's mean over all of its periodic evaluations
(a normalised area under the learning curve, far less noisy than one evaluation), then the final
point beside each seed's mean over its last 5 evaluations (``--last-k``; up to the tagged update
for ``#NNNNNN``), with 95% bootstrap confidence intervals over seeds (scipy's percentile
bootstrap), and, for evaluations with the control (``oir_gym.evaluation``), the
instruction-following gain: success when asked for an achievement minus success when asked for
another one (or given the neutral instruction).
``--interval t`` prints, instead of that table and with 95% Student's t intervals over seeds, the
summary docs/results.md shows: the final point, the mean of the last k evaluations and of the whole
run, completed instructions and aggregate score at the final point, and how much of its success on
the original set a seed keeps on the paraphrase sets (``kept``: success on ``simple`` or ``complex`` /
success on ``original``, per seed); the control table then also takes t intervals.
``--time-target X`` adds mean success against wall clock (``time`` of the metrics rows, summed over
resumes): the first evaluation reaching X and the best within ``--time-budget`` seconds.
``--ablation`` takes ``VALUE=PREFIX`` pairs for the delta ablation and ``--tsne NAME=FILE``
instruction lists (``instructions.json`` / ``goals.json`` of a run).

Two more tables use Student's t intervals over seeds (``oir_gym.metrics.t_interval``): per method
and set, the final success, the paraphrase retention (over the achievements a seed learned on the
original set, success >= 0.25: mean of paraphrase success / original success,
``oir_gym.metrics.paraphrase_retention``; unlike ``kept``, it compares each learned achievement with
itself) and the instruction-following gain; and, where the ordered-compound sets were evaluated,
success on "X then Y", on "Y then X", and the order gain (success of "X then Y" when asked for it
minus the same order's success when asked "Y then X"). With ``--baseline NAME`` each of their cells
also gives the difference to that method (mean difference [95% Welch t interval],
``oir_gym.metrics.welch_interval``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.analyze_runs import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
