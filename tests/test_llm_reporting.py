"""The progress line says what the LLM's instructions reached, not only that it answered (issue 26,
item 6): a run where the LLM answers but none of its instructions gets into a training batch or a
buffer says so in the line a user reads."""

from __future__ import annotations

from agents import train

ROW = {"update": 3, "env_steps": 300, "sps": 10.0, "epsilon": 0.5, "loss": 0.1, "train/success_rate": 0.2,
       "relabel/rows": 4, "relabel/grounded_frac": 1.0, "relabel/llm_share": 1.0, "relabel/llm_offer_share": 0.0}


def test_an_llm_that_answers_but_contributes_nothing_is_named_as_such():
    line = train.summary_line(ROW | {"relabel/llm_rows_total": 0.0, "relabel/llm_buffered_total": 0.0}, 10)
    assert "LLM answered 100%" in line and "none of its instructions reached a batch or a buffer" in line


def test_what_the_llm_contributed_is_counted_in_rows_and_buffer_entries():
    line = train.summary_line(ROW | {"relabel/llm_rows_total": 12.0, "relabel/llm_buffered_total": 3.0}, 10)
    assert "its instructions in 12 batch rows, 3 buffer entries" in line and "none of" not in line


def test_a_run_without_an_llm_prints_no_llm_part():
    row = {k: v for k, v in ROW.items() if not k.startswith("relabel/llm")}
    assert "LLM" not in train.summary_line(row, 10)
