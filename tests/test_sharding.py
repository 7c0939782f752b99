"""Device layouts for seeds and envs (agents.pqn.sharding, run.num_devices): refused before compiling or
writing anything, placed by axis, and a run over 2 devices matching the same seeds on 1 device.

Several devices on a CPU need ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` set before JAX
starts, so those tests run a child Python process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from run_metrics import assert_same_seeds_metrics, read_rows

from agents.pqn.config import preset
from agents.pqn.sharding import check_layout, make_mesh, shard_leading

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str, devices: int = 2, timeout: int = 600, env: dict | None = None) -> str:
    """Run ``code`` in a fresh Python with ``devices`` virtual CPU devices; return its stdout. The child
    uses the test session's JAX compilation cache folder (the same programs, compiled once)."""
    cache = {"JAX_COMPILATION_CACHE_DIR": str(jax.config.jax_compilation_cache_dir)} \
        if jax.config.jax_compilation_cache_dir else {}
    full = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT), **cache, **(env or {})}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout, env=full, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("seeds, envs, devices, visible, match", [
    (3, 8, 2, 2, "num_seeds=3 is not divisible by num_devices=2"),
    (2, 8, 4, 2, "only 2 device"),
    (1, 7, 2, 2, "num_envs=7 is not divisible by 2"),
    (3, 8, 4, 4, "4 is not a multiple of 3"),
    (1, 8, 0, 2, "must be >= 1"),
])
def test_bad_layouts_are_refused_with_the_numbers(seeds, envs, devices, visible, match):
    with pytest.raises(ValueError, match=match):
        check_layout(seeds, envs, devices, visible)


def test_good_layouts_pass():
    check_layout(6, 64, 2, 2)
    check_layout(1, 64, 2, 2)
    check_layout(1, 7, 1, 1)


@pytest.mark.parametrize("changes, match", [
    ({"run.num_seeds": 3, "run.num_devices": 2}, r"num_seeds=3 is not divisible by num_devices=2.*--run.num-devices 1"),
    ({"run.num_seeds": 1, "pqn.num_envs": 6, "pqn.num_minibatches": 2, "run.num_devices": 4},
     "num_envs=6 is not divisible by 4"),
    ({"run.num_devices": -1}, "run.num_devices=-1 must be >= 0"),
])
def test_config_validation_refuses_a_layout_that_cannot_divide(changes, match):
    # the script validates before it writes anything (examples/train_pqn.py main)
    with pytest.raises(ValueError, match=match):
        preset("smoke").replace(**changes).validate()


def test_trainer_refuses_more_devices_than_visible_before_writing(tmp_path):
    from agents.pqn.trainer import Trainer

    n = len(jax.devices())
    cfg = preset("smoke").replace(**{"run.num_seeds": n + 1, "run.num_devices": n + 1, "pqn.num_envs": 4})
    with pytest.raises(ValueError, match=f"only {n} device"):
        Trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_script_refuses_a_bad_layout_before_writing(tmp_path, capsys):
    from agents.pqn import recipe

    rc = recipe.pqn_main(["smoke", "--run-dir", str(tmp_path / "run"), "--run.num-seeds", "3", "--run.num-devices", "2"])
    assert rc == 2 and "num_seeds=3 is not divisible by num_devices=2" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- placement
def test_shard_leading_places_seed_and_env_axes():
    mesh = make_mesh(1)
    tree = {"params": jnp.zeros((3, 5)), "envs": jnp.zeros((12, 2)), "pool": jnp.zeros((7,)), "key": jnp.zeros(())}
    out = shard_leading(tree, mesh, sizes=(3, 12))
    assert out["params"].sharding.spec == jax.sharding.PartitionSpec("devices")
    assert out["pool"].sharding.spec == jax.sharding.PartitionSpec()


@pytest.mark.slow  # ~50 s on 2 loaded cores: three trainers compile their env reset
def test_trainer_splits_seeds_or_envs_over_two_devices_and_restore_reshards(tmp_path):
    """2 virtual CPU devices: 2 seeds put one seed (and its envs) on each device; 1 seed keeps its
    parameters on both and splits its envs; a checkpoint restored into a 2-device trainer is split again."""
    out = _child(f"""
        import jax, json
        from agents.pqn.config import preset
        from agents.pqn.trainer import Trainer
        def layout(tr):
            p = jax.tree_util.tree_leaves(tr.train_state.params)[0]
            instr = tr.runner[0].env.instr
            return dict(n=tr.num_devices, params=[s.data.shape[0] for s in p.addressable_shards],
                        envs=[s.data.shape[0] for s in instr.addressable_shards],
                        devices=len(p.sharding.device_set))
        res = {{}}
        base = preset("smoke").replace(**{{"run.method": "gt", "pqn.num_envs": 4}})
        tr = Trainer(base.replace(**{{"run.num_seeds": 2}}), {str(tmp_path / 'a')!r})
        tr.init_state(); res["two_seeds"] = layout(tr); tr.save(); tr.close()
        tr = Trainer(base.replace(**{{"run.num_seeds": 1}}), {str(tmp_path / 'b')!r})
        tr.init_state(); res["one_seed"] = layout(tr); tr.close()
        # 1 seed saved on 1 device (1 env block) resumes on 2 devices (2 blocks) and trains on
        one = base.replace(**{{"run.num_seeds": 1, "run.num_devices": 1}})
        tr = Trainer(one, {str(tmp_path / 'c')!r}); tr.init_state(); tr.save(); tr.close()
        tr = Trainer(base.replace(**{{"run.num_seeds": 1}}), {str(tmp_path / 'c')!r}); tr.load()
        res["one_to_two"] = [layout(tr), tr.iteration().env_steps]; tr.close()
        tr = Trainer(base.replace(**{{"run.num_seeds": 2}}), {str(tmp_path / 'a')!r})
        tr.load(); res["restored"] = layout(tr); tr.close()
        print(json.dumps(res))
    """)
    res = json.loads(out.strip().splitlines()[-1])
    assert res["two_seeds"] == {"n": 2, "params": [1, 1], "envs": [4, 4], "devices": 2}
    assert res["one_seed"] == {"n": 2, "params": [1, 1], "envs": [2, 2], "devices": 2}  # params replicated
    assert res["restored"] == res["two_seeds"]
    assert res["one_to_two"][0] == res["one_seed"] and res["one_to_two"][1] > 0


