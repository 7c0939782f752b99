"""Shared fixtures of the environment tests.

Compiling the batched Craftax step takes tens of seconds on a small CPU, so the tests share a
few env instances built once per session, all with ``NUM_ENVS`` envs (one compiled program per
configuration; the JAX persistent compilation cache switched on below makes a
second instance of the same configuration cheap). Tests that need a particular situation edit
the Craftax state of the shared env (:class:`Scene`) instead of searching for a world.

Training a PQN ``Trainer`` first traces its programs (10-15 s even with a warm cache; a second
trainer of the same program configuration in the process shares them: ``agents.pqn.trainer.trainer_programs``),
so the training tests share one trained smoke trainer (:func:`smoke_trainer`) and one finished
smoke run directory (:func:`smoke_run`) per session.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# one BLAS thread per process (numpy's OpenBLAS: the numpy encoder; inherited by child processes):
# the suite's workers already fill the cores, and idle BLAS threads spin (the encoder's matmuls took
# twice the CPU time of one thread for the same wall time on 2 cores)
for _blas in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_blas, "1")

# cache every compiled program, not only those over JAX's 1 s (inherited by child processes): the
# suite compiles hundreds of sub-second programs, and loading them took half the CPU time of
# compiling them (tests/test_pqn.py + test_env_scripted.py: 104 -> 55 s of CPU on a warm cache)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import oir_gym  # noqa: E402  (registers the env id)
from oir_gym.captions import EVENT_NAMES  # noqa: E402
from oir_gym.craftax_compat import Action, BlockType  # noqa: E402

oir_gym.enable_compilation_cache()

ROOT = Path(__file__).resolve().parents[1]
#: Number of envs of every shared vector env (one compiled program).
NUM_ENVS = 4
#: Where hand-built scenes put the player (the centre of Craftax-Classic's 64x64 map).
CENTER = (32, 32)
EV = {name: i for i, name in enumerate(EVENT_NAMES)}
A = Action
B = BlockType


# --------------------------------------------------------------------------- test order and workers

#: Files whose tests train whole runs or trainers (tens of seconds each), started first: with
#: several pytest-xdist workers (``-n``, set in pyproject.toml), a long test left for the end keeps
#: one worker busy while the others idle.
HEAVY_FILES = ("test_sharding.py", "test_train_pqn.py", "test_docs_snippets.py", "test_no_run_lost.py", "test_ellm.py",
               "test_sb3_train.py", "test_relabel_transformers.py", "test_batch_composition.py", "test_oir_grounding.py")


#: Files whose tests train PQN runs in the test process: each file's tests run on one pytest-xdist
#: worker (``--dist loadgroup``), so those of equal program configurations share their compiled
#: programs (:func:`agents.pqn.trainer.trainer_programs`: a smoke run's second trainer starts in a second
#: instead of tracing for 10-15 s). The tests of the live smoke trainer (:func:`smoke_trainer`) run
#: on one worker too, which builds it once.
PQN_FILES = ("test_train_pqn.py", "test_no_run_lost.py", "test_eval_only.py", "test_oracle.py", "test_run_trust.py", "test_oir_grounding.py",
             "test_batch_composition.py", "test_methods.py")

#: Costly fixtures built once per worker (a session or module scope): their tests run on one worker,
#: which builds them once (the Gemma backend takes about 12 s to load, the evaluator 25 s to compile).
SHARED_FIXTURES = ("tf_backend", "jax_eval")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks set here
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept otherwise
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "smoke_trainer" in names:
            item.add_marker(pytest.mark.xdist_group("smoke_trainer"))
        elif shared := next((f for f in SHARED_FIXTURES if f in names), None):
            item.add_marker(pytest.mark.xdist_group(shared))
        elif item.path.name in PQN_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: for the whole suite, one worker per core and one more, at most 4 (part of the
    suite waits on child processes, servers and deadlines, which the extra worker fills; each
    worker builds the session fixtures below: on 2 cores, 3 workers took 410 s where 2 took 443);
    none (in process) when the command line names test files or tests, where starting workers
    would cost more than it saves."""
    if any(Path(str(arg).split("::")[0]).is_file() for arg in config.args):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores + 1))


@pytest.fixture(scope="session")
def encoder():
    """The packaged all-MiniLM-L6-v2 encoder, loaded once (offline)."""
    return oir_gym.get_encoder()


@pytest.fixture(scope="session")
def _venv_session(encoder):
    from oir_gym.vector_env import InstructionCraftax

    env = InstructionCraftax(num_envs=NUM_ENVS, seed=0, encoder=encoder, render_mode="rgb_array")
    env.reset(seed=0)
    yield env
    env.close()


