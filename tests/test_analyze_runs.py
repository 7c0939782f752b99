"""examples/analyze_runs.py rebuilds the tables of docs/results.md, docs/results_history.md,
docs/benchmarks.md and docs/benchmarks_history.md from the files in results/; the pages' claims hold on those files."""

from __future__ import annotations

import json
import gzip
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
from agents.tools import analyze_runs  # noqa: E402

from oir_gym import analysis  # noqa: E402
from oir_gym.metrics import t_interval  # noqa: E402

RES = ROOT / "results"
R = RES / "gpu_h200_1e7"  # PQN-GT (and a pre-fix OIR replicate to 6.25e6)
H = RES / "gpu_h100_1e7"  # the first cosine, ELLM (pinned goal) and OIR (seeds 2 + 1) runs
F = RES / "gpu_h100_1e7_fixed"  # ELLM with the any-goal reward; OIR with the buffer fix only
C = RES / "gpu_h100_1e7_cut"  # OIR with every fix (seeds 1 + 1 + 1); cosine with the caption fix
D = RES / "gpu_h100_delta_early"  # OIR at delta 0.5 and 0.7, 1 seed each, to ~150 updates
L = RES / "gpu_h100_llm_vs_rules"  # Gemma 3 270M (bound) beside rules (bound, cosine), 306 updates
TUNING = RES / "gpu_h100x2_fast_tuning"
H200 = RES / "gpu_h200x2_fast_llm_delta"
H100_TIME = RES / "gpu_h100_fast_time"
FAST_1E7 = RES / "gpu_h200x2_fast_1e7"
BF16 = RES / "gpu_h100_fast_bf16"
STARTUP = RES / "gpu_h100x4_startup"  # the fast preset with the written-out LSTM gradient and the start-up changes
OIR = [C / "oir_a", C / "oir_b", C / "oir_c"]

RESULTS = (ROOT / "docs" / "results.md").read_text()
HISTORY = (ROOT / "docs" / "results_history.md").read_text()
#: both pages: sections move from the results page to the history page as newer ones take their place
PAGES = RESULTS + HISTORY
#: both benchmark pages: a measurement's earlier rows move to the history page as newer ones take their place
BENCH = (ROOT / "docs" / "benchmarks.md").read_text() + (ROOT / "docs" / "benchmarks_history.md").read_text()


def _says(doc: str, text: str) -> bool:
    """The page's prose holds ``text``, whatever its line breaks."""
    return " ".join(text.split()) in " ".join(doc.split())


def _main_runs(tag: str = "final") -> list[str]:
    """The main table's runs, named as docs/results.md names them."""
    return [f"PQN-GT={R}/gt#{tag}", f"PQN-cosine={C}/cosine#{tag}", f"ELLM-rules={F}/ellm#{tag}",
            *(f"OIR-oracle={p}#{tag}" for p in OIR)]


def _out(capsys, *args: str) -> str:
    """analyze_runs' printed output for these arguments."""
    assert analyze_runs.main(list(args)) == 0
    return capsys.readouterr().out


def _tables(capsys, runs: list[str]) -> list[list[str]]:
    """The table rows of each section ("## ...") that analyze_runs prints."""
    sections: list[list[str]] = []
    for line in _out(capsys, "--table-only", "--runs", *runs).splitlines():
        if line.startswith("## "):
            sections.append([])
        elif line.startswith("| ") and "±" in line:
            sections[-1].append(line)
    return sections


def _table(capsys, runs: list[str]) -> list[str]:
    """The end-of-run table's rows."""
    return _tables(capsys, runs)[0]


def _section(out: str, title: str) -> list[str]:
    """The table rows of the printed section whose title starts with ``title``."""
    body = out.split(f"## {title}")[1].split("\n## ")[0]
    return [line for line in body.splitlines() if line.startswith("| ") and not line.startswith(("| method", "| run "))]


def _cells(row: str) -> str:
    """The three metric cells of an end-of-run row, as the narrower tables of the pages print them."""
    return " | ".join(c.strip() for c in row.strip("|").split("|")[2:])


def _at_update(prefixes, update: int) -> list[float]:
    """Each run's mean success (original set, mean over its seeds) at one periodic evaluation."""
    return [row["eval/original/mean_success_rate"] for rows in analyze_runs.load_metrics([str(p) for p in prefixes])
            for row in rows if row["update"] == update]


def _update_medians(run: Path) -> list[float]:
    """Where a run's updates went: the medians of its ``time/rollout_s``, ``time/host_s``, ``time/update_s``."""
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    return [float(np.median([r[k] for r in rows if k in r])) for k in ("time/rollout_s", "time/host_s", "time/update_s")]


def _condensed(rows: list[str]) -> list[str]:
    """Final-point rows as the history page condenses them: method, set, final success, final gain."""
    cells = [[c.strip() for c in r.split("|")] for r in rows]
    return [f"| {c[1]} | {c[2]} | {c[4]} | {c[7]} |" for c in cells]


def _cell(row: str, i: int) -> str:
    """The i-th cell of a table row (0: the method)."""
    return row.strip().strip("|").split("|")[i].strip()


# --------------------------------------------------------------------------- docs/results.md


def test_main_table_in_results_doc_is_rebuilt_from_results(capsys):
    """The main table: final point, last 5, whole run, completed, aggregate and kept, 95% t intervals."""
    rows = _section(_out(capsys, "--table-only", "--interval", "t", "--runs", *_main_runs()), "Summary")
    assert len(rows) == 12  # 4 methods x 3 instruction sets
    for row in rows:
        assert row in RESULTS, row
    oir = next(r for r in rows if r.startswith("| OIR-oracle | original |"))
    per_seed = np.array([s["original"]["mean_success_rate"] for p in OIR for s in json.loads(Path(f"{p}_eval_final.json").read_text())])
    low, high = t_interval(per_seed)
    assert _cell(oir, 3) == f"{per_seed.mean():.3f} [{low:.3f}, {high:.3f}]"
    # over the last 5 evaluations OIR-oracle's interval is apart from every baseline's, on every set
    interval = {(_cell(r, 0), _cell(r, 1)): [float(v) for v in _cell(r, 4).split("[")[1].rstrip("]").split(",")]
                for r in rows}
    for (m, s), (low, _) in interval.items():
        if m == "OIR-oracle":
            assert all(low > hi for (b, t), (_, hi) in interval.items() if t == s and b != m), s
    # paraphrase retention as the page states it: OIR 0.86 on both sets, the baselines' range
    kept = {(_cell(r, 0), _cell(r, 1)): float(_cell(r, 8).split()[0]) for r in rows if _cell(r, 1) != "original"}
    assert {round(v, 2) for (m, _), v in kept.items() if m == "OIR-oracle"} == {0.86}
    base = [v for (m, _), v in kept.items() if m != "OIR-oracle"]
    assert _says(PAGES, f"the baselines {min(base):.2f}-{max(base):.2f}")
    assert _says(PAGES, "OIR-oracle keeps 0.86 of its original-set")


