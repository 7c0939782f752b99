"""Every SB3 preset works with every algorithm and every value of every choice flag: the algorithm
picks its own hyperparameters (the smoke preset's tiny ones for any --sb3.algo), a user's --sb3.hp
still wins, and one that the algorithm cannot take is refused before the run folder is written."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import torch  # noqa: E402

from agents.sb3 import models as sb3_agents  # noqa: E402
from agents.run.run_dir import RunDir  # noqa: E402
from agents.sb3.config import ALGOS, SB3_PRESETS, SB3TrainConfig  # noqa: E402
from agents.sb3.trainer import SB3, sb3_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
torch.set_num_threads(1)


def _choice_flags() -> list[tuple[str, tuple[str, ...]]]:
    """Every setting of an SB3 config that takes one of a few names (a Literal): (dotted path, values)."""
    out = []
    for part in dataclasses.fields(SB3TrainConfig):
        cls = part.default_factory  # type: ignore[misc]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if typing.get_origin(hints[f.name]) is typing.Literal:
                out.append((f"{part.name}.{f.name}", typing.get_args(hints[f.name])))
    return out


CHOICES = _choice_flags()
_built: dict[str, int] = {}


def _model_params(cfg: SB3TrainConfig) -> int:
    """The parameter count of the model the trainer would build for ``cfg`` (on an env that only
    declares the spaces: no Craftax stepped); built once per distinct model settings."""
    key = json.dumps([cfg.sb3.algo, cfg.env.obs_mode, cfg.sb3.num_envs, cfg.sb3.defaults, cfg.sb3.hyperparams])
    if key not in _built:
        venv = sb3_agents.spaces_only_venv(cfg.env.obs_mode, cfg.sb3.num_envs)
        model = sb3_agents.make_model(cfg.sb3.algo, venv, cfg.run.seed, cfg.sb3.hyperparams, device="cpu",
                                      defaults=cfg.sb3.defaults)
        _built[key] = sum(p.numel() for p in model.policy.parameters())
    return _built[key]


def test_the_choice_flags_include_the_algorithm_and_the_hyperparameter_set():
    names = dict(CHOICES)
    assert set(names["sb3.algo"]) == set(ALGOS) and set(names["sb3.defaults"]) == {"craftax", "tiny"}
    assert {"run.method", "env.obs_mode", "oir.relabeler", "oir.grounding", "oir.oracle"} <= set(names)


@pytest.mark.parametrize("preset", sorted(SB3_PRESETS))
@pytest.mark.parametrize("algo", ALGOS)
def test_every_preset_validates_and_builds_its_model_for_every_choice(preset, algo):
    base = SB3.parse([preset, "--sb3.algo", algo]).config
    for path, values in CHOICES:
        for value in values:
            cfg = base.replace(**{path: value})
            try:
                cfg.validate()
            except ValueError as e:  # a combination the trainer refuses: said with the setting's name
                assert path in str(e) or path.split(".")[1] in str(e), (path, value, str(e))
                continue
            assert _model_params(cfg) > 0, (preset, algo, path, value)


@pytest.mark.parametrize("algo", ALGOS)
def test_the_smoke_preset_is_small_for_every_algorithm(algo):
    smoke = SB3.parse(["smoke", "--sb3.algo", algo]).config.validate()
    cpu = SB3.parse(["cpu", "--sb3.algo", algo]).config.validate()
    assert smoke.sb3.defaults == "tiny" and smoke.sb3.hyperparams == {}  # chosen by the algorithm, not baked in
    assert _model_params(smoke) * 5 < _model_params(cpu)
    resolved = sb3_agents.resolve_hyperparams(algo, smoke.sb3.num_envs, smoke.sb3.hyperparams, smoke.sb3.defaults)
    if algo != "recurrent_ppo":
        assert resolved["buffer_size"] <= 2_000 and resolved["learning_starts"] < smoke.sb3.steps_per_update


def test_a_users_hyperparameter_wins_over_the_algorithms_set():
    cfg = SB3.parse(["smoke", "--sb3.algo", "dqn", "--sb3.hp", "batch_size=8", "policy_kwargs.net_arch=[16]"]).config
    hp = sb3_agents.resolve_hyperparams("dqn", cfg.sb3.num_envs, cfg.validate().sb3.hyperparams, cfg.sb3.defaults)
    assert hp["batch_size"] == 8 and hp["policy_kwargs"]["net_arch"] == [16] and hp["buffer_size"] == 2_000


@pytest.mark.parametrize("argv, match", [
    (["--sb3.algo", "recurrent_ppo", "--sb3.hp", "learning_starts=10"], "RecurrentPPO .* no argument 'learning_starts'"),
    (["--sb3.algo", "dqn", "--sb3.hp", "policy_kwargs.n_quantiles=5"], "DQN .* no argument 'n_quantiles'"),
    (["--sb3.hp", "batch_size='many'"], "takes a number"),
    (["--sb3.hp", "buffer_size=-5"], "buffer_size=-5 must be a whole number >= 1"),
])
def test_a_hyperparameter_the_algorithm_cannot_take_is_a_clear_error_before_any_file(argv, match, tmp_path, capsys):
    run = tmp_path / "run"
    assert sb3_main(["smoke", "--run-dir", str(run), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert re.search(match, err), err
    assert not RunDir(run).holds_run()  # the rerun needs no --overwrite


def test_a_value_sb3_refuses_when_building_is_an_error_before_config_json(tmp_path, capsys):
    """A value of the right kind that the SB3 class cannot build with fails in the trainer's
    construction, before the driver writes config.json (the env is built first: a few seconds)."""
    run = tmp_path / "run"
    assert sb3_main(["smoke", "--run-dir", str(run), "--sb3.algo", "dqn", "--sb3.hp", "policy_kwargs.net_arch='big'",
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "DQN (--sb3.algo dqn, --sb3.defaults tiny) could not be built" in err and "net_arch" in err
    assert not RunDir(run).holds_run()


@pytest.mark.slow  # three SB3 smoke runs in fresh processes: 15 s of CPU each on 2 cores, minutes when shared
@pytest.mark.parametrize("algo", ALGOS)
def test_train_sb3_smoke_runs_for_every_algorithm(algo, tmp_path):
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_sb3.py"), "smoke", "--sb3.algo", algo,
                        "--run-dir", str(run), "--no-progress"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert (run / "complete.json").is_file() and (run / "model.zip").is_file()
    saved = json.loads((run / "config.json").read_text())
    assert saved["sb3"]["algo"] == algo and saved["sb3"]["defaults"] == "tiny"
    assert saved["resolved_hyperparams"] == sb3_agents.resolve_hyperparams(algo, 4, {}, "tiny")
    assert len(p.stdout.splitlines()) < 30, p.stdout  # the final tables printed compact
