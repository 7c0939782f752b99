"""SB3 run directories: checksummed, atomic model.zip checkpoints, loading a trained policy into the
Gymnasium env, TensorBoard scalars, resume, and the command line (examples/train_sb3.py)."""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

from agents.sb3 import models as sb3_agents  # noqa: E402
from agents.sb3.config import SB3_PRESETS, SB3TrainConfig, load_sb3_config  # noqa: E402
from agents.sb3.trainer import SB3, sb3_main  # noqa: E402
from agents.tools.policy import Policy, load_policy  # noqa: E402
from agents.run.run_dir import CorruptFileError, RunDir  # noqa: E402
from oir_gym import ENV_ID  # noqa: E402
from oir_gym.vector_env import InstructionCraftax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_ENVS = 4
HORIZON = 40
CUSTOM = "chop down a tree and then build a crafting table"  # not one of the env's instructions

torch.set_num_threads(1)


def _tiny_cfg(algo: str = "qrdqn", **kw) -> SB3TrainConfig:
    """The smoke preset (400 env steps of 4 envs, updates of 200) with ``algo`` and dotted changes ``kw``."""
    hp = {
        "qrdqn": dict(learning_starts=100, buffer_size=2000, batch_size=32, target_update_interval=200,
                      policy_kwargs=dict(n_quantiles=5, net_arch=[32, 32])),
        "dqn": dict(learning_starts=100, buffer_size=2000, batch_size=32, policy_kwargs=dict(net_arch=[32])),
        "recurrent_ppo": dict(n_steps=16, n_epochs=1, policy_kwargs=dict(lstm_hidden_size=16,
                                                                        net_arch=dict(pi=[16], vf=[16]))),
    }[algo]
    return SB3_PRESETS["smoke"][1]().replace(**{"sb3.algo": algo, "sb3.hyperparams": hp, **kw})


def _write_run_config(run: RunDir, cfg: SB3TrainConfig) -> None:
    SB3.write_config(run, cfg)


def _checkpoint_only_run(path: Path, algo: str, venv) -> Path:
    """A run directory holding a config and a checkpoint of an untrained model (no training: fast)."""
    cfg = _tiny_cfg(algo)
    run = RunDir.prepare(path)
    _write_run_config(run, cfg)
    model = sb3_agents.make_model(algo, venv, seed=0, hyperparams=cfg.sb3.hyperparams, device="cpu")
    sb3_agents.save_checkpoint(run.path, model, {"update": 0})
    return run.path


@pytest.fixture(scope="module")
def venv():
    from oir_gym.sb3 import SB3VecEnv

    v = SB3VecEnv(InstructionCraftax(num_envs=N_ENVS, seed=0, max_episode_steps=HORIZON))
    yield v
    v.close()


@pytest.fixture(scope="module")
def gym_env():
    env = gym.make(ENV_ID)
    yield env
    env.close()


def _act_100_steps(policy, env, instruction: str = CUSTOM) -> list[int]:
    obs, info = env.reset(seed=0, options={"instruction": instruction})
    assert info["instruction"] == instruction
    policy.reset()
    actions = []
    for _ in range(100):
        a = policy.act(obs)
        assert isinstance(a, int) and env.action_space.contains(a)
        actions.append(a)
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            obs, _ = env.reset(options={"instruction": instruction})
            policy.reset()
    return actions


# ------------------------------------------------------------------------- loading policies (fast)


@pytest.mark.parametrize("algo", ["qrdqn", "recurrent_ppo"])
def test_load_sb3_policy_acts_in_gym_make_with_any_instruction(algo, venv, gym_env, tmp_path):
    run = _checkpoint_only_run(tmp_path / "run", algo, venv)
    policy = load_policy(run, device="cpu")  # the one loader of PQN and SB3 runs
    assert isinstance(policy, sb3_agents.SB3AgentPolicy) and isinstance(policy, Policy)
    assert policy.algo == algo and policy.recurrent == (algo == "recurrent_ppo")
    first = _act_100_steps(policy, gym_env)
    assert first == _act_100_steps(policy, gym_env)  # reset() restarts the recurrent state: same actions again
    with pytest.raises(ValueError, match="one trained seed"):
        sb3_agents.load_sb3_policy(run, seed=1)