def test_epsilon_random_policy_and_per_instruction_claims_in_results_doc(capsys):
    """The sentences under the main table: epsilon 0.05, the random policy, the per-instruction ranking."""
    eps = {_cell(r, 0): _cell(r, 2).split(" ±")[0] for r in _table(capsys, _main_runs("final_eps0.05")) if "| original |" in r}
    base = sorted(v for k, v in eps.items() if k != "OIR-oracle")
    assert _says(RESULTS, f"OIR-oracle {eps['OIR-oracle']}, the baselines {base[0]}-{base[-1]}")
    rnd = json.loads((RES / "reference" / "random_policy_4x1000.json").read_text())["original"]
    assert _says(RESULTS, f"completes {rnd['num_completed']} of 22, mean success {rnd['mean_success_rate']:.3f}")
    evals = {"gt": [R / "gt"], "cosine": [C / "cosine"], "ellm": [F / "ellm"], "oir": OIR}
    rates = {k: np.mean([s["original"]["rates"] for s in analyze_runs.load_evals([str(p) for p in v])], axis=0)
             for k, v in evals.items()}
    texts = analyze_runs.load_evals([str(R / "gt")])[0]["original"]["texts"]
    best_baseline = np.max([rates[k] for k in ("gt", "cosine", "ellm")], axis=0)
    for name in ("place table", "eat cow", "collect drink", "make wooden pickaxe", "make wooden sword", "defeat zombie"):
        assert rates["oir"][texts.index(name)] > best_baseline[texts.index(name)], name
    assert rates["oir"][texts.index("place plant")] < rates["gt"][texts.index("place plant")]


def test_the_along_the_run_claims_in_results_doc_hold_on_the_curves():
    """OIR's pooled curve leads at 20 of 25 evaluations, at every one from 5.7e6 steps on."""
    curves = {name: analysis.pooled_curves(analyze_runs.load_metrics([str(p) for p in prefixes]))
              for name, prefixes in {"gt": [R / "gt"], "cosine": [C / "cosine"], "ellm": [F / "ellm"], "oir": OIR}.items()}
    steps = curves["oir"][0]
    mean = {k: v[1]["mean_success_rate"].mean(axis=1) for k, v in curves.items()}
    best_baseline = np.max([mean[k] for k in ("gt", "cosine", "ellm")], axis=0)
    lead = mean["oir"] > best_baseline
    assert len(steps) == 25 and lead.sum() == 20
    assert lead[steps >= 5.7e6].all() and not lead[(steps > 5e6) & (steps < 5.7e6)].any()
    assert _says(RESULTS, "at 20 of the 25 evaluations, and at every one from 5.7e6 steps on")


def test_the_leakage_facts_in_results_doc_hold_on_the_vocabulary_and_the_buffers():
    """20 of the 22 canonical captions are original instructions verbatim; 65% of the OIR-oracle runs'
    buffer offers are original strings and none is a paraphrase."""
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS, get_instruction_set

    vocab = json.loads((ROOT / "oir_gym" / "data" / "captions.json").read_text())["events"]
    canonical = [e["phrases"][0] for e in vocab if e["achievement"] is not None]
    assert len(canonical) == 22 and sum(c in ORIGINAL_INSTRUCTIONS for c in canonical) == 20
    assert sorted(c for c in canonical if c not in ORIGINAL_INSTRUCTIONS) == ["make wood pickaxe", "make wood sword"]
    paraphrases = {getattr(i, "text", i) for s in ("simple", "complex") for i in get_instruction_set(s)}
    for p in OIR:
        items = json.loads(Path(f"{p}_instructions.json").read_text())["items"]
        total = sum(i["count"] for i in items)
        assert round(sum(i["count"] for i in items if i["text"] in ORIGINAL_INSTRUCTIONS) / total, 2) == 0.65
        assert not any(i["text"] in paraphrases for i in items)
    assert _says(RESULTS, "20 of the 22 are the original evaluation instructions verbatim")
    assert _says(RESULTS, "65% of the buffer's offers")


def test_instruction_following_table_in_results_doc_is_rebuilt_from_results(capsys):
    """The control on the fast preset (t intervals), original set; PQN-cosine is PQN-GT there."""
    runs = [f"OIR-oracle, fast={TUNING / 'r3_fast_oir'}", f"PQN-GT, fast={TUNING / 'r3_fast_gt'}",
            f"OIR-oracle, fast bf16={BF16 / 'h100_fast_final'}", f"OIR-oracle, fast bf16, 208 updates={BF16 / 'h100_fast_15min'}"]
    rows = [r for r in _section(_out(capsys, "--table-only", "--interval", "t", "--runs", *runs), "Instruction following")
            if "| original |" in r]
    assert len(rows) == 4 and all(r in PAGES for r in rows), rows
    # OIR's gain intervals are above 0, PQN-GT's is not: what the page says
    lows = {_cell(r, 0): float(_cell(r, 6).split("[")[1].split(",")[0]) for r in rows}
    assert all(v > 0 for k, v in lows.items() if k.startswith("OIR")) and lows["PQN-GT, fast"] < 0
    # gt and cosine at delta 0.9 got the same rewards: the same run, update by update
    gt, cos = ([json.loads(line) for line in open(TUNING / n / "metrics.jsonl")] for n in ("r3_fast_gt", "r3_fast_cosine"))
    assert [r["loss"] for r in gt] == [r["loss"] for r in cos]


def test_delta_ablation_table_in_results_doc_is_rebuilt_from_results(capsys):
    """The delta ablation to 1e7 steps at the fast preset (t intervals; original set and own_words)."""
    runs = [f"delta {d}={FAST_1E7 / n}" for d, n in (("0.5", "e7_d05"), ("0.7", "e7_d07"), ("0.9", "e7_d09"))]
    rows = _section(_out(capsys, "--table-only", "--interval", "t", "--runs", *runs), "Summary")
    shown = [r for r in rows if _cell(r, 1) in ("original", "own_words")]
    assert len(rows) == 15 and len(shown) == 6 and all(r in PAGES for r in shown), shown
    # every run reached 1e7 steps, with the lag the preset now sets, and evaluated the user file during training
    for n in ("e7_d05", "e7_d07", "e7_d09"):
        cfg = json.loads((FAST_1E7 / n / "config.json").read_text())
        assert (cfg["run"]["total_timesteps"], cfg["oir"]["relabel_lag"]) == (10_485_760, 1)
        assert cfg["eval"]["instruction_files"] and "own_words" in json.loads((FAST_1E7 / n / "eval_final.json").read_text())[0]
    div = [json.loads((FAST_1E7 / n / "diversity.json").read_text()) for n in ("e7_d05", "e7_d07", "e7_d09")]
    assert [(int(d["diversity/instructions"]), round(d["diversity/novelty_share"], 2)) for d in div] == [(20, 0.15), (48, 0.52), (20, 0.0)]
    assert _says(PAGES, "20 distinct instructions each (novelty share 0.15 and 0.00), delta 0.7 offered 48 (0.52)")


