"""The run directory shared by both trainers: flags checked before deleting, metrics resume, provenance."""

from __future__ import annotations

import csv
import shutil
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.run.run_dir import (
    COMPLETE, CONFIG, CorruptFileError, MetricsPosition, RunDir, RunDirError, atomic_write_json, read_json,
)

ROOT = Path(__file__).resolve().parents[1]


def _rows(n: int, start: int = 1) -> list[dict]:
    return [{"update": u, "env_steps": 128 * u, "loss": 1.0 / u} for u in range(start, start + n)]


def _new_run(tmp_path: Path, rows: int = 3) -> tuple[RunDir, MetricsPosition]:
    run = RunDir.prepare(tmp_path / "run")
    run.write_config({"method": "oir", "lr": 1e-3})
    with run.open_metrics(tensorboard=False) as m:
        for r in _rows(rows):
            m.write(r)
        pos = m.sync()
    return run, pos


def test_a_folder_holding_a_run_is_never_reused_without_resume_or_overwrite(tmp_path):
    run, _ = _new_run(tmp_path)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    with pytest.raises(RunDirError, match="already holds a run; pass --resume"):
        RunDir.prepare(run.path)
    # --resume --overwrite is refused before anything is deleted
    with pytest.raises(RunDirError, match="pass one of them"):
        RunDir.prepare(run.path, resume=True, overwrite=True)
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before
    with pytest.raises(RunDirError, match="does not exist"):
        RunDir.prepare(tmp_path / "nothing", resume=True)
    assert not (tmp_path / "nothing").exists()


def test_overwrite_removes_the_old_runs_outputs_and_nothing_else(tmp_path):
    run, _ = _new_run(tmp_path)
    (run.path / "checkpoints" / "000003").mkdir(parents=True)
    (run.path / "checkpoints" / "000003" / "state.msgpack").write_bytes(b"x")
    for name in ("eval_final.json", "eval_final.md", "training.png", "instructions.json", "checkpoint.pkl",
                 "model.zip", COMPLETE):
        (run.path / name).write_text("old")
    (run.path / "tb").mkdir()
    (run.path / "tb" / "events").write_text("old")
    (run.path / "notes.txt").write_text("mine")
    again = RunDir.prepare(run.path, overwrite=True)
    assert sorted(p.name for p in again.path.iterdir()) == ["notes.txt"]
    assert not again.holds_run()


def test_config_records_provenance_and_resumes_keep_the_first(tmp_path):
    run, _ = _new_run(tmp_path)
    data = read_json(run.path / CONFIG)
    prov = data["provenance"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert prov["git_commit"] == head and isinstance(prov["git_dirty"], bool)
    for pkg in ("jax", "craftax", "torch"):
        assert prov["packages"][pkg]
    assert "transformers" in prov["packages"] or "llama_cpp_python" in prov["packages"]
    assert run.read_config() == {"method": "oir", "lr": 1e-3}
    run.write_config({"method": "oir", "lr": 1e-3})  # a resumed process
    again = read_json(run.path / CONFIG)
    assert again["provenance"] == prov and len(again["resumed"]) == 1


def test_resume_cuts_the_rows_written_after_the_checkpoint(tmp_path):
    run, pos = _new_run(tmp_path, rows=3)
    with run.open_metrics(tensorboard=False) as m:  # the run went on past its checkpoint, then died
        for r in _rows(2, start=4):
            m.write(r)
    with open(run.metrics_path, "ab") as f:
        f.write(b'{"update": 6, "env_st')  # killed in the middle of a row
    with run.open_metrics(position=pos.to_dict(), tensorboard=False) as m:
        assert m.position() == pos
        for r in _rows(3, start=4):
            m.write(r)
    assert [r["update"] for r in run.read_metrics()] == [1, 2, 3, 4, 5, 6]  # no duplicates


def test_resume_without_a_recorded_position_keeps_rows_up_to_the_checkpoint_update(tmp_path):
    run, _ = _new_run(tmp_path, rows=5)
    with run.open_metrics(after_update=2, tensorboard=False) as m:
        assert (m.position().rows, m.position().update) == (2, 2)
        m.write(_rows(1, start=3)[0])
    assert [r["update"] for r in run.read_metrics()] == [1, 2, 3]


@pytest.mark.parametrize("damage", ["bitflip", "truncate"])
def test_a_damaged_metrics_file_is_an_error_naming_it(tmp_path, damage):
    run, pos = _new_run(tmp_path, rows=3)
    data = bytearray(run.metrics_path.read_bytes())
    if damage == "bitflip":
        i = data.index(b"0.5")
        data[i + 2] ^= 0x01  # 0.5 -> 0.4: still valid JSON, only the checksum can tell
    else:
        data = data[:-10]
    run.metrics_path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match=str(run.metrics_path)):
        run.open_metrics(position=pos, tensorboard=False)
    if damage == "truncate":
        with pytest.raises(CorruptFileError, match="line 3 is cut short"):
            run.read_metrics()


