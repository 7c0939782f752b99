"""docs/benchmarks.md stays a page of current figures that rebuild: at most 300 lines, every table
and quoted ratio here rebuilt from its file under results/ (the time-to-target, update-medians,
kernel and scaling tables are rebuilt in tests/test_analyze_runs.py), ratios only within one call,
and the suite time read from the newest raw log of bench/suite_timing.sh."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RES = ROOT / "results"
PAGE = (ROOT / "docs" / "benchmarks.md").read_text()
HISTORY = (ROOT / "docs" / "benchmarks_history.md").read_text()
#: both pages: a measurement's earlier rows move to the history page as newer ones take their place
BOTH = PAGE + HISTORY
B = RES / "gpu_h200_bf16_backward"


def _says(doc: str, text: str) -> bool:
    """The page's prose holds ``text``, whatever its line breaks."""
    return " ".join(text.split()) in " ".join(doc.split())


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def update_rows() -> tuple[list[str], dict[tuple[str, str], list[float]]]:
    """The update-program table: per code and dtype, its two passes of update_cost_final.txt
    (blocks in the order old, new, old, new), and the times themselves."""
    blocks = (B / "update_cost_final.txt").read_text().split("# update program")[1:]
    cells: dict[tuple[str, str], list[list[str]]] = {}
    for code, block in zip(["old (889a683)", "new (2c161bc)"] * 2, blocks):
        for row in re.findall(r"^\| sequence \| 8 \| (\w+) \| hoisted \| [\d.]+ \| ([\d.]+) \| [\d.]+ \| ([\d.]+) \| ([\d.]+%) \|",
                              block, re.M):
            cells.setdefault((code, row[0]), []).append(list(row[1:]))
    rows = []
    for dtype in ("bfloat16", "float32"):
        for code in ("old (889a683)", "new (2c161bc)"):
            passes = cells[(code, dtype)]
            assert len(passes) == 2, (code, dtype)
            cols = [[p[0] for p in passes]] + [list(dict.fromkeys(p[i] for p in passes)) for i in (1, 2)]
            rows.append(f"| {code} | {dtype} | {', '.join(cols[0])} | {', '.join(cols[1])} | {', '.join(cols[2])} |")
    times = {k: [float(p[0]) for p in v] for k, v in cells.items()}
    return rows, times


def h100_update_ratios() -> dict[str, str]:
    """The H100 calls before and after the written-out LSTM gradient: whole change, gradient alone
    (the new call), dtype alone (the old call)."""
    def times(name: str) -> dict[tuple[str, str], float]:
        text = (RES / "gpu_h100x4_speed" / name).read_text()
        out = {}
        for line in text.splitlines():
            c = [x.strip() for x in line.strip("|").split("|")]
            if line.startswith("| sequence | 8 |"):
                grad = c[3] if len(c) == 9 else "autodiff"
                out[(c[2], grad)] = float(c[5] if len(c) == 9 else c[4])
        return out

    old, new = times("update_cost_h100_old.txt"), times("update_cost_h100_new.txt")
    return {"whole": _x(old[("float32", "autodiff")], new[("bfloat16", "hoisted")]),
            "gradient": _x(new[("bfloat16", "autodiff")], new[("bfloat16", "hoisted")]),
            "dtype": _x(old[("float32", "autodiff")], old[("bfloat16", "autodiff")])}


def process_scaling() -> tuple[str, str]:
    """From the one-process-per-GPU call: the 1-process run against each process of the 2-process
    run (s/update), and 4 processes against half the 2-process run's seed-steps/s, per loop."""
    text = (RES / "gpu_h200x4_procs" / "scaling_processes.txt").read_text()
    table = text.split("Scaling | paper sizes | one process per device")[1]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:5]]
             for r in table.splitlines() if r.startswith("| (")}
    names = {"(a) plain PQN-RNN, raw Craftax": "plain", "(b) ours, gt": "gt", "(c) ours, oir (rules)": "oir"}
    per = []
    half = []
    for loop, short in names.items():
        (t1, _), (t2, r2), (_, r4) = (c.split(", ") for c in cells[loop])
        per.append(f"{short} {t1} s alone, {t2} s in each of two processes" if not per else f"{short} {t1} s, {t2} s")
        half.append(_x(float(r4.replace(",", "")), float(r2.replace(",", "")) / 2))
    return "; ".join(per), ", ".join(half)


def newest_suite_log() -> Path | None:
    """The newest finished raw log of bench/suite_timing.sh (names start with the UTC date; a log
    still being written, as during the timed run itself, has no "wall time" line yet)."""
    logs = [p for p in sorted((RES / "test_suite").glob("*_*.txt")) if "\nwall time: " in p.read_text()]
    return logs[-1] if logs else None