def test_delta_sensitivity_reference_file_and_doc_table_match_the_script(tmp_path, capsys):
    """examples/delta_sensitivity.py rebuilds results/reference/delta_sensitivity.json exactly."""
    from agents.tools import delta_sensitivity

    out = tmp_path / "d.json"
    assert delta_sensitivity.main(["--out", str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| original |")]
    assert json.loads(out.read_text()) == json.loads((RES / "reference" / "delta_sensitivity.json").read_text())
    assert len(rows) == 5
    for row in rows:
        assert row in PAGES, row
    with pytest.raises(SystemExit):
        delta_sensitivity.main(["--deltas", "1.5"])


def test_relabeler_ablation_table_and_llm_facts_in_results_doc_are_rebuilt_from_results(capsys):
    """The LLM relabeler beside rules (bound grounding) and rules with cosine grounding, fast preset."""
    runs = [f"OIR-Gemma+oracle, bound={H200 / 'fast_bound_llm'}", f"OIR-oracle, bound={H200 / 'fast_bound_rules'}",
            f"OIR-oracle, cosine={H200 / 'fast_oir_k4'}"]
    rows = _section(_out(capsys, "--table-only", "--interval", "t", "--runs", *runs), "Summary")
    shown = [r for r in rows if _cell(r, 1) in ("original", "own_words")]
    assert len(rows) == 13 and len(shown) == 5 and all(r in PAGES for r in shown), shown
    # offers, the LLM's share, distinct instructions per run
    div = {n: json.loads((H200 / n / "diversity.json").read_text()) for n in ("fast_bound_llm", "fast_bound_rules", "fast_oir_k4")}
    llm = div["fast_bound_llm"]
    offers, share = llm["relabel/offers_total"], llm["relabel/llm_offer_share_total"]
    assert _says(PAGES, f"{share:.1%} of the buffer's offers ({round(share * offers):,} of {offers:,.0f})")
    distinct = [int(d["diversity/instructions"]) for d in div.values()]
    assert _says(PAGES, f"{distinct[0]} distinct instructions offered with the LLM, {distinct[1]} with rules, {distinct[2]} with cosine")
    # the LLM run's calls, latency and answers as the page states them
    last = [json.loads(line) for line in open(H200 / "fast_bound_llm" / "metrics.jsonl")][-1]
    assert (last["relabel/llm_calls"], last["relabel/llm_candidates_llm"], last["relabel/dropped/unbound"]) == (16, 485, 1582)
    assert round(last["relabel/llm_latency_mean_s"], 1) == 17.2 and last["relabel/llm_stale"] == 0
    assert _says(PAGES, "16 calls in 64 updates (mean latency 17.2 s); 485") and _says(PAGES, "1,582 dropped as unbound")
    # what only the LLM run offered, and how much of it copies the prompt's example answers
    from oir_gym.diversity import ECHO_BAR, prompt_echo
    from oir_gym.relabel.prompts import load_template

    items = {n: {i["text"]: i["count"] for i in json.loads((H200 / n / "instructions.json").read_text())["items"]}
             for n in ("fast_bound_llm", "fast_bound_rules")}
    only = {t: c for t, c in items["fast_bound_llm"].items() if t not in items["fast_bound_rules"]}
    echo = {t: c for t, c in only.items() if prompt_echo(t, load_template("segments").examples()) >= ECHO_BAR}
    assert (len(only), sum(only.values()), len(echo), sum(echo.values())) == (95, 374, 40, 307)
    assert _says(PAGES, "Of the 95 instructions only the LLM run offered (374 offers), 40") and _says(PAGES, "hold 307")


def test_results_doc_stays_a_product_page():
    """At most 250 lines, no round-by-round talk, and the rule relabeler never named as if an LLM ran."""
    assert len(RESULTS.splitlines()) <= 250
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        low = " ".join(page.read_text().lower().split())
        assert not any(w in low for w in ("this round", "last round", "previous round")), page.name
    assert "oir (rules)" not in RESULTS.lower() and "| oir |" not in RESULTS


# --------------------------------------------------------------------------- docs/results_history.md


def test_earlier_oir_runs_and_equal_steps_tables_in_history_doc_are_rebuilt_from_results(capsys):
    mid = [r for r in _table(capsys, _main_runs("000750")) if "| original |" in r]
    earlier = [r for r in _table(capsys, [f"first={H}/oir_a", f"first={H}/oir_b",
                                          f"buffer={F}/oir_a", f"buffer={F}/oir_b", f"buffer={F}/oir_c",
                                          f"all={C}/oir_a", f"all={C}/oir_b", f"all={C}/oir_c",
                                          f"cosine={H}/cosine", f"ellm={H}/ellm"]) if "| original |" in r]
    assert len(mid) == 4 and len(earlier) == 5
    for row in mid + earlier:
        assert _cells(row) in HISTORY, row


def test_early_curve_window_and_the_update_150_check_in_history_doc(capsys):
    """--curve-max-step keeps the first evaluations; the short GPU check and the full runs at update 150."""
    out = _out(capsys, "--table-only", "--curve-max-step", "1228800", "--runs", *_main_runs())
    rows = [r for r in out.split("## Mean over")[1].split("\n## ")[0].splitlines() if "| original |" in r]
    assert len(rows) == 4 and all("| 3 |" in r for r in rows)
    short = _table(capsys, [f"short={RES}/gpu_h100_short/oir#000150"])
    assert _cells(short[0]).startswith("0.114 ± 0.034 |")  # its final evaluation, at update 150
    at150 = _at_update(OIR, 150)
    assert len(at150) == 3  # one seed per run; "eval/..." is the mean over a run's seeds
    se = np.std(at150, ddof=1) / np.sqrt(3)
    assert f"{np.mean(at150):.3f} ± {se:.3f}" == "0.083 ± 0.010"
    assert _says(HISTORY, "scored 0.114 ± 0.034 at 1.2e6 steps") and _says(HISTORY, "gave 0.083 ± 0.010 there")


def test_early_delta_tables_in_history_doc_are_rebuilt_from_results(tmp_path, capsys):
    """The early delta look: mean success at updates 50/100/150, the distinct instructions offered,
    and the ablation table at update 100 (with its plot)."""
    for name, prefixes, offered in [("0.5", [D / "d05"], "51 in 150 updates"), ("0.7", [D / "d07"], "53 in 145 updates"),
                                    ("0.9 (the main table's OIR-oracle)", OIR, None)]:
        cells = " / ".join(f"{np.mean(v):.3f}" if (v := _at_update(prefixes, u)) else "-" for u in (50, 100, 150))
        assert f"| {name} | {len(prefixes)} | {cells}" in HISTORY, (name, cells)
        if offered:
            info = json.loads(Path(f"{prefixes[0]}_instructions.json").read_text())
            assert offered == f"{info['distinct']} in {info['update']} updates"
    assert "| 0.7 | 1 | 0.000 / 0.023 / - (stopped at update 145) | 53 in 145 updates |" in HISTORY
    out = _out(capsys, "--runs", f"oir={C}/oir_a", "--out", str(tmp_path), "--ablation",
               f"0.5={D}/d05#000100", f"0.7={D}/d07#000100", *(f"0.9={C}/{r}#000100" for r in ("oir_a", "oir_b", "oir_c")))
    rows = [r for r in out.split("## Delta ablation")[1].splitlines() if r.startswith("| delta=")]
    assert [r.split("|")[1].strip() for r in rows] == ["delta=0.5", "delta=0.7", "delta=0.9"]
    assert all(r in HISTORY for r in rows), rows
    assert (tmp_path / "delta_ablation.png").stat().st_size > 10_000


def test_stopped_fast_delta_tables_in_history_doc_are_rebuilt_from_results(capsys):
    """Delta 0.5 against 0.9 at the fast preset, stopped at update 49 (bootstrap intervals)."""
    root = RES / "gpu_h100x2_fast_delta"
    runs = [f"fast, delta {d}={root}/fast_d{tag}_lr2.5e-4#000048" for d, tag in (("0.9", "09"), ("0.5", "05"))]
    rows = [ln for ln in _out(capsys, "--table-only", "--runs", *runs).splitlines()
            if ln.startswith("| fast, delta") and "| original |" in ln and ln.count("|") in (8, 9)]
    assert len(rows) == 4 and all(r in HISTORY for r in rows), rows  # final/last-5 and control rows of both runs


def test_fast_delta_to_8m_steps_and_its_withdrawn_rows_in_history_doc(capsys):
    """The 8.4M-step delta runs on 2 x H200; the delta-0.9 user-file rows (an --eval-only bug) are withdrawn."""
    d09 = f"{H200 / 'fast_oir_k4'}#end_files"
    out = _out(capsys, "--table-only", "--runs", f"d0.5={H200 / 'fast_d05'}", f"d0.7={H200 / 'fast_d07'}",
               f"d0.9={d09}", "--ablation", f"0.5={H200 / 'fast_d05'}", f"0.7={H200 / 'fast_d07'}", f"0.9={d09}")
    ablation = _section(out, "Delta ablation")
    assert len(ablation) == 3 and all(r in HISTORY for r in ablation)

    def withdrawn(row: str) -> bool:
        return row.startswith(("| d0.9 | own_words", "| d0.9 | compound"))

    final = _condensed(_section(out, "Final point"))
    assert len(final) == 15 and all(r in HISTORY for r in final if not withdrawn(r)), [r for r in final if r not in HISTORY]
    assert sum(map(withdrawn, final)) == 2 and not any(r in HISTORY for r in final if withdrawn(r))
    assert _says(HISTORY, "**Withdrawn: the delta-0.9 rows")


def test_first_gpu_llm_run_tables_in_history_doc_are_rebuilt_from_results(capsys):
    """Gemma (bound) beside rules (bound, cosine) at update 306: evaluation, final/last-5 and control tables."""
    names = {"OIR-Gemma+oracle, bound": "oir_llm_bound", "OIR-oracle, bound": "oir_rules_bound",
             "OIR-oracle, cosine": "oir_rules_cosine"}
    rows = [ln for ln in _out(capsys, "--table-only", "--runs", *(f"{k}={L}/{v}#000306" for k, v in names.items())).splitlines()
            if ln.startswith("| OIR-")]
    ev = [r for r in rows if r.count("|") == 6 and any(f"| {s} |" in r for s in ("original", "own_words", "compound"))]
    wanted = ev + [r for r in rows if r.count("|") in (8, 9) and "| original |" in r]
    assert len(wanted) == 9 + 3 + 3  # evaluation table (3 sets) + final/last-5 + control (original)
    for row in wanted:
        assert row in HISTORY, row
    d = json.loads((L / "oir_llm_bound" / "diversity.json").read_text())
    assert d["relabel/llm_offer_share_total"] == 0.0 and d["relabel/offers_total"] == 19647
    assert _says(HISTORY, "(its share of the 19,647 buffer offers: 0.000)")


TIME_RUNS = [f"paper (64 envs), OIR-oracle={p}" for p in OIR] + [
    f"fast (1,024 envs), OIR-oracle, lr 2.5e-4={RES / 'gpu_h100x2_fast' / 'fast_oir'}",
    f"fast (1,024 envs), OIR-oracle, lr 5e-4={RES / 'gpu_h100x2_fast' / 'fast_oir_lr5e-4'}"]


def _time_rows(capsys, runs: list[str], budget: str, tmp_path: Path | None = None) -> list[str]:
    args = ["--runs", *runs, "--time-target", "0.33", "--time-budget", budget]
    args += ["--out", str(tmp_path)] if tmp_path else ["--table-only"]
    return _section(_out(capsys, *args), "Time to target")


def test_time_to_target_tables_in_history_doc_are_rebuilt_from_results(tmp_path, capsys):
    """Mean success against wall clock (compile included, resumes summed): the first fast runs against
    the paper preset (15 min), and the tuned preset beside gt and cosine (5 min); the plot is written."""
    rows = _time_rows(capsys, TIME_RUNS, "900", tmp_path)
    assert len(rows) == 3 and rows[0].startswith("| paper") and "not reached" in rows[2]
    assert all(r in HISTORY for r in rows), rows
    assert (tmp_path / "time_to_target.png").stat().st_size > 10_000
    beside = [f"paper (64 envs), OIR-oracle={p}" for p in OIR] + [
        f"fast, first version (lr 2.5e-4, 40 updates), OIR-oracle={RES / 'gpu_h100x2_fast' / 'fast_oir'}",
        f"fast, tuned, OIR-oracle={TUNING / 'r3_fast_oir'}", f"fast, tuned, PQN-cosine={TUNING / 'r3_fast_cosine'}",
        f"fast, tuned, PQN-GT={TUNING / 'r3_fast_gt'}"]
    rows = _time_rows(capsys, beside, "300")
    assert len(rows) == 5 and all(r in HISTORY for r in rows), rows


# --------------------------------------------------------------------------- docs/benchmarks.md


def test_fast_preset_time_to_target_and_tuning_tables_in_benchmarks_doc_are_rebuilt_from_results(capsys):
    """The preset on one H100 (bfloat16 runs passing 0.33 within 300 s, the 15-minute run), and the tuning runs."""
    ttt = [f"fast preset (bfloat16), H100={BF16 / 'h100_bf16'}", f"fast preset, final code, H100={BF16 / 'h100_fast_final'}",
           f"fast preset + lr 7e-4, H100={BF16 / 'h100_bf16_lr7e-4'}", f"fast preset, 208 updates, H100={BF16 / 'h100_fast_15min'}",
           f"fast preset, float32, H100={H100_TIME / 'h100_fast_lag'}", f"paper preset, H100={F / 'oir_a'}"]
    rows = _time_rows(capsys, ttt, "300")
    assert len(rows) == 6 and all(r in BENCH for r in rows), rows
    assert rows[0].startswith("| fast preset (bfloat16), H100 | 3 | 265 s;")  # the headline: within 300 s
    assert rows[1].startswith("| fast preset, final code, H100 | 3 | 295 s;")
    # the runs are what the page says: the preset's bfloat16 matmuls, one card each, 3 seeds
    for n, updates in (("h100_bf16", 64), ("h100_fast_final", 64), ("h100_bf16_lr7e-4", 64), ("h100_fast_15min", 208)):
        cfg = json.loads((BF16 / n / "config.json").read_text())
        assert (cfg["pqn"]["compute_dtype"], cfg["run"]["num_seeds"], cfg["pqn"]["num_envs"]) == ("bfloat16", 3, 1024)
        assert cfg["run"]["total_timesteps"] == updates * 1024 * 128
    tuning = [f"40 updates, lr 5e-4 (H100)={TUNING / 'r1_fast40_oir_lr5e-4'}",
              f"64 updates, 2 epochs (H100)={TUNING / 'r2_fast64_oir_ep2'}", f"64 updates, 4 epochs (H100)={TUNING / 'r2_fast64_oir_ep4'}",
              f"64 updates, programs compiled side by side (H100)={TUNING / 'r3_fast_oir'}",
              f"K 4 (H200)={H200 / 'fast_oir_k4'}", f"K 2 (H200)={H200 / 'fast_oir_k2'}",
              f"relabel lag 1, workers loading encoders at start (H100)={H100_TIME / 'h100_fast_warm'}"]
    rows = _time_rows(capsys, tuning, "300")
    assert len(rows) == 7 and all(r in BENCH for r in rows), rows
    # the first update of the tuning runs before and with the side-by-side compiles
    first = [json.loads(open(TUNING / n / "metrics.jsonl").readline())["time"] for n in ("r2_fast64_oir_ep4", "r3_fast_oir")]
    assert [round(t) for t in first] == [128, 103] and _says(BENCH, "from 128 s to 103 s")


def test_fast_preset_runs_with_the_current_update_and_start_are_rebuilt_from_results(capsys):
    """The two 3-seed runs and the 12-seed run on 4 cards: their time-to-target rows, start-up lines and medians."""
    runs = [f"fast preset, seed 0, H100={STARTUP / 'fast_s0'}", f"fast preset, seed 1, H100={STARTUP / 'fast_s1'}",
            f"fast preset, 12 seeds on 4 H100s={STARTUP / 'fast_12seeds_4gpus'}"]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 3 and all(r in BENCH for r in rows), rows
    assert rows[0].startswith("| fast preset, seed 0, H100 | 3 | 252 s;") and rows[2].startswith("| fast preset, 12 seeds")
    for n, seeds in (("fast_s0", 3), ("fast_s1", 3), ("fast_12seeds_4gpus", 12)):
        cfg = json.loads((STARTUP / n / "config.json").read_text())
        assert (cfg["pqn"]["compute_dtype"], cfg["run"]["num_seeds"], cfg["pqn"]["num_envs"]) == ("bfloat16", seeds, 1024)
    assert "ready after 62 s (imports 5 s, encoder 21 s, instructions 8 s, method 14 s, initial state 10 s)" in (
        STARTUP / "fast_s0" / "log.txt").read_text() and _says(BENCH, '"ready after 62 s"')
    medians = [round(m, 2) for m in _update_medians(STARTUP / "fast_s0")]
    assert medians == [0.53, 0.09, 1.28] and _says(BENCH, "rollout 0.53 s, host 0.09 s, update program 1.28 s")
    host12 = _update_medians(STARTUP / "fast_12seeds_4gpus")[1]
    assert round(host12, 2) == 0.51 and _says(BENCH, "0.51 s against 0.09 s")


def test_fast_preset_runs_on_h100_and_h200_after_the_worker_start_are_rebuilt_from_results(capsys):
    w, h = RES / "gpu_h100x4_warmup", RES / "gpu_h200x4_start"
    runs = [f"fast preset, seed 0, H100 (6a8bf9c)={w / 'fast0'}", f"fast preset, seed 1, H100 (6a8bf9c)={w / 'fast1'}",
            f"fast preset, seed 0, H200 (ea5f82d)={h / 'fast0e'}", f"fast preset, seed 1, H200 (ea5f82d)={h / 'fast1e'}"]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 4 and all(r in BENCH for r in rows), rows
    assert "ready after 47 s (imports 4 s, encoder 17 s, instructions 11 s, method 1 s, initial state 8 s)" in (
        w / "fast0" / "log.txt").read_text()
    assert [round(m, 2) for m in _update_medians(w / "fast0")] == [0.63, 0.13, 1.28]
    assert round(_update_medians(h / "fast0e")[2], 2) == 1.06


def test_fast_preset_runs_with_the_bfloat16_backward_and_its_kernel_tables_are_rebuilt_from_results(capsys):
    """The current code's three H200 runs: time-to-target rows, their update medians and start-up lines;
    the kernel-kind table beside the traced update is the one in the run files."""
    b = RES / "gpu_h200_bf16_backward"
    runs = [f"fast preset, seed 0, H200 (cf95ad4)={b / 'fast'}", f"fast preset, seed 0, 2 x H200 (cf95ad4)={b / 'fast0'}",
            f"fast preset, seed 1, 2 x H200 (cf95ad4)={b / 'fast1'}"]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 3 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["185 s", "183 s", "168 s"]
    for n in ("fast", "fast0", "fast1"):
        cfg = json.loads((b / n / "config.json").read_text())
        assert (cfg["pqn"]["compute_dtype"], cfg["run"]["num_seeds"], cfg["pqn"]["num_envs"]) == ("bfloat16", 3, 1024)
        assert round(_update_medians(b / n)[2], 2) in (0.93, 0.94)  # "update program 0.93 s"
    assert "ready after 18 s (imports 3 s, encoder 0 s, instructions 0 s, method 0 s, initial state 11 s)" in (
        b / "startup.txt").read_text() and _says(BENCH, '"ready after" 18 s')

    def kinds(name: str) -> dict[str, list[str]]:
        lines = (b / name).read_text().splitlines()
        i = lines.index("| kind | ms | share | calls |")
        return {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:4]]
                for r in lines[i + 2:] if r.startswith("|")}

    before, after = kinds("trace_before.md"), kinds("trace_after.md")
    for kind in ("matmul", "fused elementwise", "copy / memset", "reduction"):
        assert f"| {kind} | {' | '.join(before[kind])} | {' | '.join(after[kind])} |" in BENCH, kind