def test_a_garbled_metrics_line_names_file_and_line(tmp_path):
    run, _ = _new_run(tmp_path, rows=2)
    with open(run.metrics_path, "ab") as f:
        f.write(b"{not json}\n")
    with pytest.raises(CorruptFileError, match=r"metrics.jsonl: line 3 is not valid JSON"):
        run.read_metrics()
    with pytest.raises(CorruptFileError, match="line 3"):
        run.open_metrics(after_update=10, tensorboard=False)


def test_rows_need_update_and_env_steps(tmp_path):
    run, _ = _new_run(tmp_path, rows=0)
    with run.open_metrics(tensorboard=False) as m:
        with pytest.raises(ValueError, match="update"):
            m.write({"loss": 1.0})


def test_csv_eval_files_and_completion_marker(tmp_path):
    run, _ = _new_run(tmp_path, rows=3)
    with run.open_metrics(tensorboard=False) as m:
        m.write({"update": 4, "env_steps": 512, "eval/original/mean_success_rate": 0.25})
    rows = list(csv.DictReader(open(run.write_csv())))
    assert [r["update"] for r in rows] == ["1", "2", "3", "4"]
    assert rows[-1]["eval/original/mean_success_rate"] == "0.25" and rows[0]["eval/original/mean_success_rate"] == ""
    run.write_eval("final", [{"original": {"rates": [0.5]}}], markdown="| a |")
    assert run.read_eval("final")[0]["original"]["rates"] == [0.5]
    assert (run.path / "eval_final.md").read_text() == "| a |"
    with pytest.raises(ValueError, match="evaluation tag"):
        run.eval_path("../escape")
    assert run.completion() is None
    run.mark_complete(update=4)
    assert run.completion()["update"] == 4
    (run.path / COMPLETE).write_text('{"upd')
    with pytest.raises(CorruptFileError, match=COMPLETE):
        run.completion()


def _tensorboard_losses(run: RunDir) -> list[tuple[int, float]]:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run.path / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars("loss")]


def test_tensorboard_gets_the_numeric_values_and_a_resume_drops_the_steps_it_writes_again(tmp_path):
    """A resume after a crash rewrites rows past its checkpoint: TensorBoard shows each step once."""
    pytest.importorskip("tensorboard")
    run = RunDir.prepare(tmp_path / "run")
    with run.open_metrics(tensorboard=True) as m:
        for r in _rows(3):
            m.write(r)
    assert [step for step, _ in _tensorboard_losses(run)] == [128, 256, 384]
    time.sleep(1.1)  # event files are named by the second they were opened in
    with run.open_metrics(after_update=1, tensorboard=True) as m:
        m.write({**_rows(2)[1], "loss": 9.0})
    assert _tensorboard_losses(run) == [(128, 1.0), (256, 9.0)]


def test_atomic_json_write_killed_midway_leaves_the_old_file(tmp_path):
    """A writer process killed (SIGKILL) while it rewrites a JSON file: the old contents stay readable."""
    path = tmp_path / "state.json"
    atomic_write_json(path, {"version": 1})
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from agents.run.run_dir import atomic_write_json\n"
            "big = {'version': 2, 'pad': 'x' * 20_000_000}\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    atomic_write_json(%r, big)\n") % (str(ROOT), str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    import time

    time.sleep(0.3)  # mid-write with high probability (each write is 20 MB)
    proc.kill()
    proc.wait()
    data = json.loads(path.read_text())
    assert data["version"] in (1, 2)
    # a killed write may leave its temporary file (".state.json.*.tmp"), never a broken state.json
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".tmp")) == ["state.json"]


