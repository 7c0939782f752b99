"""The nested run config: validation before anything is written, presets, old flat files, the tyro CLI."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import pytest
import tyro

from agents.pqn.config import FLAT_KEYS, PRESETS, TrainConfig, cli, load_config, preset
from agents.run.config import MAX_EVAL_EPISODES, LLMConfig
from agents.run.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[1]
OLD_CONFIGS = sorted((ROOT / "results").glob("*/*config.json"))


def _with(**changes) -> TrainConfig:
    return TrainConfig().replace(**changes)


@pytest.mark.parametrize("changes, match", [
    ({"run.method": "ppo"}, "run.method='ppo'"),
    ({"oir.relabeler": "gpt"}, "oir.relabeler"),
    ({"llm.backend": "gpt4all"}, "llm.backend"),
    ({"ellm.proposer": "gpt"}, "ellm.proposer"),
    ({"env.delta": 1.5}, "env.delta"),
    ({"env.delta": -1.0}, "env.delta"),
    ({"env.delta": math.nan}, "env.delta=nan must be a finite number"),
    ({"pqn.num_envs": 0}, "pqn.num_envs"),
    ({"pqn.num_minibatches": 3}, "pqn.num_minibatches=3 must divide the 80 trajectories"),
    ({"oir.tau_low": 0.9, "oir.tau_high": 0.1}, "oir.tau_low"),
    ({"pqn.lr": 0.0}, "pqn.lr"),
    ({"pqn.lr": math.inf}, "pqn.lr=inf must be a finite number"),
    ({"run.total_timesteps": 10}, "run.total_timesteps"),
    ({"oir.relabel_balance": True, "oir.keep_ungrounded": True}, "oir.relabel_balance"),
    ({"oir.relabel_lag": 2}, "oir.relabel_lag=2 must be 0"),
    ({"oir.relabel_lag": -1}, "oir.relabel_lag=-1"),
    # 17.8: values that were silently accepted
    ({"pqn.max_grad_norm": -1.0}, "pqn.max_grad_norm=-1.0 must be > 0"),
    ({"pqn.max_grad_norm": 0.0}, "pqn.max_grad_norm"),
    ({"pqn.max_grad_norm": math.nan}, "pqn.max_grad_norm=nan must be a finite number"),
    ({"pqn.gamma": math.nan}, "pqn.gamma"),
    ({"eval.epsilon": math.nan}, "eval.epsilon"),
    ({"ellm.timeout": math.nan}, "ellm.timeout"),
    ({"llm.call_timeout": 0.0}, "llm.call_timeout"),
    ({"llm.call_timeout": math.nan}, "llm.call_timeout"),
    ({"llm.base_url": "127.0.0.1:8000"}, "llm.base_url"),
    ({"llm.max_prompt_tokens": -1}, "llm.max_prompt_tokens=-1 must be a number of tokens"),
    ({"oir.relabel_workers": -3}, "oir.relabel_workers=-3 must be -1 (auto)"),
    ({"eval.episodes": MAX_EVAL_EPISODES + 1}, "eval.episodes=33 must be <= 32"),
    ({"eval.instruction_files": ("does/not/exist.json",)}, "does/not/exist.json"),
    # wrong types (what a JSON file or Python caller may pass)
    ({"pqn.num_envs": "16"}, "pqn.num_envs='16' has type str; expected int"),
    ({"pqn.num_envs": 16.0}, "pqn.num_envs"),
    ({"oir.keep_ungrounded": "false"}, "oir.keep_ungrounded"),
    ({"pqn.norm_input": 1}, "pqn.norm_input"),
])
def test_bad_values_are_refused_naming_the_field(changes, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        _with(**changes).validate()


def test_every_preset_is_valid_for_every_method():
    for name in PRESETS:
        for method in ("gt", "cosine", "oir", "ellm"):
            preset(name).replace(**{"run.method": method}).validate()


def test_presets_hold_their_documented_values():
    cpu = preset("cpu")
    assert (cpu.oir.relabeler, cpu.run.total_timesteps, cpu.eval.every, cpu.eval.episodes) == ("rules", 98_304, 48, 1)
    smoke = preset("smoke")
    assert smoke.num_updates == 4 and smoke.eval.every == 2 and smoke.run.checkpoint_every == 2
    assert smoke.oir.relabeler == "rules" and smoke.rows_per_update() % smoke.pqn.num_minibatches == 0
    assert preset("paper").pqn.hidden_size == 512
    assert preset("cpu") is not preset("cpu")  # fresh copies
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def test_unknown_fields_and_parts_are_named():
    with pytest.raises(ValueError, match=r"unknown config key 'pqn.buffer_size' in section 'pqn'"):
        TrainConfig.from_dict({"pqn": {"buffer_size": 3}})
    with pytest.raises(ValueError, match="unknown config section 'ppo'"):
        TrainConfig.from_dict({"ppo": {}})
    with pytest.raises(ValueError, match="unknown config field 'lr'"):
        TrainConfig().replace(lr=1.0)
    with pytest.raises(ValueError, match=r"unknown config key 'no_such' in a flat"):
        TrainConfig.from_flat_dict({"no_such": 1})


def test_an_unknown_key_of_a_nested_config_json_is_named_with_its_section_and_a_close_match():
    """A typo in a nested config.json used to be read as a flat (old) config: the message listed every
    section as an unknown flat key. Now it names the key, its section and the closest known name."""
    good = preset("smoke").to_dict()
    for broken, expected in (
        ({**good, "pqnn": {"lr": 1e-3}}, r"unknown config section 'pqnn'; did you mean 'pqn'\?"),
        ({**good, "pqn": {**good["pqn"], "lrr": 1e-3}}, r"unknown config key 'pqn.lrr' in section 'pqn'; did you mean "
                                                         r"'pqn.lr'\?"),
        ({"pqnn": {"lr": 1e-3}}, r"unknown config section 'pqnn'"),
    ):
        with pytest.raises(ValueError, match=expected) as e:
            load_config(broken)
        assert "flat" not in str(e.value) and "'run'" not in str(e.value)
    assert load_config({"method": "gt", "lr": 1e-3}).run.method == "gt"  # a flat (old) config still loads


def test_an_out_of_range_seed_is_refused_before_anything_is_written(tmp_path, capsys):
    """--run.seed 99999999999999999999 used to pass validation and overflow in JAX after config.json
    was written; seeds 2**32 and up would also meet seed 0's worlds (JAX keys hold 32 bits)."""
    from agents.pqn import recipe

    for seed, seeds in ((99999999999999999999, 1), (2**32, 1), (-1, 1), (2**32 - 1, 2)):
        with pytest.raises(ValueError, match=rf"run.seed={seed} must be in \[0, {2**32 - seeds}\]"):
            TrainConfig().replace(**{"run.seed": seed, "run.num_seeds": seeds}).validate()
    TrainConfig().replace(**{"run.seed": 2**32 - 1}).validate()
    run = tmp_path / "run"
    assert recipe.pqn_main(["smoke", "--run-dir", str(run), "--run.seed", "99999999999999999999"]) == 2
    assert "run.seed=99999999999999999999" in capsys.readouterr().err and not run.exists()