def suite_row(log: Path | None) -> str:
    """What the page says about the newest suite log: its result line, wall time, machine and commit."""
    if log is None:
        return ("No run is recorded under `results/test_suite/` yet: the earlier timings have no raw log "
                "and are not quoted here.")
    text = log.read_text()
    field = dict(re.findall(r"^(commit|nproc|uptime before|wall time|pytest exit status): (.*)$", text, re.M))
    result = re.findall(r"^=*\s*(\d[\d,]* passed.*? in [\d.]+s.*?)\s*=*$", text, re.M)[-1]
    load = field["uptime before"].split("load average:")[1].split(",")[0].strip()
    return ("| file | commit | result | wall time | cores | load average at the start |\n|---|---|---|---|---|---|\n"
            f"| `results/test_suite/{log.name}` | {field['commit'][:7]} | {result} | {field['wall time']} | "
            f"{field['nproc']} | {load} |")


def fill(template: str) -> str:
    """The page's generated parts into ``template`` (how the page was written; the tests check the result)."""
    rows, times = update_rows()
    r = h100_update_ratios()
    per, half = process_scaling()
    bf16 = _x(times[("old (889a683)", "bfloat16")][0], times[("new (2c161bc)", "bfloat16")][0])
    return (template.replace("UPDATE_ROWS", "\n".join(rows)).replace("RATIO_BF16", bf16)
            .replace("RATIO_H100", r["whole"]).replace("RATIO_GRAD", r["gradient"]).replace("RATIO_DTYPE", r["dtype"])
            .replace("PER_PROC", per).replace("HALF_TWO", half).replace("SUITE_ROW", suite_row(newest_suite_log())))


def test_the_page_is_short_and_its_history_is_linked():
    assert len(PAGE.splitlines()) <= 300
    assert "](benchmarks_history.md)" in PAGE and "# Benchmarks history" in HISTORY


def test_the_update_program_table_and_its_same_call_ratios_are_rebuilt_from_results():
    rows, times = update_rows()
    assert all(r in BOTH for r in rows), rows
    old, new = times[("old (889a683)", "bfloat16")], times[("new (2c161bc)", "bfloat16")]
    assert [_x(o, n) for o, n in zip(old, new)] == ["1.13x", "1.13x"]  # both passes of the one call agree
    assert _says(BOTH, "The written-out bfloat16 backward: 1.13x faster in the same call")
    r = h100_update_ratios()
    assert r == {"whole": "1.66x", "gradient": "1.36x", "dtype": "1.19x"}
    assert _says(BOTH, f"bfloat16 with the written-out LSTM gradient 1.357 s: **{r['whole']}**")
    assert _says(BOTH, f"gives {r['gradient']}; in the old call bfloat16 alone (1.885 s) gives {r['dtype']}")


def _same_call_rows(folder: str, shas: tuple[str, str], kernel: str = "scan") -> set[str]:
    """The page rows of one new/old update_cost call (one process each, new, old, new, old) and the ratio."""
    d = RES / folder
    cells = {code: re.findall(rf"^\| sequence \| 8 \| bfloat16 \| hoisted \| {kernel} \| off \| [\d.]+ \| ([\d.]+) \| "
                              r"[\d.]+ \| ([\d.]+) \| ([\d.]+%) \|", (d / f"update_cost_{code}.txt").read_text(), re.M)
             for code in ("new", "old")}
    assert all(len(v) == 2 for v in cells.values()), cells
    for code, sha in zip(("new", "old"), shas):
        passes = cells[code]
        cols = [[p[0] for p in passes]] + [list(dict.fromkeys(p[i] for p in passes)) for i in (1, 2)]
        assert f"| {code} ({sha}) | {' | '.join(', '.join(c) for c in cols)} |" in PAGE, (code, cols)
    return {f"{float(n[0]) / float(o[0]):.2f}x" for n, o in zip(cells["new"], cells["old"])}