def test_provenance_takes_the_commit_declared_in_the_environment(tmp_path, monkeypatch):
    from agents.run.run_dir import provenance

    monkeypatch.delenv("OIR_GYM_SOURCE_COMMIT", raising=False)
    assert provenance(tmp_path)["git_commit"] is None  # a copy of the source without .git
    monkeypatch.setenv("OIR_GYM_SOURCE_COMMIT", "abc123")
    prov = provenance(tmp_path)
    assert prov["git_commit"] == "abc123" and prov["git_commit_from"] == "environment"
    # a copy with a .git of another commit (as on a lent GPU): the declared commit, the checkout's beside it
    inside = provenance(ROOT)
    assert inside["git_commit"] == "abc123" and inside["checkout_commit"] != "abc123"
    monkeypatch.delenv("OIR_GYM_SOURCE_COMMIT")
    plain = provenance(ROOT)  # nothing declared: the checkout's commit
    assert plain["git_commit"] == inside["checkout_commit"] and "git_commit_from" not in plain


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_run_files_take_the_users_umask_like_every_other_file(tmp_path, umask):
    """config.json, eval_*, metrics.csv, state.json, model.zip... were written owner-only (0600,
    mkstemp's mode) beside plots and logs of 0644: every atomic write now gets 0666 less the umask."""
    import os

    from agents.run.run_dir import atomic_write_bytes

    old = os.umask(umask)
    try:
        run = RunDir.prepare(tmp_path / "run")
        run.write_config({"method": "oir"})
        with run.open_metrics(tensorboard=False) as m:
            m.write({"update": 1, "env_steps": 8})
        run.write_csv()
        run.write_eval("final", [{"original": {}}], markdown="# table\n")
        atomic_write_bytes(run.path / "model.zip", b"zip")
        run.mark_complete(update=1, env_steps=8)
        (run.path / "plain.txt").write_text("as open() makes it")  # the reference: any file the user creates
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in run.path.iterdir()}
    expected = 0o666 & ~umask
    assert modes == dict.fromkeys(modes, expected), {k: oct(v) for k, v in modes.items()}
    assert set(modes) >= {"config.json", "metrics.jsonl", "metrics.csv", "eval_final.json", "eval_final.md",
                          "model.zip", "complete.json"}


