"""Issue 17.8: no run is ever lost (kills, signals, bad flags, damaged files, diverged updates)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from agents.run.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from agents.pqn.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
from agents.pqn import recipe  # noqa: E402

FINAL_OUTPUTS = ("eval_final.md", "metrics.csv", "training.png", "learning_curves.png", "instruction_success.png")


def _updates(run: Path) -> list[int]:
    return [json.loads(line)["update"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(smoke_run) -> Path:
    """The session's complete smoke run (conftest.py): 4 updates, evaluation and checkpoint every 2
    (checkpoints 2 and 4 kept). Read-only: tests that change it use ``run_copy``."""
    assert (smoke_run / "complete.json").exists() and _updates(smoke_run) == [1, 2, 3, 4]
    return smoke_run


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished_run, dst)
    return dst


def test_a_non_finite_update_never_overwrites_the_last_good_checkpoint(tmp_path):
    from test_train_pqn import tiny

    tr = Trainer(tiny(), tmp_path, log=lambda s: None)
    tr.init_state()
    tr.iteration()
    good = tr.save()
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    # Fault injection: parameters as a diverged update leaves them (the settings that produced this,
    # e.g. --pqn.max-grad-norm nan, are refused by validation now, so nothing real makes it on demand).
    tr.train_state = tr.train_state.replace(
        params=jax.tree_util.tree_map(lambda x: x * np.nan, tr.train_state.params))
    with pytest.raises(FloatingPointError, match=f"the last good checkpoint {good} is kept"):
        tr.iteration()
    assert latest_checkpoint(tmp_path) == good
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    arrays, host = load_checkpoint(tmp_path)
    assert host["update"] == 1
    assert all(np.isfinite(x).all() for x in jax.tree_util.tree_leaves(arrays["train_state"]["params"]))
    tr.close()


@pytest.mark.slow  # a smoke run in a fresh process (~20 s on 2 cores); the first SIGTERM's stop is also in the next test
def test_sigterm_stops_with_a_checkpoint_like_sigint(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "train_pqn.py"), "smoke", "--run-dir", str(run), "--no-progress",
           "--run.total-timesteps", str(64 * 200), "--eval.every", "1000", "--run.checkpoint-every", "1000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # wait until training runs (past the compile)
        if line.startswith("[    2/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped (SIGTERM)" in out
    rows = _updates(run)
    assert rows == list(range(1, len(rows) + 1)) and len(rows) < 200
    assert int(latest_checkpoint(run).name) == rows[-1]  # everything logged is in the checkpoint
    assert not (run / "complete.json").exists()


def _lines_until(proc: subprocess.Popen, pattern: str, seconds: float) -> str:
    """The child's output lines read until one holds ``pattern`` (returned); fails after ``seconds``."""
    import queue
    import threading
    import time

    if not hasattr(proc, "_lines"):  # one reader thread per child, kept for later calls
        proc._lines = queue.Queue()
        threading.Thread(target=lambda: [proc._lines.put(line) for line in proc.stdout] + [proc._lines.put(None)],
                         daemon=True).start()
    seen, end = [], time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        try:
            line = proc._lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if pattern in line:
            return line
    proc.kill()
    pytest.fail(f"no line with {pattern!r} within {seconds} s; output:\n{''.join(seen)[-3000:]}")


