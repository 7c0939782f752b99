"""One command line for both trainers (agents.train): the same flag names for the settings they
share, help text on every flag, and the old SB3 spellings refused with the new name."""

from __future__ import annotations

import re
import warnings

import pytest
import tyro

from agents.sb3_trainer import SB3, SB3Options
from agents.train import PQN, PQNOptions

SHARED_PARTS = ("--run.", "--env.", "--oir.", "--llm.", "--eval.")


def _help_flags(recipe, capsys, monkeypatch, preset: str = "smoke") -> set[str]:
    """The flag names that ``--help`` of ``recipe``'s script prints (after ``preset``)."""
    monkeypatch.setenv("COLUMNS", "250")  # no flag name wrapped
    with pytest.raises(SystemExit) as e:
        recipe.parse([preset, "--help"])
    assert e.value.code == 0
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9.-]*[a-z0-9]", capsys.readouterr().out))


def test_help_of_both_scripts_shows_the_same_names_for_the_shared_settings(capsys, monkeypatch):
    pqn, sb3 = _help_flags(PQN, capsys, monkeypatch), _help_flags(SB3, capsys, monkeypatch)
    shared = {f for f in sb3 if f.startswith(SHARED_PARTS)}
    assert len(shared) > 30 and {"--eval.every", "--run.total-timesteps", "--oir.relabeler", "--llm.backend"} <= shared
    assert shared <= pqn, sorted(shared - pqn)  # every SB3 setting of a shared part is a PQN flag, same name
    run_flags = {"--run-dir", "--resume", "--overwrite", "--max-updates", "--time-limit", "--eval-only", "--wandb",
                 "--progress", "--no-progress", "--log-every"}
    assert run_flags <= pqn and run_flags <= sb3
    assert {f for f in sb3 if not f.startswith((*SHARED_PARTS, "--sb3."))} <= pqn  # SB3's own are under --sb3.*


def _flags_and_help(options_type: type) -> dict[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # tyro's parser accessor, for its actions
        parser = tyro.extras.get_parser(options_type)
    return {o: a.help or "" for a in parser._actions for o in a.option_strings if o.startswith("--")}


@pytest.mark.parametrize("options_type", [PQNOptions, SB3Options])
def test_every_flag_has_help_text(options_type):
    flags = _flags_and_help(options_type)
    assert len(flags) > 50
    bare = sorted(f for f, h in flags.items() if not re.sub(r"\(default: .*\)", "", h, flags=re.S).strip())
    assert not bare, f"flags without help text: {bare}"


def test_booleans_and_units_are_the_pqn_trainers():
    """--eval.every counts updates and booleans are flags in both; an SB3 update is
    --sb3.steps-per-update env steps."""
    cfg = SB3.parse(["smoke", "--eval.every", "3", "--eval.no-control", "--sb3.steps-per-update", "100",
                     "--run.total-timesteps", "1000"]).config
    assert (cfg.eval.every, cfg.eval.control, cfg.num_updates) == (3, False, 10)
    pcfg = PQN.parse(["smoke", "--eval.every", "3", "--eval.no-control"]).config
    assert (pcfg.eval.every, pcfg.eval.control) == (3, False)
    with pytest.raises(SystemExit):
        SB3.parse(["--eval.control", "false"])  # as in the PQN trainer: a flag takes no value


@pytest.mark.parametrize("old, new", [("--eval-every", "--eval.every"), ("--algo", "--sb3.algo"),
                                      ("--eval-horizon", "--eval.horizon"), ("--seed", "--run.seed"),
                                      ("--grounding", "--oir.grounding"), ("--llm-model", "--llm.model")])
def test_an_old_sb3_spelling_is_a_usage_error_naming_the_new_flag(old, new, capsys):
    with pytest.raises(SystemExit) as e:
        SB3.parse([old, "4"])
    assert e.value.code == 2
    assert f"use {new}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        SB3.parse(["--wandb", "true"])
    assert e.value.code == 2 and "--wandb takes no value now" in capsys.readouterr().err