def test_a_missing_prompt_template_is_refused_whichever_relabeler_runs():
    for relabeler in ("rules", "llm", "both"):
        with pytest.raises(ValueError, match=r"llm.template='/nonexistent.txt': unknown prompt template"):
            TrainConfig().replace(**{"oir.relabeler": relabeler, "llm.template": "/nonexistent.txt"}).validate()


def test_a_key_inside_the_llm_url_never_reaches_config_json_or_a_checkpoint(tmp_path):
    """The key belongs in OPENAI_API_KEY; one typed into --llm.base-url (user:key@ or ?api_key=) is
    redacted from everything a run writes (config.json, and checkpoints, which store to_dict())."""
    from agents.pqn import recipe

    url = "http://me:sk-SECRET1@127.0.0.1:8000/v1?api_key=sk-SECRET2&version=3"
    opts = recipe.PQN.parse(["smoke", "--llm.base-url", url])
    d = opts.config.to_dict()
    assert d["llm"]["base_url"] == "http://REDACTED@127.0.0.1:8000/v1?api_key=REDACTED&version=3"
    run = RunDir.prepare(tmp_path / "run")
    run.write_config(d)
    assert "SECRET" not in (tmp_path / "run" / "config.json").read_text()
    assert load_config(run.read_config()).llm.base_url == d["llm"]["base_url"]
    plain = "http://127.0.0.1:8000/v1"
    assert TrainConfig().replace(**{"llm.base_url": plain}).to_dict()["llm"]["base_url"] == plain