def test_recurrent_policy_carries_its_state_between_acts(venv, tmp_path):
    policy = sb3_agents.load_sb3_policy(_checkpoint_only_run(tmp_path / "run", "recurrent_ppo", venv), device="cpu")
    obs = {k: v[0] for k, v in venv.reset().items()}
    assert policy.state is None
    policy.act(obs)
    s1 = [np.array(x, copy=True) for x in policy.state[0]]
    policy.act(obs)
    assert not np.allclose(s1[0], policy.state[0][0])  # the LSTM state moved on
    policy.reset()
    assert policy.state is None
    policy.act(obs)
    np.testing.assert_allclose(policy.state[0][0], s1[0], atol=1e-6)  # reset: the first step again
    # a vector env's batch: one state per env; episode_start restarts the envs it marks
    batch = venv.reset()
    policy.reset()
    a = policy.act(batch)
    assert a.shape == (N_ENVS,) and a.dtype == np.int64
    h_fresh = np.array(policy.state[0], copy=True)  # [layers, n, hidden] after one step
    policy.act(batch, episode_start=np.array([True] + [False] * (N_ENVS - 1)))
    np.testing.assert_allclose(policy.state[0][:, 0], h_fresh[:, 0], atol=1e-6)  # env 0 restarted
    assert not np.allclose(policy.state[0][:, 1:], h_fresh[:, 1:])  # the others carried on
    assert isinstance(policy.act(obs), int)  # back to one env: a fresh state of its own
    with pytest.raises(ValueError, match=r"shape \(5,\) per env"):
        policy.reset()
        policy.act({"obs": np.zeros(5, np.float32), "instruction": obs["instruction"]})


# ------------------------------------------------------------------------- checksums: a zip is code


def _crafted_zip(path: Path, marker: Path) -> None:
    """An SB3-format model.zip whose 'data' holds a pickle that creates ``marker`` when loaded."""
    payload = base64.b64encode(pickle.dumps(_MakeDir(str(marker)))).decode()
    data = {"policy_class": {":type:": "<class 'type'>", ":serialized:": payload}}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data", json.dumps(data))


class _MakeDir:
    """Unpickles into a call of os.mkdir: the stand-in for arbitrary code in a foreign zip."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_foreign_model_zip_is_refused_before_its_code_runs(venv, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    crafted = tmp_path / "crafted.zip"
    _crafted_zip(crafted, marker)
    # the threat is real: SB3's own load runs the payload; load_model reads no pickle
    with pytest.raises(Exception):
        sb3_agents.algo_class("qrdqn").load(crafted, device="cpu")
    assert marker.exists()
    marker.rmdir()
    with pytest.raises(CorruptFileError, match="lacks"):
        sb3_agents.load_model("qrdqn", crafted, device="cpu")
    assert not marker.exists()

    run = _checkpoint_only_run(tmp_path / "run", "qrdqn", venv)
    shutil.copy(crafted, run / "model.zip")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(sb3_agents.UntrustedModelError, match="sha256.*replaced or damaged.*runs the code"):
        sb3_agents.load_sb3_policy(run)
    assert sb3_main(["--run-dir", str(run), "--resume"]) == 2
    assert "replaced or damaged" in capsys.readouterr().err
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # nothing written


def test_a_bit_flip_or_a_missing_checksum_is_refused(venv, tmp_path):
    run = _checkpoint_only_run(tmp_path / "run", "qrdqn", venv)
    data = bytearray((run / "model.zip").read_bytes())
    data[len(data) // 2] ^= 0x01
    (run / "model.zip").write_bytes(bytes(data))
    with pytest.raises(sb3_agents.UntrustedModelError, match="replaced or damaged"):
        sb3_agents.load_sb3_policy(run)
    # a run saved before checksums existed: refused, with the explicit way to trust a file you made
    run2 = _checkpoint_only_run(tmp_path / "run2", "qrdqn", venv)
    state = json.loads((run2 / "state.json").read_text())
    del state["model_sha256"]
    (run2 / "state.json").write_text(json.dumps(state))
    with pytest.raises(sb3_agents.UntrustedModelError, match="no checksum.*trust_model_zip"):
        sb3_agents.load_sb3_policy(run2)
    sb3_agents.trust_model_zip(run2)
    assert sb3_agents.load_sb3_policy(run2, device="cpu").algo == "qrdqn"


# ------------------------------------------------------------------------- atomic checkpoints


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import torch
    torch.set_num_threads(1)
    from stable_baselines3 import DQN
    from agents.sb3 import models as sb3_agents
    model = DQN("MlpPolicy", "CartPole-v1", policy_kwargs=dict(net_arch=[512, 512]), device="cpu")
    i = 0
    while True:
        i += 1
        model.num_timesteps = i  # each checkpoint's zip and state tell their number
        sb3_agents.save_checkpoint({run!r}, model, {{"update": i}})
        print(i, flush=True)
""")


