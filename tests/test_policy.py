"""load_policy: a freshly trained PQN run acts in gym.make("OIR-CraftaxClassic-v0") on any instruction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import gymnasium as gym  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import oir_gym  # noqa: E402,F401  (registers the env id)
from agents.tools.policy import Policy, PQNPolicy, is_sb3_run, load_policy  # noqa: E402
from agents.run.run_dir import RunDir  # noqa: E402


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, smoke_trainer):
    """A smoke-sized OIR run of 2 seeds, trained 3 updates and checkpointed as train_pqn.py does: the
    session's shared smoke trainer's checkpoint (conftest.py) in a run directory with its config."""
    import shutil

    cfg = smoke_trainer.cfg.validate()
    run = RunDir.prepare(tmp_path_factory.mktemp("policy") / "run")
    run.write_config(cfg.to_dict())
    shutil.copytree(smoke_trainer.checkpoint_3, run.path / "checkpoints" / smoke_trainer.checkpoint_3.name)
    return run.path, cfg, smoke_trainer.params_3


def test_a_trained_pqn_run_acts_100_steps_on_a_custom_instruction(trained_run):
    run, cfg, params = trained_run
    policy = load_policy(run, seed=1)
    assert isinstance(policy, Policy) and isinstance(policy, PQNPolicy)
    assert policy.env_kwargs == {"obs_mode": "paper", "delta": 0.9}
    env = gym.make("OIR-CraftaxClassic-v0", **policy.env_kwargs)
    obs, info = env.reset(seed=3, options={"instruction": "chop a tree and build a crafting table"})
    assert info["instruction"] == "chop a tree and build a crafting table"
    policy.reset()
    # the same greedy actions as the trained network of seed 1 (not seed 0), carry kept across steps
    net = policy.net
    apply = jax.jit(net.apply)
    p1 = jax.tree_util.tree_map(lambda x: jnp.asarray(x[1]), params)
    p0 = jax.tree_util.tree_map(lambda x: jnp.asarray(x[0]), params)
    carry, carry0, start = net.initial_carry(1), net.initial_carry(1), True
    differs_from_seed0 = 0
    episodes = 0
    for _ in range(100):
        action = policy.act(obs)
        assert isinstance(action, int) and env.action_space.contains(action)
        o, i = jnp.asarray(obs["obs"])[None, None], jnp.asarray(obs["instruction"])[None, None]
        s = jnp.array([[start]])
        carry, q = apply(p1, carry, o, i, s)
        carry0, q0 = apply(p0, carry0, o, i, s)
        assert action == int(jnp.argmax(q[0, 0]))
        differs_from_seed0 += int(jnp.argmax(q0[0, 0])) != action
        obs, reward, terminated, truncated, info = env.step(action)
        start = False
        if terminated or truncated:
            episodes += 1
            obs, info = env.reset(options={"instruction": "drink some water"})
            policy.reset()
            start = True
    env.close()
    assert differs_from_seed0 > 0  # the seeds' networks differ, so the check above can tell them apart


def test_a_vector_env_batch_with_episode_starts(trained_run):
    run, _, _ = trained_run
    policy = load_policy(run)
    envs = gym.make_vec("OIR-CraftaxClassic-v0", num_envs=4, **policy.env_kwargs)  # 4: the shape conftest compiles
    obs, _ = envs.reset(seed=0, options={"instruction": ["collect wood", "eat a cow", "place a stone", "sleep"]})
    done = np.zeros(4, bool)
    for _ in range(5):
        actions = policy.act(obs, episode_start=done)
        assert actions.shape == (4,) and actions.dtype == np.int64
        obs, _, term, trunc, _ = envs.step(actions)
        done = term | trunc
    envs.close()


def test_bad_inputs_are_named(trained_run, tmp_path):
    run, _, _ = trained_run
    with pytest.raises(ValueError, match=r"seed=2: the run .* trained seeds 0..1"):
        load_policy(run, seed=2)
    policy = load_policy(run)
    with pytest.raises(ValueError, match="observation of 5 features; this policy was trained on 888"):
        policy.act({"obs": np.zeros(5, np.float32), "instruction": np.zeros(384, np.float32)})
    with pytest.raises(TypeError, match="observation dict"):
        policy.act(np.zeros(888))
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "nothing")


def test_an_sb3_run_without_stable_baselines3_names_the_extra_to_install(tmp_path):
    """load_policy sends an SB3 run to the SB3 loader; without the package the error says what to install."""
    from agents.sb3.models import trust_model_zip
    from agents.sb3.config import SB3TrainConfig

    (tmp_path / "config.json").write_text(json.dumps(SB3TrainConfig().to_dict()))
    (tmp_path / "model.zip").write_bytes(b"a checkpoint that is never unpickled here")
    trust_model_zip(tmp_path)  # the run's own checksum, so loading gets as far as the SB3 class
    assert is_sb3_run(tmp_path) and not is_sb3_run(Path(__file__).parent)
    # Fault injection: stable-baselines3 and sb3-contrib absent (None in sys.modules blocks the import).
    code = ("import sys; sys.path.insert(0, %r)\n"
            "sys.modules['stable_baselines3'] = sys.modules['sb3_contrib'] = None\n"
            "from agents.tools.policy import load_policy\n"
            "try:\n    load_policy(%r)\nexcept ImportError as e:\n    print('ImportError:', e)\n"
            ) % (str(Path(__file__).resolve().parents[1]), str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ImportError:" in out.stdout and "oir-gym[sb3]" in out.stdout, out.stdout


def test_record_video_writes_a_gif_of_the_policy(trained_run, tmp_path):
    import sys

    from PIL import Image

    from agents.tools import record_video

    run, _, _ = trained_run
    out = tmp_path / "v.gif"
    res = record_video.record(run, "collect wood then place a table", out, steps=6, scale=1)
    assert res["frames"] == 7 and res["path"] == str(out)
    with Image.open(out) as im:
        assert im.size == (144, 144)  # Craftax-Classic's 9x9 view of 16-px blocks (with the inventory rows)
    assert record_video.main([str(run), "drink water", "--out", str(tmp_path / "v.avi")]) == 2
    pytest.importorskip("imageio_ffmpeg")  # the `video` extra
    mp4 = record_video.record(run, "drink water", tmp_path / "v.mp4", steps=4, scale=1, fps=5)
    assert mp4["frames"] >= 2 and (tmp_path / "v.mp4").stat().st_size > 0


def test_a_checkpoint_of_non_finite_weights_is_refused_naming_the_file(trained_run, tmp_path):
    """Issue 30.8: a checkpoint whose manifest matches its files but whose weights are NaN was
    loaded (and record_video.py ran it)."""
    import shutil

    from agents.run.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint

    from agents.tools import record_video

    run = tmp_path / "run"
    shutil.copytree(trained_run[0], run)
    folder = latest_checkpoint(run)
    arrays, host = load_checkpoint(folder)
    lstm = arrays["train_state"]["params"]["params"]["OptimizedLSTMCell_0"]["hf"]
    lstm["bias"] = np.full_like(lstm["bias"], np.inf)
    shutil.rmtree(folder)
    save_checkpoint(run, host["update"], arrays, host)  # a consistent manifest
    with pytest.raises(CheckpointError, match="OptimizedLSTMCell_0/hf/bias holds NaN or infinite") as err:
        load_policy(run)
    assert str(folder / "arrays.msgpack") in str(err.value)
    assert record_video.main([str(run), "drink water", "--out", str(tmp_path / "v.gif")]) == 2
    assert not (tmp_path / "v.gif").exists()
