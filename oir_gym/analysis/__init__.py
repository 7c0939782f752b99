"""Plots and tables from run directories (``metrics.jsonl``, ``eval_*.json``).

By concern: :mod:`~oir_gym.analysis.runs` reads run files, :mod:`~oir_gym.analysis.tables` computes
summaries and markdown tables, :mod:`~oir_gym.analysis.plots` draws figures; their names are here.

Works on any run directory written by ``examples/train_pqn.py`` or ``examples/train_sb3.py``;
several runs (seeds, methods) are aggregated as mean +- standard error.
"""

from oir_gym.analysis.runs import (  # noqa: F401
    JsonlError, parse_jsonl, read_jsonl, write_csv, metrics_path, read_instruction_list,
)
from oir_gym.analysis.tables import (  # noqa: F401
    EVAL_METRICS, CONTROL_METRICS, eval_curves, pooled_curves, curve_means, curve_mean_table, metric_points,
    last_evals_means, last_evals_count, final_values, ci_cell, set_names, final_and_last_table, control_table,
    final_table, cumulative_time, time_curves, time_to_target_table, evaluated_sets, gain_sets, pooled_points,
)
from oir_gym.analysis.plots import (  # noqa: F401
    plot_learning_curves, MARKER_BELOW, training_figure, plot_training, instruction_bars_figure,
    plot_instruction_bars, plot_tsne, plot_metric_vs_param, plot_threshold_confusion, plot_time_to_target,
    RELABEL_ROWS, RELABEL_NOVELTY, save_figure, MIN_HALF_SPAN, symmetric_limits, success_figure, gain_figure,
    LLM_IN_TIME, LLM_STALE, LLM_PENDING, LLM_LATENCY, LLM_CALLS, GROUNDED_FRAC, has_relabeling,
    relabeling_figure, event_rates_figure, write_overview_plots, caption_frame,
)
