"""examples/analyze_runs.py rebuilds the tables of docs/results.md from the files in results/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import analyze_runs  # noqa: E402

R = ROOT / "results" / "gpu_h200_1e7"


def _table(capsys, runs: list[str]) -> list[str]:
    assert analyze_runs.main(["--table-only", "--runs", *runs]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "±" in line]


def test_equal_steps_table_in_results_doc_is_rebuilt_from_results(capsys):
    rows = _table(capsys, [f"gt={R}/gt#000750", f"oir={R}/oir#000750"])
    doc = (ROOT / "docs" / "results.md").read_text()
    assert len(rows) == 6
    for row in rows:
        # the doc labels the OIR rows with the relabeler used
        assert row.replace("| oir |", "| oir (rules) |") in doc, row


def test_end_of_run_numbers_in_results_doc_are_rebuilt_from_results(capsys):
    rows = _table(capsys, [f"gt={R}/gt#final", f"gt_eps={R}/gt#final_eps0.05", f"oir={R}/oir#stop",
                           f"oir_eps={R}/oir#stop_eps0.05"])
    doc = (ROOT / "docs" / "results.md").read_text()
    originals = [r for r in rows if "| original |" in r]
    assert len(originals) == 4
    for row in originals:  # the doc's end-of-run table keeps the three metric cells of each row
        cells = " | ".join(c.strip() for c in row.strip("|").split("|")[2:])
        assert cells in doc, row


def test_repeated_names_pool_seeds_and_tags_pick_the_evaluation(capsys):
    one = _table(capsys, [f"gt={R}/gt#final"])
    pooled = _table(capsys, [f"gt={R}/gt#final", f"gt={R}/gt#final"])
    # the same three seeds twice: same mean, smaller standard error
    mean = lambda row: row.split("|")[3].split("±")[0].strip()  # noqa: E731
    assert [mean(r) for r in one] == [mean(r) for r in pooled]
    assert one != pooled
    with pytest.raises(FileNotFoundError):
        _table(capsys, [f"gt={R}/gt#no_such_tag"])