def test_where_an_update_goes_table_in_benchmarks_doc_is_rebuilt_from_results():
    runs = {"fast preset, bfloat16 (H100)": BF16 / "h100_bf16", "fast preset as it ships (H100)": BF16 / "h100_fast_final",
            "float32, relabel lag 1 (H100)": H100_TIME / "h100_fast_lag", "float32, relabel lag 0 (H200)": H200 / "fast_oir_k4",
            "float32, relabel lag 0, K 2 (H200)": H200 / "fast_oir_k2", "bound grounding, rules (H200)": H200 / "fast_bound_rules",
            "bound grounding, Gemma + rules (H200)": H200 / "fast_bound_llm"}
    for name, run in runs.items():
        med = _update_medians(run)
        assert f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {sum(med):.2f} |" in BENCH, name
    # the runs before the split timing: the median of rollout + host + update per update
    def sums(n: str) -> str:
        rows = [json.loads(line) for line in open(TUNING / n / "metrics.jsonl")]
        return f"{np.median([r['time/rollout_s'] + r['time/host_s'] + r['time/update_s'] for r in rows if 'time/host_s' in r]):.2f}"

    assert _says(BENCH, f"median {sums('r2_fast64_oir_ep2')} against {sums('r2_fast64_oir_ep4')} s")
    assert _says(BENCH, f"{sums('r3_fast_oir')} s for the tuned preset (gt: {sums('r3_fast_gt')} s)")