@pytest.mark.slow  # 2-4 min on 2 cores (a fresh process compiling a 2-device trainer); the default suite runs 2 devices in the stored pair below
def test_the_rollout_runs_as_one_program_per_device_with_no_traffic_between_them(tmp_path):
    """2 seeds on 2 (virtual) devices: the rollout (the 128-step scan, most of a run's time) is two
    single-device executables, one per device, whose compiled code holds no collective operation, so
    each device runs its seeds without waiting for the other. Left to GSPMD the one program had an
    all-reduce and collective-permutes at every env step (the shared world pool, one rollout key,
    the any-env-finished branch), and two H100s ran no faster than one."""
    out = _child(f"""
        import re, jax
        from agents.pqn.config import preset
        from agents.pqn.trainer import Trainer
        cfg = preset("smoke").replace(**{{"run.method": "gt", "pqn.num_envs": 4, "pqn.num_steps": 4, "run.num_seeds": 2,
                                          "pqn.num_minibatches": 1}})
        tr = Trainer(cfg, {str(tmp_path / "run")!r})
        tr.init_state()
        log = tr.iteration()
        exes = tr.programs.rollout.compiled
        ops = [re.findall(r"\\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(?:-start)?\\(",
                          e.as_text()) for e in exes.values()]
        devs = sorted(d.id for d in exes)
        # each device's program is started from its own thread (a GPU program with host-driven
        # control flow holds the thread that starts it, so one thread would run the devices in turn)
        import threading
        seen = []
        for d, exe in list(exes.items()):
            exes[d] = lambda *a, _exe=exe: (seen.append(threading.current_thread().name), _exe(*a))[1]
        tr.iteration()
        threads = len(set(seen)) == 2 and threading.current_thread().name not in seen
        print(tr.num_devices, devs, sum(map(len, ops)), log.env_steps, threads)
    """)
    assert out.split()[-6:] == ["2", "[0,", "1]", "0", "16", "True"], out


# ----------------------------------------------------------------------------- same metrics
#: The metrics rows of the 1-device side of the pair below, stored so that the default suite runs
#: only the 2-device side. Regenerate after a change to what the smoke run computes or logs:
#: ``OIR_GYM_WRITE_REFERENCES=1 python -m pytest -m slow tests/test_sharding.py -k one_device``.
ONE_DEVICE_ROWS = ROOT / "tests" / "data" / "sharding_smoke_oir_2seeds_1device.jsonl"


def _smoke_on_devices(tmp_path: Path, devices: tuple[int, ...]) -> list[list[dict]]:
    """The smoke preset, OIR (rules), 2 seeds, through train_pqn in a child with 2 virtual CPU devices,
    on each number of ``devices`` (run dirs ``tmp_path/d<n>``); their metrics rows."""
    _child(f"""
        from agents.pqn import recipe
        for nd in {devices!r}:
            rc = recipe.pqn_main(["smoke", "--run-dir", f"{tmp_path}/d{{nd}}", "--no-progress", "--run.method", "oir",
                                 "--oir.relabeler", "rules", "--run.num-seeds", "2", "--run.num-devices", str(nd)])
            assert rc == 0, rc
    """, timeout=900)
    return [read_rows(tmp_path / f"d{nd}") for nd in devices]


def _stored_one_device_rows() -> list[dict]:
    return [json.loads(line) for line in ONE_DEVICE_ROWS.read_text().splitlines()]


def test_two_devices_give_the_metrics_of_the_stored_one_device_run(tmp_path):
    """The pair below with its 1-device side read from ``ONE_DEVICE_ROWS`` (issue 15 asks for the
    comparison in CI; the whole pair, and the check that the stored side is still what the code
    computes, run under ``-m slow``). A failure after a deliberate change to the smoke run's
    metrics: regenerate the file (see ``ONE_DEVICE_ROWS``)."""
    (two,) = _smoke_on_devices(tmp_path, (2,))
    assert_same_seeds_metrics(_stored_one_device_rows(), two)


