"""SB3 run directories: checksummed, atomic model.zip checkpoints, loading a trained policy into the
Gymnasium env, TensorBoard scalars, resume, and the command line (examples/train_sb3.py)."""

from __future__ import annotations

import base64
import importlib.util
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

from agents import sb3_agents  # noqa: E402
from agents.policy import Policy, load_policy  # noqa: E402
from agents.run_dir import CorruptFileError, RunDir, RunDirError  # noqa: E402
from oir_gym import ENV_ID  # noqa: E402
from oir_gym.vector_env import InstructionCraftax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_ENVS = 4
HORIZON = 40
CUSTOM = "chop down a tree and then build a crafting table"  # not one of the env's instructions

torch.set_num_threads(1)


def _tiny_cfg(algo: str = "qrdqn", **kw) -> sb3_agents.SB3Config:
    hp = {
        "qrdqn": dict(learning_starts=100, buffer_size=2000, batch_size=32, target_update_interval=200,
                      policy_kwargs=dict(n_quantiles=5, net_arch=[32, 32])),
        "dqn": dict(learning_starts=100, buffer_size=2000, batch_size=32, policy_kwargs=dict(net_arch=[32])),
        "recurrent_ppo": dict(n_steps=16, n_epochs=1, policy_kwargs=dict(lstm_hidden_size=16,
                                                                        net_arch=dict(pi=[16], vf=[16]))),
    }[algo]
    base = dict(algo=algo, total_timesteps=400, num_envs=N_ENVS, max_episode_steps=HORIZON, log_every=200,
                checkpoint_every=200, eval_sets="original", eval_horizon=10, segment_length=32, hyperparams=hp)
    base.update(kw)
    return sb3_agents.SB3Config(**base)


def _checkpoint_only_run(path: Path, algo: str, venv) -> Path:
    """A run directory holding a config and a checkpoint of an untrained model (no training: fast)."""
    cfg = _tiny_cfg(algo)
    run = RunDir.prepare(path)
    run.write_config(cfg.to_dict())
    model = sb3_agents.make_model(algo, venv, seed=0, hyperparams=cfg.hyperparams, device="cpu")
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


def test_a_foreign_model_zip_is_refused_before_its_code_runs(venv, tmp_path):
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
    with pytest.raises(sb3_agents.UntrustedModelError):
        sb3_agents.train(_tiny_cfg(), run, resume=True)
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
    from agents import sb3_agents
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
    rows = []
    final = sb3_agents.train(_tiny_cfg(), run, print_fn=rows.append)
    return run, final


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
    for tag in ("relabel/rows_added", "relabel/grounded_fraction", "eval/original/mean_success_rate", "train/loss",
                "rollout/exploration_rate"):
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
    sb3_agents.train(_tiny_cfg(), run, resume=True, print_fn=lambda s: None)
    assert (run / "complete.json").exists() and (run / "eval_final.json").exists()
    rows = RunDir(run).read_metrics()
    updates = [r["update"] for r in rows]
    assert updates == sorted(set(updates)) == list(range(1, len(rows) + 1))
    # complete: a further resume at the same total does nothing
    before = (run / "metrics.jsonl").read_bytes()
    out = sb3_agents.train(_tiny_cfg(), run, resume=True, print_fn=lambda s: None)
    assert out["complete"] and (run / "metrics.jsonl").read_bytes() == before