def test_2_gpu_scaling_table_in_benchmarks_doc_is_rebuilt_from_results():
    table = (RES / "gpu_h100x2_scaling_lag" / "scaling_paper_h100x2.txt").read_text().split("Scaling | paper sizes")[1]
    scaling = [line for line in table.splitlines() if line.startswith("| (")]
    assert len(scaling) == 3 and all(r in BENCH for r in scaling), scaling
    assert [r.rsplit("|", 2)[1].strip() for r in scaling] == ["1.93x", "1.92x", "2.00x"]


def test_4_gpu_scaling_and_fast_size_rows_in_benchmarks_doc_are_rebuilt_from_results():
    warm = RES / "gpu_h100x4_warmup"
    table = (warm / "scaling.txt").read_text().split("Scaling | paper sizes")[1]
    scaling = [line for line in table.splitlines() if line.startswith("| (")]
    assert len(scaling) == 3 and all(r in BENCH for r in scaling), scaling
    assert [r.rsplit("|", 3)[1:3] for r in scaling] == [[" 1.80x ", " 2.93x "], [" 1.49x ", " 2.46x "],
                                                         [" 1.73x ", " 3.00x "]]
    fast = (warm / "thr_fast.txt").read_text()
    per_update = dict(re.findall(r"^\| \((\w)\) [^|]+\| ([\d.]+) \| [\d,]+ \| [\d.]+ \|", fast, re.M))
    assert per_update == {"a": "0.910", "b": "0.807", "c": "1.302", "d": "1.375"}
    assert "| 0.910 | 0.807 (0.89x) | 1.302 (1.43x) | 1.375 (1.51x) |" in BENCH
    h200 = (RES / "gpu_h200_bf16_backward" / "thr_fast.txt").read_text()
    per_update = dict(re.findall(r"^\| \((\w)\) [^|]+\| ([\d.]+) \| [\d,]+ \| [\d.]+ \|", h200, re.M))
    assert per_update == {"a": "0.771", "b": "0.680", "c": "1.220", "d": "1.125"}
    assert "| 0.771 | 0.680 (0.88x) | 1.220 (1.58x) | 1.125 (1.46x) |" in BENCH