def test_a_second_signal_ends_the_run_while_the_main_thread_waits_on_the_device(tmp_path):
    run = tmp_path / "run"
    # Fault injection: the first update waits in jax.device_get for a program that never finishes, as
    # the paper preset's first update once did (a deadlocked XLA program; that deadlock needs a given
    # jaxlib and core count, this wait happens anywhere). The program behind it waits in a host
    # callback that never returns, on an XLA thread (its input comes from a program still running, so
    # it is not run on the caller's thread); the main thread then waits for a buffer that is never
    # allocated, in C, where JAX checks for no signal.
    code = textwrap.dedent(f"""
        import sys, threading
        sys.path[:0] = [{str(ROOT)!r}]
        import jax, jax.numpy as jnp
        from agents.pqn.trainer import Trainer
        never = threading.Event()
        def wait_forever(v):
            assert threading.current_thread() is not threading.main_thread()
            never.wait()
        def iteration(self):
            x = jax.ShapeDtypeStruct((512, 512), jnp.float32)
            busy, stuck, after = (jax.jit(f).lower(x).compile() for f in (
                lambda x: jax.lax.fori_loop(0, 20, lambda i, a: jnp.tanh(a @ a), x),
                lambda x: jax.pure_callback(wait_forever, x, x),
                lambda x: x + 1))
            y = after(stuck(busy(jnp.ones(x.shape))))
            print("waiting on the device", flush=True)
            jax.device_get(y)
        Trainer.iteration = iteration
        Trainer.init_state = lambda self: None  # (no state needed: saves its compile)
        from agents.pqn import recipe
        sys.exit(recipe.pqn_main(["smoke", "--run-dir", {str(run)!r}, "--no-progress"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)
    _lines_until(proc, "waiting on the device", 600)
    proc.send_signal(signal.SIGTERM)
    _lines_until(proc, "SIGTERM: stopping after this update with a checkpoint", 10)
    proc.send_signal(signal.SIGINT)
    _lines_until(proc, "SIGINT, a second signal: exiting now; the newest checkpoint on disk is the last state", 10)
    assert proc.wait(timeout=10) == 128 + signal.SIGINT


@pytest.mark.slow  # a smoke run without the compilation cache: its first update compiles for a minute
def test_a_second_sigint_during_the_first_compile_ends_the_run_at_once(tmp_path):
    import os
    import time

    run = tmp_path / "run"
    cmd = [sys.executable, str(ROOT / "examples" / "train_pqn.py"), "smoke", "--run-dir", str(run), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "OIR_GYM_JAX_CACHE": "0"})
    _lines_until(proc, "compiling the rollout and update programs", 900)
    time.sleep(3)  # past the tracing, into XLA's compile
    proc.send_signal(signal.SIGINT)
    _lines_until(proc, "SIGINT: stopping after this update with a checkpoint", 10)
    t = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 128 + signal.SIGINT
    assert time.monotonic() - t < 10
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


@pytest.mark.slow  # two smoke runs in fresh processes (about 45 s on 2 cores)
def test_a_run_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(tmp_path, capsys):
    run = tmp_path / "run"
    # Fault injection: SIGKILL the training process itself halfway through writing checkpoint 3 (its
    # arrays file written, host state and manifest not yet), a moment no real signal hits on demand.
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path[:0] = [{str(ROOT)!r}]
        import agents.run.checkpoint as ck
        real = ck._write_synced
        def write(path, data):
            real(path, data)
            if path.name == ck.ARRAYS and path.parent.name.startswith(".tmp-000003-"):
                os.kill(os.getpid(), signal.SIGKILL)
        ck._write_synced = write
        from agents.pqn import recipe
        sys.exit(recipe.pqn_main(["smoke", "--run-dir", {str(run)!r}, "--no-progress",
                                 "--run.checkpoint-every", "1", "--run.keep-checkpoints", "3"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpts = run / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [".tmp-000003-" + p.name.rsplit("-", 1)[1]
                                                        for p in ckpts.glob(".tmp-*")] + ["000001", "000002"]
    assert latest_checkpoint(run).name == "000002" and not (run / "complete.json").exists()

    assert recipe.pqn_main(["--run-dir", str(run), "--resume", "--no-progress"]) == 0
    assert "resumed from update 2" in capsys.readouterr().out
    assert _updates(run) == [1, 2, 3, 4]  # the rows of update 3 written before the kill are not repeated
    assert (run / "complete.json").exists() and latest_checkpoint(run).name == "000004"
    assert not list(ckpts.glob(".tmp-*"))  # the killed writer's half folder is cleaned up
    load_checkpoint(run)  # verifies


def test_an_llm_that_fails_its_start_up_check_leaves_no_run_behind(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    run = tmp_path / "run"
    dead = ["--llm.backend", "openai", "--llm.model", "m", "--llm.base-url", "http://127.0.0.1:9/v1"]  # nothing listens
    assert recipe.pqn_main(["smoke", "--run-dir", str(run), "--no-progress", "--oir.relabeler", "llm", *dead]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --oir.relabeler llm: ") and "--oir.relabeler rules" in err
    assert not run.exists() or not any(run.iterdir())  # no config.json that would block a fresh start
    assert recipe.pqn_main(["smoke", "--run-dir", str(run), "--no-progress", "--max-updates", "1"]) == 0


def test_a_kill_just_after_the_final_save_is_finished_by_resume(run_copy, capsys):
    # what a kill after the last checkpoint but before the final outputs leaves
    for name in FINAL_OUTPUTS + ("complete.json",):
        (run_copy / name).unlink()
    metrics = (run_copy / "metrics.jsonl").read_text()
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--no-progress"]) == 0
    assert "already complete" not in capsys.readouterr().out
    for name in FINAL_OUTPUTS + ("complete.json",):
        assert (run_copy / name).exists(), name
    assert (run_copy / "metrics.jsonl").read_text() == metrics


def test_a_kill_just_before_the_final_save_resumes_without_duplicate_rows(run_copy, capsys):
    # what a kill after the final update's metrics row and evaluation, before its checkpoint, leaves:
    # the checkpoint of update 2 is the newest, rows 3 and 4 are in metrics.jsonl
    shutil.rmtree(run_copy / "checkpoints" / "000004")
    (run_copy / "complete.json").unlink()
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "already complete" not in out and "resumed from update 2" in out
    assert _updates(run_copy) == [1, 2, 3, 4]
    assert (run_copy / "complete.json").exists() and latest_checkpoint(run_copy).name == "000004"


def test_resume_with_overwrite_is_refused_before_anything_is_deleted(run_copy, capsys):
    before = _snapshot(run_copy)
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--overwrite"]) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert _snapshot(run_copy) == before


def test_overwrite_removes_the_old_runs_outputs(run_copy):
    (run_copy / "notes.txt").write_text("mine")
    assert recipe.pqn_main(["smoke", "--run-dir", str(run_copy), "--overwrite", "--no-progress",
                           "--max-updates", "1"]) == 0
    assert _updates(run_copy) == [1]
    assert [p.name for p in (run_copy / "checkpoints").iterdir()] == ["000001"]
    for name in ("eval_000002.json", "eval_final.json", "complete.json") + FINAL_OUTPUTS[:1] + FINAL_OUTPUTS[2:]:
        assert not (run_copy / name).exists(), name
    assert (run_copy / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("target", ["metrics.jsonl", "checkpoints/000004/arrays.msgpack",
                                    "checkpoints/000004/host.json"])
def test_a_damaged_file_stops_resume_with_an_error_naming_it(run_copy, capsys, target):
    (run_copy / "complete.json").unlink()  # a run still to finish
    path = run_copy / target
    data = bytearray(path.read_bytes())
    if target.endswith("host.json"):
        data = data[: len(data) // 2]  # truncated
    else:
        i = data.index(b"0.", len(data) // 3) if target == "metrics.jsonl" else len(data) // 2
        for j in range(i + 2, i + 4):  # digits of a number: still parses, only the checksum can tell
            data[j] = ord("7") if data[j] != ord("7") else ord("3")
    path.write_bytes(bytes(data))
    before = _snapshot(run_copy)
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume"]) == 2
    assert str(path) in capsys.readouterr().err
    assert _snapshot(run_copy) == before  # nothing written, nothing cut


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path, capsys):
    """Issue 30.9: what a kill during the first updates leaves (the config and a metrics row, no
    checkpoint) used to be blocked for good: a fresh start said "pass --resume", --resume said
    "no checkpoint". --resume now starts the run again with its saved config."""
    from agents.pqn.config import preset
    from agents.run.run_dir import RunDir

    run = RunDir.prepare(tmp_path / "run")
    run.write_config(preset("smoke").validate().to_dict())
    with run.open_metrics(tensorboard=False) as metrics:
        metrics.write({"update": 1, "env_steps": 64, "loss": 123.0})
    assert recipe.pqn_main(["smoke", "--run-dir", str(run.path), "--no-progress"]) == 2
    assert "pass --resume to continue it" in capsys.readouterr().err
    assert recipe.pqn_main(["--run-dir", str(run.path), "--resume", "--no-progress", "--max-updates", "2"]) == 0
    out = capsys.readouterr().out
    assert "holds no checkpoint yet" in out and "stopped (--max-updates 2) at update 2/4" in out
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2] and rows[0]["loss"] != 123.0  # the killed run's row replaced
    assert latest_checkpoint(run.path).name == "000002"


def test_a_partial_copy_of_the_newest_checkpoint_resumes_from_the_one_before_and_saves_again(run_copy, capsys):
    """Issue 30.7: checkpoints/000004 without its manifest (a copy that stopped part way): the
    resume starts from 000002, and saving update 4 again used to fail with 'Directory not empty'."""
    (run_copy / "complete.json").unlink()
    (run_copy / "checkpoints" / "000004" / "manifest.json").unlink()
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "resumed from update 2" in out and f"skipped {run_copy / 'checkpoints' / '000004'}: it has no" in out
    assert _updates(run_copy) == [1, 2, 3, 4] and (run_copy / "complete.json").exists()
    assert latest_checkpoint(run_copy).name == "000004" and (run_copy / "checkpoints" / "000004.incomplete").is_dir()
    load_checkpoint(run_copy)  # verifies


def test_eval_only_refuses_a_checkpoint_of_non_finite_weights(run_copy, capsys):
    """Issue 30.8: a checkpoint whose manifest matches its files but whose weights are NaN was
    evaluated with exit status 0."""
    from agents.run.checkpoint import save_checkpoint

    folder = latest_checkpoint(run_copy)
    arrays, host = load_checkpoint(folder)
    dense = arrays["train_state"]["params"]["params"]["Dense_0"]
    dense["kernel"] = np.full_like(dense["kernel"], np.nan)
    shutil.rmtree(folder)
    save_checkpoint(run_copy, host["update"], arrays, host)  # a consistent manifest
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--eval-only", "nan"]) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'arrays.msgpack'}: field train_state/params/params/Dense_0/kernel holds NaN" in err
    assert not (run_copy / "eval_nan.json").exists()


def test_a_run_whose_checkpoints_are_gone_is_refused_not_restarted(run_copy, capsys):
    """Issue 37.13: without checkpoints/ but with metrics rows and evaluations past the first
    checkpoint, --resume used to restart from update 0 and cut metrics.jsonl to nothing."""
    (run_copy / "complete.json").unlink()  # a run still to finish
    shutil.rmtree(run_copy / "checkpoints")
    before = _snapshot(run_copy)
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run_copy / 'checkpoints'} holds no checkpoint, while {run_copy} holds metrics.jsonl rows up to update 4" \
        in err and "eval_final.json" in err and "--overwrite" in err and "\n" not in err.strip()
    assert _snapshot(run_copy) == before  # nothing written, nothing cut


def test_resume_refuses_a_metrics_file_that_is_a_link_and_leaves_its_target_alone(run_copy, capsys, tmp_path):
    """Issue 37.12: a symlinked metrics.jsonl was appended to (and tb/ and the plots written) in the
    link's target, outside the run folder."""
    (run_copy / "complete.json").unlink()
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes((run_copy / "metrics.jsonl").read_bytes())
    (run_copy / "metrics.jsonl").unlink()
    (run_copy / "metrics.jsonl").symlink_to(outside)
    before = outside.read_bytes()
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--resume", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{run_copy / 'metrics.jsonl'} is a symbolic link (to {outside})" in err and "never through a link" in err
    assert outside.read_bytes() == before
