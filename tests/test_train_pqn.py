"""End-to-end: a short OIR training run on CPU, its checkpoint, and the main-job script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from agents import pqn  # noqa: E402
from agents.oir import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def tiny(**kw) -> pqn.PQNConfig:
    base = dict(method="oir", relabeler="rules", total_timesteps=4 * 16 * 6, num_envs=4, num_steps=16,
                hidden_size=32, num_epochs=2, num_minibatches=2, k=2, eval_every=1000, eval_episodes=1,
                eval_horizon=8, checkpoint_every=1000, lr=1e-3)
    base.update(kw)
    return pqn.PQNConfig(**base)


def _params(tr: Trainer):
    return jax.tree_util.tree_leaves(jax.device_get(tr.train_state.params))


def test_training_runs_and_resume_continues_identically(tmp_path):
    cfg = tiny()
    straight = Trainer(cfg, tmp_path / "a", log=lambda s: None)
    straight.init_state()
    logs = [straight.iteration() for _ in range(4)]
    losses = [l.metrics["loss"] for l in logs]
    assert np.isfinite(losses).all()
    assert min(losses[1:]) < losses[0]  # the first update's loss (random Q vs targets) comes down
    assert logs[-1].env_steps == 4 * cfg.batch_steps
    # rule relabeling produced training rows (the first rollouts act almost at random, so they have events)
    assert max(l.metrics["relabel/rows"] for l in logs) > 0

    first = Trainer(cfg, tmp_path / "b", log=lambda s: None)
    first.init_state()
    for _ in range(3):
        first.iteration()
    first.save()
    first.close()

    resumed = Trainer(cfg, tmp_path / "b", log=lambda s: None)
    resumed.load()
    assert (resumed.update_idx, resumed.env_steps) == (3, 3 * cfg.batch_steps)
    log = resumed.iteration()
    assert log.update == 4
    for a, b in zip(_params(straight), _params(resumed)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert [b.contents() for b in straight.buffers] == [b.contents() for b in resumed.buffers]
    straight.close()
    resumed.close()


def test_load_rejects_a_checkpoint_of_another_shape(tmp_path):
    cfg = tiny()
    tr = Trainer(cfg, tmp_path, log=lambda s: None)
    tr.init_state()
    tr.save()
    other = Trainer(tiny(num_envs=8, num_minibatches=4), tmp_path, log=lambda s: None)
    with pytest.raises(ValueError, match="num_envs"):
        other.load()


def test_evaluation_reports_all_sets(tmp_path):
    tr = Trainer(tiny(eval_horizon=5), tmp_path, log=lambda s: None)
    tr.init_state()
    res = tr.evaluate()[0]
    assert set(res.rates) == {"original", "simple", "complex"}
    assert len(res.rates["original"]) == 22 and len(res.rates["simple"]) == 66
    m = res.summary()["original"]
    assert 0.0 <= m["aggregate_score"] <= m["mean_success_rate"] <= 1.0


@pytest.mark.slow
def test_main_job_script_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "train_pqn.py"), "--relabeler", "rules", "--run-dir", str(run),
           "--total-timesteps", "512", "--num-envs", "4", "--num-steps", "16", "--hidden-size", "32", "--k", "2",
           "--num-minibatches", "2", "--eval-every", "4", "--eval-horizon", "8", "--eval-episodes", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("config.json", "metrics.jsonl", "metrics.csv", "checkpoint.pkl", "eval_final.json", "eval_final.md",
                 "training.png", "learning_curves.png", "instruction_success.png"):
        assert (run / name).exists(), name
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 512 and "eval/original/mean_success_rate" in rows[-1]
    assert "Final evaluation" in out.stdout
    # --resume of a finished run is a no-op that still succeeds and says so
    metrics = (run / "metrics.jsonl").read_text()
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete (8/8 updates" in again.stdout
    assert (run / "metrics.jsonl").read_text() == metrics


def test_main_job_refuses_to_mix_a_new_run_into_an_existing_run_dir(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import train_pqn

    (tmp_path / "metrics.jsonl").write_text('{"update": 1}\n')
    assert train_pqn.main(["--run-dir", str(tmp_path), "--relabeler", "rules"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == '{"update": 1}\n'  # nothing lost
    assert train_pqn.main(["--run-dir", str(tmp_path / "nothing"), "--resume"]) == 2


def test_eval_only_evaluates_the_checkpoint_without_touching_the_run(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "examples"))
    import train_pqn

    run = tmp_path / "run"
    tiny_args = ["--run-dir", str(run), "--relabeler", "rules", "--total-timesteps", "512", "--num-envs", "4",
                 "--num-steps", "16", "--hidden-size", "32", "--k", "2", "--num-minibatches", "2",
                 "--eval-every", "100", "--eval-horizon", "8", "--eval-episodes", "1"]
    assert train_pqn.main(tiny_args + ["--max-updates", "1"]) == 0
    config_before = (run / "config.json").read_text()
    metrics_before = (run / "metrics.jsonl").read_text()
    assert train_pqn.main(["--run-dir", str(run), "--eval-only", "eps0.5", "--eval-epsilon", "0.5"]) == 0
    res = json.loads((run / "eval_eps0.5.json").read_text())
    assert set(res[0]) == {"original", "simple", "complex"} and len(res[0]["original"]["rates"]) == 22
    assert "epsilon 0.5" in (run / "eval_eps0.5.md").read_text()
    # the run itself is untouched: same config (eval_epsilon 0), no new metrics rows
    assert (run / "config.json").read_text() == config_before
    assert (run / "metrics.jsonl").read_text() == metrics_before
    capsys.readouterr()
    assert train_pqn.main(["--run-dir", str(run), "--eval-only", "../x"]) == 2
    assert "--eval-only tag" in capsys.readouterr().err
    assert train_pqn.main(["--run-dir", str(tmp_path / "none"), "--eval-only", "a"]) == 2


def test_seeds_are_evaluated_together_exactly_as_one_by_one(tmp_path):
    from oir_gym.evaluation import eval_key, evaluate_jax

    # epsilon 1 acts at random: over 50 steps some of the 154 envs succeed, so the comparison has content
    tr = Trainer(tiny(num_seeds=2, eval_horizon=50, eval_epsilon=1.0), tmp_path, log=lambda s: None)
    tr.init_state()
    together = tr.evaluate()
    params = tr.base_params.replace(table=tr.registry.device_table())
    for s in range(2):
        p_s = jax.tree_util.tree_map(lambda x: x[s], tr.train_state.params)
        one = evaluate_jax(tr._evaluator, eval_key(tr.cfg.seed, s, tr.update_idx), p_s, params, tr.eval_rows,
                           tr.eval_cfg, tr.eval_texts, tr.eval_achs, tr.eval_sets)
        for name in one.rates:
            np.testing.assert_array_equal(together[s].rates[name], one.rates[name])
        assert sum(r.sum() for r in one.rates.values()) > 0



def test_a_run_counts_as_finished_only_once_its_final_evaluation_is_written(tmp_path):
    sys.path.insert(0, str(ROOT / "examples"))
    import train_pqn

    assert train_pqn._finished_update(tmp_path) is None  # empty folder
    (tmp_path / "metrics.jsonl").write_text('{"update": 1}\n{"update": 2}\n')
    assert train_pqn._finished_update(tmp_path) is None  # stopped early: no eval_final.json
    (tmp_path / "eval_final.json").write_text("[]")
    assert train_pqn._finished_update(tmp_path) == 2


def test_checkpoints_from_before_also_pays_still_load(tmp_path):
    """EnvState gained ``also_pays``; a checkpoint written before has no such field and must load."""
    import pickle

    tr = Trainer(tiny(), tmp_path, log=lambda s: None)
    tr.init_state()
    tr.save()
    path = tmp_path / "checkpoint.pkl"
    state = pickle.loads(path.read_bytes())
    del state["runner"][0].env.__dict__["also_pays"]  # what an older checkpoint unpickles to
    path.write_bytes(pickle.dumps(state))
    tr.load()
    assert np.asarray(tr.runner[0].env.also_pays).shape == (tr.cfg.num_envs, 0)
    tr.iteration()
    tr.close()