def test_one_process_per_gpu_rows_in_benchmarks_doc_are_rebuilt_from_results(capsys):
    procs, mb = RES / "gpu_h200x4_procs", RES / "gpu_h200x4_minibatch"
    table = (procs / "scaling_processes.txt").read_text().split("Scaling | paper sizes | one process per device")[1]
    scaling = [line for line in table.splitlines() if line.startswith("| (")]
    assert len(scaling) == 3 and all(r in BENCH for r in scaling), scaling
    assert [r.rsplit("|", 3)[1:3] for r in scaling] == [[" 2.46x ", " 3.57x "], [" 2.05x ", " 3.21x "],
                                                         [" 2.33x ", " 3.61x "]]
    rows = _time_rows(capsys, [f"fast preset, 12 seeds, 4 processes={procs / 'fast12mp'}",
                               f"fast preset, 3 seeds, 1 card={mb / 'fast'}"], "300")
    assert len(rows) == 2 and all("  " + r in BENCH for r in rows), rows
    # fewer, larger minibatches: the update program's medians and the score at update 64
    medians = {n: round(_update_medians(mb / n)[2], 3) for n in ("fast", "mb8", "mb8lr", "mb4")}
    assert medians == {"fast": 1.059, "mb8": 0.983, "mb8lr": 0.982, "mb4": 0.922}, medians
    assert _says(BENCH, "took 0.983 and 0.922 s per update (median `time/update_s`) against the preset's 1.059 s")
    last = {n: json.loads((mb / n / "metrics.jsonl").read_text().splitlines()[-1])["eval/original/mean_success_rate"]
            for n in ("fast", "mb8", "mb8lr", "mb4")}
    assert {n: round(v, 3) for n, v in last.items()} == {"fast": 0.350, "mb8": 0.279, "mb8lr": 0.309, "mb4": 0.192}


# --------------------------------------------------------------------------- analyze_runs itself


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


def test_final_point_beside_the_mean_of_the_last_5_evaluations_with_bootstrap_intervals(capsys):
    from oir_gym.metrics import bootstrap_ci

    out = _out(capsys, "--table-only", "--runs", *_main_runs())
    rows = _section(out, "Final point and mean of the last 5 evaluations")
    assert len(rows) == 12 and all(r.split("|")[3].strip() == "3" and r.split("|")[5].strip() == "5" for r in rows)
    oir = next(r for r in rows if r.startswith("| OIR-oracle | original |"))
    # OIR: each seed's last 5 evaluations (updates 1050-1220) averaged, then the 3 seeds
    per_seed = []
    for run in analyze_runs.load_metrics([str(p) for p in OIR]):
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
    # --interval t: the summary (final, last 3 of 3, whole run, completed, aggregate, kept, gains) and the
    # control table take 95% t intervals over the seeds
    out = _out(capsys, "--table-only", "--interval", "t", "--runs", f"m={run}")
    summary = _section(out, "Summary")
    assert len(summary) == 1 and "bootstrap" not in out.split("## Summary")[1]
    low, high = t_interval(gain)
    agg = results[0].to_dict()["original"]["aggregate_score"]  # both seeds complete the same two instructions
    t_gain = f"{np.mean(gain):+.3f} [{low:+.3f}, {high:+.3f}]"
    assert summary[0] == (f"| m | original | 2 | {2 / 22:.3f} [{2 / 22:.3f}, {2 / 22:.3f}] | {2 / 22:.3f} [{2 / 22:.3f}, "
                          f"{2 / 22:.3f}] | {2 / 22:.3f} [{2 / 22:.3f}, {2 / 22:.3f}] | 2.0 [2.0, 2.0] | "
                          f"{agg:.3f} [{agg:.3f}, {agg:.3f}] | - | {t_gain} | {t_gain} |")
    neutral = [r.to_dict()["original"]["control"]["gain_neutral"] for r in results]  # nothing happens when neutral
    assert neutral == [2 / 22, 2 / 22]
    assert _section(out, "Instruction following")[0] == (f"| m | original | 2 | {2 / 22:.3f} | {0.5 / 22:.3f} | 0.000 | "
                                                         f"{t_gain} | +{2 / 22:.3f} [+{2 / 22:.3f}, +{2 / 22:.3f}] |")


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


LADDER = RES / "oracle_ladder"


def _ladder_rows(capsys) -> tuple[list[str], list[str]]:
    """analyze_runs' retention and ordered-compound rows for the oracle ladder's runs (the page's command)."""
    runs = [f"canonical={LADDER}/canonical_s0", f"canonical={LADDER}/canonical_s1", f"diverse={LADDER}/diverse_s0",
            f"diverse={LADDER}/diverse_s1", f"tasks={LADDER}/tasks_s0", f"compound={LADDER}/compound_s0",
            f"noisy={LADDER}/noisy_s0"]
    out = _out(capsys, "--table-only", "--baseline", "canonical", "--runs", *runs)
    return _section(out, "Paraphrase retention"), _section(out, "Ordered compounds")


def test_oracle_ladder_tables_in_results_doc_are_rebuilt_from_results(capsys):
    retention, ordered = _ladder_rows(capsys)
    cells = {(c[0], c[1]): c for c in ([x.strip() for x in row.strip("|").split("|")] for row in retention)}

    def own(cell: str) -> str:  # the arm's own value, without its difference to the baseline
        return cell.split("; vs base")[0]

    for arm in ("canonical", "diverse", "tasks", "compound", "noisy"):
        seeds = cells[(arm, "original")][2]
        row = [arm, seeds, own(cells[(arm, "original")][3]), own(cells[(arm, "heldout")][3]),
               *(own(cells[(arm, s)][4]) for s in ("simple", "complex", "heldout")),
               own(cells[(arm, "original")][5]), own(cells[(arm, "heldout")][5])]
        assert "| " + " | ".join(row) + " |" in RESULTS, arm
    diff = {s: cells[("diverse", s)][4].split("vs base: ")[1] for s in ("simple", "complex", "heldout")}
    assert _says(RESULTS, f"retention {diff['simple']} (simple), {diff['complex']} (complex), {diff['heldout']} (heldout)")
    assert _says(RESULTS, f"original success {cells[('diverse', 'original')][3].split('vs base: ')[1]}")
    assert _says(RESULTS, f"the original set {cells[('diverse', 'original')][5].split('vs base: ')[1]}")
    for row in ordered:
        c = [x.strip() for x in row.strip("|").split("|")]
        if c[0] in ("canonical", "compound"):
            assert "| " + " | ".join([*c[:5], own(c[5])]) + " |" in RESULTS, c[0]


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