def test_the_current_update_program_tables_are_their_calls():
    """dcd44bd against f258bec, then 85ab07c against ad5b76a (the code of dcd44bd), each in one call; the scan's
    kernel table of 85ab07c (now on the history page)."""
    ratios = _same_call_rows("gpu_h200_update_bootstrap", ("dcd44bd", "f258bec"))
    assert ratios == {"0.87x"} and _says(BOTH, "The update's sequence T steps long: 0.87x the time in the same call")
    ratios = _same_call_rows("gpu_h200_bf16_residuals", ("85ab07c", "ad5b76a"))
    assert ratios == {"0.96x"} and _says(BOTH, "The input projection and gates in bfloat16: 0.96x.")
    text = (RES / "gpu_h200_bf16_residuals" / "update_cost_new.txt").read_text()
    assert "| sequence | 8 | bfloat16 | hoisted | pallas | off | 5.9 | 0.887 | 1.14 | 136.2 | 13.8% | 136.2 |" in text
    assert "| new (85ab07c), `--lstm-kernel pallas` | 0.887 | 136.2 | 13.8% |" in BOTH
    assert _says(BOTH, "The Pallas recurrence is now 1.14x the scan.")
    before = (RES / "gpu_h200_update_bootstrap" / "trace_before.md").read_text()
    assert "| `loop_slice_fusion` | fused elementwise | 30.26 | 3.1% | 64 | 472.8 |" in before
    after = (RES / "gpu_h200_bf16_residuals" / "trace_after.md").read_text()
    lines = after.splitlines()
    i = lines.index("| kind | ms | share | calls |")
    kinds = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:4]] for r in lines[i + 2:i + 7]}
    for kind in ("matmul", "fused elementwise", "copy / memset", "reduction"):
        assert f"| {kind} | {' | '.join(kinds[kind])} |" in BOTH, kind
    for bucket, label in ((">= 1,000", ">= 1,000 times"), ("100-999", "100-999 times"), ("0-99", "0-99 times")):
        row = next(r for r in lines if r.startswith(f"| {bucket} |")).split("|")
        assert f"| launched {label} per update | {row[2].strip()} | {row[3].strip()} |" in BOTH, bucket
    assert _says(BOTH, "(launched >= 1,000 times per update) still take 396.1 ms")


def test_the_statements_that_did_not_stand_are_gone_from_both_pages():
    """Ratios across calls, machines or loads: 1.76x (two machines), 1.30x and 1.12x for 4x the
    seeds (different load, different calls), 3.6x "met" on one slow baseline."""
    for doc in (PAGE, HISTORY):
        flat = " ".join(doc.split())
        assert "1.76x faster" not in flat and "took 1.30x the time" not in flat and "1.12x the wall time" not in flat
        assert "4 GPUs >= 3.6x: met" not in flat
    assert _says(PAGE, "4 GPUs >= 3.6x: not shown met by any loop.")


def test_the_one_process_per_gpu_caveat_is_computed_from_the_same_call():
    per, half = process_scaling()
    assert half == "2.90x, 3.14x, 3.10x", half
    assert per == "plain 0.737 s alone, 0.598 s in each of two processes; gt 0.620 s, 0.605 s; oir 0.861 s, 0.739 s"
    assert _says(PAGE, f"slower than each process of the 2-process run ({per})")
    assert _says(PAGE, f"4 processes give {half} (plain, gt, oir)")
    # the independent figures have no file here: the page says so instead of quoting them as measured
    assert not any("3.12x" in p.read_text() for p in (RES / "gpu_h200x4_procs").glob("*.txt"))
    assert _says(PAGE, "(3.12x plain, 3.26x oir) has no file under `results/` and is not reproduced here")


def test_the_training_throughput_row_is_the_files():
    text = (B / "thr_fast.txt").read_text()
    med = dict(re.findall(r"^\| \((\w)\) [^|]+\| ([\d.]+) \| [\d,]+ \| [\d.]+ \|", text, re.M))
    a = float(med["a"])
    row = f"| {med['a']} | " + " | ".join(f"{med[k]} ({_x(float(med[k]), a)})" for k in "bcd") + " |"
    assert row in PAGE, row


def test_the_suite_time_is_the_newest_raw_log(tmp_path):
    """The page quotes the newest bench/suite_timing.sh log, or says there is none."""
    assert suite_row(newest_suite_log()) in PAGE
    # the reader of a log as the script writes it
    log = tmp_path / "2026-11-29T101500Z_abcdef1.txt"
    log.write_text("commit: abcdef1234\ntracked files changed since the commit: 0\nnproc: 2\n"
                   "uptime before:  10:15:00 up 1 day,  0 users,  load average: 0.42, 0.50, 0.61\n"
                   "command: python -m pytest -q -p no:cacheprovider --durations=25\n\n....\n"
                   "============ 1,080 passed, 58 deselected in 301.22s (0:05:01) ============\n\n"
                   "uptime after:  10:20:01 up 1 day, load average: 1.9, 1.2, 0.8\npytest exit status: 0\n"
                   "wall time: 303.4 s\n")
    assert suite_row(log).endswith("| `results/test_suite/2026-11-29T101500Z_abcdef1.txt` | abcdef1 | "
                                   "1,080 passed, 58 deselected in 301.22s (0:05:01) | 303.4 s | 2 | 0.42 |")