@pytest.mark.slow  # ~100 s on 2 cores; the default suite compares the 2-device run with the stored 1-device rows
def test_two_devices_give_the_metrics_of_one_device(tmp_path):
    """The smoke preset, OIR with the rule relabeler, 2 seeds, through examples/train_pqn.py on 1 and
    on 2 (virtual CPU) devices.

    Not bitwise equal: on 2 devices each device multiplies one seed's matrices instead of a batch of
    two, and XLA's CPU kernels round differently (losses differ in the 7th significant digit from
    the second update on). Measured: every rollout metric (episodes, successes, rewards, relabeled
    rows, epsilon) was identical over the 4 updates; losses agreed to ~1e-7 relative; the greedy
    evaluation flipped one of 66 episodes of one seed (an argmax between near-equal Q values). So
    rollout metrics are compared exactly, losses to rtol 1e-4, evaluation successes to 1/20.

    With ``OIR_GYM_WRITE_REFERENCES=1`` it writes the 1-device rows to ``ONE_DEVICE_ROWS``; otherwise
    it checks that the stored rows are still those of the 1-device run.
    """
    rows = _smoke_on_devices(tmp_path, (1, 2))
    assert len(rows[0]) == 4
    assert_same_seeds_metrics(*rows)
    if os.environ.get("OIR_GYM_WRITE_REFERENCES") == "1":
        ONE_DEVICE_ROWS.write_text((tmp_path / "d1" / "metrics.jsonl").read_text())
    assert_same_seeds_metrics(_stored_one_device_rows(), rows[0])


# ----------------------------------------------------------------------------- multi-host
def test_two_processes_share_one_mesh_through_jax_distributed():
    """Two processes on localhost, one CPU device each, joined by jax.distributed (gloo collectives):
    the mesh spans both, each holds its half of a seed-split array, and a jitted reduction sees all."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent("""
        import jax, numpy as np
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        from agents.run.multihost import initialize_distributed
        from agents.pqn.sharding import make_mesh, shard_leading
        assert initialize_distributed()
        mesh = make_mesh()
        x = shard_leading({"a": np.arange(8.0).reshape(4, 2), "b": np.ones(3)}, mesh, sizes=(4,))
        total = jax.jit(lambda t: t["a"].sum() + t["b"].sum())(x)
        print(len(jax.devices()), len(jax.local_devices()), x["a"].addressable_shards[0].data.shape[0], float(total))
        jax.distributed.shutdown()
    """)
    procs = []
    for i in range(2):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT), "JAX_COORDINATOR_ADDRESS":
               f"127.0.0.1:{port}", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(i)}
        env.pop("XLA_FLAGS", None)
        procs.append(subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=str(ROOT)))
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (so, se) in zip(procs, outs):
        assert p.returncode == 0, se[-3000:]
        assert so.split()[-4:] == ["2", "1", "2", "31.0"]


def test_relayout_runner_fits_an_old_or_other_block_layout():
    """A checkpoint's runner with one rollout key, a scalar cursor and one pool (written before env
    blocks existed) is fitted to 2 blocks: keys re-split, cursors at 0, pool worlds reused in order."""
    from agents.pqn.trainer import relayout_runner

    old = {"0": {"env": {"x": np.arange(8)}, "pool": {"map": np.arange(5 * 2).reshape(5, 2)}, "cursor": np.int32(3)},
           "1": {}, "2": {}, "3": np.zeros(8, bool), "4": np.asarray(jax.random.PRNGKey(4))}
    new = relayout_runner(old, blocks=2, pool_per_block=4)
    assert new["4"].shape == (2, 2) and not np.array_equal(new["4"][0], new["4"][1])
    assert new["0"]["cursor"].tolist() == [0, 0]
    np.testing.assert_array_equal(new["0"]["pool"]["map"][:, 0], [0, 2, 4, 6, 8, 0, 2, 4])
    np.testing.assert_array_equal(new["0"]["env"]["x"], old["0"]["env"]["x"])
    assert relayout_runner(new, blocks=2, pool_per_block=4) is new  # already fits: untouched


def test_placeholder_keeps_shape_dtype_weak_type_and_sharding():
    """Compiling ahead runs programs on placeholder zeros: a leaf that differs from the real array in
    weak type or placement would compile the program a second time."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from agents.pqn.sharding import make_mesh, placeholder

    mesh = make_mesh(1)
    real = {"step": jnp.broadcast_to(jnp.asarray(0), (2,)), "x": jnp.ones((2, 3), jnp.float32),
            "placed": jax.device_put(jnp.ones((4,), jnp.int8), NamedSharding(mesh, PartitionSpec()))}
    shapes = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                                                   sharding=a.sharding), real)
    out = placeholder(shapes)
    for k, a in real.items():
        assert (out[k].shape, out[k].dtype, out[k].weak_type) == (a.shape, a.dtype, a.weak_type), k
        assert not out[k].any()
    assert out["placed"].sharding == real["placed"].sharding
