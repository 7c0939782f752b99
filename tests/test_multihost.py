"""A run over several processes joined by jax.distributed (agents.run.multihost): seeds split by
process, one merged metrics file, per-process checkpoints that resume, and bad layouts refused.

The end-to-end tests start real processes on localhost (CPU, gloo collectives), as a cluster
scheduler would start one per host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from run_metrics import assert_same_seeds_metrics, read_rows

from agents.run.multihost import (
    allgather_json, check_processes, merge_evals, merge_rows, newest_common_update, process_dir, seed_slice,
)

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- pure parts
def test_seed_slices_cover_every_seed_once_in_process_order():
    assert [seed_slice(6, 3, i) for i in range(3)] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    assert seed_slice(4, 1, 0) == slice(0, 4)


def test_seeds_that_do_not_split_into_whole_seeds_per_process_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"num_seeds=3 is not divisible by the 2 processes.*--run.num-seeds 2"):
        check_processes(3, 2)
    with pytest.raises(ValueError, match=r"num_seeds=1 is not divisible by the 2 processes.*--run.num-seeds 2"):
        check_processes(1, 2)


def test_process_dirs_are_the_run_dir_alone_and_subfolders_otherwise(tmp_path):
    assert process_dir(tmp_path, 1, 0) == tmp_path
    assert process_dir(tmp_path, 2, 1) == tmp_path / "process1"


def test_allgather_in_one_process_returns_the_object_without_collectives():
    assert allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}]


def test_merge_rows_keeps_seed_columns_adds_throughput_takes_the_slowest_time_and_averages_the_rest():
    rows = [{"update": 3, "env_steps": 96, "time": 10.0, "time/update_s": 1.0, "sps": 100.0, "loss": 0.2,
             "seed0/loss": 0.1, "seed1/loss": 0.3, "eval/original/mean_success_rate": 0.5},
            {"update": 3, "env_steps": 96, "time": 12.0, "time/update_s": 0.5, "sps": 80.0, "loss": 0.4,
             "seed2/loss": 0.5, "seed3/loss": 0.3, "eval/original/mean_success_rate": 0.25}]
    out = merge_rows(rows)
    assert out == {"update": 3, "env_steps": 96, "time": 12.0, "time/update_s": 1.0, "sps": 180.0,
                   "loss": pytest.approx(0.3), "seed0/loss": 0.1, "seed1/loss": 0.3, "seed2/loss": 0.5,
                   "seed3/loss": 0.3, "eval/original/mean_success_rate": pytest.approx(0.375)}


def test_one_process_row_is_kept_as_written():
    row = {"update": 1, "env_steps": 8, "relabel/llm_calls": 16, "sps": 5.0, "flag": True}
    out = merge_rows([row])
    assert out == row and type(out["relabel/llm_calls"]) is int and out is not row


def test_rows_of_different_updates_are_not_merged():
    with pytest.raises(ValueError, match="different update"):
        merge_rows([{"update": 1, "env_steps": 8}, {"update": 2, "env_steps": 16}])


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.data())
def test_merged_seed_means_equal_the_mean_over_every_seed(procs, per, data):
    """Each process averages its own (equally many) seeds; the merged column is the mean over all
    seeds, as a one-process run would write it."""
    values = data.draw(st.lists(st.floats(-1e3, 1e3), min_size=procs * per, max_size=procs * per))
    rows = [{"update": 1, "env_steps": 8, "x": sum(values[p * per:(p + 1) * per]) / per,
             **{f"seed{p * per + i}/x": values[p * per + i] for i in range(per)}} for p in range(procs)]
    out = merge_rows(rows)
    assert out["x"] == pytest.approx(sum(values) / len(values), abs=1e-9)
    assert [out[f"seed{g}/x"] for g in range(procs * per)] == values


def test_the_run_resumes_from_the_newest_checkpoint_every_process_holds():
    assert newest_common_update([[2, 4], [2]]) == 2  # process 1 stopped before its save of update 4
    assert newest_common_update([[4, 6], [2, 4]]) == 4
    assert newest_common_update([[6, 8], [2, 4]]) is None  # nothing shared: the run starts again
    assert newest_common_update([[], [2]]) is None and newest_common_update([[3, 5]]) == 5


def test_merge_evals_concatenates_in_process_order():
    assert merge_evals([[{"s": 0}, {"s": 1}], [{"s": 2}]]) == [{"s": 0}, {"s": 1}, {"s": 2}]


# ----------------------------------------------------------------------------- real processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], processes: int) -> list[subprocess.Popen]:
    """examples/train_pqn.py ``args`` in ``processes`` processes joined on localhost (1: no join), running."""
    port = _free_port()
    procs = []
    for i in range(processes):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
        env.pop("XLA_FLAGS", None)
        if processes > 1:
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes),
                       JAX_PROCESS_ID=str(i))
        procs.append(subprocess.Popen([sys.executable, "examples/train_pqn.py", *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT)))
    return procs


def _train(args: list[str], processes: int, timeout: int = 600) -> list[subprocess.CompletedProcess]:
    """examples/train_pqn.py ``args`` in ``processes`` processes joined on localhost (1: no join)."""
    procs = _start(args, processes)
    out = []
    try:
        for p in procs:
            so, se = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
    finally:  # a timeout or a failed test leaves no process behind
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


SMOKE = ["smoke", "--no-progress", "--run.method", "oir", "--oir.relabeler", "rules", "--run.num-seeds", "2"]


@pytest.mark.slow  # five training processes, two at a time, each compiling: 3-4 min on 2 cores
def test_two_processes_train_the_seeds_of_one_process_and_resume_from_their_own_checkpoints(tmp_path):
    """OIR (rules), 2 seeds: 2 processes of 1 seed each, stopped after 2 of 4 updates and resumed,
    against one uninterrupted process of 2 seeds.

    Measured: every rollout metric (episodes, successes, rewards, relabeled rows, epsilon) is
    identical; losses agree to ~1e-7 relative (a batch of two seeds' matmuls against one, as on 2
    devices); the greedy evaluation can flip one episode (an argmax between near-equal Q-values).
    Per-process ratios and run totals (relabel/grounded_frac, relabel/new_instructions: texts new to
    that process's buffers, the diversity/* of the buffer offers, relabel/*_total) are merged as means
    over processes, so they are not compared."""
    one, two = tmp_path / "one", tmp_path / "two"
    (ref,) = _train([*SMOKE, "--run-dir", str(one)], 1)
    assert ref.returncode == 0, ref.stderr[-3000:]
    first = _train([*SMOKE, "--run-dir", str(two), "--max-updates", "2"], 2)
    for r in first:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "stopped (--max-updates 2) at update 2/4" in first[0].stdout
    assert "[    1/4]" not in first[1].stdout  # process 0 alone prints progress
    resumed = _train(["--run-dir", str(two), "--resume", "--no-progress"], 2)
    for r in resumed:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from update 2" in resumed[0].stdout
    # per-process checkpoints and files; the run's merged ones at the top
    for p in (0, 1):
        assert sorted(os.listdir(two / f"process{p}" / "checkpoints")) == ["000002", "000004"]
        assert (two / f"process{p}" / "diversity.json").exists()
    assert (two / "complete.json").exists() and (two / "training.png").exists()
    assert len(json.loads((two / "eval_final.json").read_text())) == 2  # both seeds' results
    rows = [read_rows(d) for d in (one, two)]
    assert [r["update"] for r in rows[1]] == [1, 2, 3, 4]  # the resume wrote each update once
    assert_same_seeds_metrics(*rows, skip=lambda k: k in ("relabel/grounded_frac", "relabel/new_instructions")
                              or k.startswith("diversity/") or k.endswith("_total"))


def test_a_seed_count_the_processes_cannot_split_is_refused_by_every_process(tmp_path):
    out = _train([*SMOKE, "--run.num-seeds", "3", "--run-dir", str(tmp_path / "r")], 2, timeout=300)
    for r in out:
        assert r.returncode == 2
        assert "num_seeds=3 is not divisible by the 2 processes" in r.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was written


@pytest.mark.slow
def test_a_lost_process_ends_the_others_in_one_line_and_the_run_resumes_where_every_process_can(tmp_path):
    """Issue 30.10: process 1 is SIGKILLed mid-run. Process 0 ends within seconds with one line
    (it used to wait for the heartbeat timeout, about 100 s, and abort with a C++ stack dump).
    The processes can hold different checkpoints (here process 1 lost its newest, as when it dies
    between its save and the others'); --resume continues both from the newest one both hold
    (it used to refuse until the newer ones were deleted by hand) and every update is logged once."""
    run = tmp_path / "run"
    procs = _start([*SMOKE, "--run.total-timesteps", str(8 * 64), "--run.checkpoint-every", "1",
                    "--run-dir", str(run)], 2)
    try:
        for line in procs[0].stdout:  # process 0 prints the run's progress
            if line.startswith("[    3/8]"):
                break
        procs[1].kill()
        killed = time.time()
        _, err = procs[0].communicate(timeout=300)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert procs[0].returncode == 3 and time.time() - killed < 60, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: process 0 of 2: another process of this run stopped") and "--resume" in last
    assert "Traceback" not in err and "stack trace" not in err
    held = [sorted(int(n) for n in os.listdir(run / f"process{p}" / "checkpoints") if n.isdigit()) for p in (0, 1)]
    if held[1][-1] >= held[0][-1] and len(held[1]) > 1:  # process 1 one checkpoint behind process 0
        import shutil

        shutil.rmtree(run / "process1" / "checkpoints" / f"{held[1][-1]:06d}")
        held[1] = held[1][:-1]
    common = newest_common_update(held)
    assert common is not None and common < held[0][-1], held
    resumed = _train(["--run-dir", str(run), "--resume", "--no-progress"], 2)
    for r in resumed:
        assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from update {common} " in resumed[0].stdout
    assert f"process0/checkpoints/{held[0][-1]:06d}: not every process of the run reached it" in resumed[0].stdout
    assert [r["update"] for r in read_rows(run)] == list(range(1, 9))
    assert (run / "complete.json").exists()
    for p in (0, 1):
        assert sorted(os.listdir(run / f"process{p}" / "checkpoints")) == ["000007", "000008"]


_FAILS_AT_START = """
import os, runpy, sys
import agents.pqn.recipe as train
if os.environ["JAX_PROCESS_ID"] == "0":  # injected fault: process 0's start raises
    build = train.PQNRecipe.build
    def failing_build(self, *a, **k):
        trainer = build(self, *a, **k)
        def init_state():
            raise RuntimeError("injected: the initial state failed")
        trainer.init_state = init_state
        return trainer
    train.PQNRecipe.build = failing_build
sys.argv = ["examples/train_pqn.py", *sys.argv[1:]]
runpy.run_path("examples/train_pqn.py", run_name="__main__")
"""


@pytest.mark.slow  # two processes importing and building their trainers: about 10 s on 2 cores
def test_an_unexpected_error_in_one_process_ends_every_process(tmp_path):
    """An error no test of the run's inputs catches (here injected: process 0's initial state raises;
    on a 4 x H200 machine a compile failed with "Failed to launch ptxas") ends the process at once
    with its traceback and one line, and the other process stops too: the failing process used to
    wait at jax.distributed's exit barrier while the others waited for it (a hang)."""
    port = _free_port()
    procs = []
    for i in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "JAX_NUM_PROCESSES": "2",
               "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAX_PROCESS_ID": str(i)}
        env.pop("XLA_FLAGS", None)
        procs.append(subprocess.Popen([sys.executable, "-c", _FAILS_AT_START, *SMOKE, "--run-dir", str(tmp_path / "r")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT)))
    try:
        out = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    err0 = out[0][1]
    assert procs[0].returncode == 1, err0[-3000:]
    assert "RuntimeError: injected: the initial state failed" in err0
    assert err0.strip().splitlines()[-1].startswith("error: process 0 of 2 failed (above)")
    assert procs[1].returncode != 0, out[1][1][-3000:]
