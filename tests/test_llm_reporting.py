"""The progress line says what the LLM's answers reached, not only that it answered (issue 26,
item 6; issue 37, item 3): a run where the LLM answers too late, or answers but none of its
instructions gets into a training batch or a buffer, says so in the line a user reads."""

from __future__ import annotations

import time

import pytest

from agents.pqn import recipe

ROW = {"update": 3, "env_steps": 300, "sps": 10.0, "epsilon": 0.5, "loss": 0.1, "train/success_rate": 0.2,
       "relabel/rows": 4, "relabel/grounded_frac": 1.0, "relabel/llm_share": 1.0, "relabel/llm_offer_share": 0.0}


def test_an_llm_whose_answers_all_come_too_late_reads_zero_in_time_not_100_percent():
    """The default command on a 2-core CPU once read "LLM answered 100%" while every answer was stale."""
    line = recipe.summary_line(ROW | {"relabel/llm_in_time_total": 0.0, "relabel/llm_stale": 6.0,
                                     "relabel/llm_rows_total": 0.0, "relabel/llm_buffered_total": 0.0}, 10)
    assert "LLM answers 0/6 in time" in line and "100%" not in line
    assert "none of its instructions reached a batch or a buffer" in line


def test_what_the_llm_contributed_is_counted_in_rows_and_buffer_entries():
    line = recipe.summary_line(ROW | {"relabel/llm_in_time_total": 5.0, "relabel/llm_stale": 1.0,
                                     "relabel/llm_rows_total": 12.0, "relabel/llm_buffered_total": 3.0}, 10)
    assert "LLM answers 5/6 in time" in line
    assert "its instructions in 12 batch rows, 3 buffer entries" in line and "none of" not in line


def test_a_run_without_an_llm_prints_no_llm_part():
    row = {k: v for k, v in ROW.items() if not k.startswith("relabel/llm")}
    assert "LLM" not in recipe.summary_line(row, 10)


def test_the_cpu_preset_relabels_with_rules_and_its_first_line_names_the_llm_flag(tmp_path):
    """On a 2-core CPU the LLM's answers arrived too late to train on (issue 37, item 3): the default
    preset runs rules, and the run's first line says which flag adds the LLM."""
    from agents.pqn.config import DEFAULT_PRESET, preset
    from agents.run.run_dir import RunDir

    cfg = preset(DEFAULT_PRESET)
    assert DEFAULT_PRESET == "cpu" and cfg.oir.relabeler == "rules" and cfg.run.method == "oir"
    header = recipe.PQN.header(cfg, None, 1, RunDir(tmp_path / "run"))
    assert "relabeler=rules (the offline LLM beside the rules: --oir.relabeler both)" in header
    both = cfg.replace(**{"oir.relabeler": "both"})
    assert "--oir.relabeler both" not in recipe.PQN.header(both, None, 1, RunDir(tmp_path / "run"))


@pytest.mark.slow
def test_the_time_limit_bounds_the_llm_start_up_check(capsys):
    """``--time-limit`` covers the LLM's start-up check: a backend that never answers (a real child
    process that sleeps in generate) is cut short at the deadline, and the warning says by what."""
    from agents.run.config import LLMConfig
    from agents.run.llm import check_deadline
    from agents.run.relabeling import RelabelerOptions, make_relabeler

    with check_deadline(time.time() + 20, "--time-limit 20"):
        bg = make_relabeler("both", llm=LLMConfig(backend="llm_child_backends:HangsInGenerate"),
                            options=RelabelerOptions(flag="--oir.relabeler"))
    try:
        err = capsys.readouterr().err
        assert "failed its start-up check" in err and "cut short by --time-limit 20" in err
        assert "--llm.call-timeout" in err and "--llm.per-update" in err  # the flags as the CLI spells them
    finally:
        bg.close(timeout=1)