@pytest.mark.slow  # three SB3 writer processes killed mid-save: ~20 s on 2 cores
def test_killing_the_writer_during_checkpoints_never_corrupts_the_checkpoint(tmp_path):
    """SIGKILL a process that saves checkpoints back to back, at several moments: every time,
    the verified zip loads and is the one its state.json describes."""
    from stable_baselines3 import DQN

    run = tmp_path / "run"
    run.mkdir()
    rng = np.random.default_rng(0)
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=str(ROOT), run=str(run))],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip()  # at least one checkpoint written
            time.sleep(float(rng.uniform(0.0, 0.4)))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        path, state = sb3_agents.verified_model_zip(run, repair=True)
        assert path == run / "model.zip"
        model = DQN.load(path, device="cpu")
        assert model.num_timesteps == state["num_timesteps"] == state["update"]


# ------------------------------------------------------------------------- training runs (slow)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("sb3") / "run"
    assert sb3_main(["smoke", "--run-dir", str(run), "--no-progress"]) == 0
    return run, RunDir(run).read_metrics()[-1]


@pytest.mark.slow
def test_trained_run_loads_and_acts_in_gym_make(trained_run, gym_env):
    run, final = trained_run
    for f in ("config.json", "metrics.jsonl", "metrics.csv", "model.zip", "state.json", "eval_final.json",
              "eval_final.md", "training.png", "complete.json"):
        assert (run / f).exists(), f
    assert final["env_steps"] >= 400 and "eval/original/mean_success_rate" in final
    policy = load_policy(run)
    _act_100_steps(policy, gym_env)


