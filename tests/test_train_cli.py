"""One command line for both trainers (agents.run.train): the same flag names for the settings they
share, help text on every flag, and the old SB3 spellings refused with the new name."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tyro

from agents.pqn.config import PRESETS
from agents.sb3.config import SB3_PRESETS
from agents.sb3.trainer import SB3, SB3Options
from agents.pqn.recipe import PQN, PQNOptions
from agents.run.train import compact_table

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


# ----------------------------------------------------------------------------- entry points and help text
ROOT = Path(__file__).resolve().parents[1]
RST = re.compile(r"``|:(class|mod|func|meth|data|attr):`")


def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "200", **(env or {})})


@pytest.mark.parametrize("recipe, presets", [(PQN, PRESETS), (SB3, SB3_PRESETS)])
def test_bare_help_lists_every_preset_and_marks_the_default_not_required(recipe, presets, capsys):
    with pytest.raises(SystemExit) as e:
        recipe.parse(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "(required)" not in out and "default: cpu" in out
    for name, (desc, _) in presets.items():
        assert re.search(rf"^  {name} +\S", out, re.M), name
    assert "PRESET --help" in out  # where every option is listed


@pytest.mark.parametrize("recipe, presets", [(PQN, PRESETS), (SB3, SB3_PRESETS)])
def test_help_text_shows_no_rst_markup(recipe, presets, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    description = ast.get_docstring(ast.parse((ROOT / recipe.script).read_text()))  # the script's --help text
    assert RST.search(description)
    for argv in (["--help"], *[[name, "--help"] for name in presets]):
        with pytest.raises(SystemExit):
            recipe.parse(list(argv), description)
        out = capsys.readouterr().out
        assert len(out) > 1000 and not RST.search(out), (argv, RST.search(out) and out[RST.search(out).start() - 80:][:160])
    # the docstrings themselves keep their markup (the API reference reads them)
    from agents.run.config import LLMConfig, plain_help

    assert plain_help("``--eval.sets``, :class:`~oir_gym.relabel.parallel.ParallelRelabeler`, :mod:`agents.run.run_dir`") \
        == "--eval.sets, ParallelRelabeler, agents.run.run_dir"
    assert "``" in (LLMConfig.__doc__ or "") + (__import__("agents.run.config").run.config.__doc__ or "")


@pytest.mark.parametrize("recipe", [PQN, SB3])
def test_a_preset_after_a_flag_is_a_usage_error_saying_it_comes_first(recipe, capsys):
    with pytest.raises(SystemExit) as e:
        recipe.parse(["--run-dir", "runs/x", "smoke"])
    assert e.value.code == 2
    assert "a preset (smoke) must be the first argument" in capsys.readouterr().err
    assert recipe.parse(["smoke", "--run-dir", "runs/x"]).run_dir == "runs/x"


def test_python_m_agents_train_is_the_pqn_command_line(tmp_path):
    help_ = _run("-m", "agents.run.train", "--help")
    assert help_.returncode == 0 and "usage: python -m agents.run.train [PRESET]" in help_.stdout and "smoke" in help_.stdout
    run = tmp_path / "run"  # a bad value: the driver's own check answers, before anything is written
    bad = _run("-m", "agents.train", "smoke", "--run-dir", str(run), "--run.seed", "-3")  # the old path still runs
    assert bad.returncode == 2 and "run.seed=-3" in bad.stderr and not run.exists()


def test_python_m_agents_checkpoint_verifies_a_run_directory(tmp_path, capsys):
    from agents.run import checkpoint

    help_ = _run("-m", "agents.run.checkpoint", "--help")
    assert help_.returncode == 0 and "Verify the newest checkpoint of a PQN run" in help_.stdout
    assert not RST.search(help_.stdout)
    missing = _run("-m", "agents.checkpoint", str(tmp_path / "nowhere"))  # the old path still runs
    assert missing.returncode == 2 and "is not a folder" in missing.stderr and "invalid choice" not in missing.stderr
    run = tmp_path / "run"
    checkpoint.save_checkpoint(run, 3, {"w": np.ones(3, np.float32)}, {"update": 3, "env_steps": 30})
    for argv in ([str(run)], ["verify", str(run)]):  # "verify" is the same command
        assert checkpoint.main(argv) == 0
        assert "update 3" in capsys.readouterr().out
    (run / "checkpoints" / "000003" / "arrays.msgpack").write_bytes(b"damaged")
    assert checkpoint.main([str(run)]) == 2
    assert "arrays.msgpack" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint.main([str(empty)]) == 2 and "no checkpoint" in capsys.readouterr().err


def test_scripts_silence_xla_log_banners_only_in_their_own_process(monkeypatch):
    from agents.run.train import quiet_xla_logs

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    show = "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
    lib = subprocess.run([sys.executable, "-c", f"import os, agents.run.train, agents.sb3.trainer, oir_gym; {show}"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert lib.returncode == 0 and lib.stdout.strip() != "3"  # importing the library leaves JAX's own default
    # a script sets it before JAX is imported (JAX keeps a value that is set), so XLA's C++ reads it
    script = subprocess.run([sys.executable, "-c", f"import os, agents.run.train; agents.run.train.quiet_xla_logs(); "
                                                   f"import jax; {show}"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert script.stdout.strip() == "3"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    quiet_xla_logs()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")  # the user's own setting wins
    quiet_xla_logs()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_the_printed_final_tables_collapse_rows_of_zeros():
    from oir_gym.evaluation import EvalResult

    res = EvalResult()
    res.texts["original"] = [f"instruction {i}" for i in range(22)]
    res.achievements["original"] = list(range(22))
    res.rates["original"] = np.array([0.5] + [0.0] * 21)
    res.texts["ordered"] = [f"a{i} then b{i}" for i in range(22)]
    res.achievements["ordered"] = list(range(22))
    res.rates["ordered"] = np.zeros(22)
    full = res.to_markdown()
    short = compact_table(full)
    assert "| instruction 0 | 0.50 |" in short and "instruction 1 " not in short
    assert "(21 of 22 at 0 not shown)" in short and "Set ordered, per instruction: all 22 at 0" in short
    assert len(short.splitlines()) < 20 < len(full.splitlines())
    assert short.splitlines()[:4] == full.splitlines()[:4]  # the summary rows stay
