"""examples/analyze_runs.py rebuilds the tables of docs/results.md from the files in results/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import analyze_runs  # noqa: E402

from oir_gym import analysis  # noqa: E402

R = ROOT / "results" / "gpu_h200_1e7"  # gt (and a pre-fix OIR replicate to 6.25e6)
H = ROOT / "results" / "gpu_h100_1e7"  # cosine; the pre-fix ellm and OIR (seeds 2 + 1)
F = ROOT / "results" / "gpu_h100_1e7_fixed"  # ellm with the any-goal reward; OIR with the buffer fix only
C = ROOT / "results" / "gpu_h100_1e7_cut"  # OIR with every fix (seeds 1 + 1 + 1); cosine with the caption fix
D = ROOT / "results" / "gpu_h100_delta_early"  # OIR at delta 0.5 and 0.7, 1 seed each, to ~150 updates
OIR = [C / "oir_a", C / "oir_b", C / "oir_c"]


def _runs(tag: str) -> list[str]:
    return [f"gt={R}/gt#{tag}", f"cosine={C}/cosine#{tag}", f"ellm={F}/ellm#{tag}",
            f"oir={C}/oir_a#{tag}", f"oir={C}/oir_b#{tag}", f"oir={C}/oir_c#{tag}"]


def _tables(capsys, runs: list[str]) -> list[list[str]]:
    """The table rows of each section ("## ...") that analyze_runs prints."""
    assert analyze_runs.main(["--table-only", "--runs", *runs]) == 0
    sections: list[list[str]] = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("## "):
            sections.append([])
        elif line.startswith("| ") and "±" in line:
            sections[-1].append(line)
    return sections


def _table(capsys, runs: list[str]) -> list[str]:
    """The end-of-run table's rows."""
    return _tables(capsys, runs)[0]


def _cells(row: str) -> str:
    """The three metric cells of a table row, as the doc's narrower tables print them."""
    return " | ".join(c.strip() for c in row.strip("|").split("|")[2:])


def _at_update(prefixes, update: int) -> list[float]:
    """Each run's mean success (original set, mean over its seeds) at one periodic evaluation."""
    return [row["eval/original/mean_success_rate"] for rows in analyze_runs._load_metrics([str(p) for p in prefixes])
            for row in rows if row["update"] == update]


def _labelled(row: str) -> str:
    """The doc labels the ELLM and OIR rows with the proposer / relabeler used."""
    return row.replace("| ellm |", "| ellm (rules) |").replace("| oir |", "| oir (rules) |")


DOC = (ROOT / "docs" / "results.md").read_text()


def test_end_of_run_and_whole_run_tables_in_results_doc_are_rebuilt_from_results(capsys):
    final, whole = _tables(capsys, _runs("final"))[:2]
    assert len(final) == 12 and len(whole) == 12  # 4 methods x 3 instruction sets
    for row in final + whole:
        assert _labelled(row) in DOC, row


def test_epsilon_equal_steps_and_earlier_run_tables_in_results_doc_are_rebuilt_from_results(capsys):
    eps = [r for r in _table(capsys, _runs("final_eps0.05")) if "| original |" in r]
    mid = [r for r in _table(capsys, _runs("000750")) if "| original |" in r]
    earlier = [r for r in _table(capsys, [f"first={H}/oir_a", f"first={H}/oir_b",
                                          f"buffer={F}/oir_a", f"buffer={F}/oir_b", f"buffer={F}/oir_c",
                                          f"all={C}/oir_a", f"all={C}/oir_b", f"all={C}/oir_c",
                                          f"cosine={H}/cosine", f"ellm={H}/ellm"]) if "| original |" in r]
    assert len(eps) == 4 and len(mid) == 4 and len(earlier) == 5
    for row in eps + mid + earlier:
        assert _cells(row) in DOC, row


def test_early_curve_window_and_the_update_150_check_in_results_doc(capsys):
    """--curve-max-step keeps the first evaluations; the short GPU check and the full runs at update 150."""
    assert analyze_runs.main(["--table-only", "--curve-max-step", "1228800", "--runs", *_runs("final")]) == 0
    out = capsys.readouterr().out.split("## Mean over")[1].split("\n## ")[0]
    rows = [r for r in out.splitlines() if "| original |" in r]
    assert len(rows) == 4 and all("| 3 |" in r for r in rows)
    short = _table(capsys, [f"short={ROOT}/results/gpu_h100_short/oir#000150"])
    assert _cells(short[0]).startswith("0.114 ± 0.034 |")  # its final evaluation, at update 150
    at150 = _at_update(OIR, 150)
    assert len(at150) == 3  # one seed per run; "eval/..." is the mean over a run's seeds
    se = np.std(at150, ddof=1) / np.sqrt(3)
    assert f"{np.mean(at150):.3f} ± {se:.3f}" == "0.083 ± 0.010"
    assert "scored 0.114 ± 0.034 at 1.2e6 steps" in DOC and "gave 0.083 ± 0.010 there" in DOC


