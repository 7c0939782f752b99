"""End-to-end: a short OIR training run on CPU, its checkpoint, and the main-job script.

Most tests read the session's shared trained smoke trainer (``smoke_trainer``) or finished smoke run
(``smoke_run``, both in conftest.py) instead of training their own; the paired runs that need a
trainer of their own for both sides run under ``-m slow``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from conftest import tiny  # noqa: E402  (re-exported: other test modules import it from here)

from agents.run.checkpoint import CheckpointError  # noqa: E402
from agents.pqn.config import TrainConfig, preset  # noqa: E402
from agents.pqn.trainer import Trainer  # noqa: E402
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _params(tr: Trainer):
    return jax.tree_util.tree_leaves(jax.device_get(tr.train_state.params))


def test_training_runs_and_resume_continues_identically(smoke_trainer, tmp_path):
    """The shared trainer trained 4 updates straight (saving at update 3 on the way); a trainer that
    loads the update-3 checkpoint and trains one update reaches the same parameters and buffers."""
    cfg, logs = smoke_trainer.cfg, smoke_trainer.logs
    losses = [l.metrics["loss"] for l in logs]
    assert np.isfinite(losses).all()
    assert min(losses[1:]) < losses[0]  # the first update's loss (random Q vs targets) comes down
    assert logs[-1].env_steps == 4 * cfg.batch_steps
    # rule relabeling produced training rows (the first rollouts act almost at random, so they have events)
    assert max(l.metrics["relabel/rows"] for l in logs) > 0

    resumed = Trainer(cfg, tmp_path, log=lambda s: None)
    resumed.load(smoke_trainer.checkpoint_3)
    assert (resumed.update_idx, resumed.env_steps) == (3, 3 * cfg.batch_steps)
    log = resumed.iteration()
    assert log.update == 4
    for a, b in zip(smoke_trainer.params_4, _params(resumed), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert smoke_trainer.buffers_4 == [b.contents() for b in resumed.buffers]
    resumed.close()


def test_load_rejects_a_checkpoint_of_another_shape_or_method(smoke_trainer, tmp_path):
    cfg, folder = smoke_trainer.cfg, smoke_trainer.checkpoint_3
    other = Trainer(cfg.replace(**{"pqn.num_envs": 8, "pqn.num_minibatches": 4}), tmp_path, log=lambda s: None)
    with pytest.raises(CheckpointError, match=r"host.json: the checkpoint has pqn.num_envs=4, this run 8"):
        other.load(folder)
    gt = Trainer(cfg.replace(**{"run.method": "gt"}), tmp_path, log=lambda s: None)
    with pytest.raises(CheckpointError, match="run.method='oir', this run 'gt'"):
        gt.load(folder)


def test_evaluation_reports_all_sets(smoke_trainer):
    res = smoke_trainer.trainer.evaluate()[0]
    assert set(res.rates) == {"original", "simple", "complex"}
    assert len(res.rates["original"]) == 22 and len(res.rates["simple"]) == 66
    m = res.summary()["original"]
    assert 0.0 <= m["aggregate_score"] <= m["mean_success_rate"] <= 1.0


def _script(run, *extra) -> list[str]:
    """train_pqn.py arguments: the smoke preset (4 updates, evaluation and checkpoint every 2) in ``run``."""
    return ["smoke", "--run-dir", str(run), "--no-progress", *extra]


@pytest.mark.slow
def test_main_job_script_writes_a_complete_run_directory(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "train_pqn.py"), *_script(run)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ("config.json", "metrics.jsonl", "metrics.csv", "checkpoints/000004/manifest.json", "eval_final.json",
                 "eval_final.md", "training.png", "learning_curves.png", "instruction_success.png", "complete.json"):
        assert (run / name).exists(), name
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["env_steps"] == 256 and "eval/original/mean_success_rate" in rows[-1]
    assert "Final evaluation" in out.stdout and "compiling" in out.stdout
    # the wall clock starts with the process: the imports are part of the startup it reports
    imports = float(re.search(r"ready after \d+ s \(imports (\d+) s", out.stdout).group(1))
    assert rows[0]["time"] >= imports
    # the first update's wait, launch to its end, is said and logged
    first = float(re.search(r"first update done (\d+) s after launch", out.stdout).group(1))
    assert rows[0]["time/first_update_s"] == rows[0]["time"] and abs(first - rows[0]["time"]) <= 1
    assert "time/first_update_s" not in rows[1]
    config = json.loads((run / "config.json").read_text())
    assert config["pqn"]["num_envs"] == 4 and config["provenance"]["git_commit"]
    # --resume of a finished run is a no-op that still succeeds and says so
    metrics = (run / "metrics.jsonl").read_text()
    again = subprocess.run(cmd[:2] + ["--run-dir", str(run), "--resume"], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete (4/4 updates" in again.stdout
    assert (run / "metrics.jsonl").read_text() == metrics


def test_main_job_refuses_to_mix_a_new_run_into_an_existing_run_dir(tmp_path, capsys):
    from agents.pqn import recipe

    (tmp_path / "metrics.jsonl").write_text('{"update": 1, "env_steps": 64}\n')
    assert recipe.pqn_main(_script(tmp_path)) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == '{"update": 1, "env_steps": 64}\n'  # nothing lost
    assert recipe.pqn_main(["--run-dir", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eval_only_evaluates_the_checkpoint_without_touching_the_run(smoke_run, tmp_path, capsys):
    from agents.pqn import recipe

    run = tmp_path / "run"
    shutil.copytree(smoke_run, run)
    config_before = (run / "config.json").read_text()
    metrics_before = (run / "metrics.jsonl").read_text()
    assert recipe.pqn_main(["--run-dir", str(run), "--eval-only", "eps0.5", "--eval.epsilon", "0.5"]) == 0
    res = json.loads((run / "eval_eps0.5.json").read_text())
    # exactly the run's eval.sets (the final evaluation's held-out and ordered sets only when named)
    assert set(res[0]) == {"original", "simple", "complex"} and len(res[0]["original"]["rates"]) == 22
    assert "epsilon 0.5" in (run / "eval_eps0.5.md").read_text()
    # the run itself is untouched: same config (eval.epsilon 0), no new metrics rows
    assert (run / "config.json").read_text() == config_before
    assert (run / "metrics.jsonl").read_text() == metrics_before
    # only a file's sets (the 155 built-in instructions are not run again), its table printed
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"sets": {"mine": [{"text": "chop a tree", "achievement": "collect_wood"},
                                                  {"text": "have a drink", "achievement": "collect_drink"}]}}))
    capsys.readouterr()
    assert recipe.pqn_main(["--run-dir", str(run), "--eval-only", "mine", "--eval.instruction-files", str(mine),
                           "--eval.sets"]) == 0
    out = capsys.readouterr().out
    assert set(json.loads((run / "eval_mine.json").read_text())[0]) == {"mine"}
    assert "Set mine, per instruction:" in out and "| chop a tree |" in out and "| have a drink |" in out
    assert (run / "config.json").read_text() == config_before
    assert recipe.pqn_main(["--run-dir", str(run), "--eval-only", "../x"]) == 2
    assert "evaluation tag" in capsys.readouterr().err
    assert recipe.pqn_main(["--run-dir", str(tmp_path / "none"), "--eval-only", "a"]) == 2


def test_seeds_are_evaluated_together_exactly_as_one_by_one(smoke_trainer):
    from oir_gym.evaluation import eval_key, evaluate_jax

    # 2 seeds; epsilon 1 acts at random: over 50 steps some of the 154 envs succeed, so the comparison has content
    tr = smoke_trainer.trainer
    together = tr.evaluate()
    params = tr.base_params.replace(table=tr.registry.device_table())
    for s in range(2):
        p_s = jax.tree_util.tree_map(lambda x: x[s], tr.train_state.params)
        one = evaluate_jax(tr.evaluator, eval_key(tr.cfg.run.seed, s, tr.update_idx), p_s, params, tr.eval_rows,
                           tr.eval_cfg, tr.eval_texts, tr.eval_achs, tr.eval_sets)
        for name in one.rates:
            np.testing.assert_array_equal(together[s].rates[name], one.rates[name])
        assert sum(r.sum() for r in one.rates.values()) > 0



def _legacy_pickle(tr: Trainer) -> dict:
    """What the pickle checkpoints of earlier versions held (``Trainer.save`` before agents.run.checkpoint)."""
    reg = tr.registry.state_dict()
    return {
        "cfg": {"method": "oir", "relabeler": "rules", "num_envs": 4, "num_steps": 16, "hidden_size": 32, "k": 2},
        "update": tr.update_idx, "env_steps": tr.env_steps,
        "train_state": jax.device_get((tr.train_state.params, tr.train_state.opt_state, tr.train_state.step)),
        "runner": jax.device_get(tr.runner), "key": jax.device_get(tr.key),
        "buffers": [b.state_dict() for b in tr.buffers],
        "registry": {"texts": reg["texts"], "emb": reg["emb"], "event_sim": reg["event_sim"],
                     "achievement": reg["achievement"], "rows": dict(reg["rows"])},
        "generated": {"counts": dict(tr.generated), "pinned": {}, "goal_rng": None},
    }


def _legacy_run(path) -> tuple[TrainConfig, dict]:
    """A run directory as earlier versions left it: flat config.json, checkpoint.pkl of update 1
    (from before EnvState.also_pays, as the oldest ones), metrics rows up to update 2."""
    import pickle

    cfg = tiny()
    tr = Trainer(cfg, path, log=lambda s: None)
    tr.init_state()
    tr.iteration()
    state = _legacy_pickle(tr)
    tr.close()
    del state["runner"][0].env.__dict__["also_pays"]  # what the oldest checkpoints unpickle to
    (path / "checkpoint.pkl").write_bytes(pickle.dumps(state))
    flat = {"method": "oir", "relabeler": "rules", "total_timesteps": 384, "num_envs": 4, "num_steps": 16,
            "hidden_size": 32, "num_epochs": 2, "num_minibatches": 2, "k": 2, "eval_every": 1000, "eval_episodes": 1,
            "eval_horizon": 8, "checkpoint_every": 1000, "lr": 1e-3}
    (path / "config.json").write_text(json.dumps(flat))
    (path / "metrics.jsonl").write_text('{"update": 1, "env_steps": 64}\n{"update": 2, "env_steps": 128}\n')
    return cfg, state


def test_a_legacy_pickle_checkpoint_is_refused_and_converted_only_on_request(tmp_path, capsys):
    """Loading refuses checkpoint.pkl (unpickling runs code); ``python -m agents.tools.legacy_checkpoint``
    converts a trusted one."""
    from agents.tools import legacy_checkpoint
    from agents.pqn import recipe

    cfg, state = _legacy_run(tmp_path)
    with pytest.raises(CheckpointError, match="legacy pickle checkpoint.*convert"):
        Trainer(cfg, tmp_path, log=lambda s: None).load()
    assert recipe.pqn_main(["--run-dir", str(tmp_path), "--resume"]) == 2
    assert "python -m agents.tools.legacy_checkpoint" in capsys.readouterr().err

    assert legacy_checkpoint.main([str(tmp_path)]) == 0
    again = Trainer(cfg, tmp_path, log=lambda s: None)
    host = again.load()
    assert (again.update_idx, host["metrics_after_update"]) == (1, 1)
    assert np.asarray(again.runner[0].env.also_pays).shape == (cfg.pqn.num_envs, 0)
    for a, b in zip(_params(again), jax.tree_util.tree_leaves(state["train_state"][0])):
        np.testing.assert_array_equal(a, b)
    again.iteration()
    again.close()


@pytest.mark.slow
def test_a_converted_legacy_run_resumes_to_its_end_through_the_script(tmp_path):
    from agents.tools import legacy_checkpoint
    from agents.pqn import recipe

    _legacy_run(tmp_path)
    assert legacy_checkpoint.main([str(tmp_path)]) == 0
    # the flat config.json loads, the metrics rows after the converted checkpoint's update are cut
    assert recipe.pqn_main(["--run-dir", str(tmp_path), "--resume", "--no-progress"]) == 0
    rows = [json.loads(line)["update"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4, 5, 6] and (tmp_path / "complete.json").exists()
    assert json.loads((tmp_path / "config.json").read_text())["pqn"]["num_envs"] == 4  # now nested


def test_bad_instruction_files_are_refused_by_validation(tmp_path):
    """(The good file's sets reaching the evaluation: the next test.)"""
    bad = tmp_path / "bad.json"
    bad.write_text('{"sets": {"mine": [{"text": "chop a tree", "achievement": "collect_unobtainium"}]}}')
    with pytest.raises(ValueError, match="bad.json.*collect_unobtainium"):
        tiny(**{"eval.instruction_files": (str(bad),)}).validate()


def test_a_checkpoint_evaluates_instruction_files_its_run_never_saw(smoke_trainer, tmp_path):
    """--eval-only with a user file the training run did not evaluate: the checkpoint's instruction
    table replaces the trainer's, and each of the file's wordings must still be evaluated with its
    own embedding (before the fix they read whatever text held their row in the saved table).
    ``eval.instruction_files`` (13.3c) and ``eval.control`` (13.3a) reach the PQN trainer's
    evaluation: the file's sets are evaluated beside the built-in ones and the gain is reported."""
    from importlib import resources

    path = str(resources.files("oir_gym.data").joinpath("example_instruction_sets.json"))
    cfg = smoke_trainer.cfg.replace(**{"eval.instruction_files": (path,), "eval.horizon": 20, "eval.episodes": 1,
                                       "eval.control": True})
    later = Trainer(cfg, tmp_path, log=lambda s: None)
    later.load(smoke_trainer.checkpoint_3)
    assert [later.registry.text(r) for r in later.eval_rows] == later.eval_texts
    assert [later.registry.text(r) for r in later.orig_rows] == list(ORIGINAL_INSTRUCTIONS)
    table = later.registry.device_table()
    fresh = Trainer(cfg, tmp_path / "fresh", log=lambda s: None)  # the same texts, encoded without a checkpoint
    np.testing.assert_allclose(np.asarray(table.emb)[later.eval_rows],
                               np.asarray(fresh.registry.device_table().emb)[fresh.eval_rows], atol=1e-5)
    res = later.evaluate()[0]
    assert {"original", "own_words", "compound"} <= set(res.rates)
    flat = res.flat_metrics()
    assert "eval/own_words/mean_success_rate" in flat and "eval/control/original/gain" in flat


def test_progress_line_says_what_the_llm_answered_and_what_it_added():
    """The per-update line separates the LLM's answers that arrived in time to train on (of all that
    arrived) from what it added (its share of the buffer offers)."""
    from agents.pqn import recipe

    row = {"update": 3, "env_steps": 300, "sps": 10.0, "epsilon": 0.5, "loss": 0.1, "train/success_rate": 0.2,
           "relabel/rows": 4, "relabel/grounded_frac": 1.0, "relabel/llm_share": 1.0, "relabel/llm_offer_share": 0.0}
    line = recipe.summary_line(row | {"relabel/llm_in_time_total": 2.0, "relabel/llm_stale": 4.0}, 10)
    assert "LLM answers 2/6 in time, offers 0%" in line and "100%" not in line
    row = {k: v for k, v in row.items() if not k.startswith("relabel/")} | {"ellm/distinct_goals": 3,
                                                                           "ellm/distinct_pinned": 2,
                                                                           "ellm/cache_hit_rate": 0.5,
                                                                           "ellm/llm_fraction": 0.25}
    assert "LLM goals 25%" in recipe.summary_line(row, 10)


@pytest.mark.parametrize("when", ["before init_state", pytest.param("after init_state", marks=pytest.mark.slow)])
def test_compiling_on_side_threads_leaves_training_and_evaluation_unchanged(smoke_trainer, tmp_path, when):
    """Trainer.start_compiling compiles the rollout, batch, update and evaluation programs ahead
    (throwaway calls; before init_state on a placeholder state of zeros, beside init_state's own
    compile): the first update then compiles none of them again, and parameters, metrics and
    evaluation are those of a trainer that compiled nothing ahead (the shared smoke trainer, at
    update 2). Before init_state (what train_pqn does on an accelerator) in the default suite."""
    import jax.monitoring

    cfg = smoke_trainer.cfg
    ref_logs = [log.metrics for log in smoke_trainer.logs[:2]]
    expected = smoke_trainer.eval_2
    tr = Trainer(cfg, tmp_path / "warm", log=lambda s: None)
    if when == "before init_state":
        warm = tr.start_compiling()
        tr.init_state()
    else:
        tr.init_state()
        warm = tr.start_compiling()
    assert len(warm) == 3
    for f in warm:  # the rollout, the batch + update and the evaluation: none compiles during the update below
        assert f.result(timeout=300) is None
    compiles: list[float] = []
    me = threading.get_ident()  # the update runs here (one device); other threads' compiles are not its own

    def listener(event, secs, **kw):
        if event.endswith("backend_compile_duration") and threading.get_ident() == me:
            compiles.append(secs)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        logs = [tr.iteration().metrics]
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []  # everything the update runs was compiled ahead (or by the reference trainer)
    logs.append(tr.iteration().metrics)
    for a, b in zip(_params(tr), smoke_trainer.params_2, strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(logs, ref_logs):
        assert {k: v for k, v in got.items() if not k.startswith("time/") and k != "sps"} == \
            {k: v for k, v in want.items() if not k.startswith("time/") and k != "sps"}
    assert [r.to_dict() for r in tr.evaluate()] == expected
    assert tr.update_idx == 2


@pytest.mark.slow  # two whole smoke runs through the script (about 90 s); the fast check of start_compiling is above
def test_train_pqn_compiles_ahead_on_an_accelerator_with_the_same_run(tmp_path, monkeypatch, capsys):
    """On an accelerator train_pqn starts Trainer.start_compiling before init_state (a CPU skips it);
    faked here on the CPU: the run's metrics and final evaluation are those of a run without it."""
    from agents.pqn import recipe

    started = []
    real = Trainer.start_compiling
    monkeypatch.setattr(Trainer, "start_compiling", lambda self: started.append(self.runner is None) or real(self))
    args = ["smoke", "--no-progress", "--eval.horizon", "4"]
    assert recipe.pqn_main(args + ["--run-dir", str(tmp_path / "plain")]) == 0
    assert started == []
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert recipe.pqn_main(args + ["--run-dir", str(tmp_path / "ahead")]) == 0
    assert started == [True]  # before init_state
    rows = [[json.loads(line) for line in open(tmp_path / n / "metrics.jsonl")] for n in ("plain", "ahead")]
    strip = lambda r: {k: v for k, v in r.items() if k not in ("sps", "time") and not k.startswith("time/")}  # noqa: E731
    assert [strip(r) for r in rows[0]] == [strip(r) for r in rows[1]]
    assert (json.loads((tmp_path / "plain" / "eval_final.json").read_text())
            == json.loads((tmp_path / "ahead" / "eval_final.json").read_text()))


def test_wall_clock_and_time_limit_count_from_the_process_start(tmp_path, capsys):
    """main(started=...) (the script passes its own start) puts the imports on the run's clock: the
    metrics' time and --time-limit count from there, not from when main was called."""
    from agents.pqn import recipe

    run = tmp_path / "run"
    args = ["smoke", "--no-progress", "--eval.horizon", "4", "--run-dir", str(run), "--time-limit", "1000"]
    assert recipe.pqn_main(args, started=time.time() - 1000) == 0
    out = capsys.readouterr().out
    # the 1,000 s before main() plus the seconds main() took to parse and prepare (more on a loaded machine)
    assert re.search(r"imports 10[0-5]\d s", out) and "stopped (--time-limit 1000s) at update 1/4" in out
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert len(rows) == 1 and rows[0]["time"] >= 1000
    # a stopped run reports its buffer's diversity too: it may never be resumed
    assert json.loads((run / "diversity.json").read_text())["update"] == 1


def test_relabel_lag_trains_the_relabeled_copies_one_update_later(smoke_trainer, tmp_path):
    """oir.relabel_lag 1 against the shared trainer (the same run without it): the lagged run's
    second update trains on exactly the relabeled instructions the plain run's first update chose.
    (Bigger batches and a resume: the slow test below.)"""
    cfg = smoke_trainer.cfg
    first = smoke_trainer.logs[0]
    assert first.metrics["relabel/rows"] > 0 and any(t for seed in smoke_trainer.texts_1 for t in seed)
    assert smoke_trainer.offered_1
    lagged = Trainer(cfg.replace(**{"oir.relabel_lag": 1}), tmp_path, log=lambda s: None)
    lagged.init_state()
    assert lagged.iteration().metrics["relabel/rows"] == 0  # nothing relabeled yet
    assert not lagged.method.offered  # and nothing offered to the buffers
    second = lagged.iteration()
    assert lagged.method.last_texts == smoke_trainer.texts_1
    assert second.metrics["relabel/rows"] == first.metrics["relabel/rows"]
    assert np.isfinite(second.metrics["loss"])
    lagged.close()


@pytest.mark.slow  # two trainers of 8 envs x 64 steps and a resumed one (about 35 s)
def test_relabel_lag_trains_each_rollouts_relabeled_copies_one_update_later(tmp_path):
    """oir.relabel_lag 1: the rule relabeler reads a rollout on a side thread; its copies and buffer
    offers enter the next update. The first rollouts of both runs are the same, so the lagged run's
    second update trains on exactly the relabeled instructions the plain run's first update chose."""
    cfg = tiny(**{"pqn.num_envs": 8, "pqn.num_steps": 64, "run.total_timesteps": 8 * 64 * 4})
    plain = Trainer(cfg, tmp_path / "plain", log=lambda s: None)
    lagged = Trainer(cfg.replace(**{"oir.relabel_lag": 1}), tmp_path / "lagged", log=lambda s: None)
    for tr in (plain, lagged):
        tr.init_state()
    first = plain.iteration()
    texts = plain.method.last_texts
    assert first.metrics["relabel/rows"] > 0 and any(t for seed in texts for t in seed)
    assert lagged.iteration().metrics["relabel/rows"] == 0  # nothing relabeled yet
    assert plain.method.offered and not lagged.method.offered  # and nothing offered to the buffers
    second = lagged.iteration()
    assert lagged.method.last_texts == texts and second.metrics["relabel/rows"] == first.metrics["relabel/rows"]
    logs = [lagged.iteration(), lagged.iteration()]
    assert all(np.isfinite(log.metrics["loss"]) for log in [second, *logs])
    # a checkpoint keeps no relabel in flight: the resumed run's first update has no relabeled rows
    folder = lagged.save()
    lagged.close()
    plain.close()
    resumed = Trainer(cfg.replace(**{"oir.relabel_lag": 1, "run.total_timesteps": 8 * 64 * 6}), tmp_path / "lagged",
                      log=lambda s: None)
    resumed.load(folder)
    assert resumed.iteration().metrics["relabel/rows"] == 0 and resumed.iteration().metrics["relabel/rows"] > 0
    resumed.close()


def _on_two_cpus(cmd: list[str]) -> list[str]:
    """``cmd`` (a Python command line) run on two CPUs: XLA sizes its CPU thread pool from the
    affinity, and a pool of two threads is where the presets' first update once waited for ever
    (:func:`agents.pqn.network.create_train_states`)."""
    import os

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs to pin a 2-thread XLA pool")
    pin = f"import os, sys; os.sched_setaffinity(0, {cpus[:2]}); os.execv(sys.executable, sys.argv[1:])"
    return [sys.executable, "-c", pin, *cmd]


@pytest.mark.slow  # the preset's LSTM 512 x 3 seeds on a CPU: minutes on 2 cores
@pytest.mark.parametrize("name,envs", [("paper", 4), ("fast", 16)])  # fast: 16 minibatches of 16 x (1 + K) rows
def test_the_gpu_presets_first_update_runs_on_a_small_cpu(tmp_path, name, envs):
    run = tmp_path / "run"
    # the preset's network, seeds, scan and update settings as they are; fewer envs and steps
    cmd = [sys.executable, str(ROOT / "examples" / "train_pqn.py"), name, "--run.num-seeds", "3",
           "--pqn.num-envs", str(envs), "--pqn.num-steps", "16", "--run.total-timesteps", str(envs * 16 * 10),
           "--max-updates", "1", "--run-dir", str(run), "--no-progress"]
    try:
        out = subprocess.run(_on_two_cpus(cmd), capture_output=True, text=True, timeout=1200, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{name}: no first update within {e.timeout} s (a deadlock?): {str(e.stdout)[-2000:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stopped (--max-updates 1) at update 1/10" in out.stdout
    config = json.loads((run / "config.json").read_text())
    want = preset(name).pqn
    assert (config["pqn"]["hidden_size"], config["pqn"]["scan_unroll"], config["run"]["num_seeds"]) == (
        want.hidden_size, want.scan_unroll, 3) == (512, 8, 3)
    assert (run / "checkpoints" / "000001" / "manifest.json").exists()


def test_seed_means_average_each_metric_over_the_seeds_that_hold_it():
    """A seed that learned no achievement has no paraphrase retention: the run's row averages the
    retention over the seeds that have one (the final summary once stopped on the missing key)."""
    from agents.run.train import seed_means

    rows = [{"eval/original/mean_success_rate": 0.5, "eval/simple/retention": 0.8, "eval/simple/retention_learned": 2.0},
            {"eval/original/mean_success_rate": 0.1, "eval/simple/retention_learned": 0.0}]
    assert seed_means(rows) == pytest.approx({"eval/original/mean_success_rate": 0.3, "eval/simple/retention": 0.8,
                                              "eval/simple/retention_learned": 1.0})
    assert seed_means(rows[::-1]).keys() == seed_means(rows).keys()
    assert seed_means([]) == {}


def test_trainers_of_one_program_config_share_their_programs(smoke_trainer, tmp_path):
    """A second trainer of the same program configuration reuses the first's jitted programs (no
    trace, no compile); a field the programs read gives it programs of its own; the programs are
    built from the program fields alone (the others at their defaults)."""
    from agents.pqn.config import TrainConfig
    from agents.pqn.trainer import Trainer, program_config

    first = smoke_trainer.trainer
    same = Trainer(first.cfg.replace(**{"eval.every": 7, "run.checkpoint_every": 3, "run.seed": 5}), tmp_path / "a",
                   log=lambda s: None)
    other = Trainer(first.cfg.replace(**{"pqn.lr": first.cfg.pqn.lr / 2}), tmp_path / "b", log=lambda s: None)
    try:
        assert same.programs is first.programs and same.net is first.net
        assert other.programs is not first.programs
        seen = same.programs.cfg
        assert seen.to_dict() == program_config(first.cfg).to_dict()
        assert (seen.pqn, seen.eval.horizon) == (first.cfg.pqn, first.cfg.eval.horizon)
        assert (seen.run.seed, seen.oir.relabeler, seen.eval.every) == (
            TrainConfig().run.seed, TrainConfig().oir.relabeler, TrainConfig().eval.every)
    finally:
        same.close()
        other.close()