def test_suite_timing_script_records_what_the_page_needs():
    script = (ROOT / "bench" / "suite_timing.sh").read_text()
    for part in ("git rev-parse HEAD", "nproc", "uptime before", "uptime after", "--durations=25",
                 "wall time", "results/test_suite/"):
        assert part in script, part


def pallas_rows() -> list[str]:
    """The fused-kernel table: one row per recurrence of the same update_cost call."""
    rows = []
    for line in (RES / "gpu_h200_pallas_start" / "update_cost.txt").read_text().splitlines():
        if line.startswith("| sequence |"):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            rows.append(f"| {c[4]} | {c[6]} | {c[7]} | {c[8]} | {c[9]} |")
    return rows


def test_the_fused_kernel_table_is_its_one_call():
    rows = pallas_rows()
    assert len(rows) == 6 and rows[0].startswith("| scan | 0.933 | 1.00 |")
    assert all(r in BOTH for r in rows), rows
    best = min(rows[1:], key=lambda r: float(r.split("|")[2]))
    assert best.startswith("| pallas/64/32/64/2/4 | 0.884 | 0.95 |")
    assert _says(BOTH, "The best tiling (64/32/64/2/4, the module's default) is 0.95x the scan")


def test_the_fused_recurrence_table_and_its_trace_are_their_calls():
    """6cde687's Pallas recurrence in seven tilings between two scans of one process; the call before (zero-filled
    buffers, 0c1c27f's kernel); d341441's later call; the kernel table of its trace."""
    d = RES / "gpu_h200_pallas_fused"
    rows = []
    for line in (d / "update_cost_tilings.txt").read_text().splitlines():
        if line.startswith("| sequence |"):
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            rows.append((c[4], c[7], c[8], c[9], c[10]))
    assert [r[0] for r in rows[:2]] == ["scan", "pallas"] and rows[0][1:] == rows[-1][1:] == ("0.779", "1.00", "155.1",
                                                                                             "15.7%")
    assert "| scan (first, last) | 0.779, 0.779 | 1.00 | 155.1 | 15.7% |" in PAGE
    assert "| pallas (64/32/64/2/4/32, the module's default) | 0.594 | 0.76 | 203.4 | 20.6% |" in PAGE
    for name, *cols in rows[2:-1]:
        assert f"| {name} | {' | '.join(cols)} |" in PAGE, name
    assert _says(PAGE, "0.76x the scan's time in the same call (0.594 s against 0.779 s)")
    fill, old = ((d / f"update_cost_before_{p}.txt").read_text() for p in ("fill", "old"))
    assert "| scan | off | 9.9 | 0.780 | 1.00 |" in fill and "| pallas | off | 4.2 | 0.662 | 0.85 |" in fill
    assert "| pallas | off | 4.7 | 0.887 | 1.14 |" in old
    assert _says(PAGE, "took 0.662 s, and 0c1c27f's Pallas kernel (float32 buffers) 0.887 s, against 0.780 s")
    final = (d / "update_cost_final.txt").read_text()
    assert "| scan | off | 13.8 | 0.779 | 1.00 |" in final and "| pallas | off | 5.9 | 0.592 | 0.76 |" in final
    assert _says(PAGE, "0.592 s against 0.779 s")
    indexed = {p: (d / "indexed_loop" / f"update_cost_{p}.txt").read_text() for p in ("new_1", "old_1")}
    assert "| 0.913 |" in indexed["new_1"] and "| 0.781 |" in indexed["old_1"]
    assert _says(PAGE, "took 0.913 s against 0.781 s")
    lines = (d / "trace_pallas.md").read_text().splitlines()
    i = lines.index("| kind | ms | share | calls |")
    kinds = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:4]] for r in lines[i + 2:i + 7]}
    assert f"| other (the Pallas kernels) | {' | '.join(kinds['other'])} |" in PAGE
    for kind in ("matmul", "fused elementwise", "copy / memset", "reduction"):
        assert f"| {kind} | {' | '.join(kinds[kind])} |" in PAGE, kind
    for bucket, label in ((">= 1,000", ">= 1,000 times"), ("100-999", "100-999 times"), ("0-99", "0-99 times")):
        row = next(r for r in lines if r.startswith(f"| {bucket} |")).split("|")
        assert f"| launched {label} per update | {row[2].strip()} | {row[3].strip()} |" in PAGE, bucket
    steps = [r.split("|") for r in lines if r.startswith("| `_") and int(r.split("|")[-3].replace(",", "")) >= 1000]
    assert {c[1].strip(): c[-2].strip() for c in steps} == {"`_bwd_kernel__1`": "20.4", "`_fwd_kernel__1`": "14.7"}
    assert _says(PAGE, "`_fwd_kernel` 14.7 us, `_bwd_kernel` 20.4 us")
