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



def test_read_jsonl_skips_a_torn_last_line_and_names_a_damaged_one(tmp_path):
    """A run killed mid-write leaves a last line without its newline: the rows before it are read
    (also from ``metrics.jsonl.gz``); a damaged line in the middle is an error naming file and line."""
    import gzip

    good = "".join(json.dumps({"update": u, "env_steps": u}) + "\n" for u in (1, 2))
    (tmp_path / "metrics.jsonl.gz").write_bytes(gzip.compress((good + '{"update": 3, "env_st').encode()))
    assert analysis.metrics_path(tmp_path).name == "metrics.jsonl.gz"
    assert [r["update"] for r in analysis.read_jsonl(analysis.metrics_path(tmp_path))] == [1, 2]
    bad = tmp_path / "metrics.jsonl"
    bad.write_text(good + "{not json}\n" + good)
    with pytest.raises(ValueError, match=r"metrics.jsonl: line 3 is not valid JSON"):
        analysis.read_jsonl(bad)

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


# --------------------------------------------------------------------------- the plots a run writes

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _labels(ax) -> list[str]:
    """Labels of an axes' data lines (reference lines such as the gain's zero are named ``_...``)."""
    return [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def _notes(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _multi_set_rows(n_points: int = 3, seeds: int = 2, sets=("compound", "original", "simple")) -> list[dict]:
    """Evaluation rows of a run with a user set listed first, each set's success ``0.1 * point + 0.01 * seed``
    and, per set, the control's gain half of it."""
    rows = []
    for i in range(n_points):
        rows.append({"update": 2 * i, "env_steps": 100 * (2 * i), "loss": 0.1})
        ev = {"update": 2 * i + 1, "env_steps": 100 * (2 * i + 1)}
        for s in sets:
            for seed in range(seeds):
                v = 0.1 * i + 0.01 * seed
                ev[f"seed{seed}/eval/{s}/mean_success_rate"] = v
                ev[f"seed{seed}/eval/control/{s}/gain"] = v / 2
                ev[f"seed{seed}/eval/control/{s}/mismatched_mean_success_rate"] = v / 2
            ev[f"eval/{s}/mean_success_rate"] = 0.1 * i
        rows.append(ev)
    return rows


def test_success_figure_has_an_axes_per_evaluated_set_fixed_to_0_1_with_the_seed_mean():
    a = _multi_set_rows()
    b = _multi_set_rows(seeds=1, sets=("original",))
    assert analysis.evaluated_sets([a, b]) == ["original", "simple", "compound"]  # built-in sets first
    fig = analysis.success_figure({"a": [a], "b": [b]})
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["original", "simple", "compound"]
    for ax in axes:
        assert ax.get_ylim() == (0.0, 1.0) and ax.get_xlabel() == "env steps"
    assert _labels(axes[0]) == ["a (2 seeds)", "b (1 seed)"]
    assert _labels(axes[2]) == ["a (2 seeds)"]  # b did not evaluate compound
    x, y = axes[0].get_lines()[0].get_data()
    np.testing.assert_allclose(x, [100, 300, 500])
    np.testing.assert_allclose(y, [0.005, 0.105, 0.205])  # the mean of seeds 0 and 1
    assert len(axes[0].collections) == 1  # a band for a (2 seeds), none for b (1 seed)
    fig = analysis.success_figure({"b": [b]}, sets=["original", "heldout"])
    assert _labels(fig.get_axes()[1]) == [] and _notes(fig.get_axes()[1]) == ["not evaluated"]
    with pytest.raises(ValueError, match="no evaluation"):
        analysis.success_figure({"a": [[{"update": 1, "env_steps": 4, "loss": 0.1}]]})


def test_gain_figure_plots_asked_minus_mismatched_per_set_and_needs_the_control():
    rows = _multi_set_rows()
    fig = analysis.gain_figure({"oir": [rows, _multi_set_rows()]})  # two runs of 2 seeds: 4 seeds
    axes = fig.get_axes()
    assert [ax.get_title() for ax in axes] == ["original", "simple", "compound"]
    for ax in axes:
        # scaled to the data: the largest gain (0.1025 + its s.e.) with a margin, symmetric around 0
        assert ax.get_ylim() == pytest.approx((-0.15, 0.15)) and _labels(ax) == ["oir (4 seeds)"]
        assert any(ln.get_label() == "_zero" for ln in ax.get_lines())  # the no-following line
    np.testing.assert_allclose(axes[0].get_lines()[0].get_ydata(), [0.0025, 0.0525, 0.1025])
    no_control = [{k: v for k, v in r.items() if "/control/" not in k} for r in rows]
    assert analysis.gain_sets([no_control]) == []
    with pytest.raises(ValueError, match="no instruction-following gain.*control"):
        analysis.gain_figure({"oir": [no_control]})


def _relabel_rows(n: int = 4, llm: bool = True) -> list[dict]:
    """Per-update rows of an OIR run: rows, the LLM's offer share, new instructions; diversity at the end."""
    rows = []
    for u in range(1, n + 1):
        r = {"update": u, "env_steps": 10 * u, "relabel/rows": 0.0 if u == 1 else 5.0 * u,
             "relabel/llm_offer_share": 0.0 if u == 1 else 0.25, "relabel/new_instructions": float(8 - u)}
        if llm:
            r["relabel/llm_results"] = 1.0
        rows.append(r)
    rows[-1]["diversity/novelty_share"] = 0.5
    return rows


def _ellm_rows(n: int = 4) -> list[dict]:
    return [{"update": u, "env_steps": 10 * u, "ellm/pinned_frac": 0.75, "ellm/distinct_goals": 3.0 * u}
            for u in range(1, n + 1)]


def test_relabeling_figure_shows_rows_sources_and_novelty_per_update():
    fig = analysis.relabeling_figure({"oir": [_relabel_rows(), _relabel_rows()], "rules": [_relabel_rows(llm=False)],
                                      "ellm": [_ellm_rows()]})
    rows_ax, src_ax, new_ax = fig.get_axes()[:3]
    assert _labels(rows_ax) == ["oir (PQN: rows per seed)", "rules (PQN: rows per seed)"]
    np.testing.assert_allclose(rows_ax.get_lines()[0].get_ydata(), [0, 10, 15, 20])
    assert _labels(src_ax) == ["oir: rules", "oir: LLM", "rules: rules", "ellm: proposer"]
    assert src_ax.get_ylim()[0] == 0.0 and src_ax.get_ylim()[1] <= 1.05
    rules_line, llm_line = src_ax.get_lines()[:2]
    # the update without relabeled rows offered nothing: left out rather than drawn as all-rules
    np.testing.assert_allclose(rules_line.get_xdata(), [20, 30, 40])
    np.testing.assert_allclose(rules_line.get_ydata(), [0.75] * 3)
    np.testing.assert_allclose(llm_line.get_ydata(), [0.25] * 3)
    np.testing.assert_allclose(src_ax.get_lines()[3].get_ydata(), [0.75] * 4)
    assert _labels(new_ax) == ["oir (texts offered to a buffer for the first time; final novelty share 0.50)",
                               "rules (texts offered to a buffer for the first time; final novelty share 0.50)",
                               "ellm (goals proposed for the first time)"]
    np.testing.assert_allclose(new_ax.get_lines()[0].get_ydata(), [7, 6, 5, 4])
    np.testing.assert_allclose(new_ax.get_lines()[2].get_ydata(), [3, 3, 3, 3])  # a running count, differenced
    # a run that did not log a quantity says so on its axes
    old = [{k: v for k, v in r.items() if k != "relabel/new_instructions"} for r in _relabel_rows()]
    _, _, new_ax = analysis.relabeling_figure({"old": [old]}).get_axes()[:3]
    assert _labels(new_ax) == [] and _notes(new_ax) == ["not logged by this run (relabel/new_instructions)"]
    with pytest.raises(ValueError, match="no relabeling metrics"):
        analysis.relabeling_figure({"gt": [_rows([[0.5]])]})


@pytest.mark.parametrize("run, files", [
    # a run directory whose evaluation has the control and the user sets own_words and compound
    ("gpu_h200x2_fast_llm_delta/fast_bound_llm/metrics.jsonl", ["success.png", "gain.png", "relabeling.png"]),
    # a flat file of a run from before the control: no gain plot
    ("gpu_h100_short/oir_metrics.jsonl", ["success.png", "relabeling.png"]),
])
def test_write_overview_plots_on_committed_runs(tmp_path, run, files):
    from PIL import Image

    rows = analysis.read_jsonl(ROOT / "results" / run)
    written = analysis.write_overview_plots({"oir": [rows]}, tmp_path)
    assert [p.name for p in written] == files and sorted(p.name for p in tmp_path.iterdir()) == sorted(files)
    for p in written:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size[0] > 500
    sets = analysis.evaluated_sets([rows])
    assert sets[:3] == ["original", "simple", "complex"]
    if "gain.png" in files:
        assert sets[3:] == ["own_words", "compound"] and analysis.gain_sets([rows]) == sets
        fig = analysis.success_figure({"oir": [rows]})
        assert len(fig.get_axes()) == 5 and all(ax.get_ylim() == (0.0, 1.0) for ax in fig.get_axes())
        assert all(_labels(ax) == ["oir (3 seeds)"] for ax in fig.get_axes())
    rows_ax, src_ax, new_ax = analysis.relabeling_figure({"oir": [rows]}).get_axes()[:3]
    assert _labels(rows_ax) == ["oir (PQN: rows per seed)"]
    if "gain.png" in files:
        assert _labels(src_ax) == ["oir: rules", "oir: LLM"]
    else:  # before relabel/llm_offer_share was logged
        assert _notes(src_ax) == ["not logged by this run (relabel/llm_offer_share or ellm/pinned_frac)"]
    assert _notes(new_ax) == ["not logged by this run (relabel/new_instructions)"]  # logged from this version on


def test_caption_frame_writes_the_instruction_across_the_top_of_the_frame():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 120, size=(288, 288, 3), dtype=np.uint8)  # darker than the white text
    out = analysis.caption_frame(frame, "collect wood then place a table")
    assert out.shape == frame.shape and out.dtype == np.uint8
    changed = np.flatnonzero((out != frame).any(axis=(1, 2)))
    assert changed.min() == 0 and changed.max() < 288 // 3  # a band at the top, the rest of the view untouched
    np.testing.assert_array_equal(out[changed.max() + 1:], frame[changed.max() + 1:])
    assert (out[: changed.max() + 1] > 200).all(axis=-1).sum() > 50  # white text pixels in the band
    assert not np.array_equal(analysis.caption_frame(frame, "drink water"), out)  # the text, not just a band
    np.testing.assert_array_equal(analysis.caption_frame(frame, "collect wood then place a table"), out)
    # a long instruction wraps onto more lines, and stops at a third of the frame
    long = analysis.caption_frame(frame, " ".join(["collect wood then place a table"] * 20))
    band = np.flatnonzero((long != frame).any(axis=(1, 2)))
    assert changed.max() < band.max() < 288 // 3
    small = analysis.caption_frame(frame[:144, :144], "drink water")  # record_video --scale 1
    assert small.shape == (144, 144, 3) and (small != frame[:144, :144]).any()
    with pytest.raises(ValueError, match=r"frame must be an \[H, W, 3\] uint8"):
        analysis.caption_frame(frame.astype(np.float32), "x")


def test_relabeling_figure_reads_the_running_counts_of_an_sb3_run():
    """SB3 logs running counts (relabeled transitions, texts written to the instruction buffer) that a
    resumed process starts again from 0 (its replay buffer is not saved)."""
    added, inserted = [40, 100, 30, 90], [3, 5, 1, 2]  # the process resumed before the third row
    rows = [{"update": u, "env_steps": 100 * u, "relabel/rows_added": float(a), "relabel/buffer_inserted": float(i)}
            for u, a, i in zip(range(1, 5), added, inserted)]
    rows_ax, src_ax, new_ax = analysis.relabeling_figure({"qrdqn": [rows]}).get_axes()[:3]
    assert _labels(rows_ax) == ["qrdqn (SB3: transitions per metrics row)"]
    np.testing.assert_allclose(rows_ax.get_lines()[0].get_ydata(), [40, 60, 30, 60])
    np.testing.assert_allclose(new_ax.get_lines()[0].get_ydata(), [3, 2, 1, 1])
    assert _labels(src_ax) == []  # SB3 does not log where its relabeled texts came from


def _gain_rows(gains: list[float]) -> list[dict]:
    return [{"update": u, "env_steps": 100 * u, "eval/control/original/gain": g} for u, g in enumerate(gains)]


@pytest.mark.parametrize("gains, half", [
    ([0.0, 0.01, 0.02], 0.1),      # near 0: the minimum span, not a flat line on [-1, 1]
    ([0.0, 0.04, 0.08], 0.1),      # 0.08 * 1.1 = 0.088 -> 0.1
    ([0.0, -0.3, 0.1], 0.35),      # a negative gain counts by its size: 0.33 -> 0.35
    ([0.2, 0.9, 1.0], 1.0),        # never beyond what a gain can be
])
def test_gain_axis_is_symmetric_around_zero_and_scaled_to_the_data(gains, half):
    (ax,) = analysis.gain_figure({"oir": [_gain_rows(gains)]}).get_axes()
    assert ax.get_ylim() == pytest.approx((-half, half))
    top = max(abs(g) for g in gains)
    assert ax.get_ylim()[1] >= top  # every point inside the frame


def _llm_rows() -> list[dict]:
    """Rows of a PQN run with an LLM relabeler: no call before update 2, one stale answer at update 3."""
    rows = []
    for u, (fresh, stale, pending, calls, latency) in enumerate(
            [(0, 0, 4, 0, 0.0), (0, 0, 8, 1, 2.0), (2, 1, 6, 3, 3.0), (3, 1, 5, 6, 2.5)], start=1):
        rows.append({"update": u, "env_steps": 10 * u, "relabel/rows": 4.0, "relabel/grounded_frac": 0.2 * u,
                     "relabel/llm_results": float(fresh), "relabel/llm_stale": float(stale),
                     "relabel/llm_pending": float(pending), "relabel/llm_calls": float(calls),
                     "relabel/llm_latency_mean_s": latency})
    return rows


def test_relabeling_figure_shows_the_grounded_fraction_and_the_llms_staleness_and_latency():
    axes = analysis.relabeling_figure({"oir": [_llm_rows()], "rules": [_relabel_rows(llm=False)]}).get_axes()
    assert [ax.get_title() for ax in axes] == [
        "relabeled rows per update", "instructions by source (share per update)",
        "novelty: new instructions per update", "grounded fraction of relabeled candidates",
        "LLM answers per update: in time, stale, queued", "LLM latency (mean per call so far)"]
    grounded_ax, llm_ax, latency_ax = axes[3:]
    assert _labels(grounded_ax) == ["oir"] and grounded_ax.get_ylim() == (0.0, 1.05)
    np.testing.assert_allclose(grounded_ax.get_lines()[0].get_ydata(), [0.2, 0.4, 0.6, 0.8])
    assert _labels(llm_ax) == ["oir: in time", "oir: stale", "oir: queued"]
    fresh, stale, queued = (ln.get_ydata() for ln in llm_ax.get_lines())
    np.testing.assert_allclose(fresh, [0, 0, 2, 3])
    np.testing.assert_allclose(stale, [0, 0, 1, 0])  # the running count, per update
    np.testing.assert_allclose(queued, [4, 8, 6, 5])
    # the mean latency of no call is not drawn as 0 s
    x, y = latency_ax.get_lines()[0].get_data()
    np.testing.assert_allclose(x, [20, 30, 40])
    np.testing.assert_allclose(y, [2.0, 3.0, 2.5])
    # a run without an LLM (or from before these keys) says what it did not log
    axes = analysis.relabeling_figure({"rules": [_relabel_rows(llm=False)]}).get_axes()
    assert _notes(axes[3]) == ["not logged by this run (relabel/grounded_frac)"]
    assert _notes(axes[4]) == ["not logged by this run (relabel/llm_results)"]
    assert _notes(axes[5]) == ["not logged by this run (relabel/llm_latency_mean_s)"]


def test_training_figure_marks_the_points_of_a_short_series():
    """An SB3 smoke run logs its loss once: a line without markers would leave the panel empty."""
    short = [{"update": 1, "env_steps": 64, "loss": 0.5, "sps": 900.0}, {"update": 2, "env_steps": 128, "sps": 950.0}]
    axes = analysis.training_figure(short).get_axes()
    assert [ax.get_title() for ax in axes] == ["loss", "sps"]
    loss, sps = (ax.get_lines()[0] for ax in axes)
    assert loss.get_marker() not in (None, "None", "") and list(loss.get_xdata()) == [64]
    assert sps.get_marker() not in (None, "None", "")
    long = [{"update": u, "env_steps": 10 * u, "loss": 1.0 / u} for u in range(1, 201)]
    (ax,) = analysis.training_figure(long).get_axes()
    assert ax.get_lines()[0].get_marker() in (None, "None", "")  # 200 points: a line
    (ax,) = analysis.training_figure([{"update": 1}]).get_axes()
    assert "no training metrics logged" in _notes(ax)[0]


def test_instruction_bars_are_titled_with_the_set_and_the_episodes():
    results = {"oir": [{"simple": {"texts": ["collect wood", "place table"], "rates": [0.5, 0.25]}}] * 3}
    (ax,) = analysis.instruction_bars_figure(results, set_name="simple", episodes=16).get_axes()
    assert ax.get_title() == "success per instruction: set 'simple' (2 instructions, 16 episodes per instruction)"
    assert ax.get_legend().get_texts()[0].get_text() == "oir (3 seeds)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["collect wood", "place table"]
    # a run that evaluated only its own sets: their first set, named in the title
    (ax,) = analysis.instruction_bars_figure({"oir": [{"mine": {"texts": ["a"], "rates": [1.0]}}]},
                                             episodes=1).get_axes()
    assert ax.get_title() == "success per instruction: set 'mine' (1 instruction, 1 episode per instruction)"


def test_each_sets_gain_axis_is_scaled_to_that_sets_gains():
    rows = [{"update": u, "env_steps": 100 * u, "eval/control/original/gain": 0.02 * u,
             "eval/control/compound/gain": 0.2 * u} for u in range(4)]
    original, compound = analysis.gain_figure({"oir": [rows]}).get_axes()
    assert original.get_ylim() == pytest.approx((-0.1, 0.1))   # 0.06: not flattened by compound's 0.6
    assert compound.get_ylim() == pytest.approx((-0.7, 0.7))


def test_event_rates_figure_has_an_axis_per_event_on_a_log_scale(tmp_path):
    rows = [{"update": u, "env_steps": 1000 * u, "rate/collect_wood": 5.0 * u, "rate/see_stone": 0.0}
            for u in range(1, 5)]
    fig = analysis.event_rates_figure({"oir": [rows]})
    titled = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in titled] == ["collect_wood", "see_stone"]
    assert all(ax.get_yscale() == "log" for ax in titled)
    assert titled[1].get_lines()[0].get_ydata().min() == pytest.approx(1e-3)  # zero rates at the floor
    written = analysis.write_overview_plots({"oir": [rows]}, tmp_path)
    assert tmp_path / "event_rates.png" in written
    with pytest.raises(ValueError, match="no training rates"):
        analysis.event_rates_figure({"old": [[{"update": 1, "env_steps": 10, "loss": 0.1}]]})
