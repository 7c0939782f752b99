"""The program cache: compiled programs stored, loaded in a new cache object without tracing, keyed by
everything they are built from, and a bad entry compiled again. On the CPU the trainer leaves it off
(``ProgramCache.from_jax_config``), so these tests build caches on a folder directly, on small programs
compiled fresh (JAX's persistent cache keeps only programs that take over a second to compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training.train_state import TrainState

from agents.pqn.program_cache import ProgramCache, signature


def traced_counter():
    calls = {"n": 0}

    def f(x, y):
        calls["n"] += 1  # runs once per trace
        return {"sum": x + y, "prod": x * y}

    return f, calls


SCRIPT = """
import json, sys
import jax, jax.numpy as jnp, optax
from flax.training.train_state import TrainState
from agents.pqn.program_cache import ProgramCache

traces = []

def f(x, y):
    traces.append(1)
    return {"sum": x + y, "prod": x * y}

def step(ts, g):
    traces.append(1)
    return ts.apply_gradients(grads={"w": g}), jnp.sum(g)

tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
state = TrainState.create(apply_fn=None, params={"w": jnp.ones(3)}, tx=tx)
cache = ProgramCache(sys.argv[1], context="c")
x, y = jnp.arange(4.0), jnp.ones(4)
program = cache.wrap(jax.jit(f), "f")
shape = program.eval_shape(x, y)["sum"].shape
out = program(x, y)
new_state, total = cache.wrap(jax.jit(step), "step")(state, jnp.full(3, 0.5))
print(json.dumps({"loaded": cache.loaded, "compiled": cache.compiled, "traces": len(traces), "shape": shape,
                  "prod": out["prod"].tolist(), "w": new_state.params["w"].tolist(), "same_tx": new_state.tx is tx,
                  "summary": cache.summary()}))