def test_resume_with_overwrite_is_refused_before_anything_is_deleted(venv, tmp_path):
    run = _checkpoint_only_run(tmp_path / "run", "qrdqn", venv)
    before = sorted(p.name for p in run.iterdir())
    with pytest.raises(RunDirError, match="--resume.*--overwrite"):
        sb3_agents.train(_tiny_cfg(), run, resume=True, overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == before
    with pytest.raises(RunDirError, match="already holds a run"):
        sb3_agents.train(_tiny_cfg(), run)


def test_a_damaged_metrics_file_is_refused_on_resume_before_anything_is_written(venv, tmp_path):
    from agents.run_dir import CorruptFileError

    run = RunDir.prepare(tmp_path / "run")
    cfg = _tiny_cfg()
    run.write_config(cfg.to_dict())
    metrics = run.open_metrics(tensorboard=False)
    for u in (1, 2):
        metrics.write({"update": u, "env_steps": 200 * u, "loss": 0.5})
    position = metrics.sync()
    metrics.close()
    model = sb3_agents.make_model("qrdqn", venv, hyperparams=cfg.hyperparams, device="cpu")
    sb3_agents.save_checkpoint(run.path, model, {"update": 2, "metrics": position.to_dict()})
    data = bytearray(run.metrics_path.read_bytes())
    data[10] ^= 0x01  # a bit flip inside the rows the checkpoint covers
    run.metrics_path.write_bytes(bytes(data))
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    with pytest.raises(CorruptFileError, match="metrics.jsonl"):
        sb3_agents.train(cfg, run.path, resume=True)
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------------- config and command line


def _script():
    spec = importlib.util.spec_from_file_location("train_sb3", ROOT / "examples" / "train_sb3.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_device_flags_and_the_device_hyperparameter(venv):
    script = _script()
    cfg = script.build_config(script.parse_args(["--hp", "device=cpu"]))  # was: "multiple values for 'device'"
    assert cfg.resolved_device == "cpu"
    model = sb3_agents.make_model("dqn", venv, hyperparams={"device": "cpu", "learning_starts": 10**9},
                                  device=cfg.device)
    assert model.device.type == "cpu"
    assert script.build_config(script.parse_args(["--device", "cuda:0"])).device == "cuda:0"
    with pytest.raises(ValueError, match="device given twice"):
        script.build_config(script.parse_args(["--device", "cuda", "--hp", "device=cpu"]))
    with pytest.raises(ValueError, match="not a torch device"):
        script.build_config(script.parse_args(["--device", "gpu"]))


def test_bad_hyperparameters_are_refused_before_any_file(tmp_path):
    script = _script()
    for argv, match in ([["--hp", "learning_rat=1e-3"], "no argument 'learning_rat'"],
                        [["--hp", "seed=3"], "use --seed"],
                        [["--algo", "recurrent_ppo", "--hp", "buffer_size=10"], "no argument 'buffer_size'"]):
        with pytest.raises(ValueError, match=match):
            script.build_config(script.parse_args(argv))
    run = tmp_path / "run"
    assert script.main(["--run-dir", str(run), "--hp", "learning_rat=1e-3"]) == 2
    assert not run.exists()


def test_strict_booleans_and_progress_bar():
    script = _script()
    assert script.build_config(script.parse_args(["--progress-bar", "true"])).progress_bar is True
    assert script.build_config(script.parse_args(["--progress-bar", "off"])).progress_bar is False
    with pytest.raises(SystemExit):
        script.parse_args(["--progress-bar", "ture"])  # was read as False


@pytest.mark.slow
def test_train_sb3_example_writes_a_run_directory_and_resumes(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples/train_sb3.py"), "--algo", "qrdqn", "--relabeler", "rules",
           "--total-timesteps", "600", "--num-envs", str(N_ENVS), "--log-every", "200", "--eval-sets", "original",
           "--eval-horizon", "10", "--max-episode-steps", str(HORIZON), "--checkpoint-every", "200",
           "--hp", "learning_starts=100", "--hp", "buffer_size=2000", "--hp", "policy_kwargs={'net_arch': [32]}",
           "--progress-bar", "true", "--run-dir", str(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 600 and "eval/original/mean_success_rate" in rows[-1]
    assert any(r.get("relabel/rows_added", 0) > 0 for r in rows)
    out = subprocess.run(cmd[:2] + ["--run-dir", str(run), "--resume", "--total-timesteps", "800"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] >= 800
    assert [r["update"] for r in rows] == list(range(1, len(rows) + 1))


def test_eval_instruction_files_reach_the_sb3_config_and_bad_files_are_refused(tmp_path):
    """13.3c from the SB3 trainer: ``--eval-instructions FILE`` (repeatable) lands in the config,
    which checks the files before anything runs."""
    from importlib import resources

    train_sb3 = _script()
    good = str(resources.files("oir_gym.data").joinpath("example_instruction_sets.json"))
    args = train_sb3.parse_args(["--eval-instructions", good])
    cfg = train_sb3.build_config(args)
    assert cfg.eval_instructions == (good,)
    bad = tmp_path / "bad.json"
    bad.write_text('{"sets": {"mine": [{"text": "", "achievement": "collect_wood"}]}}')
    with pytest.raises(ValueError, match="bad.json"):
        train_sb3.build_config(train_sb3.parse_args(["--eval-instructions", good, "--eval-instructions", str(bad)]))


def test_the_llm_part_is_the_pqn_trainers_llm_config_with_its_flags_and_old_flat_keys():
    """SB3 and PQN share agents.config.LLMConfig: the same --llm.* flags (the old --llm-* spellings
    still parse), one validation, and the flat llm_* keys of older SB3 config.json files load."""
    from agents.config import LLMConfig

    script = _script()
    cfg = script.build_config(script.parse_args(["--llm.model", "/m.gguf", "--llm-backend", "openai",
                                                 "--llm.call-timeout", "5"]))
    assert isinstance(cfg.llm, LLMConfig)
    assert (cfg.llm.backend, cfg.llm.model, cfg.llm.call_timeout) == ("openai", "/m.gguf", 5.0)
    assert sb3_agents.SB3Config.from_dict(cfg.to_dict()) == cfg  # config.json round trip (nested)
    old = {k: v for k, v in cfg.to_dict().items() if k != "llm"}
    old.update(llm_backend="openai", llm_model="x", llm_base_url="http://h:1/v1", llm_template="segments")
    loaded = sb3_agents.SB3Config.from_dict(old)
    assert (loaded.llm.backend, loaded.llm.model, loaded.llm.base_url) == ("openai", "x", "http://h:1/v1")
    with pytest.raises(ValueError, match="llm.base_url='ftp://x' must be an http"):
        script.build_config(script.parse_args(["--llm.base-url", "ftp://x"]))
    with pytest.raises(ValueError, match=r"unknown config keys \['llm.temperature'\]"):
        sb3_agents.SB3Config.from_dict({"llm": {"temperature": 0.3}})


def test_llm_call_timeout_reaches_the_relabeler_in_both_trainers(monkeypatch, capfd):
    """``llm.call_timeout`` bounds each LLM call (it was a config field nothing read)."""
    from agents.config import LLMConfig, preset
    from agents.oir import make_relabeler as pqn_relabeler

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    llm = LLMConfig(backend="openai", base_url="http://127.0.0.1:9/v1", model="m", call_timeout=3.0)
    rl = sb3_agents.make_relabeler("llm", llm=llm)
    try:
        assert rl.llm_timeout == 3.0
    finally:
        rl.close()
    cfg = preset("smoke").replace(**{"oir.relabeler": "both", "llm.backend": "openai", "llm.model": "m",
                                     "llm.base_url": "http://127.0.0.1:9/v1", "llm.call_timeout": 3.0})
    rl = pqn_relabeler(cfg)  # no server there: 'both' warns and goes on with rules
    assert "failed its start-up check" in capfd.readouterr().err
    try:
        assert rl.llm_timeout == 3.0
    finally:
        rl.close()


@pytest.mark.slow  # builds SB3 envs twice (~20 s on 2 cores); the PQN trainer's check is in test_no_run_lost
def test_an_llm_relabeler_is_checked_before_training_like_the_pqn_trainers(tmp_path, monkeypatch, capsys):
    """--relabeler llm with an LLM that does not answer stops before config.json or metrics are
    written (it trained on rule labels without a word before); 'both' warns and goes on with rules."""
    from agents.config import LLMConfig

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    script = _script()
    run = tmp_path / "run"
    dead = ["--llm.backend", "openai", "--llm.model", "m", "--llm.base-url", "http://127.0.0.1:9/v1"]  # nothing listens
    assert script.main(["--run-dir", str(run), "--relabeler", "llm", "--num-envs", "2", *dead]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --relabeler llm: ") and "--relabeler rules" in err
    assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()
    cfg = _tiny_cfg(relabeler="both", total_timesteps=64, num_envs=2, llm=LLMConfig(
        backend="openai", model="m", base_url="http://127.0.0.1:9/v1"))
    final = sb3_agents.train(cfg, tmp_path / "both", print_fn=lambda s: None)
    assert "--relabeler both" in capsys.readouterr().err and final["env_steps"] >= 64


def test_wandb_without_its_package_is_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """Both trainers: --wandb without the wandb package is one line with the install command, and
    no run directory."""
    # CI installs wandb (the `all` extra): a None entry in sys.modules makes `import wandb` fail as
    # it does where the package is missing (a real package cannot be uninstalled for one test)
    monkeypatch.setitem(sys.modules, "wandb", None)
    sys.path.insert(0, str(ROOT / "examples"))
    import train_pqn

    run = tmp_path / "pqn"
    assert train_pqn.main(["smoke", "--run-dir", str(run), "--wandb"]) == 2
    assert "pip install 'oir-gym[wandb]'" in capsys.readouterr().err and not run.exists()
    script = _script()
    run = tmp_path / "sb3"
    assert script.main(["--run-dir", str(run), "--wandb", "true"]) == 2
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
    cfg = _tiny_cfg(total_timesteps=64, num_envs=N_ENVS, log_every=16, eval_every=32, checkpoint_every=1000,
                    relabeler="rules", eval_horizon=5, eval_sets="", eval_instructions=(str(mine),))
    final = sb3_agents.train(cfg, tmp_path / "run", print_fn=lambda s: None)
    rows = RunDir(tmp_path / "run").read_metrics()
    steps = [r["env_steps"] for r in rows]
    assert steps == [16, 32, 48, 64] and final["env_steps"] == 64
    assert sorted(p.name for p in (tmp_path / "run").glob("eval_*.json")) == ["eval_000000032.json",
                                                                                "eval_final.json"]
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    assert ["eval/mine/mean_success_rate" in r for r in rows] == [False, True, False, True]
    assert set(json.loads((tmp_path / "run" / "eval_final.json").read_text())[0]) == {"mine"}
    assert "epsilon" in rows[-1] and "sps" not in rows[-1]


def test_a_key_inside_the_llm_url_is_redacted_from_the_sb3_config_json(tmp_path):
    from agents.config import LLMConfig

    cfg = _tiny_cfg(llm=LLMConfig(base_url="https://me:sk-SECRET@example.invalid/v1?token=sk-SECRET"))
    assert cfg.to_dict()["llm"]["base_url"] == "https://REDACTED@example.invalid/v1?token=REDACTED"
    assert cfg.llm.base_url.startswith("https://me:sk-SECRET")  # the running config keeps what was given