@pytest.fixture
def venv(_venv_session):
    """The shared same-step vector env (4 envs, defaults otherwise), reset, nothing pinned.

    Tests may pin instructions, swap the buffer or edit the state: it is all undone here.
    """
    env = _venv_session
    buffer = env.buffer
    env.reset(seed=0, options={"instruction": None})
    yield env
    env.buffer = buffer
    env.reset(seed=0, options={"instruction": None})


# --------------------------------------------------------------------------- shared PQN training


def tiny(**changes):
    """The smoke preset (4 envs x 16 steps, LSTM 32, K=2, rule relabeler) for 6 updates, no periodic
    evaluation or checkpoint; ``changes`` are dotted fields, e.g. ``tiny(**{"run.method": "gt"})``."""
    from agents.pqn.config import preset

    return preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "rules", "run.total_timesteps": 4 * 16 * 6,
                                      "eval.every": 1000, "run.checkpoint_every": 1000, **changes})


#: The shared smoke trainer's configuration: two seeds (so seed-batched paths run), and an
#: evaluation that acts at random for 50 steps (some of the 154 evaluation envs then succeed).
SMOKE_TRAINER_CHANGES = {"run.num_seeds": 2, "eval.horizon": 50, "eval.epsilon": 1.0}


@pytest.fixture(scope="session")
def pqn_main():
    """The PQN command line's ``main(argv) -> exit code`` (:func:`agents.pqn.recipe.pqn_main`)."""
    from agents.pqn import recipe

    return recipe.pqn_main


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, pqn_main) -> Path:
    """A complete run of the CLI's smoke preset (4 updates, evaluation and checkpoint every 2, so
    checkpoints 2 and 4, the final evaluation), made once per session: under pytest-xdist, by the
    first worker that asks, in the folder all workers share. Read-only: a test that changes a run
    copies it first (``shutil.copytree``)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder above each worker's
    run = shared / "smoke_run" / "run"
    with FileLock(str(shared / "smoke_run.lock")):
        if not (run / "complete.json").exists():
            assert pqn_main(["smoke", "--run-dir", str(run), "--no-progress", "--overwrite"]) == 0
            assert (run / "complete.json").exists()
    return run


@dataclass
class SmokeTrainer:
    """What :func:`smoke_trainer` recorded along its 4 updates."""

    cfg: Any
    trainer: Any  #: the Trainer, at update 4 (tests may evaluate it, not train it further)
    logs: list  #: the IterationLog of updates 1-4
    texts_1: list  #: ``method.last_texts`` after update 1 (the relabeled instructions it trained on)
    offered_1: bool  #: whether update 1 offered instructions to the buffers
    params_2: list  #: the parameter leaves at update 2 (host arrays)
    eval_2: list  #: ``[r.to_dict() for r in trainer.evaluate()]`` at update 2
    checkpoint_3: Path  #: the checkpoint saved at update 3 (in ``trainer.run_dir``)
    params_3: Any  #: the parameters (a host pytree) of that checkpoint
    generated_3: dict  #: ``dict(trainer.generated)`` when it was saved (what ``instructions.json`` holds)
    instructions_3: str  #: the text of ``instructions.json`` as that save wrote it
    params_4: list  #: the parameter leaves at update 4 (host arrays)
    buffers_4: list  #: ``[b.contents() for b in trainer.buffers]`` at update 4


@pytest.fixture(scope="session")
def smoke_trainer(tmp_path_factory) -> SmokeTrainer:
    """One ``Trainer`` of ``tiny(**SMOKE_TRAINER_CHANGES)`` trained 4 updates, evaluated at update 2 and
    checkpointed at update 3, shared by the tests that only need a trained state or a reference
    run of this configuration (another Trainer of other program settings traces its own for 10-15 s)."""
    from agents.pqn.trainer import Trainer

    cfg = tiny(**SMOKE_TRAINER_CHANGES)
    tr = Trainer(cfg, tmp_path_factory.mktemp("smoke_trainer"), log=lambda s: None)
    tr.init_state()
    logs = [tr.iteration()]
    texts_1 = copy.deepcopy(tr.method.last_texts)
    offered_1 = bool(tr.method.offered)
    logs.append(tr.iteration())
    params_2 = jax.tree_util.tree_leaves(jax.device_get(tr.train_state.params))
    eval_2 = [r.to_dict() for r in tr.evaluate()]
    logs.append(tr.iteration())
    checkpoint_3 = tr.save()
    generated_3 = dict(tr.generated)
    params_3 = jax.device_get(tr.train_state.params)
    instructions_3 = (tr.run_dir / "instructions.json").read_text()
    logs.append(tr.iteration())
    params_4 = jax.tree_util.tree_leaves(jax.device_get(tr.train_state.params))
    yield SmokeTrainer(cfg, tr, logs, texts_1, offered_1, params_2, eval_2, checkpoint_3, params_3, generated_3, instructions_3,
                       params_4,
                       [b.contents() for b in tr.buffers])
    tr.close()


# --------------------------------------------------------------------------- hand-built scenes


class Scene:
    """Edit the Craftax states of a vector env's batch on the host, then write them back.

    Every env of the batch is put in a quiet, deterministic setting: the player at ``CENTER``
    facing right on a patch of sand (mobs spawn on grass, at distance > 3, so none can reach the
    player within a few steps), no mobs, no plants, empty inventory, full vitals, zero hunger /
    thirst / fatigue counters, no achievements, daylight.
    """

    def __init__(self, env, radius: int = 6) -> None:
        self.env = env
        self.cs = jax.tree_util.tree_map(np.array, jax.device_get(env._state.env.craftax))
        cs = self.cs
        r0, c0 = CENTER
        for i in range(env.num_envs):
            cs.map[i, r0 - radius: r0 + radius + 1, c0 - radius: c0 + radius + 1] = B.SAND.value
        cs.player_position[:] = CENTER
        cs.player_direction[:] = A.RIGHT.value
        cs.mob_map[:] = False
        for mobs in (cs.zombies, cs.cows, cs.skeletons, cs.arrows):
            mobs.mask[:] = False
        cs.growing_plants_mask[:] = False
        for item in jax.tree_util.tree_leaves(cs.inventory):
            item[:] = 0
        for v in (cs.player_health, cs.player_food, cs.player_drink, cs.player_energy):
            v[:] = 9
        for v in (cs.player_recover, cs.player_hunger, cs.player_thirst, cs.player_fatigue):
            v[:] = 0.0
        cs.is_sleeping[:] = False
        cs.achievements[:] = False
        cs.light_level[:] = 1.0

    def block(self, i: int, offset, block: BlockType) -> "Scene":
        """Put ``block`` at ``CENTER + offset`` (row, column) in env ``i``."""
        self.cs.map[i, CENTER[0] + offset[0], CENTER[1] + offset[1]] = block.value
        return self

    def mob(self, i: int, kind: str, slot: int, offset, health: int = 3) -> "Scene":
        """Put a mob (``"zombies"``, ``"cows"``, ``"skeletons"``, ``"arrows"``) at ``CENTER + offset``."""
        mobs = getattr(self.cs, kind)
        pos = (CENTER[0] + offset[0], CENTER[1] + offset[1])
        mobs.position[i, slot] = pos
        mobs.mask[i, slot] = True
        mobs.health[i, slot] = health
        mobs.attack_cooldown[i, slot] = 5
        if kind != "arrows":
            self.cs.mob_map[i, pos[0], pos[1]] = True
        return self

    def inventory(self, i: int, **counts) -> "Scene":
        for name, n in counts.items():
            getattr(self.cs.inventory, name)[i] = n
        return self

    def set(self, i: int, **fields) -> "Scene":
        """Set top-level Craftax fields of env ``i`` (``player_energy=5``, ``is_sleeping=True``...)."""
        for name, v in fields.items():
            getattr(self.cs, name)[i] = v
        return self

    def apply(self, **env_fields) -> None:
        """Write the edited states back into the env (and optionally wrapper fields such as ``steps``)."""
        env = self.env
        craftax = jax.tree_util.tree_map(jnp.asarray, self.cs)
        new_env = env._state.env.replace(craftax=craftax, **{k: jnp.asarray(v) for k, v in env_fields.items()})
        env._state = env._state.replace(env=new_env)


@pytest.fixture
def scene():
    """Factory: ``scene(env)`` -> :class:`Scene` over the env's current batch."""
    return Scene


def run_actions(env, actions):
    """Step ``env`` through a ``[T, num_envs]`` action script; return stacked rewards, terms, truncs, infos."""
    rewards, terms, truncs, infos = [], [], [], []
    for a in actions:
        _, r, te, tr, inf = env.step(np.asarray(a, dtype=np.int64))
        rewards.append(r)
        terms.append(te)
        truncs.append(tr)
        infos.append(inf)
    return np.stack(rewards), np.stack(terms), np.stack(truncs), infos