def test_repeated_names_pool_seeds_and_tags_pick_the_evaluation(capsys):
    one = _table(capsys, [f"gt={R}/gt#final"])
    pooled = _table(capsys, [f"gt={R}/gt#final", f"gt={R}/gt#final"])
    # the same three seeds twice: same mean, smaller standard error
    mean = lambda row: row.split("|")[3].split("±")[0].strip()  # noqa: E731
    assert [mean(r) for r in one] == [mean(r) for r in pooled]
    assert one != pooled


def test_a_missing_file_names_what_is_there(capsys):
    with pytest.raises(SystemExit, match=r"no evaluation file .*gt_eval_000300\.json; evaluations there: "
                                         r"#000750, #final, #final_eps0\.05"):
        analyze_runs.main(["--table-only", "--runs", f"gt={R}/gt#000300"])
    with pytest.raises(SystemExit, match="no evaluation file .*eval_final.json; no evaluation file there"):
        analyze_runs.main(["--table-only", "--runs", f"x={R}/nothing"])
    with pytest.raises(SystemExit, match="expected NAME=PATH"):
        analyze_runs.main(["--table-only", "--runs", str(R / "gt")])


def test_delta_sensitivity_reference_file_and_doc_table_match_the_script(tmp_path, capsys):
    """examples/delta_sensitivity.py rebuilds results/reference/delta_sensitivity.json exactly."""
    import delta_sensitivity

    out = tmp_path / "d.json"
    assert delta_sensitivity.main(["--out", str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| original |")]
    assert json.loads(out.read_text()) == json.loads((ROOT / "results" / "reference" / "delta_sensitivity.json").read_text())
    assert len(rows) == 5
    for row in rows:
        assert row in DOC, row
    with pytest.raises(SystemExit):
        delta_sensitivity.main(["--deltas", "1.5"])


def test_the_along_the_run_claims_in_results_doc_hold_on_the_curves():
    """OIR's pooled curve leads at 20 of 25 evaluations, at every one from 5.7e6 steps on."""
    curves = {name: analysis.pooled_curves(analyze_runs._load_metrics([str(p) for p in prefixes]))
              for name, prefixes in {"gt": [R / "gt"], "cosine": [C / "cosine"], "ellm": [F / "ellm"], "oir": OIR}.items()}
    steps = curves["oir"][0]
    mean = {k: v[1]["mean_success_rate"].mean(axis=1) for k, v in curves.items()}
    best_baseline = np.max([mean[k] for k in ("gt", "cosine", "ellm")], axis=0)
    lead = mean["oir"] > best_baseline
    assert len(steps) == 25 and lead.sum() == 20
    assert lead[steps >= 5.7e6].all() and not lead[(steps > 5e6) & (steps < 5.7e6)].any()
    assert "at 20 of the 25 evaluations" in DOC and "ahead at every evaluation from 5.7e6 steps on" in DOC


def test_early_delta_table_in_results_doc_is_rebuilt_from_results():
    """The early delta look: mean success at updates 50/100/150 and the distinct instructions offered."""
    for name, prefixes, offered in [("0.5", [D / "d05"], "51 in 150 updates"), ("0.7", [D / "d07"], "53 in 145 updates"),
                                    ("0.9 (this page's OIR)", OIR, None)]:
        cells = " / ".join(f"{np.mean(v):.3f}" if (v := _at_update(prefixes, u)) else "-" for u in (50, 100, 150))
        assert f"| {name} | {len(prefixes)} | {cells}" in DOC, (name, cells)
        if offered:
            info = json.loads(Path(f"{prefixes[0]}_instructions.json").read_text())
            assert offered == f"{info['distinct']} in {info['update']} updates"
    assert "| 0.7 | 1 | 0.000 / 0.023 / - (stopped at update 145) | 53 in 145 updates |" in DOC


def test_delta_ablation_table_and_plot_are_rebuilt_from_results(tmp_path, capsys):
    assert analyze_runs.main(["--runs", f"oir={C}/oir_a", "--out", str(tmp_path), "--ablation",
                              f"0.5={D}/d05#000100", f"0.7={D}/d07#000100",
                              *(f"0.9={C}/{r}#000100" for r in ("oir_a", "oir_b", "oir_c"))]) == 0
    out = capsys.readouterr().out.split("## Delta ablation")[1]
    rows = [r for r in out.splitlines() if r.startswith("| delta=")]
    assert [r.split("|")[1].strip() for r in rows] == ["delta=0.5", "delta=0.7", "delta=0.9"]
    for row in rows:
        assert row in DOC, row
    assert (tmp_path / "delta_ablation.png").stat().st_size > 10_000


def _section(out: str, title: str) -> list[str]:
    """The table rows of the printed section whose title starts with ``title``."""
    body = out.split(f"## {title}")[1].split("\n## ")[0]
    return [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| method")]


def test_final_point_beside_the_mean_of_the_last_5_evaluations_with_bootstrap_intervals(capsys):
    from oir_gym.metrics import bootstrap_ci

    assert analyze_runs.main(["--table-only", "--runs", *_runs("final")]) == 0
    out = capsys.readouterr().out
    rows = _section(out, "Final point and mean of the last 5 evaluations")
    assert len(rows) == 12 and all(r.split("|")[3].strip() == "3" and r.split("|")[5].strip() == "5" for r in rows)
    oir = next(r for r in rows if r.startswith("| oir | original |"))
    # OIR: each seed's last 5 evaluations (updates 1050-1220) averaged, then the 3 seeds
    per_seed = []
    for run in analyze_runs._load_metrics([str(p) for p in OIR]):
        evals = [r["eval/original/mean_success_rate"] for r in run if "eval/original/mean_success_rate" in r]
        per_seed.append(np.mean(evals[-5:]))
    low, high = bootstrap_ci(per_seed)
    assert f"| {np.mean(per_seed):.3f} [{low:.3f}, {high:.3f}] |" in oir
    assert oir.split("|")[4].strip().startswith("0.352 [")  # the final point: the end-of-run table's mean
    assert "gain" not in out  # these runs predate the control: no gain columns, no control table


def test_a_numeric_tag_ends_the_last_evaluations_at_that_update(capsys):
    assert analyze_runs.main(["--table-only", "--runs", f"oir={C}/oir_a#000750"]) == 0
    row = _section(capsys.readouterr().out, "Final point")[0]
    expected = np.mean([v for u in (550, 600, 650, 700, 750) for v in _at_update([C / "oir_a"], u)])
    assert f"| 5 | {expected:.3f} [n/a] |" in row  # one seed: no interval


def test_runs_with_the_control_get_gain_columns_and_the_control_table(tmp_path, capsys):
    """A run directory as train_pqn.py writes it, with evaluations made by oir_gym.evaluation."""
    from oir_gym.evaluation import EvalConfig, eval_instructions, eval_result

    cfg = EvalConfig(sets=("original",), episodes=1)
    texts, achs, sets = eval_instructions(cfg)
    wood, drink = texts.index("collect wood"), texts.index("collect drink")

    def seed_result(extra_wood: bool):
        achieved = np.zeros((len(texts), 22), bool)
        achieved[wood, 0] = True  # asked for wood: wood
        achieved[drink, 4] = True  # asked for drink: drink
        achieved[texts.index("eat cow"), 0] = extra_wood  # wood's mismatched instruction is "eat cow"
        return eval_result(cfg, texts, achs, sets, achieved)

    results = [seed_result(False), seed_result(True)]
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_final.json").write_text(json.dumps([r.to_dict() for r in results]))
    rows = []
    for u in range(1, 4):
        row = {"update": u, "env_steps": 100 * u}
        for s, r in enumerate(results):
            row.update({f"seed{s}/{k}": v for k, v in r.flat_metrics().items()})
        rows.append(row)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert analyze_runs.main(["--table-only", "--runs", f"m={run}"]) == 0
    out = capsys.readouterr().out
    gain = [2 / 22, 1 / 22]  # seed 0: wood and drink only when asked; seed 1: wood also under "eat cow"
    last = _section(out, "Final point")[0]
    assert last.startswith(f"| m | original | 2 | {2 / 22:.3f} [") and "| 3 |" in last
    assert last.endswith(f"| {np.mean(gain):+.3f} [{gain[1]:+.3f}, {gain[0]:+.3f}] | "
                         f"{np.mean(gain):+.3f} [{gain[1]:+.3f}, {gain[0]:+.3f}] |")
    control = _section(out, "Instruction following")
    assert control[0].startswith(f"| m | original | {2 / 22:.3f} | {0.5 / 22:.3f} | 0.000 | {np.mean(gain):+.3f} [")


def test_cumulative_time_adds_the_time_of_each_earlier_process_of_a_resumed_run():
    rows = [{"time": 10.0}, {"time": 20.0}, {"time": 5.0}, {"time": 7.5}, {"time": 1.0}]
    np.testing.assert_allclose(analysis.cumulative_time(rows), [10, 20, 25, 27.5, 28.5])


def test_cumulative_training_time_leaves_out_the_evaluations_before_each_row():
    """A row's ``time`` is taken before its own evaluation (``time/eval_s``), so only earlier
    evaluations are subtracted; a resumed process starts its evaluation count again."""
    rows = [{"time": 10.0, "time/eval_s": 2.0}, {"time": 20.0}, {"time": 30.0, "time/eval_s": 3.0},
            {"time": 5.0, "time/eval_s": 1.0}, {"time": 9.0}]
    np.testing.assert_allclose(analysis.cumulative_time(rows, exclude_eval=True), [10, 18, 28, 33, 36])
    np.testing.assert_allclose(analysis.cumulative_time(rows), [10, 20, 30, 35, 39])


TIME_RUNS = [f"paper (64 envs), oir rules={p}" for p in OIR] + [
    f"fast (1,024 envs), oir rules, lr 2.5e-4={ROOT / 'results' / 'gpu_h100x2_fast' / 'fast_oir'}",
    f"fast (1,024 envs), oir rules, lr 5e-4={ROOT / 'results' / 'gpu_h100x2_fast' / 'fast_oir_lr5e-4'}"]


def test_time_to_target_table_in_results_doc_is_rebuilt_from_results(tmp_path, capsys):
    """Issue 15: mean success against wall clock for the paper and fast presets (compile included,
    resumes summed), the first evaluation at >= 0.33 and the best within 15 min; the plot is written."""
    assert analyze_runs.main(["--runs", *TIME_RUNS, "--time-target", "0.33", "--time-budget", "900",
                              "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.split("## Time to target")[1].splitlines() if ln.startswith("| ") and " s" in ln
            and not ln.startswith("| run ")]
    assert len(rows) == 3 and rows[0].startswith("| paper") and "not reached" in rows[2]
    doc = (ROOT / "docs" / "results.md").read_text()
    for row in rows:
        assert row in doc, row
    assert (tmp_path / "time_to_target.png").stat().st_size > 10_000


def test_plots_leave_the_callers_matplotlib_backend_and_pyplot_figures_alone(tmp_path):
    """A notebook's backend must survive our plots (they draw on Figure objects, not through pyplot)."""
    import subprocess

    code = f"""
import sys, matplotlib
sys.path.insert(0, {str(ROOT)!r})
matplotlib.use("svg")
import matplotlib.pyplot as plt
from oir_gym import analysis
rows = analysis.read_jsonl({str(ROOT / 'results' / 'gpu_h100x2_fast' / 'fast_oir' / 'metrics.jsonl')!r})
analysis.plot_training(rows, {str(tmp_path / 't.png')!r})
analysis.plot_learning_curves({{"a": [rows]}}, {str(tmp_path / 'c.png')!r})
analysis.plot_time_to_target({{"a": [rows]}}, {str(tmp_path / 'w.png')!r}, 0.33)
print(matplotlib.get_backend(), len(plt.get_fignums()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["svg", "0"]
    assert all((tmp_path / f).stat().st_size > 5_000 for f in ("t.png", "c.png", "w.png"))


L = ROOT / "results" / "gpu_h100_llm_vs_rules"  # Gemma 3 270M (bound) beside rules (bound, cosine), 306 updates


def test_llm_against_rules_tables_in_results_doc_are_rebuilt_from_results(capsys):
    """Issue 14: the three runs at update 306, their final/last-5/gain table and the control table."""
    runs = [f"{n}={L}/{n}#000306" for n in ("oir_llm_bound", "oir_rules_bound", "oir_rules_cosine")]
    assert analyze_runs.main(["--table-only", "--runs", *runs]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| oir_")]
    ev = [r for r in rows if r.count("|") == 6 and any(f"| {s} |" in r for s in ("original", "own_words", "compound"))]
    wanted = ev + [r for r in rows if r.count("|") in (8, 9) and "| original |" in r]
    assert len(wanted) == 9 + 3 + 3  # evaluation table (3 sets) + final/last-5 + control (original)
    for row in wanted:
        assert row in DOC, row
    # the LLM's share of buffer offers, as the doc states it, from the run's diversity file
    import json
    d = json.loads((L / "oir_llm_bound" / "diversity.json").read_text())
    assert d["relabel/llm_offer_share_total"] == 0.0 and d["relabel/offers_total"] == 19647
    assert "| `oir_llm_bound` | 19,647 | **0.000** | 107 | 0.561 | 7.13 |" in DOC


def test_fast_preset_delta_tables_in_results_doc_are_rebuilt_from_results(capsys):
    """Issue 14's delta ablation, partial: delta 0.5 against 0.9 at the fast preset, update 48."""
    root = ROOT / "results" / "gpu_h100x2_fast_delta"
    runs = [f"fast, delta {d}={root}/fast_d{tag}_lr2.5e-4#000048" for d, tag in (("0.9", "09"), ("0.5", "05"))]
    assert analyze_runs.main(["--table-only", "--runs", *runs]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| fast, delta") and "| original |" in ln]
    wanted = [r for r in rows if r.count("|") in (8, 9)]
    assert len(wanted) == 4  # final/last-5 and control rows of both runs
    for row in wanted:
        assert row in DOC, row


TUNING = ROOT / "results" / "gpu_h100x2_fast_tuning"


def test_fast_preset_tuning_tables_in_results_doc_are_rebuilt_from_results(tmp_path, capsys):
    """Issue 15: the tuning rounds' time-to-target table, and the tuned preset beside gt, cosine and
    the paper preset (time to target, final success and gain), as docs/results.md shows them."""
    tuning = [f"r1 fast40 oir lr5e-4={TUNING / 'r1_fast40_oir_lr5e-4'}", f"r1 fast40 gt lr5e-4={TUNING / 'r1_fast40_gt_lr5e-4'}",
              f"r2 fast64 oir 2 epochs={TUNING / 'r2_fast64_oir_ep2'}", f"r2 fast64 oir 4 epochs={TUNING / 'r2_fast64_oir_ep4'}",
              f"r3 fast (tuned) oir={TUNING / 'r3_fast_oir'}"]
    beside = [f"paper (64 envs), oir rules={p}" for p in OIR] + [
        f"fast, last round (lr 2.5e-4, 40 updates), oir rules={ROOT / 'results' / 'gpu_h100x2_fast' / 'fast_oir'}",
        f"fast, tuned, oir rules={TUNING / 'r3_fast_oir'}", f"fast, tuned, cosine={TUNING / 'r3_fast_cosine'}",
        f"fast, tuned, gt={TUNING / 'r3_fast_gt'}"]
    doc = (ROOT / "docs" / "results.md").read_text()
    for runs, n in ((tuning, 5), (beside, 5)):
        assert analyze_runs.main(["--runs", *runs, "--time-target", "0.33", "--time-budget", "300",
                                  "--out", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        rows = [ln for ln in out.split("## Time to target")[1].splitlines() if ln.startswith("| ")
                and not ln.startswith("| run ")]
        assert len(rows) == n
        for row in rows:
            assert row in doc, row
    # the final point of the tuned preset: success and gain per set, as the condensed table gives them
    final = _section(out, "Final point")
    for name, sets in (("fast, tuned, oir rules", ("original", "simple", "complex")),
                       ("fast, tuned, cosine", ("original",)), ("fast, tuned, gt", ("original",))):
        for s in sets:
            cells = [c.strip() for c in next(r for r in final if r.startswith(f"| {name} | {s} |")).split("|")]
            assert f"| {name} | {s} | {cells[4]} | {cells[7]} |" in doc, (name, s)
    # gt and cosine at delta 0.9 got the same rewards: the same run, update by update
    gt, cos = ([json.loads(line) for line in open(TUNING / n / "metrics.jsonl")] for n in ("r3_fast_gt", "r3_fast_cosine"))
    assert [r["loss"] for r in gt] == [r["loss"] for r in cos]


H200 = ROOT / "results" / "gpu_h200x2_fast_llm_delta"


def _update_medians(run: Path) -> list[float]:
    """Where a run's updates went: the medians of its ``time/rollout_s``, ``time/host_s``, ``time/update_s``."""
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    return [float(np.median([r[k] for r in rows if k in r])) for k in ("time/rollout_s", "time/host_s", "time/update_s")]


def _condensed(rows: list[str]) -> list[str]:
    """Final-point rows as the page condenses them: method, set, final success, final gain."""
    cells = [[c.strip() for c in r.split("|")] for r in rows]
    return [f"| {c[1]} | {c[2]} | {c[4]} | {c[7]} |" for c in cells]


def test_latest_fast_preset_tables_in_results_doc_are_rebuilt_from_results(tmp_path, capsys):
    """Issues 14 and 15 on 2 x H200: time to target, the delta ablation (with the user file's sets)
    and the LLM relabeler beside rules, as docs/results.md shows them."""
    doc = (ROOT / "docs" / "results.md").read_text()
    ttt = [f"fast preset, oir rules, H200={H200 / 'fast_oir_k4'}", f"fast preset but K 2, oir rules, H200={H200 / 'fast_oir_k2'}",
           f"fast preset, oir rules, H100 (last round)={ROOT / 'results' / 'gpu_h100x2_fast_tuning' / 'r3_fast_oir'}"]
    assert analyze_runs.main(["--runs", *ttt, "--time-target", "0.33", "--time-budget", "300", "--out", str(tmp_path)]) == 0
    rows = _section(capsys.readouterr().out, "Time to target")
    assert len(rows) == 4 and all(r in doc for r in rows[1:]), rows  # rows[0]: the header
    d09 = f"{H200 / 'fast_oir_k4'}#end_files"
    assert analyze_runs.main(["--table-only", "--runs", f"d0.5={H200 / 'fast_d05'}", f"d0.7={H200 / 'fast_d07'}",
                              f"d0.9={d09}", "--ablation", f"0.5={H200 / 'fast_d05'}", f"0.7={H200 / 'fast_d07'}",
                              f"0.9={d09}"]) == 0
    out = capsys.readouterr().out
    ablation = _section(out, "Delta ablation")
    assert len(ablation) == 3 and all(r in doc for r in ablation)
    # the file's sets of the delta-0.9 (cosine) run came from --eval-only on its checkpoint, before the
    # fix of that path (95b02fe): withdrawn, so the page must not show them
    def withdrawn(row: str) -> bool:
        return row.startswith(("| d0.9 | own_words", "| d0.9 | compound", "| oir rules, cosine | own_words",
                               "| oir rules, cosine | compound"))

    final = _condensed(_section(out, "Final point"))
    assert len(final) == 15 and all(r in doc for r in final if not withdrawn(r)), [r for r in final if r not in doc]
    assert not any(r in doc for r in final if withdrawn(r)) and "**Withdrawn: the delta-0.9 rows" in doc
    llm = [f"oir llm+rules, bound={H200 / 'fast_bound_llm'}", f"oir rules, bound={H200 / 'fast_bound_rules'}",
           f"oir rules, cosine={d09}"]
    assert analyze_runs.main(["--table-only", "--runs", *llm]) == 0
    final = _condensed(_section(capsys.readouterr().out, "Final point"))
    assert len(final) == 15 and all(r in doc for r in final if not withdrawn(r)), [r for r in final if r not in doc]
    assert sum(withdrawn(r) for r in final) == 2 and not any(r in doc for r in final if withdrawn(r))
    # the relabeling table: offers, LLM share, distinct instructions, novelty, wordings per event
    for name, run in (("oir llm+rules, bound", "fast_bound_llm"), ("oir rules, bound", "fast_bound_rules"),
                      ("oir rules, cosine", "fast_oir_k4")):
        d = json.loads((H200 / run / "diversity.json").read_text())
        assert (f"| {name} | {d['relabel/offers_total']:,.0f} | {d['relabel/llm_offer_share_total']:.3f} | "
                f"{d['diversity/instructions']:.0f} | {d['diversity/novelty_share']:.3f} | "
                f"{d['diversity/wordings_per_event']:.2f} |") in doc, name
    # the LLM run's calls, latency and answers as the page states them
    last = [json.loads(line) for line in open(H200 / "fast_bound_llm" / "metrics.jsonl")][-1]
    assert (last["relabel/llm_calls"], last["relabel/llm_candidates_llm"], last["relabel/dropped/unbound"]) == (16, 485, 1582)
    assert round(last["relabel/llm_latency_mean_s"], 1) == 17.2 and last["relabel/llm_stale"] == 0
    # what only the LLM run offered, and how much of it copies the prompt's example answers
    from oir_gym.diversity import ECHO_BAR, prompt_echo
    from oir_gym.relabel.prompts import load_template

    items = {n: {i["text"]: i["count"] for i in json.loads((H200 / n / "instructions.json").read_text())["items"]}
             for n in ("fast_bound_llm", "fast_bound_rules")}
    only = {t: c for t, c in items["fast_bound_llm"].items() if t not in items["fast_bound_rules"]}
    echo = {t: c for t, c in only.items() if prompt_echo(t, load_template("segments").examples()) >= ECHO_BAR}
    assert (len(only), sum(only.values()), len(echo), sum(echo.values())) == (95, 374, 40, 307)
    # where an update went (medians of time/*), as the page states them
    k4, k2, llm_run, rules_run = (_update_medians(H200 / n) for n in ("fast_oir_k4", "fast_oir_k2", "fast_bound_llm", "fast_bound_rules"))
    assert [round(v, 2) for v in k4] == [0.52, 0.53, 1.99] and round(sum(k4), 2) == 3.04
    assert "0.52 s waiting for the rollout, 0.53 s of host work" in doc and "1.99 s for the update program; 3.04 s" in doc
    assert round(k2[2], 2) == 1.43 and round(sum(k2), 2) == 2.33 and "(1.43 s for the update program, 2.33 s in" in doc
    assert (round(sum(llm_run), 2), round(sum(rules_run), 2)) == (3.88, 3.74) and "3.88 s against 3.74 s" in doc


H100_TIME = ROOT / "results" / "gpu_h100_fast_time"
FAST_1E7 = ROOT / "results" / "gpu_h200x2_fast_1e7"


def test_this_rounds_h100_time_to_target_and_1e7_delta_ablation_tables_are_rebuilt_from_results(tmp_path, capsys):
    """Issue 15's H100 timing and issue 14's delta ablation to 1e7 steps, as docs/results.md shows them."""
    doc = (ROOT / "docs" / "results.md").read_text()
    R = ROOT / "results"
    ttt = [f"fast preset, H100={H100_TIME / 'h100_fast_warm'}", f"fast preset + lag 1, H100={H100_TIME / 'h100_fast_lag'}",
           f"fast preset (lag 0), H100 (round before)={R / 'gpu_h100x2_fast_tuning' / 'r3_fast_oir'}",
           f"fast preset (lag 0), H200 (last round)={H200 / 'fast_oir_k4'}"]
    assert analyze_runs.main(["--runs", *ttt, "--time-target", "0.33", "--time-budget", "300", "--out", str(tmp_path)]) == 0
    rows = _section(capsys.readouterr().out, "Time to target")
    assert len(rows) == 5 and all(r in doc for r in rows[1:]), rows
    assert rows[1].startswith("| fast preset, H100 | 3 | not reached |")  # the page's headline: not within 300 s
    runs = [f"d0.5={FAST_1E7 / 'e7_d05'}", f"d0.7={FAST_1E7 / 'e7_d07'}", f"d0.9={FAST_1E7 / 'e7_d09'}"]
    assert analyze_runs.main(["--table-only", "--runs", *runs, "--ablation", *(r[1:] for r in runs)]) == 0
    out = capsys.readouterr().out
    ablation = _section(out, "Delta ablation")
    assert len(ablation) == 3 and all(r in doc for r in ablation)
    final = _condensed(_section(out, "Final point"))
    assert len(final) == 15 and all(r in doc for r in final), [r for r in final if r not in doc]
    # every run reached 1e7 steps, with the lag the preset now sets, and evaluated the user file during training
    for n in ("e7_d05", "e7_d07", "e7_d09"):
        cfg = json.loads((FAST_1E7 / n / "config.json").read_text())
        assert (cfg["run"]["total_timesteps"], cfg["oir"]["relabel_lag"]) == (10_485_760, 1)
        assert cfg["eval"]["instruction_files"] and "own_words" in json.loads((FAST_1E7 / n / "eval_final.json").read_text())[0]
    # where an H100 update went (medians of time/*), as the page states them
    lag, warm = ([round(v, 2) for v in _update_medians(H100_TIME / n)] for n in ("h100_fast_lag", "h100_fast_warm"))
    assert lag == [0.54, 0.11, 2.32] and warm == [0.60, 0.13, 2.33]
    assert "0.54 / 0.60 s waiting for the rollout, 0.11 / 0.13 s of host work, and 2.32 / 2.33 s" in doc


BF16 = ROOT / "results" / "gpu_h100_fast_bf16"


def test_bfloat16_fast_preset_time_to_target_and_15_minute_tables_are_rebuilt_from_results(tmp_path, capsys):
    """Issue 15 on one H100 (this round): the fast preset with bfloat16 matmuls passing 0.33 within
    300 s, the 15-minute run, and the 2-GPU scaling, as docs/results.md and docs/benchmarks.md show them."""
    doc = (ROOT / "docs" / "results.md").read_text()
    R = ROOT / "results"
    ttt = [f"fast preset (bfloat16), H100={BF16 / 'h100_bf16'}", f"fast preset, final code, H100={BF16 / 'h100_fast_final'}",
           f"fast preset + lr 7e-4, H100={BF16 / 'h100_bf16_lr7e-4'}",
           f"fast preset, 208 updates, H100={BF16 / 'h100_fast_15min'}",
           f"fast preset float32 (last round), H100={R / 'gpu_h100_fast_time' / 'h100_fast_lag'}",
           f"paper preset, H100={R / 'gpu_h100_1e7_fixed' / 'oir_a'}"]
    assert analyze_runs.main(["--runs", *ttt, "--time-target", "0.33", "--time-budget", "300", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = _section(out, "Time to target")
    assert len(rows) == 7 and all(r in doc for r in rows[1:]), rows
    # the headline: both runs of the preset within 300 s
    assert rows[1].startswith("| fast preset (bfloat16), H100 | 3 | 265 s;")
    assert rows[2].startswith("| fast preset, final code, H100 | 3 | 295 s;")
    gains = [r for r in _section(out, "Instruction following") if "| original |" in r and "lr 7e-4" not in r
             and "float32" not in r and "paper" not in r]
    assert len(gains) == 3 and all(r in doc for r in gains), gains
    # the runs are what the page says: the preset's bfloat16 matmuls, one card each, 3 seeds
    for n, updates in (("h100_bf16", 64), ("h100_fast_final", 64), ("h100_bf16_lr7e-4", 64), ("h100_fast_15min", 208)):
        cfg = json.loads((BF16 / n / "config.json").read_text())
        assert (cfg["pqn"]["compute_dtype"], cfg["run"]["num_seeds"], cfg["pqn"]["num_envs"]) == ("bfloat16", 3, 1024)
        assert cfg["run"]["total_timesteps"] == updates * 1024 * 128
    med = [round(v, 2) for v in _update_medians(BF16 / "h100_bf16")]
    assert med == [0.54, 0.08, 1.91] and "medians 0.54 s waiting\n  for the rollout, 0.08 s of host work and 1.91 s" in doc
    last = [json.loads(line) for line in open(BF16 / "h100_fast_15min" / "metrics.jsonl")][-1]
    assert round(last["eval/original/mean_success_rate"], 3) == 0.413 and round(last["time"]) == 757
    # the 2-GPU scaling table as docs/benchmarks.md shows it
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    table = (R / "gpu_h100x2_scaling_lag" / "scaling_paper_h100x2.txt").read_text().split("Scaling | paper sizes")[1]
    scaling = [line for line in table.splitlines() if line.startswith("| (")]
    assert len(scaling) == 3 and all(r in bench for r in scaling), scaling
    assert [r.rsplit("|", 2)[1].strip() for r in scaling] == ["1.93x", "1.92x", "2.00x"]


def test_retention_and_ordered_tables_with_t_intervals(tmp_path, capsys):
    """Hand-built final evaluations of two seeds with the held-out and ordered sets: the retention
    and order tables print each seed's values' mean with the 95% t interval."""
    from oir_gym.evaluation import RECORD_SHAPE, EvalConfig, eval_instructions, eval_result
    from oir_gym.metrics import t_interval

    cfg = EvalConfig(sets=("original", "heldout", "ordered", "ordered_reverse"), episodes=1)
    texts, achs, sets = eval_instructions(cfg)
    heldout = [i for i, s in enumerate(sets) if s == "heldout"]
    sw, ws = texts.index("collect sapling then collect wood"), texts.index("collect wood then collect sapling")

    def seed_result(both_wood_paraphrases: bool):
        rec = np.full((len(texts), *RECORD_SHAPE), -1, np.int32)
        rec[texts.index("collect wood"), 0, 0] = 5  # wood and drink learned (success 1), the rest not
        rec[texts.index("collect drink"), 0, 4] = 5
        rec[heldout[0], 0, 0] = 7  # wood's first held-out wording; the second one in one seed only
        rec[heldout[1], 0, 0] = 7 if both_wood_paraphrases else -1
        rec[heldout[8:10], 0, 4] = 3  # both of drink's
        rec[sw, 0, [3, 0]] = [1, 3]  # asked "sapling then wood": sapling at 1, wood at 3
        rec[sw, 1 + 3, 0] = 3
        rec[ws, 0, [0, 3]] = [1, 2]  # asked "wood then sapling": wood at 1, sapling at 2
        rec[ws, 1 + 0, 3] = 2
        return eval_result(cfg, texts, achs, sets, rec)

    results = [seed_result(False), seed_result(True)]
    assert [texts[i] for i in heldout[8:10]] == ["Take a sip of water.", "Go to the water's edge and have a drink."]
    run = tmp_path / "run"
    run.mkdir()
    (run / "eval_final.json").write_text(json.dumps([r.to_dict() for r in results]))
    (run / "metrics.jsonl").write_text(json.dumps({"update": 1, "env_steps": 100}) + "\n")
    assert analyze_runs.main(["--table-only", "--runs", f"m={run}"]) == 0
    out = capsys.readouterr().out
    retention = [0.75, 1.0]  # seed 0: (0.5 + 1) / 2; seed 1: (1 + 1) / 2
    lo, hi = t_interval(retention)
    rows = {r.split("|")[2].strip(): r for r in _section(out, "Paraphrase retention")}
    assert f"| {np.mean(retention):.3f} [{lo:.3f}, {hi:.3f}] |" in rows["heldout"]
    assert rows["original"].startswith(f"| m | original | 2 | {2 / 22:.3f} [{2 / 22:.3f}, {2 / 22:.3f}] | - |")
    (order,) = _section(out, "Ordered compounds")
    # each set: 1 of 22 pairs in its order; asked "wood then sapling", sapling never came before wood
    assert order == (f"| m | 2 | {1 / 22:.3f} [{1 / 22:.3f}, {1 / 22:.3f}] | {1 / 22:.3f} [{1 / 22:.3f}, {1 / 22:.3f}] "
                     f"| 0.000 [0.000, 0.000] | +{1 / 22:.3f} [+{1 / 22:.3f}, +{1 / 22:.3f}] |")
    assert results[0].flat_metrics()["eval/heldout/retention"] == pytest.approx(0.75)
    # --baseline: each cell's difference to the baseline's, with a Welch t interval (here: itself, 0)
    assert analyze_runs.main(["--table-only", "--runs", f"m={run}", f"b={run}", "--baseline", "b"]) == 0
    rows = {(r.split("|")[1].strip(), r.split("|")[2].strip()): r for r in _section(capsys.readouterr().out,
                                                                                  "Paraphrase retention")}
    assert "; vs base: +0.000 [" in rows[("m", "heldout")] and "vs base" not in rows[("b", "heldout")]
    with pytest.raises(SystemExit):
        analyze_runs.main(["--table-only", "--runs", f"m={run}", "--baseline", "nope"])
    assert results[0].flat_metrics()["eval/control/ordered/order_gain"] == pytest.approx(1 / 22)