def test_a_repeated_multi_value_flag_keeps_every_value(tmp_path):
    """--eval.instruction-files a.json --eval.instruction-files b.json used to keep only b.json; both
    spellings (several values after one flag, or the flag repeated, or mixed) now add up."""
    from agents.pqn import recipe

    files = []
    for name in ("a", "b", "c"):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"sets": {f"set_{name}": [{"text": f"chop a tree {name}",
                                                                 "achievement": "collect_wood"}]}}))
        files.append(str(path))
    a, b, c = files
    for argv in (["--eval.instruction-files", a, "--eval.instruction-files", b, c],
                 ["--eval.instruction-files", a, b, "--pqn.lr", "0.001", "--eval.instruction_files", c],
                 [f"--eval.instruction-files={a}", "--eval.instruction-files", b, f"--eval.instruction-files={c}"]):
        cfg = recipe.PQN.parse(["smoke", *argv]).config
        assert cfg.eval.instruction_files == (a, b, c), argv
        cfg.validate()
    assert recipe.PQN.parse(["smoke", "--eval.instruction-files", a]).config.eval.instruction_files == (a,)


def test_eval_sets_chooses_the_built_in_sets_and_can_leave_only_the_files_sets(tmp_path):
    from agents.pqn import recipe

    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"sets": {"mine": [{"text": "chop a tree", "achievement": "collect_wood"}]}}))
    cfg = recipe.PQN.parse(["smoke", "--eval.instruction-files", str(path), "--eval.sets"]).config.validate()
    assert cfg.eval.sets == ()
    from oir_gym.evaluation import eval_config

    assert eval_config(cfg.eval.instruction_files, sets=cfg.eval.sets).set_names == ("mine",)
    assert recipe.PQN.parse(["smoke", "--eval.sets", "original"]).config.eval.sets == ("original",)
    assert preset("smoke").eval.sets == ("original", "simple", "complex")
    with pytest.raises(ValueError, match="eval.sets: unknown built-in set 'mine'"):
        cfg.replace(**{"eval.sets": ("mine",)}).validate()  # a file's sets are always evaluated: not named here
    with pytest.raises(ValueError, match="nothing to evaluate"):
        preset("smoke").replace(**{"eval.sets": ()}).validate()


