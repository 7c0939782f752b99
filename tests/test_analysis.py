"""oir_gym.analysis: the curve maths on hand-built metrics rows, and the plots' files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym import analysis


def _rows(curve: list[list[float]], step: int = 100, set_name: str = "original") -> list[dict]:
    """Metrics rows of one run: a training row between evaluation rows, ``curve[point][seed]``."""
    rows = []
    for i, seeds in enumerate(curve):
        rows.append({"update": 2 * i, "env_steps": step * (2 * i), "loss": 0.1})
        ev = {"update": 2 * i + 1, "env_steps": step * (2 * i + 1)}
        for s, v in enumerate(seeds):
            ev[f"seed{s}/eval/{set_name}/mean_success_rate"] = v
            ev[f"seed{s}/eval/{set_name}/num_completed"] = 22 * v
            ev[f"seed{s}/eval/{set_name}/aggregate_score"] = v / 2
        rows.append(ev)
    return rows


def test_read_jsonl_keeps_the_last_row_of_a_repeated_update(tmp_path):
    """A resumed run rewrites the updates after its checkpoint; the later rows win."""
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in [{"update": 1, "x": 1}, {"update": 2, "x": 2},
                                                    {"update": 2, "x": 3}, {"update": 3, "x": 4}]) + "\n\n")
    assert [r["x"] for r in analysis.read_jsonl(p)] == [1, 3, 4]


def test_pooled_curves_put_the_seeds_of_several_runs_side_by_side_and_cut_to_the_shortest():
    a = _rows([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])  # 2 seeds, 3 evaluations
    b = _rows([[0.0], [1.0]])  # 1 seed, stopped after 2 evaluations
    steps, curves = analysis.pooled_curves([a, b])
    assert steps.tolist() == [100, 300]
    np.testing.assert_allclose(curves["mean_success_rate"], [[0.1, 0.2, 0.0], [0.3, 0.4, 1.0]])
    np.testing.assert_allclose(curves["aggregate_score"], curves["mean_success_rate"] / 2)
    steps, curves = analysis.pooled_curves([a], "simple")  # no evaluation of that set
    assert len(steps) == 0 and curves["mean_success_rate"].size == 0


def test_curve_means_average_each_seed_over_its_evaluations():
    rows = _rows([[0.0, 0.2], [0.4, 0.2], [0.8, 0.2]])
    m = analysis.curve_means([rows])
    np.testing.assert_allclose(m["mean_success_rate"], [0.4, 0.2])
    np.testing.assert_allclose(m["num_completed"], [8.8, 4.4])
    # min_step drops the early points (at 100 env steps here), max_step the late ones (500)
    np.testing.assert_allclose(analysis.curve_means([rows], min_step=200)["mean_success_rate"], [0.6, 0.2])
    np.testing.assert_allclose(analysis.curve_means([rows], max_step=300)["mean_success_rate"], [0.2, 0.2])
    assert "| m | original | 2 | 0.200 ± 0.000 |" in analysis.curve_mean_table({"m": [rows]}, max_step=300)
    with pytest.raises(ValueError, match="no 'original' evaluation between 1e\\+06 and inf"):
        analysis.curve_means([rows], min_step=1e6)
    with pytest.raises(ValueError, match="no 'complex' evaluation"):
        analysis.curve_means([rows], "complex")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=3, max_size=3), min_size=1, max_size=8))
def test_curve_means_lie_within_each_seeds_range(curve):
    means = analysis.curve_means([_rows(curve)])["mean_success_rate"]
    arr = np.array(curve)
    assert means.shape == (3,)
    assert np.all(means >= arr.min(axis=0) - 1e-12) and np.all(means <= arr.max(axis=0) + 1e-12)


@settings(max_examples=25, deadline=None)
@given(st.floats(0, 1), st.integers(1, 6), st.integers(1, 4))
def test_a_flat_curve_has_its_level_as_mean_and_no_spread(level, points, seeds):
    rows = _rows([[level] * seeds] * points)
    table = analysis.curve_mean_table({"m": [rows]}, sets=("original",))
    row = table.splitlines()[-1]
    assert row.startswith(f"| m | original | {points} | {level:.3f} ± 0.000 |")


def test_curve_mean_table_skips_sets_a_run_did_not_evaluate():
    table = analysis.curve_mean_table({"a": [_rows([[0.5]])], "b": [_rows([[0.1], [0.3]])]})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| method | set | evaluations |")
    assert lines[2].startswith("| a | original | 1 | 0.500 ± 0.000 |")
    assert lines[3].startswith("| b | original | 2 | 0.200 ± 0.000 |")


def test_learning_curve_plot_takes_run_directories_and_metrics_files(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows([[0.1, 0.2], [0.3, 0.4]])))
    flat = tmp_path / "other_metrics.jsonl"
    flat.write_text((d / "metrics.jsonl").read_text())
    assert analysis.metrics_path(d) == d / "metrics.jsonl" and analysis.metrics_path(flat) == flat
    out = analysis.plot_learning_curves({"a": [d], "b": [flat, d]}, tmp_path / "c.png")
    assert out.stat().st_size > 10_000
    rows = analysis.plot_learning_curves({"a": [analysis.read_jsonl(flat)], "b": [flat, d]}, tmp_path / "r.png")
    assert rows.read_bytes() == out.read_bytes()  # rows already read draw the same figure


# --------------------------------------------------------------------------- last evaluations, CIs, control


def _control_rows(gains: list[list[float]], step: int = 100) -> list[dict]:
    """Evaluation rows with per-seed mean success and control gain: ``gains[point][seed]``."""
    rows = _rows(gains, step)
    for r, seeds in zip([r for r in rows if "seed0/eval/original/mean_success_rate" in r], gains):
        for s, g in enumerate(seeds):
            r[f"seed{s}/eval/control/original/gain"] = g
            r[f"seed{s}/eval/control/original/gain_neutral"] = g / 2
        r["eval/control/original/gain"] = float(np.mean(seeds))
    return rows


def _eval_dict(rate: float, gain: float | None = None) -> dict:
    d = {"original": {"texts": ["a"], "achievements": [0], "rates": [rate], "mean_success_rate": rate,
                      "num_completed": int(rate > 0), "aggregate_score": rate}}
    if gain is not None:
        d["original"]["control"] = {"gain": gain, "gain_neutral": gain / 2, "mismatched_mean_success_rate": rate - gain,
                                    "neutral_mean_success_rate": rate - gain / 2}
    return d


def test_metric_points_read_seed_columns_or_the_run_level_value():
    steps, vals = analysis.metric_points(_control_rows([[0.1, 0.3], [0.2, 0.4]]), "eval/control/original/gain")
    assert steps.tolist() == [100, 300] and vals.tolist() == [[0.1, 0.3], [0.2, 0.4]]
    rows = [{"update": 1, "env_steps": 5, "eval/original/mean_success_rate": 0.5}]
    assert analysis.metric_points(rows, "eval/original/mean_success_rate")[1].tolist() == [[0.5]]
    steps, vals = analysis.metric_points(rows, "eval/control/original/gain")
    assert steps.size == 0 and vals.size == 0


def test_last_evals_means_average_each_seeds_last_k_points_per_run():
    a = _rows([[0.0, 1.0], [0.2, 0.8], [0.4, 0.6], [0.6, 0.4]])  # 2 seeds, 4 evaluations
    b = _rows([[0.9], [0.3]])  # 1 seed, 2 evaluations: a run keeps its own last points
    key = "eval/original/mean_success_rate"
    np.testing.assert_allclose(analysis.last_evals_means([a, b], key, k=2), [0.5, 0.5, 0.6])
    np.testing.assert_allclose(analysis.last_evals_means([a], key, k=2, max_step=500), [0.3, 0.7])  # points <= 500
    assert analysis.last_evals_means([a], "eval/control/original/gain").size == 0
    # a run shorter than k contributes all of its points, and the count says so
    np.testing.assert_allclose(analysis.last_evals_means([a, b], key, k=3), [0.4, 0.6, 0.6])
    assert analysis.last_evals_count([a, b], key, k=3) == 2 and analysis.last_evals_count([a], key, k=3) == 3
    assert analysis.last_evals_count([a], "eval/control/original/gain") == 0
    with pytest.raises(ValueError, match="k must be >= 1"):
        analysis.last_evals_means([a], key, k=0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=2, max_size=2), min_size=1, max_size=8), st.integers(1, 8))
def test_the_last_k_mean_is_the_whole_run_mean_when_k_covers_the_run(curve, k):
    rows = _rows(curve)
    key = "eval/original/mean_success_rate"
    last = analysis.last_evals_means([rows], key, k)
    np.testing.assert_allclose(last, np.array(curve)[-k:].mean(axis=0))
    if k >= len(curve):
        np.testing.assert_allclose(last, analysis.curve_means([rows])["mean_success_rate"])


def test_final_and_last_table_adds_gain_columns_only_when_some_run_has_them():
    plain = {"m": [_eval_dict(0.3), _eval_dict(0.4), _eval_dict(0.5)]}
    runs = {"m": [_rows([[0.1, 0.2, 0.3], [0.3, 0.4, 0.5]])]}
    table = analysis.final_and_last_table(plain, runs, sets=("original",), k=2)
    lines = table.splitlines()
    assert lines[0] == "| method | set | seeds | final: mean success rate | last: evaluations | last 2: mean success rate |"
    # 3 seeds: the percentile interval of the mean runs from the lowest to the highest seed
    assert lines[2] == "| m | original | 3 | 0.400 [0.300, 0.500] | 2 | 0.300 [0.200, 0.400] |"
    with_gain = {"m": [_eval_dict(0.3, 0.1), _eval_dict(0.4, 0.1), _eval_dict(0.5, 0.1)], "old": plain["m"]}
    runs = {"m": [_control_rows([[0.1, 0.2, 0.3], [0.3, 0.4, 0.5]])], "old": runs["m"]}
    lines = analysis.final_and_last_table(with_gain, runs, sets=("original",), k=2).splitlines()
    assert lines[0].endswith("| final: gain | last 2: gain |")
    assert lines[2] == ("| m | original | 3 | 0.400 [0.300, 0.500] | 2 | 0.300 [0.200, 0.400] | +0.100 [+0.100, +0.100] | "
                        "+0.300 [+0.200, +0.400] |")
    assert lines[3].endswith("| - | - |")  # a run from before the control


def test_control_table_reports_the_final_gains():
    assert analysis.control_table({"m": [_eval_dict(0.3)]}) == ""
    table = analysis.control_table({"m": [_eval_dict(0.3, 0.2), _eval_dict(0.5, 0.0)]}, sets=("original",))
    assert table.splitlines()[2] == "| m | original | 0.400 | 0.300 | 0.350 | +0.100 [+0.000, +0.200] | +0.050 [+0.000, +0.100] |"
    assert analysis.ci_cell([0.5]) == "0.500 [n/a]" and analysis.ci_cell([]) == "-" and analysis.ci_cell([np.nan, 1]) == "-"