def first_update(path: Path) -> str:
    """``"N s"`` of a log's "first update done N s after launch" line (gzipped or plain)."""
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return re.search(r"first update done (\d+) s after launch", text).group(1) + " s"


def test_the_current_fast_preset_rows_and_starts_are_rebuilt_from_results(capsys):
    """The benchmarks page's current fast-preset runs (6cde687 and d341441: the fused recurrence; shipped encoder,
    cold caches; warm starts): time-to-target rows, update medians, update 64's time, first-update times and first
    evaluations."""
    d = RES / "gpu_h200_pallas_fused"
    runs = [d / "p_s0", d / "p_s1", d / "p_s2", d / "q_s0"]
    shas = ["6cde687"] * 3 + ["d341441"]
    labels = [f"fast preset, seed {i}, H200 ({sha})={r}" for i, r, sha in zip([0, 1, 2, 0], runs, shas)]
    rows = _time_rows(capsys, labels, "300")
    assert len(rows) == 4 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["174 s", "152 s", "179 s", "176 s"]
    assert [r.split("|")[-2].split(",")[0].strip() for r in rows] == ["0.339", "0.362", "0.364", "0.351"]
    assert _says(BENCH, "(0.339, 0.362, 0.364, 0.351)")
    assert [json.loads((r / "config.json").read_text())["provenance"]["git_commit"] for r in runs] == shas
    assert {json.loads((r / "config.json").read_text())["pqn"]["lstm_kernel"] for r in runs} == {"auto"}
    medians = [[round(m, 2) for m in _update_medians(r)] for r in runs]
    assert medians == [[0.55, 0.16, 0.6], [0.5, 0.15, 0.6], [0.58, 0.19, 0.6], [0.56, 0.18, 0.6]]
    assert _says(BENCH, "0.50-0.58 s waiting for the rollout, 0.15-0.19 s of host work and 0.60 s of update program")
    update64 = [round([json.loads(line) for line in open(r / "metrics.jsonl")][63]["time"]) for r in runs]
    assert update64 == [174, 166, 179, 176] and _says(BENCH, "update 64 came at 166-179 s")
    cold = [first_update(r / "log.txt") for r in runs]
    assert cold == ["47 s", "42 s", "50 s", "50 s"]
    assert [first_update(d / w / "log.txt") for w in ("warm", "warm_d341441")] == ["14 s", "13 s"]
    assert ("| 6cde687 (+ the Pallas recurrence in every program); d341441 (in the update only) | 47 s, 42 s, 50 s; "
            "50 s | 14 s; 13 s |") in BENCH
    first_eval = [[json.loads(line) for line in open(r / "metrics.jsonl") if '"time/eval_s"' in line][0] for r in runs]
    assert [round(r["time/eval_s"], 1) for r in first_eval] == [14.5, 14.1, 13.0, 13.5]
    assert _says(BENCH, "the first evaluation (13.0-14.5 s)") and _says(BENCH, "(d341441: 0.56 s, 13.5 s, one run)")


def test_the_dcd44bd_and_85ab07c_fast_preset_rows_and_starts_are_rebuilt_from_results(capsys):
    """The history's fast-preset runs of the scan (dcd44bd and 85ab07c, shipped encoder, cold caches; a warm start):
    time-to-target rows, update medians, update 64's time, first-update times and first evaluations."""
    f, g = RES / "gpu_h200_update_bootstrap", RES / "gpu_h200_bf16_residuals"
    runs = [f / "fast_s0", f / "fast_s1", f / "fast_s2", g / "fast_s0", g / "fast_s1"]
    shas = ["dcd44bd"] * 3 + ["85ab07c"] * 2
    labels = [f"fast preset, seed {i}, H200 ({sha})={r}" for i, r, sha in zip([0, 1, 2, 0, 1], runs, shas)]
    rows = _time_rows(capsys, labels, "300")
    assert len(rows) == 5 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["171 s", "180 s", "168 s", "174 s", "175 s"]
    assert [r.split("|")[-2].split(",")[0].strip() for r in rows] == ["0.347", "0.365", "0.361", "0.361", "0.361"]
    assert [json.loads((r / "config.json").read_text())["provenance"]["git_commit"] for r in runs] == shas
    medians = [[round(m, 2) for m in _update_medians(r)] for r in runs]
    assert medians == [[0.53, 0.18, 0.83], [0.54, 0.16, 0.83], [0.49, 0.13, 0.83], [0.49, 0.14, 0.79],
                       [0.52, 0.15, 0.79]]
    assert _says(BENCH, "0.49-0.54 s waiting for the rollout, 0.13-0.18 s of host work and 0.83 s of update "
                        "program at dcd44bd, 0.79 s at 85ab07c")
    update64 = [round([json.loads(line) for line in open(r / "metrics.jsonl")][63]["time"]) for r in runs]
    assert update64 == [171, 180, 168, 174, 175] and _says(BENCH, "came at 168-180 s")
    cold = [first_update(r / "log.txt") for r in runs]
    assert cold == ["40 s", "47 s", "42 s", "45 s", "45 s"] and first_update(f / "warm" / "log.txt") == "11 s"
    assert "| dcd44bd (+ the update's sequence T steps long); 85ab07c | 40 s, 47 s, 42 s; 45 s, 45 s | 11 s |" in BENCH
    assert "6 programs loaded from the program cache, 0 compiled" in (f / "warm" / "log.txt").read_text()
    first_eval = [[json.loads(line) for line in open(r / "metrics.jsonl") if '"time/eval_s"' in line][0] for r in runs]
    assert sorted(round(r["time/eval_s"], 1) for r in first_eval) == [7.4, 9.8, 9.9, 11.9, 12.3]
    assert _says(BENCH, "The first evaluation, which compiles once the rollout has, took 7.4-12.3 s")