def test_nested_dict_round_trip_through_json():
    cfg = preset("paper").replace(**{"run.method": "ellm", "eval.control": True, "llm.call_timeout": 3.0})
    again = load_config(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize("path", OLD_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_old_flat_config_files_still_load(path):
    flat = json.loads(path.read_text())
    cfg = load_config(flat).validate()
    for key, targets in FLAT_KEYS.items():
        if key in flat:
            for target in targets:
                part, name = target.split(".")
                assert getattr(getattr(cfg, part), name) == flat[key], target


def test_flat_names_map_to_their_new_homes():
    assert len(OLD_CONFIGS) >= 10  # the results/ folder holds the 42-, 44-, 45- and 46-key generations
    cfg = TrainConfig.from_flat_dict({"buffer_size": 7, "k": 3, "llm_backend": "openai", "eval_every": 5, "lr": 1e-4})
    assert (cfg.oir.instruction_buffer_size, cfg.oir.k, cfg.ellm.k) == (7, 3, 3)
    assert (cfg.llm.backend, cfg.eval.every, cfg.pqn.lr) == ("openai", 5, 1e-4)
    # keys the oldest runs did not have keep the defaults those runs ran with
    assert TrainConfig.from_flat_dict({}) == TrainConfig()
    assert (TrainConfig().pqn.scan_unroll, TrainConfig().ellm.reward, TrainConfig().oir.relabel_balance) == (1, "any",
                                                                                                          False)


# ----------------------------------------------------------------------------- CLI
@dataclass
class Opts:
    config: Annotated[TrainConfig, tyro.conf.arg(name="")] = field(default_factory=TrainConfig)
    run_dir: str = "x"


def test_cli_starts_from_the_named_preset_and_overrides_fields():
    o = cli(Opts, ["paper", "--pqn.num-envs", "32", "--oir.keep-ungrounded", "--run-dir", "r"])
    assert o.config == preset("paper").replace(**{"pqn.num_envs": 32, "oir.keep_ungrounded": True})
    assert o.run_dir == "r"
    assert cli(Opts, []).config == preset("cpu")  # the default preset
    assert cli(Opts, ["--run.method", "gt"]).config == preset("cpu").replace(**{"run.method": "gt"})
    base = preset("smoke")
    assert cli(Opts, ["--eval.epsilon", "0.05"], base=base).config == base.replace(**{"eval.epsilon": 0.05})


def test_cli_help_shows_the_chosen_presets_values(capsys):
    with pytest.raises(SystemExit) as e:
        cli(Opts, ["paper", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--run.total-timesteps INT Env steps per seed. (default: 10000000)" in out
    assert "(default: 512)" in out and "{gt,cosine,oir,ellm}" in out


@pytest.mark.parametrize("argv", [
    ["--oir.keep-ungrounded", "ture"],  # a typo is not "false"
    ["--run.method", "ppo"],
    ["--llm.backend", "gpt"],
    ["--pqn.num-envs", "many"],
    ["--pqn.nnum-envs", "4"],
])
def test_cli_refuses_bad_input_with_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli(Opts, argv)
    assert e.value.code == 2
    capsys.readouterr()


def test_cli_accepts_a_backend_module_path_as_the_python_api_does(capsys):
    opts = cli(Opts, ["--llm.backend", "my_pkg.llm:Backend"])
    assert opts.config.llm.backend == "my_pkg.llm:Backend" and opts.config.validate()
    for bad in ("my_pkg.llm:", ":Backend", "my pkg:Backend", "my_pkg.llm:Back-end"):
        with pytest.raises(SystemExit) as e:
            cli(Opts, ["--llm.backend", bad])
        assert e.value.code == 2, bad
        assert "package.module:ClassName" in capsys.readouterr().err
        with pytest.raises(ValueError, match="llm.backend"):
            LLMConfig(backend=bad).validate()
    with pytest.raises(SystemExit):
        cli(Opts, ["smoke", "--help"])
    assert "MODULE:CLASS" in capsys.readouterr().out


def test_a_preset_cannot_be_applied_to_a_resumed_run(capsys):
    with pytest.raises(SystemExit) as e:
        cli(Opts, ["paper"], base=preset("smoke"))
    assert e.value.code == 2 and "keeps its saved config" in capsys.readouterr().err


def test_train_script_refuses_bad_values_before_writing_anything(tmp_path, capsys):
    from agents.pqn import recipe

    run = tmp_path / "run"
    for argv in (["--pqn.num-minibatches", "5"], ["--pqn.max-grad-norm", "nan"], ["--env.delta", "nan"],
                 ["--pqn.max-grad-norm", "-1"], ["--eval.episodes", "64"], ["--max-updates", "0"]):
        assert recipe.pqn_main(["smoke", "--run-dir", str(run), *argv]) == 2, argv
        assert "error:" in capsys.readouterr().err
        assert not run.exists(), argv
    with pytest.raises(SystemExit) as e:
        recipe.pqn_main(["smoke", "--run-dir", str(run), "--llm.backend", "gpt"])
    assert e.value.code == 2 and not run.exists()
    capsys.readouterr()


def test_the_llm_backend_names_are_the_relabeler_factorys_less_rules():
    """``llm.backend`` accepts exactly the names oir_gym.relabel.make_backend builds (one table)."""
    from agents.config import LLM_BACKENDS
    from oir_gym.relabel.backends import BACKEND_NAMES

    assert LLM_BACKENDS == tuple(n for n in BACKEND_NAMES if n != "rules")
