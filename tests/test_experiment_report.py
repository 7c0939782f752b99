"""agents.tools.experiment_report rebuilds the mixed-arm and stone-tier tables of docs/results.md from
results/, and its verdicts follow the pre-registered endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.tools import experiment_report as er

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "docs" / "results.md").read_text()


@pytest.mark.parametrize("experiment, folder", [("mixed", "mixed_arm"), ("stone", "stone_tier")])
def test_results_doc_tables_are_rebuilt_from_the_run_files(experiment, folder):
    report = er.mixed_report(ROOT / "results" / folder) if experiment == "mixed" else er.stone_report(
        ROOT / "results" / folder)
    rows = [line for line in report.splitlines() if line.startswith("| ")]
    assert len(rows) >= 8
    missing = [r for r in rows if r not in RESULTS]
    assert not missing, missing
    verdict = report.splitlines()[0].rsplit("**", 2)[1]
    assert verdict.split(":")[0] in RESULTS.lower() or verdict in RESULTS


def test_every_run_records_the_pre_registered_commit_and_disjoint_seeds():
    for folder in ("mixed_arm", "stone_tier"):
        runs = sorted(p for p in (ROOT / "results" / folder).iterdir() if p.is_dir())
        assert len(runs) == (8 if folder == "mixed_arm" else 4)
        for run in runs:
            cfg = json.loads((run / "config.json").read_text())
            assert cfg["provenance"]["git_commit"].startswith("dff7c35")
            assert cfg["run"]["seed"] == int(run.name.rsplit("_s", 1)[1]) and cfg["run"]["num_seeds"] == 3
    # the pre-registration pages were committed in dff7c35, before these runs: they hold both pages
    assert (ROOT / "docs" / "experiments" / "mixed-arm.md").exists() and (ROOT / "docs" / "experiments" / "stone-tier.md").exists()


def _seed(heldout: float, original: float) -> dict:
    return {"heldout": {"mean_success_rate": heldout}, "original": {"mean_success_rate": original}}


@pytest.mark.parametrize("mixed, canonical, verdict", [
    ([0.40, 0.41, 0.42, 0.40, 0.41, 0.42], [0.30, 0.31, 0.32, 0.30, 0.31, 0.32], "support"),
    ([0.30, 0.31, 0.32, 0.30, 0.31, 0.32], [0.30, 0.31, 0.32, 0.30, 0.31, 0.32], "refute"),
    ([0.30, 0.40, 0.35, 0.25, 0.45, 0.30], [0.30, 0.31, 0.32, 0.30, 0.31, 0.32], "inconclusive"),
])
def test_the_mixed_verdict_follows_the_endpoints(mixed, canonical, verdict):
    arms = {"mixed": [[_seed(h, 0.35) for h in mixed[:3]], [_seed(h, 0.35) for h in mixed[3:]]],
            "canonical": [[_seed(h, 0.35) for h in canonical[:3]], [_seed(h, 0.35) for h in canonical[3:]]]}
    assert f"**{verdict}**" in er.mixed_verdict(arms)


def test_a_support_with_a_failed_guard_is_not_a_support():
    arms = {"mixed": [[_seed(0.41, 0.20)] * 3, [_seed(0.42, 0.20)] * 3],
            "canonical": [[_seed(0.30, 0.35)] * 3, [_seed(0.31, 0.35)] * 3]}
    assert "**inconclusive**" in er.mixed_verdict(arms)


def test_pooled_counts_and_fisher():
    seed = {"original": {"texts": ["collect stone"], "rates": [0.25]}}
    assert er.pooled_counts([[seed, seed], [seed]], "collect stone", 16) == (12, 48)
    assert er.fisher_p((0, 96), (0, 96)) == 1.0
    assert er.fisher_p((12, 96), (0, 96)) < 0.001


def test_the_command_line_names_a_folder_without_runs(tmp_path, capsys):
    assert er.main(["mixed", str(tmp_path)]) == 2
    assert "no run folders" in capsys.readouterr().err