def test_wandb_logs_offline_and_a_resumed_run_keeps_its_wandb_id(tmp_path, monkeypatch):
    """--wandb crashed with the wandb of today (wandb.util.generate_id is gone) right after config.json
    was written. Offline mode: the real package writes its run files under the run directory."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunDir.prepare(tmp_path / "run")
    run.write_config({"method": "oir", "lr": 1e-3})
    with run.open_metrics(tensorboard=False, wandb=True) as m:
        m.write({"update": 1, "env_steps": 64, "loss": 0.5})
        pos = m.sync()
    run_id = (run.path / "wandb" / "run_id").read_text().strip()
    assert len(run_id) == 8 and run_id.isalnum() and run_id == run_id.lower()
    offline = sorted((run.path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline and list(offline[0].glob(f"run-{run_id}.wandb"))
    with run.open_metrics(position=pos, tensorboard=False, wandb=True) as m:  # a resume: the same W&B run
        m.write({"update": 2, "env_steps": 128, "loss": 0.4})
    assert (run.path / "wandb" / "run_id").read_text().strip() == run_id
    assert [r["update"] for r in run.read_metrics()] == [1, 2]


# ----------------------------------------------------------------------------- links (issue 37.12)
@pytest.mark.parametrize("name", ["metrics.jsonl", "tb", "training.png", "checkpoints", "checkpoints/000002",
                                  "checkpoints/000002/arrays.msgpack", "eval_final.json"])
def test_a_run_file_that_is_a_link_is_refused_before_anything_is_written(tmp_path, name):
    run, _ = _new_run(tmp_path)
    (run.path / "checkpoints" / "000002").mkdir(parents=True)
    (run.path / "checkpoints" / "000002" / "arrays.msgpack").write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "target"
    path = run.path / name
    if path.is_dir():
        shutil.move(str(path), str(target))
    elif path.exists():
        path.rename(target)
    else:
        target.write_text("outside")
    path.symlink_to(target)
    before = {str(p): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()}
    with pytest.raises(RunDirError, match=rf"{path} is a symbolic link \(to {target}\): .* never through a link"):
        RunDir.prepare(run.path, resume=True)
    assert {str(p): p.read_bytes() for p in sorted(outside.rglob("*")) if p.is_file()} == before


def test_links_are_never_written_through(tmp_path):
    """Without the check of prepare: the metrics file is opened without following a link, and a
    whole file (atomic write) replaces a link instead of writing into its target."""
    outside = tmp_path / "outside.txt"
    outside.write_text("outside")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "training.png").symlink_to(outside)  # a fresh run in a folder holding a link
    with pytest.raises(RunDirError, match="training.png is a symbolic link"):
        RunDir.prepare(tmp_path / "run")
    (tmp_path / "run" / "training.png").unlink()
    run = RunDir.prepare(tmp_path / "run")
    run.metrics_path.symlink_to(outside)
    with pytest.raises(RunDirError, match="metrics.jsonl is a symbolic link"):
        run.open_metrics(tensorboard=False)
    run.eval_path("mine").symlink_to(outside)
    run.write_eval("mine", {"a": 1})
    assert not run.eval_path("mine").is_symlink() and run.read_eval("mine") == {"a": 1}
    assert outside.read_text() == "outside"
    # --overwrite removes the links (not their targets) and goes on; W&B's own links are its business
    run.write_config({"x": 1})
    again = RunDir.prepare(run.path, overwrite=True)
    assert not run.metrics_path.exists() and outside.read_text() == "outside"
    (again.path / "wandb" / "run-1").mkdir(parents=True)
    (again.path / "wandb" / "latest-run").symlink_to(again.path / "wandb" / "run-1")
    RunDir.prepare(again.path)


def test_evaluation_tags_are_checked_and_the_runs_own_are_reserved():
    from agents.run.run_dir import check_tag, check_user_tag

    assert check_tag("final") == "final" and check_tag("000004") == "000004" and check_user_tag("eps0.05") == "eps0.05"
    for tag in ("final", "000004", "12"):
        with pytest.raises(ValueError, match=rf"'{tag}' is the name of the run's own .* choose another name"):
            check_user_tag(tag)
    with pytest.raises(ValueError, match="has 65 characters; at most 64"):
        check_user_tag("a" * 65)
    for tag in ("../x", ".hidden", "a/b", ""):
        with pytest.raises(ValueError, match="may hold only letters"):
            check_user_tag(tag)


# ----------------------------------------------------------------------------- before the first checkpoint (37.13)
def test_a_run_without_checkpoints_restarts_only_when_its_files_agree(tmp_path):
    run, _ = _new_run(tmp_path, rows=2)  # rows of updates 1 and 2
    run.check_before_first_checkpoint(2, 10, run.path / "checkpoints")  # a kill before checkpoint 2 was written
    run.write_eval("000002", {})
    run.check_before_first_checkpoint(2, 10, run.path / "checkpoints")
    run.write_eval("final", {})  # the last update (10) is past the first checkpoint
    with pytest.raises(RunDirError, match=r"holds eval_final.json: the run went past its first checkpoint \(update 2\)"):
        run.check_before_first_checkpoint(2, 10, run.path / "checkpoints")
    run.check_before_first_checkpoint(2, 2, run.path / "checkpoints")  # a run of 2 updates: its final one
    with pytest.raises(RunDirError, match="holds no checkpoint, while .* holds metrics.jsonl rows up to update 2"):
        run.check_before_first_checkpoint(1, 10, run.path / "checkpoints")
    run.eval_path("final").unlink()
    run.write_eval("mine", {})  # a user's evaluation needs a checkpoint
    with pytest.raises(RunDirError, match="holds eval_mine.json"):
        run.check_before_first_checkpoint(2, 10, run.path / "checkpoints")