@pytest.mark.slow
def test_qrdqn_tensorboard_folder_has_relabel_and_eval_scalars(trained_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = trained_run
    acc = EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("relabel/rows", "relabel/rows_added", "relabel/grounded_frac", "eval/original/mean_success_rate",
                "train/loss", "loss", "rollout/exploration_rate"):
        assert tag in tags, (tag, sorted(tags))
    assert acc.Scalars("relabel/rows_added")[-1].value > 0


@pytest.mark.slow
def test_resume_after_a_kill_between_final_save_and_completion(trained_run, tmp_path):
    """Without complete.json the run is not complete: resume evaluates and completes it, and the
    metrics rows after the checkpoint are replaced, never duplicated."""
    src, _ = trained_run
    run = tmp_path / "run"
    shutil.copytree(src, run)
    for f in ("complete.json", "eval_final.json", "eval_final.md", "metrics.csv"):
        (run / f).unlink()
    assert sb3_main(["--run-dir", str(run), "--resume", "--no-progress"]) == 0
    assert (run / "complete.json").exists() and (run / "eval_final.json").exists()
    rows = RunDir(run).read_metrics()
    updates = [r["update"] for r in rows]
    assert updates == sorted(set(updates)) == list(range(1, len(rows) + 1))
    # complete: a further resume at the same total does nothing
    before = (run / "metrics.jsonl").read_bytes()
    assert sb3_main(["--run-dir", str(run), "--resume", "--no-progress"]) == 0
    assert (run / "metrics.jsonl").read_bytes() == before


def test_resume_with_overwrite_is_refused_before_anything_is_deleted(venv, tmp_path, capsys):
    run = _checkpoint_only_run(tmp_path / "run", "qrdqn", venv)
    before = sorted(p.name for p in run.iterdir())
    assert sb3_main(["--run-dir", str(run), "--resume", "--overwrite"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    assert sb3_main(["smoke", "--run-dir", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_a_damaged_metrics_file_is_refused_on_resume_before_anything_is_written(venv, tmp_path, capsys):
    run = RunDir.prepare(tmp_path / "run")
    cfg = _tiny_cfg()
    _write_run_config(run, cfg)
    metrics = run.open_metrics(tensorboard=False)
    for u in (1, 2):
        metrics.write({"update": u, "env_steps": 200 * u, "loss": 0.5})
    position = metrics.sync()
    metrics.close()
    model = sb3_agents.make_model("qrdqn", venv, hyperparams=cfg.sb3.hyperparams, device="cpu")
    sb3_agents.save_checkpoint(run.path, model, {"update": 2, "metrics": position.to_dict()})
    data = bytearray(run.metrics_path.read_bytes())
    data[10] ^= 0x01  # a bit flip inside the rows the checkpoint covers
    run.metrics_path.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    assert sb3_main(["--run-dir", str(run.path), "--resume"]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------------- config and command line


def _cfg(*argv: str) -> SB3TrainConfig:
    """The validated config of train_sb3.py's command line ``argv``."""
    return SB3.parse(list(argv)).config.validate()


def test_device_flags_and_the_device_hyperparameter(venv):
    cfg = _cfg("--sb3.hp", "device=cpu")  # was: "multiple values for 'device'"
    assert cfg.resolved_device == "cpu"
    model = sb3_agents.make_model("dqn", venv, hyperparams={"device": "cpu", "learning_starts": 10**9},
                                  device=cfg.sb3.device)
    assert model.device.type == "cpu"
    assert _cfg("--sb3.device", "cuda:0").sb3.device == "cuda:0"
    with pytest.raises(ValueError, match="device given twice"):
        _cfg("--sb3.device", "cuda", "--sb3.hp", "device=cpu")
    with pytest.raises(ValueError, match="not a torch device"):
        _cfg("--sb3.device", "gpu")


def test_bad_hyperparameters_are_refused_before_any_file(tmp_path):
    for argv, match in ([["--sb3.hp", "learning_rat=1e-3"], "no argument 'learning_rat'"],
                        [["--sb3.hp", "seed=3"], "use --run.seed"],
                        [["--sb3.algo", "recurrent_ppo", "--sb3.hp", "buffer_size=10"], "no argument 'buffer_size'"]):
        with pytest.raises(ValueError, match=match):
            _cfg(*argv)
    # repeated or several after one flag: every override counts, policy_kwargs.KEY reaches the network's
    cfg = _cfg("--sb3.hp", "learning_rate=3e-4", "batch_size=64", "--sb3.hp", "policy_kwargs.net_arch=[8]")
    assert cfg.sb3.hyperparams == {"learning_rate": 3e-4, "batch_size": 64, "policy_kwargs": {"net_arch": [8]}}
    run = tmp_path / "run"
    assert sb3_main(["--run-dir", str(run), "--sb3.hp", "learning_rat=1e-3"]) == 2
    assert not run.exists()


def test_booleans_are_flags_as_in_the_pqn_trainer(capsys):
    assert _cfg("--eval.no-control").eval.control is False
    assert SB3.parse(["--no-progress"]).progress is False
    with pytest.raises(SystemExit):
        SB3.parse(["--eval.control", "ture"])  # a flag takes no value


def test_old_flag_spellings_name_the_new_flag(capsys):
    """The flat flags of earlier versions are a usage error that names the flag to use now."""
    for old, new in (("--eval-every", "--eval.every"), ("--wandb", "--wandb or --no-wandb"),
                     ("--total-timesteps", "--run.total-timesteps"), ("--algo", "--sb3.algo"),
                     ("--relabeler", "--oir.relabeler"), ("--hp", "--sb3.hp"), ("--llm-backend", "--llm.backend"),
                     ("--eval-instructions", "--eval.instruction-files"), ("--checkpoint-every", "--run.checkpoint-every"),
                     ("--progress-bar", "--progress")):
        with pytest.raises(SystemExit) as e:
            SB3.parse([old, "true"] if old in ("--wandb", "--progress-bar") else [f"{old}=1"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"use {new}" in err, (old, err)
    assert SB3.parse(["--wandb", "--log-every", "3"]).log_every == 3  # flags of both scripts now


def test_an_old_flat_sb3_config_json_loads_with_its_units_converted():
    """Run directories of earlier versions hold a flat config.json: resume and load_policy read it,
    their env-step intervals as updates of its log_every env steps."""
    old = {"algo": "dqn", "relabeler": "none", "reward": "gt", "total_timesteps": 1000, "num_envs": 4, "seed": 3,
           "log_every": 100, "eval_every": 250, "checkpoint_every": 400, "eval_sets": "original,simple",
           "eval_instructions": [], "hyperparams": {"batch_size": 8}, "progress_bar": False, "wandb": False,
           "llm_backend": "openai", "resolved_hyperparams": {}}
    cfg = load_sb3_config(old)
    assert (cfg.sb3.algo, cfg.run.method, cfg.run.seed, cfg.sb3.steps_per_update) == ("dqn", "gt", 3, 100)
    assert (cfg.eval.every, cfg.run.checkpoint_every, cfg.eval.sets) == (3, 4, ("original", "simple"))
    assert cfg.llm.backend == "openai" and cfg.sb3.hyperparams == {"batch_size": 8}
    assert load_sb3_config(cfg.to_dict()) == cfg  # the nested form round-trips


@pytest.mark.slow
def test_train_sb3_example_writes_a_run_directory_and_resumes(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples/train_sb3.py"), "--sb3.algo", "qrdqn", "--oir.relabeler", "rules",
           "--run.total-timesteps", "600", "--sb3.num-envs", str(N_ENVS), "--sb3.steps-per-update", "200",
           "--eval.sets", "original", "--eval.horizon", "10", "--env.max-episode-steps", str(HORIZON),
           "--run.checkpoint-every", "1", "--sb3.hp", "learning_starts=100", "--sb3.hp", "buffer_size=2000",
           "--sb3.hp", "policy_kwargs={'net_arch': [32]}", "--run-dir", str(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 600 and "eval/original/mean_success_rate" in rows[-1]
    assert any(r.get("relabel/rows_added", 0) > 0 for r in rows)
    out = subprocess.run(cmd[:2] + ["--run-dir", str(run), "--resume", "--run.total-timesteps", "800"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 800
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))


def test_eval_instruction_files_reach_the_sb3_config_and_bad_files_are_refused(tmp_path):
    """13.3c from the SB3 trainer: ``--eval.instruction-files FILE`` (repeatable, as in the PQN
    trainer) lands in the config, which checks the files before anything runs."""
    from importlib import resources

    good = str(resources.files("oir_gym.data").joinpath("example_instruction_sets.json"))
    assert _cfg("--eval.instruction-files", good).eval.instruction_files == (good,)
    bad = tmp_path / "bad.json"
    bad.write_text('{"sets": {"mine": [{"text": "", "achievement": "collect_wood"}]}}')
    with pytest.raises(ValueError, match="bad.json"):
        _cfg("--eval.instruction-files", good, "--eval.instruction-files", str(bad))


def test_the_llm_part_is_the_pqn_trainers_llm_config_with_its_flags_and_old_flat_keys():
    """SB3 and PQN share agents.run.config.LLMConfig: the same --llm.* flags, one validation, and the
    flat llm_* keys of older SB3 config.json files load."""
    from agents.run.config import LLMConfig

    cfg = _cfg("--llm.model", "/m.gguf", "--llm.backend", "openai", "--llm.call-timeout", "5")
    assert isinstance(cfg.llm, LLMConfig)
    assert (cfg.llm.backend, cfg.llm.model, cfg.llm.call_timeout) == ("openai", "/m.gguf", 5.0)
    assert load_sb3_config(cfg.to_dict()) == cfg  # config.json round trip (nested)
    old = {"algo": "qrdqn", "llm_backend": "openai", "llm_model": "x", "llm_base_url": "http://h:1/v1",
           "llm_template": "segments"}
    loaded = load_sb3_config(old)
    assert (loaded.llm.backend, loaded.llm.model, loaded.llm.base_url) == ("openai", "x", "http://h:1/v1")
    with pytest.raises(ValueError, match="llm.base_url='ftp://x' must be an http"):
        _cfg("--llm.base-url", "ftp://x")
    with pytest.raises(ValueError, match=r"unknown config key 'llm.temperature'"):
        load_sb3_config({"llm": {"temperature": 0.3}})


def test_llm_call_timeout_reaches_the_relabeler_in_both_trainers(monkeypatch, capfd):
    """``llm.call_timeout`` bounds each LLM call (it was a config field nothing read)."""
    from agents.run.config import LLMConfig
    from agents.pqn.config import preset
    from agents.pqn.trainer import make_relabeler as pqn_relabeler

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    llm = LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", call_timeout=3.0)
    rl = sb3_agents.make_relabeler("llm", llm=llm)
    try:
        assert rl.llm.llm_timeout == 3.0
    finally:
        rl.close()
    cfg = preset("smoke").replace(**{"oir.relabeler": "both", "llm.backend": "openai", "llm.model": "m",
                                     "llm.base_url": "http://127.0.0.1:9/v1", "llm.call_timeout": 3.0})
    rl = pqn_relabeler(cfg)  # no server there: 'both' warns and goes on with rules
    assert "failed its start-up check" in capfd.readouterr().err
    try:
        assert rl.llm.llm_timeout == 3.0
    finally:
        rl.close()


@pytest.mark.slow  # builds SB3 envs twice (~20 s on 2 cores); the PQN trainer's check is in test_no_run_lost
def test_an_llm_relabeler_is_checked_before_training_like_the_pqn_trainers(tmp_path, monkeypatch, capsys):
    """--oir.relabeler llm with an LLM that does not answer stops before config.json or metrics are
    written (it trained on rule labels without a word before); 'both' warns and goes on with rules."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    run = tmp_path / "run"
    dead = ["--llm.backend", "openai", "--llm.model", "m", "--llm.base-url", "http://127.0.0.1:9/v1"]  # nothing listens
    assert sb3_main(["smoke", "--run-dir", str(run), "--oir.relabeler", "llm", "--sb3.num-envs", "2", *dead]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --oir.relabeler llm: ") and "--oir.relabeler rules" in err
    assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()
    assert sb3_main(["smoke", "--run-dir", str(tmp_path / "both"), "--oir.relabeler", "both", "--sb3.num-envs", "2",
                     "--run.total-timesteps", "64", "--sb3.steps-per-update", "32", "--no-progress", *dead]) == 0
    assert "--oir.relabeler both" in capsys.readouterr().err
    assert RunDir(tmp_path / "both").read_metrics()[-1]["env_steps"] >= 64


@pytest.mark.slow  # 25-35 s on 2 cores (an SB3 run with an LLM child); the default suite checks that SB3's "both" is the PQN trainer's BackgroundRelabeler (test_relabel_background.py::test_both_trainers_build_the_same_both)
def test_sb3_both_applies_the_rules_at_once_and_the_llms_answers_when_they_arrive(tmp_path):
    """--relabeler both is the PQN trainer's BackgroundRelabeler: the rules' results and, later, the
    LLM's (a real tiny backend in a child process, answering from the segments it reads) both reach
    the callback."""
    assert sb3_main(["smoke", "--run-dir", str(tmp_path / "both"), "--oir.relabeler", "both", "--sb3.num-envs", "2",
                     "--sb3.segment-length", "16", "--run.total-timesteps", "256", "--sb3.steps-per-update", "64",
                     "--llm.backend", "llm_child_backends:SegmentsBackend", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "both" / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["relabel/relabeler_rules_results"] > 0 and last["relabel/relabeler_llm_results"] > 0
    assert last["relabel/results"] == last["relabel/relabeler_rules_results"] + last["relabel/relabeler_llm_results"]


def test_wandb_without_its_package_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """Both trainers: --wandb without the wandb package is one line with the install command, and
    no run directory."""
    # CI installs wandb (the `all` extra): a None entry in sys.modules makes `import wandb` fail as
    # it does where the package is missing (a real package cannot be uninstalled for one test)
    monkeypatch.setitem(sys.modules, "wandb", None)
    from agents.pqn import recipe

    run = tmp_path / "pqn"
    assert recipe.pqn_main(["smoke", "--run-dir", str(run), "--wandb"]) == 2
    assert "pip install 'oir-gym[wandb]'" in capsys.readouterr().err and not run.exists()
    run = tmp_path / "sb3"
    assert sb3_main(["smoke", "--run-dir", str(run), "--wandb"]) == 2
    assert "pip install 'oir-gym[wandb]'" in capsys.readouterr().err and not run.exists()


def test_the_end_of_training_is_evaluated_and_logged_once(tmp_path):
    """SB3 runs evaluated twice at the end: the callback at the last step (a row and eval_<step>.json)
    and finish() again, a second row at the same env step (duplicate rows, a jump in the curves).
    Kept cheap: the evaluation runs 3
    instructions of a user file plus the neutral one, 4 envs like the training env (one compiled
    program for both, shared with the other tests' 4-env envs)."""
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"sets": {"mine": [{"text": "chop a tree", "achievement": "collect_wood"},
                                                  {"text": "drink water", "achievement": "collect_drink"},
                                                  {"text": "eat a cow", "achievement": "eat_cow"}]}}))
    assert sb3_main(["smoke", "--run-dir", str(tmp_path / "run"), "--run.total-timesteps", "64",
                     "--sb3.num-envs", str(N_ENVS), "--sb3.steps-per-update", "16", "--eval.every", "2",
                     "--run.checkpoint-every", "100", "--eval.horizon", "5", "--eval.sets",
                     "--eval.instruction-files", str(mine), "--no-progress"]) == 0
    rows = RunDir(tmp_path / "run").read_metrics()
    steps = [r["env_steps"] for r in rows]
    assert steps == [16, 32, 48, 64]
    assert sorted(p.name for p in (tmp_path / "run").glob("eval_*.json")) == ["eval_000002.json",
                                                                                "eval_final.json"]
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    assert ["eval/mine/mean_success_rate" in r for r in rows] == [False, True, False, True]
    assert set(json.loads((tmp_path / "run" / "eval_final.json").read_text())[0]) == {"mine"}
    assert "epsilon" in rows[-1] and "sps" not in rows[-1]


def test_a_key_inside_the_llm_url_is_redacted_from_the_sb3_config_json(tmp_path):
    cfg = _tiny_cfg(**{"llm.base_url": "https://me:sk-SECRET@example.invalid/v1?token=sk-SECRET"})
    assert cfg.to_dict()["llm"]["base_url"] == "https://REDACTED@example.invalid/v1?token=REDACTED"
    assert cfg.llm.base_url.startswith("https://me:sk-SECRET")  # the running config keeps what was given


@pytest.mark.slow
def test_a_stopped_sb3_run_resumes_to_the_same_rows_and_eval_only_reads_it(tmp_path, capsys):
    """The driver's stop (--max-updates, as for SIGINT/SIGTERM) saves a checkpoint after the update;
    --resume continues from it with one row per update, and --eval-only evaluates the finished run
    without touching its metrics or TensorBoard files."""
    run = tmp_path / "run"
    assert sb3_main(["smoke", "--run-dir", str(run), "--no-progress", "--max-updates", "1"]) == 0
    assert "stopped (--max-updates 1) at update 1/2" in capsys.readouterr().out
    assert json.loads((run / "state.json").read_text())["update"] == 1 and not (run / "complete.json").exists()
    assert sb3_main(["--run-dir", str(run), "--resume", "--no-progress"]) == 0
    rows = RunDir(run).read_metrics()
    assert [r["update"] for r in rows] == [1, 2] and rows[-1]["env_steps"] >= 400
    assert (run / "complete.json").exists()
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert sb3_main(["--run-dir", str(run), "--eval-only", "again"]) == 0
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert set(after) - set(before) == {Path("eval_again.json"), Path("eval_again.md")}
    assert all(after[p] == before[p] for p in before)


def test_load_sb3_policy_of_a_folder_that_is_not_a_run_says_what_it_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"runs/nope: no such folder; load_sb3_policy expects a run "
                                                r"directory written by examples/train_sb3.py.*config.json, model.zip"):
        sb3_agents.load_sb3_policy(tmp_path / "runs" / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty: no config.json there, so not a run directory"):
        sb3_agents.load_sb3_policy(tmp_path / "empty")
    (tmp_path / "pqn").mkdir()
    (tmp_path / "pqn" / "config.json").write_text('{"pqn": {}, "env": {}}')
    with pytest.raises(ValueError, match="a PQN run.*agents.tools.policy.load_policy"):
        sb3_agents.load_sb3_policy(tmp_path / "pqn")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "config.json").write_text('{"sb3": {"algo": "qrdqn"}}')
    with pytest.raises(FileNotFoundError, match="no checkpoint yet.*--resume"):
        sb3_agents.load_sb3_policy(tmp_path / "new")


@pytest.mark.slow
def test_sb3_metrics_rows_use_the_shared_schema(trained_run):
    """The SB3 trainer's metrics rows carry the keys PQN's do (docs/api.md, "Metric schema")."""
    from oir_gym.curriculum import OFFER_METRICS as OFFER

    run, _ = trained_run
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    training = [r for r in rows if "sps" in r]  # the last row is written after learn()
    assert training and all(set(OFFER) <= set(r) for r in rows) and any("loss" in r for r in training)
    assert any("rate/collect_wood" in r and "rate/see_stone" in r for r in training)  # training rates, as PQN
    assert not any({"relabel/grounded_fraction", "run/loss", "run/sps"} & set(r) for r in rows)