"""


def run_fresh(tmp_path) -> dict:
    """The script in a new interpreter (jaxlib 0.10's CPU executables load reliably only in another process)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "programs")], capture_output=True, text=True,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stored_programs_load_in_a_new_process_without_tracing_and_give_the_same_outputs(tmp_path):
    first = run_fresh(tmp_path)
    assert first["compiled"] == ["f", "step"] and first["loaded"] == [] and first["traces"] >= 2
    assert len(list((tmp_path / "programs").glob("*.bin"))) == 2
    second = run_fresh(tmp_path)
    assert second["loaded"] == ["f", "step"] and second["compiled"] == []
    assert second["traces"] == 0, "loading must not trace the functions"
    # a train state's optimiser functions are not picklable: the stored structures refer to the arguments'
    assert second["same_tx"] and second["w"] == first["w"] and second["prod"] == first["prod"] == [0, 1, 2, 3]
    assert second["shape"] == [4] and second["summary"] == "2 programs loaded from the program cache, 0 compiled"


@pytest.mark.parametrize("change", ["context", "shape", "dtype", "static", "name", "xla_flags"])
def test_anything_a_program_is_built_from_gives_another_entry(tmp_path, change, monkeypatch):
    f, _ = traced_counter()
    g = lambda x, y, n: f(x, y * n)  # noqa: E731
    ProgramCache(tmp_path, context="c").wrap(jax.jit(g, static_argnums=2), "f", (2,))(jnp.ones(3), jnp.ones(3), 2)
    args = {"shape": (jnp.ones(4), jnp.ones(4), 2), "dtype": (jnp.ones(3, jnp.int32), jnp.ones(3, jnp.int32), 2),
            "static": (jnp.ones(3), jnp.ones(3), 3)}.get(change, (jnp.ones(3), jnp.ones(3), 2))
    if change == "xla_flags":
        monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=/nonexistent")
    cache = ProgramCache(tmp_path, context="other" if change == "context" else "c")
    out = cache.wrap(jax.jit(g, static_argnums=2), "g" if change == "name" else "f", (2,))(*args)
    assert cache.compiled and not cache.loaded and len(list(tmp_path.glob("*.bin"))) == 2
    np.testing.assert_array_equal(out["sum"], args[0] + args[1] * args[2])


def test_signature_ignores_object_addresses_but_not_shapes():
    """Two optimisers built alike (their functions at other addresses, as in another process) sign alike."""
    def state(n, tx):
        return TrainState.create(apply_fn=None, params={"w": jnp.ones(n)}, tx=tx)

    a, b = optax.adam(1e-3), optax.adam(1e-3)
    assert a.init is not b.init
    assert signature((state(2, a),)) == signature((state(2, b),))
    assert signature((state(2, a),)) != signature((state(3, a),))
    assert signature((state(2, a),)) != signature((state(2, optax.sgd(1e-3)),))


def test_an_entry_that_does_not_load_is_compiled_again_replaced_and_logged(tmp_path):
    f, _ = traced_counter()
    ProgramCache(tmp_path).wrap(jax.jit(f), "f")(jnp.ones(2), jnp.ones(2))
    (entry,) = tmp_path.glob("f-*.bin")
    entry.write_bytes(b"not a program")
    messages: list[str] = []
    cache = ProgramCache(tmp_path, log=messages.append)
    out = cache.wrap(jax.jit(f), "f")(jnp.ones(2), jnp.ones(2))
    np.testing.assert_array_equal(out["sum"], [2.0, 2.0])
    assert cache.compiled == ["f"] and "did not load" in messages[0] and entry.name in messages[0]
    assert entry.read_bytes() != b"not a program"  # replaced by the fresh compile


def test_an_inactive_cache_stores_nothing_and_the_trainer_leaves_it_off_on_the_cpu(tmp_path, monkeypatch):
    f, _ = traced_counter()
    jitted = jax.jit(f)
    cache = ProgramCache(None)
    assert cache.wrap(jitted, "f") is jitted and cache.summary() == ""
    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    try:
        assert ProgramCache.from_jax_config().folder is None  # this suite runs on the CPU
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        assert ProgramCache.from_jax_config().folder == tmp_path / "programs"
        assert ProgramCache.from_jax_config(devices=2).folder is None  # programs over several devices
        monkeypatch.setenv("OIR_GYM_PROGRAM_CACHE", "0")
        assert ProgramCache.from_jax_config().folder is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_calls_inside_another_trace_run_the_function_itself(tmp_path):
    f, _ = traced_counter()
    program = ProgramCache(tmp_path).wrap(jax.jit(f), "f")
    out = jax.eval_shape(lambda x: program(x, x), jax.ShapeDtypeStruct((5,), jnp.float32))
    assert out["sum"].shape == (5,) and not list(tmp_path.glob("*.bin"))


def test_prune_removes_the_least_recently_used_entries_first(tmp_path):
    for i, name in enumerate(["old", "mid", "new"]):
        path = tmp_path / f"{name}.bin"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    ProgramCache(tmp_path).prune(max_bytes=200)
    assert sorted(p.stem for p in tmp_path.glob("*.bin")) == ["mid", "new"]


def test_a_program_that_cannot_be_stored_still_runs_and_leaves_no_partial_file(tmp_path):
    """An output holding a function that is not among the arguments (here a new lambda) cannot be pickled."""
    messages: list[str] = []
    cache = ProgramCache(tmp_path, log=messages.append)
    out = cache.wrap(jax.jit(lambda x: TrainState.create(apply_fn=lambda p: p, params=x, tx=optax.sgd(0.1))),
                     "init")(jnp.ones(2))
    np.testing.assert_array_equal(out.params, [1.0, 1.0])
    assert cache.compiled == ["init"] and "was not stored" in messages[0]
    assert list(tmp_path.iterdir()) == []


def test_prepare_compiles_and_stores_a_cached_program_and_runs_a_plain_one_once(tmp_path):
    from agents.pqn.program_cache import prepare

    cache = ProgramCache(tmp_path)
    prepare(cache.wrap(jax.jit(lambda x: x + 1), "f"), jnp.ones(2))
    assert cache.compiled == ["f"] and len(list(tmp_path.glob("f-*.bin"))) == 1
    ran: list[int] = []  # a host callback: such a program cannot be stored, and shows that it ran
    prepare(jax.jit(lambda x: jax.debug.callback(lambda: ran.append(1)) or x + 1), jnp.ones(2))
    jax.effects_barrier()
    assert ran == [1]


def test_prepare_waits_between_the_trace_and_the_compile_and_not_for_a_held_program(tmp_path):
    """``wait`` keeps a compile off a busier one (the trainer's evaluation waits for its rollout's compile)."""
    from agents.pqn.program_cache import prepare

    cache = ProgramCache(tmp_path)
    f, calls = traced_counter()
    program = cache.wrap(jax.jit(f), "f")
    seen: list[tuple[int, list[str]]] = []
    prepare(program, jnp.ones(2), jnp.ones(2), wait=lambda: seen.append((calls["n"], list(cache.compiled))))
    assert seen == [(1, [])] and cache.compiled == ["f"]  # traced, not yet compiled, when it waited
    prepare(program, jnp.ones(2), jnp.ones(2), wait=lambda: seen.append((-1, [])))
    assert len(seen) == 1  # held: nothing to compile, nothing to wait for
    order: list[str] = []
    prepare(jax.jit(lambda x: jax.debug.callback(lambda: order.append("ran")) or x), jnp.ones(2),
            wait=lambda: order.append("waited"))
    jax.effects_barrier()
    assert order == ["waited", "ran"]