def test_the_affa8ff_fast_preset_rows_starts_and_padding_runs_are_rebuilt_from_results(capsys):
    """The history's fast-preset runs of affa8ff and the benchmarks page's b8322e2 runs with pqn.skip_padding on
    (shipped encoder, cold caches): time-to-target rows, update medians, first-update times, first evaluations,
    and the update program and compile-option tables."""
    f = RES / "gpu_h200_start_order"
    off, skip = ["off_s0", "off_s1"], ["fast_s0", "fast_s1", "fast_s2"]
    runs = [f"fast preset, seed {i}, H200 (affa8ff)={f / n}" for i, n in enumerate(off)]
    runs += [f"skip_padding on, seed {i}, H200 (b8322e2)={f / n}" for i, n in enumerate(skip)]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 5 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["173 s", "164 s", "197 s", "not reached",
                                                                     "not reached"]
    assert [r.split("|")[-2].split(",")[0].strip() for r in rows] == ["0.351", "0.357", "0.344", "0.322", "0.320"]
    medians = [[round(m, 2) for m in _update_medians(f / n)] for n in off + skip]
    assert [m[2] for m in medians] == [0.94, 0.94, 0.83, 0.82, 0.82] and [m[1] for m in medians[:2]] == [0.18, 0.18]
    assert _says(BENCH, "0.54-0.55 s waiting for the rollout, 0.18 s of host work and 0.94 s of update program")
    cold = [first_update(f / n / "log.txt") for n in skip + off]
    assert cold == ["52 s", "42 s", "44 s", "45 s", "42 s"] and first_update(f / "warm" / "log.txt") == "13 s"
    assert ("| b8322e2, affa8ff (+ the evaluation XLA-compiles once the rollout has) | 52 s, 42 s, 44 s; 45 s, 42 s "
            "| 13 s |") in BENCH
    assert "6 programs loaded from the program cache, 0 compiled" in (f / "warm" / "log.txt").read_text()
    first_eval = [[json.loads(line) for line in open(f / n / "metrics.jsonl") if '"time/eval_s"' in line][0]
                  for n in off + skip]
    assert sorted(round(r["time/eval_s"], 1) for r in first_eval) == [8.9, 10.8, 11.1, 12.0, 17.3]
    assert _says(BENCH, "it took 8.9-17.3 s in these five runs")
    update64 = [round([json.loads(line) for line in open(f / n / "metrics.jsonl")][63]["time"]) for n in off]
    assert update64 == [190, 181] and _says(BENCH, "update 64 at 190 and 181 s")
    table = (f / "update_cost_skip_padding.txt").read_text()
    assert "| scan | off | 10.0 | 0.932 | 1.00 | 129.6 | 13.1% | 106.3 |" in table
    assert "| scan | on | 5.8 | 0.820 | 0.88 | 147.2 | 14.9% | 120.7 |" in table
    assert _says(BENCH, "0.932 s, 0.820 s with it (0.88x)") and _says(BENCH, "106.3 and 120.7 TFLOP/s")
    rollout, evaluate = ((f / f"compile_options_{p}.txt").read_text() for p in ("rollout", "evaluate"))
    assert "| default | 23.6 | 0.484 |" in rollout and "| default | 18.4 | 2.783 |" in evaluate
    assert _says(BENCH, "the rollout compiled in 23.6 s with the defaults and in 17.7-19.8 s")
    assert _says(BENCH, "the evaluation compiled in 18.4 s, and in 17.2-20.2 s")


def test_the_b107fd2_fast_preset_rows_and_starts_are_rebuilt_from_results(capsys):
    """The history's fast-preset runs of b107fd2 (shipped encoder, cold caches): their time-to-target rows,
    update medians and first-update times, and the warm starts of the program cache."""
    f = RES / "gpu_h200_program_cache"
    names = ["fast_s0", "fast_s1", "fast_s0_again"]
    runs = [f"fast preset, {label}, H200 (b107fd2)={f / n}"
            for label, n in zip(["seed 0", "seed 1", "seed 0 again"], names)]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 3 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["189 s", "189 s", "187 s"]
    assert [r.split("|")[-2].split(",")[0].strip() for r in rows] == ["0.348", "0.388", "0.350"]
    medians = [[round(m, 2) for m in _update_medians(f / n)] for n in names]
    assert medians == [[0.54, 0.17, 0.93], [0.55, 0.17, 0.93], [0.52, 0.15, 0.93]]
    assert _says(BENCH, "0.52-0.55 s waiting for the rollout, 0.15-0.17 s of host work and 0.93 s of update program")
    cold = [first_update(f / n / "log.txt") for n in names]
    warm = [first_update(f / f"warm{i}" / "log.txt") for i in (1, 2, 3)]
    assert cold == ["54 s", "54 s", "53 s"] and warm == ["19 s", "15 s", "16 s"]
    assert all("6 programs loaded from the program cache, 0 compiled" in (f / f"warm{i}" / "log.txt").read_text()
               for i in (1, 2, 3))
    assert f"| b107fd2 (the program cache) | {', '.join(cold)} | {', '.join(warm)} |" in BENCH
    start = {t: [first_update(f / f"start_final_{t}_{c}.log.gz") for c in ("cold", "warm")] for t in "abc"}
    assert start == {"a": ["62 s", "17 s"], "b": ["58 s", "19 s"], "c": ["55 s", "14 s"]}
    assert "| c1962aa (+ one trace per program: JAX 0.11 traced the rollout twice, once per thread) | 62 s, 58 s | 17 s, 19 s |" in BENCH
    assert "| 41b2094 (+ the compile-ahead loads or compiles without running the programs once) | 55 s | 14 s |" in BENCH
    timeline = gzip.decompress((f / "start_final_c_cold.log.gz").read_bytes()).decode()
    assert "  50.9 Finished XLA compilation of jit(rollout) in 31.989" in timeline and _says(BENCH, "it took 32.0 s")
    losses = [[json.loads(line)["seed0/loss"] for line in open(f / n / "metrics.jsonl")][:2]
              for n in ("fast_s0_again", "warm2")]
    assert losses[0] == losses[1] and _says(BENCH, f"({losses[0][0]:.8f}, {losses[0][1]:.8f})")
    f16 = [first_update(f / f"start_f16{t}_{c}.log.gz") for t in ("", "reserialized") for c in ("cold", "warm")]
    assert f16 == ["61 s", "24 s", "32 s", "23 s"] and _says(BENCH, "61 s cold, 24 s warm") and _says(BENCH, "32 s, then 23 s")
    table = (f / "compile_options.txt").read_text()
    assert "| default | 21.2 | 0.569 |" in table and "| xla_gpu_autotune_level=0 | 22.3 | 0.503 |" in table
    assert _says(BENCH, "compiles in 21.2 s") and _says(BENCH, "compiled in 22.3 s") and _says(BENCH, "0.503 s against 0.569 s")


def test_the_56cc473_fast_preset_rows_and_starts_are_rebuilt_from_results(capsys):
    """The history's fast-preset runs of 56cc473 (shipped encoder, cold caches): their time-to-target rows,
    update medians and first-update times, and the start table's warm runs."""
    f = RES / "gpu_h200_fast_final"
    runs = [f"fast preset, seed {s}, H200 (56cc473)={f / f'fast_s{s}'}" for s in (0, 1)]
    rows = _time_rows(capsys, runs, "300")
    assert len(rows) == 2 and all(r in BENCH for r in rows), rows
    assert [r.split("|")[3].split(";")[0].strip() for r in rows] == ["201 s", "182 s"]
    assert [r.split("|")[-2].split(",")[0].strip() for r in rows] == ["0.346", "0.357"]
    for s in (0, 1):
        assert [round(m, 2) for m in _update_medians(f / f"fast_s{s}")] == [[0.6, 0.18, 0.93], [0.62, 0.19, 0.93]][s]

    p = RES / "gpu_h200_pallas_start"
    assert [first_update(p / f"start_min1_{c}.log.gz") for c in ("cold", "warm")] == ["58 s", "26 s"]
    assert first_update(p / "start_min0_warm.log.gz") == "25 s"
    cold = [first_update(f / "start_cold.log.gz")] + [first_update(f / f"fast_s{s}" / "log.txt") for s in (0, 1)]
    assert cold == ["54 s", "52 s", "48 s"] and first_update(f / "start_warm.log.gz") == "30 s"
    assert _says(BENCH, f"| 56cc473 (the evaluation's compile waiting for the first update's; since reverted) | "
                        f"{', '.join(cold)} | 30 s |")
    assert "| ed6249a (`results/gpu_h200_pallas_start/`) | 58 s | 26 s (25 s with every program cached) |" in BENCH
    end = [first_update(f / f"start_end_{c}.log.gz") for c in ("cold", "warm")]
    assert end == ["58 s", "24 s"] and f"| 091db34 (TensorBoard without torch) | {end[0]} | {end[1]} |" in BENCH
