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
