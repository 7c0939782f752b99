"""The PQN training loop (Algorithms 1 and 2 of the paper): :class:`Trainer`.

One iteration (:meth:`Trainer.iteration`): a jitted rollout of every seed's envs, the method's step
(:mod:`agents.pqn.methods`: relabel slots, pinned goals, metrics), the update batch
(:func:`build_batch`) and one jitted PQN update (:func:`agents.pqn.network.update`).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from agents.pqn import network as pqn
from agents.pqn.methods import MethodContext, TrainingMethod, protected_rows
from agents.pqn.method_specs import METHOD_SPECS, make_proposer, make_relabeler, method_spec  # noqa: F401  (re-exported)
from agents.run.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, restore_tree, save_checkpoint
from agents.pqn.config import TrainConfig, load_config
from agents.run.run_dir import MetricsPosition, atomic_write_json
from agents.run.train import IterationLog
from agents.run.multihost import seed_slice
from agents.pqn.program_cache import ProgramCache, prepare
from agents.pqn.sharding import Layout, PerDevice, check_layout, placeholder
from oir_gym import functional as F
from oir_gym.buffer import InstructionBuffer
from oir_gym.craftax_compat import NUM_ACTIONS
from oir_gym.event_rates import RateWindow, pooled_metrics
from oir_gym.encoder import get_encoder
from oir_gym.evaluation import (
    EvalConfig, EvalResult, eval_instructions, eval_keys, evaluate_jax_seeds, evaluator_args, make_jax_evaluator,
)
from oir_gym.instruction_registry import InstructionRegistry
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.observation import obs_dim
from oir_gym.grounding import paid_steps_jax
from oir_gym.reward import first_per_episode

#: Config fields a checkpoint must share with the run that loads it (they shape its arrays or meaning).
STRUCTURAL_FIELDS = ("run.method", "run.num_seeds", "pqn.num_envs", "pqn.num_steps", "pqn.hidden_size",
                     "pqn.num_layers", "env.obs_mode", "env.table_capacity", "oir.k", "ellm.k", "ellm.reward")


class Runner(NamedTuple):
    """The rollout's state between updates (checkpoints keep it as ``"0"`` ... ``"4"``)."""

    env_state: Any
    obs: Any
    carry: Any
    done: Any
    keys: Any


def make_rollout(cfg: TrainConfig, net: pqn.QNetwork, layout: Layout | None = None, cache: ProgramCache | None = None):
    """``rollout(train_params, runner, env_params, env_steps) -> (runner, traj)``, traj leaves ``[S, T, E, ...]``;
    each env block has its own world pool and key, each device runs its blocks as its own program."""
    layout = layout or Layout(cfg.run.num_seeds, cfg.pqn.num_envs, 1)
    S, E = layout.local_seeds, layout.local_envs  # per device

    def per_seed(x):
        return x.reshape((S, E) + x.shape[1:])

    def policy(params, carry, obs, done_prev, keys, eps):
        def one(p, c, o, i, d, k):
            c, q = net.apply(p, c, o[None], i[None], d[None])
            return c, pqn.eps_greedy(k, q[0], eps)

        carry, action = jax.vmap(one)(params, carry, per_seed(obs["obs"]), per_seed(obs["instruction"]),
                                      per_seed(done_prev), keys)
        return carry, action.reshape(S * E)

    def rollout(params, runner, env_params, env_steps):
        def step(c, t):
            bstate, obs, carry, done_prev, keys = c
            ks = jax.vmap(lambda k: jax.random.split(k, 3))(keys)  # per block (= per local seed)
            keys, k_act, k_env = ks[:, 0], ks[:, 1], ks[:, 2]
            eps = pqn.epsilon(cfg.pqn, cfg.run.total_timesteps, env_steps + t * cfg.pqn.num_envs)
            new_carry, action = policy(params, carry, obs, done_prev, k_act, eps)
            next_obs, bstate, reward, term, trunc, info, _ = F.block_step(
                k_env, bstate, action, env_params, obs_mode=cfg.env.obs_mode,
                pool_refresh=max(1, min(4, layout.envs_per_block)))
            done = term | trunc
            rec = dict(obs=obs["obs"], instr=info.instr, action=action, reward=reward, done=done, reset=done_prev,
                       events=info.events, success=info.success, ep_return=info.ep_return, ep_length=info.ep_length,
                       achievements=info.achievements)
            return (bstate, next_obs, new_carry, done, keys), rec

        (bstate, obs, carry, done_prev, keys), traj = jax.lax.scan(step, tuple(runner), jnp.arange(cfg.pqn.num_steps))
        # [T, S*E, ...] -> [S, T, E, ...]
        traj = jax.tree_util.tree_map(
            lambda x: jnp.swapaxes(x.reshape((x.shape[0], S, E) + x.shape[2:]), 0, 1), traj)
        traj.update(carry0=runner[2], last_obs=per_seed(obs["obs"]), last_instr=per_seed(obs["instruction"]),
                    last_done=per_seed(done_prev))
        return Runner(bstate, obs, carry, done_prev, keys), traj

    traj_keys = ("obs", "instr", "action", "reward", "done", "reset", "events", "success", "ep_return", "ep_length",
                 "achievements")

    def in_specs(params, runner, env_params, env_steps):
        return (layout.seed_spec, layout.runner_specs(runner), PartitionSpec(), PartitionSpec())

    def out_specs(params, runner, env_params, env_steps):
        last = dict.fromkeys(("carry0", "last_obs", "last_instr", "last_done"), layout.seed_env_spec)
        return (layout.runner_specs(runner), {k: layout.traj_spec for k in traj_keys} | last)

    return PerDevice(rollout, layout.mesh(), in_specs, out_specs, cache, "rollout")


def build_batch(cfg: TrainConfig, trajs, table_emb, slots):
    """The update batch D of one seed: the newest of ``trajs`` (the last rollouts stacked, newest first) plus
    copies relabeled by ``slots`` (``src``, ``env``, ``emb``, ``final``, ``pre``, ``valid``; ``None``: none)."""
    cur = jax.tree_util.tree_map(lambda x: x[0], trajs)
    orig = dict(
        obs=cur["obs"], instr=table_emb[cur["instr"]], actions=cur["action"], rewards=cur["reward"],
        dones=cur["done"], resets=cur["reset"], weights=jnp.ones(cfg.pqn.num_envs),
        next_obs_last=cur["last_obs"], next_instr_last=cur["last_instr"], carry0=cur["carry0"],
        cuts=jnp.zeros_like(cur["done"]),
    )
    if slots is None:
        return orig
    src, env = slots["src"], slots["env"]
    pick = lambda x: jnp.swapaxes(x[src, :, env], 0, 1)  # [L, T, E, ...] -> [T, R, ...]  # noqa: E731
    T = cfg.pqn.num_steps
    events = pick(trajs["events"])  # [T, R, Ev]
    match = paid_steps_jax(events, slots["final"], slots["pre"], pick(trajs["reset"]), cfg.env.delta)
    # the copy pays at its first match in each original episode and ends there; the rest gets no target
    if cfg.oir.relabel_every_match:
        term, after = match, jnp.zeros_like(match)
    else:
        term, after = first_per_episode(match, pick(trajs["reset"]))
    # an episode the original instruction's success ended is cut, not terminal, for a copy it did not pay
    own_success = pick(trajs["done"] & trajs["success"]) if "success" in trajs else jnp.zeros_like(term)
    rel = dict(
        obs=pick(trajs["obs"]), instr=jnp.broadcast_to(slots["emb"][None], (T,) + slots["emb"].shape),
        actions=pick(trajs["action"]), rewards=term.astype(jnp.float32), dones=pick(trajs["done"]) | term,
        resets=pick(trajs["reset"]), cuts=(own_success & ~term) | after,
        weights=slots["valid"].astype(jnp.float32), next_obs_last=trajs["last_obs"][src, env],
        next_instr_last=slots["emb"], carry0=jax.tree_util.tree_map(lambda c: c[src, env], trajs["carry0"]),
    )
    cat_axis = dict(obs=1, instr=1, actions=1, rewards=1, dones=1, resets=1, cuts=1, weights=0, next_obs_last=0,
                    next_instr_last=0)
    out = {k: jnp.concatenate([orig[k], rel[k]], axis=cat_axis[k]) for k in cat_axis}
    out["carry0"] = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b], 0), orig["carry0"], rel["carry0"])
    return out


def relayout_runner(runner: dict, blocks: int, pool_per_block: int) -> dict:
    """A checkpoint's runner state dict fitted to ``blocks`` env blocks of ``pool_per_block`` pool worlds."""
    keys = np.asarray(runner["4"])
    bstate = runner["0"]
    cursor = np.asarray(bstate["cursor"])
    pool_len = len(np.asarray(jax.tree_util.tree_leaves(bstate["pool"])[0]))
    if keys.ndim == 2 and keys.shape[0] == blocks and cursor.shape == (blocks,) and pool_len == blocks * pool_per_block:
        return runner
    first = keys if keys.ndim == 1 else keys[0]
    new_keys = np.asarray(jax.random.split(jnp.asarray(first, jnp.uint32), blocks))
    take = np.arange(blocks * pool_per_block) % pool_len
    pool = jax.tree_util.tree_map(lambda x: np.asarray(x)[take], bstate["pool"])
    return {**runner, "0": {**bstate, "pool": pool, "cursor": np.zeros((blocks,), cursor.dtype)}, "4": new_keys}


def program_config(cfg: TrainConfig) -> TrainConfig:
    """The fields of ``cfg`` the jitted programs read, every other field at its default."""
    p = TrainConfig()
    p.pqn = copy.deepcopy(cfg.pqn)
    p.run.total_timesteps, p.run.num_seeds = cfg.run.total_timesteps, cfg.run.num_seeds
    p.env.obs_mode, p.env.delta = cfg.env.obs_mode, cfg.env.delta
    p.oir.relabel_every_match = cfg.oir.relabel_every_match
    p.eval.epsilon, p.eval.horizon = cfg.eval.epsilon, cfg.eval.horizon
    return p


class Programs:
    """A trainer's jitted programs, network and optimiser; no run state, shared (:func:`trainer_programs`)."""

    def __init__(self, cfg: TrainConfig, layout: Layout, instr_dim: int, context: str = "") -> None:
        self.cfg, self.layout, self.instr_dim = cfg, layout, instr_dim
        self.mesh = layout.mesh()
        #: the compiled programs kept across processes (``context``: what they are built from)
        self.cache = ProgramCache.from_jax_config(context, devices=layout.num_devices)
        keep = self.cache.wrap
        self.net = pqn.make_network(cfg.pqn, NUM_ACTIONS, layout.num_devices)
        #: one object: every train state shares its structure (jit's cache compares it)
        self.tx = pqn.make_optimizer(cfg.pqn, cfg.num_updates)
        self.rollout = make_rollout(cfg, self.net, layout, self.cache)
        self.update = keep(jax.jit(jax.vmap(lambda ts, k, b: pqn.update(ts, cfg.pqn, k, b))), "update")
        self.all_finite = keep(jax.jit(lambda tree: jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))), "all_finite")
        # ring = (newest, ..., oldest) rollouts, stacked inside the program
        stack = lambda ring: jax.tree_util.tree_map(lambda *xs: jnp.stack(xs, axis=1), *ring)  # noqa: E731
        build_seeds = jax.vmap(lambda t, e, s: build_batch(cfg, t, e, s), in_axes=(0, None, 0))
        self.build = keep(jax.jit(lambda ring, e, s: build_seeds(stack(ring), e, s)), "build")
        build_plain = jax.vmap(lambda t, e: build_batch(cfg, t, e, None), in_axes=(0, None))
        self.build_plain = keep(jax.jit(lambda t, e: build_plain(stack((t,)), e)), "build_plain")
        d_obs = obs_dim(cfg.env.obs_mode)
        self.init_train_states = jax.jit(lambda ks: pqn.create_train_states(
            ks, cfg.pqn, self.net, d_obs, instr_dim, cfg.num_updates, tx=self.tx))
        self.reset = keep(jax.jit(F.block_reset, static_argnums=(2, 3, 5, 7)), "reset", (2, 3, 5, 7))
        self._evaluators: dict[int, tuple[Callable, PerDevice]] = {}
        self._lock = threading.Lock()

    def greedy(self, params, carry, obs, done_prev, key):
        """The evaluation policy: epsilon-greedy with ``eval.epsilon`` (0: greedy)."""
        carry, q = self.net.apply(params, carry, obs["obs"][None], obs["instruction"][None], done_prev[None])
        return carry, pqn.eps_greedy(key, q[0], self.cfg.eval.epsilon)

    def evaluator(self, n: int, seeds: bool = True) -> Any:
        """The evaluation of ``n`` episodes of every seed (``seeds=False``: of one seed), built at its first request."""
        with self._lock:
            if n not in self._evaluators:
                lay = self.layout
                evaluate = make_jax_evaluator(self.greedy, self.net.initial_carry, n, self.cfg.eval.horizon,
                                              self.cfg.env.obs_mode)
                self._evaluators[n] = evaluate, PerDevice(
                    jax.vmap(evaluate, in_axes=(0, 0, None, None)), self.mesh,
                    in_specs=lambda *a: (lay.seed_spec, lay.seed_spec, PartitionSpec(), PartitionSpec()),
                    out_specs=lambda *a: lay.seed_spec, cache=self.cache, name=f"evaluate{n}")
            return self._evaluators[n][1 if seeds else 0]


@functools.lru_cache(maxsize=None)
def _world_generator() -> Callable:
    return ProgramCache.from_jax_config().wrap(jax.jit(F.block_worlds, static_argnums=(2, 3)), "worlds", (2, 3))


@functools.lru_cache(maxsize=8)
def _programs(config_json: str, layout: Layout, instr_dim: int) -> Programs:
    return Programs(TrainConfig.from_dict(json.loads(config_json)), layout, instr_dim,
                    context=f"{config_json}|{layout}|{instr_dim}")


def trainer_programs(cfg: TrainConfig, layout: Layout, instr_dim: int) -> Programs:
    """The :class:`Programs` of ``cfg`` on ``layout``, shared by this process's trainers of the same key."""
    return _programs(json.dumps(program_config(cfg).to_dict(), sort_keys=True), layout, instr_dim)


def side_threads(name: str, *jobs: Callable[[], Any]) -> list[Future]:
    """Run each job on its own thread, which ends with it."""
    pool = ThreadPoolExecutor(len(jobs), thread_name_prefix=name)
    futures = [pool.submit(job) for job in jobs]
    pool.shutdown(wait=False)
    return futures


class ProcessSeeds:
    """This process's seeds of a run, their layout, encoder, programs and evaluation (base of the trainers)."""

    def _init_seeds(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.processes, self.process_index = jax.process_count(), jax.process_index()
        self.seeds = seed_slice(cfg.run.num_seeds, self.processes, self.process_index)
        self.num_seeds = cfg.run.num_seeds
        self.S, self.seed_offset = self.seeds.stop - self.seeds.start, self.seeds.start
        local = len(jax.local_devices())
        self.num_devices = cfg.run.num_devices or local
        check_layout(self.S, cfg.pqn.num_envs, self.num_devices, visible=local)
        self.layout = Layout(self.S, cfg.pqn.num_envs, self.num_devices)
        self.update_idx, self.env_steps = 0, 0

    def _init_programs(self) -> None:
        #: seconds each part of the start took
        self.startup: dict[str, float] = {}
        t = time.time()
        self.encoder = get_encoder()
        self.startup["encoder"] = time.time() - t
        self.programs = trainer_programs(self.cfg, self.layout, self.encoder.dim)

    def eval_config(self, final: bool = False) -> EvalConfig:
        """The :class:`~oir_gym.evaluation.EvalConfig` of an evaluation (``final``: the final one)."""
        return self.cfg.eval.eval_config(final)

    def env_params_with(self, table: Any) -> F.EnvParams:
        """The run's env params with instruction table ``table``."""
        return F.EnvParams(table=table, delta=self.cfg.env.delta, max_steps=self.cfg.env.max_episode_steps,
                           reward_mode=method_spec(self.cfg.run.method).reward_mode)

    def _evaluation_of(self, policy: Any, table: Any, rows: Any, ecfg: EvalConfig, texts: list[str],
                       achs: list, sets: list[str]) -> Callable[[], list[EvalResult]]:
        """Every seed's evaluation of ``policy`` on ``rows`` of ``table`` as a call, its arguments read now."""
        keys = eval_keys(self.cfg.run.seed, self.seeds.stop, self.update_idx)[self.seeds]
        return functools.partial(evaluate_jax_seeds, self.programs.evaluator(len(texts) * ecfg.episodes), keys,
                                 policy, self.env_params_with(table), rows, ecfg, texts, achs, sets)


class Trainer(ProcessSeeds):
    """Runs PQN with method ``gt``, ``cosine``, ``oir`` or ``ellm`` for this process's seeds side by side, into
    ``run_dir``; ``relabeler`` (oir) and ``proposer`` (ellm) default to ``cfg``'s."""

    def __init__(self, cfg: TrainConfig, run_dir: str | os.PathLike, relabeler=None,
                 log: Callable[[str], None] = print, proposer=None, prefetch_worlds: bool = False) -> None:
        self._init_seeds(cfg.validate())
        self.mesh = self.layout.mesh()
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log = log
        self.rate_windows = [RateWindow(cfg.pqn.num_envs) for _ in range(self.S)]
        self._worlds: Future | None = side_threads("oir-worlds", self._initial_worlds)[0] if prefetch_worlds else None
        self._init_programs()
        self.net = self.programs.net
        t = time.time()
        self.method_spec = method_spec(cfg.run.method)
        #: rows per env that also pay (ELLM's proposed goals)
        self.num_also_pays = self.method_spec.also_pays_slots(cfg)
        self.eval_cfg, self.final_eval_cfg = self.eval_config(), self.eval_config(final=True)
        self.eval_texts, self.eval_achs, self.eval_sets = eval_instructions(self.eval_cfg)
        self.final_texts, self.final_achs, self.final_sets = eval_instructions(self.final_eval_cfg)
        n_fixed = len(set(self.all_eval_texts) | set(ORIGINAL_INSTRUCTIONS))
        capacity = self.method_spec.table_capacity(cfg, n_fixed)
        # the evaluation rows, each seed's buffer and as many rows again that envs still run after the buffer
        if capacity < n_fixed + 2 * self.S * cfg.oir.instruction_buffer_size:
            raise ValueError(
                f"env.table_capacity={capacity} holds too few rows for the {n_fixed} evaluation instructions and "
                f"{self.S} buffer(s) of {cfg.oir.instruction_buffer_size}: raise env.table_capacity for a new run, or "
                f"evaluate fewer sets at the end (--eval.final-sets with fewer of {cfg.eval.final_sets}, or none)")
        self.registry = InstructionRegistry(self.encoder, capacity=capacity)
        self._register_fixed_rows()
        #: per seed, the PLR-style instruction buffer (oir draws episodes from it; all record returns)
        self.buffers = [
            InstructionBuffer(cfg.oir.instruction_buffer_size, cfg.oir.tau_low, cfg.oir.tau_high,
                              initial=list(ORIGINAL_INSTRUCTIONS)[: cfg.oir.instruction_buffer_size],
                              seed=cfg.run.seed + self.seed_offset + s)
            for s in range(self.S)
        ]
        self.runner = None
        self.startup["instructions"] = time.time() - t
        t = time.time()
        ctx = MethodContext(cfg=self.cfg, S=self.S, seed_offset=self.seed_offset, registry=self.registry,
                            buffers=self.buffers, encoder=self.encoder, all_eval_texts=self.all_eval_texts,
                            log=self.log)
        self.method: TrainingMethod = self.method_spec.factory(ctx, relabeler, proposer)
        self.startup["method"] = time.time() - t

        self.base_params = self.env_params_with(self.registry.device_table())
        n_eval = len(self.eval_texts) * self.eval_cfg.episodes
        self.evaluator = self.programs.evaluator(n_eval, seeds=False)
        self.programs.evaluator(n_eval)  # built now, the final one at its first request
        self._compiling: list[Future] = []  # start_compiling's rollout and update jobs
        #: the last iteration's rollout (host arrays) and update batch (examples/batch_composition.py)
        self.last_rollout: dict | None = None
        self.last_batch: dict | None = None
        #: earlier rollouts on device, newest first, for relabel slots
        self._history: list[dict] = []

    @property
    def all_eval_texts(self) -> list[str]:
        return list(dict.fromkeys(self.eval_texts + self.final_texts))

    @property
    def generated(self) -> Counter:
        """Generated instruction -> count (oir: offered to the buffers; ellm: proposed goals)."""
        return self.method.generated

    def env_params(self) -> F.EnvParams:
        """Env params: the shared table, with each seed's draw rows as its row of the sample mask."""
        masks = np.zeros((self.S, self.registry.capacity), bool)
        for s in range(self.S):
            texts = self.method.draw_texts(s)
            masks[s, self.orig_rows if texts is None else self.registry.rows(texts, protected=self.protected_rows)] = True
        table = self.registry.device_table()
        return self.base_params.replace(table=table.replace(sample_mask=jnp.asarray(masks)))

    def _register_fixed_rows(self, protected: Any = ()) -> None:
        """``eval_rows``, ``final_rows`` and ``orig_rows``, registered where the table lacks them."""
        self.eval_rows = self.registry.rows(self.eval_texts, self.eval_achs, protected=protected)
        self.final_rows = self.registry.rows(self.final_texts, self.final_achs, protected=protected)
        self.orig_rows = self.registry.rows(list(ORIGINAL_INSTRUCTIONS), list(range(len(ORIGINAL_INSTRUCTIONS))),
                                            protected=protected)

    @property
    def env_state(self) -> Any:
        return self.runner.env_state

    @env_state.setter
    def env_state(self, state: Any) -> None:
        self.runner = self.runner._replace(env_state=state)

    def protected_rows(self) -> list[int]:
        """Table rows that new instructions must not take (:func:`agents.pqn.methods.protected_rows`)."""
        fixed = [*self.eval_rows.tolist(), *self.final_rows.tolist(), *self.orig_rows.tolist()]
        return protected_rows(self.registry, self.buffers, fixed, None if self.runner is None else self.runner.env_state)

    def method_batch(self, traj: dict, slots: dict | None) -> dict:
        """The update batch of this rollout and the method's relabel ``slots`` (indexing :attr:`_history` by age)."""
        if slots is None:
            return self.build_batch(traj)
        n = self.method.history_len
        ring = [traj, *self._history[: n - 1]]
        return self.build_batch(ring + [traj] * (n - len(ring)), slots)

    def build_batch(self, trajs: dict | Sequence[dict], slots: dict | None = None) -> dict:
        """All seeds' update batch (:func:`build_batch`) of this rollout, or of recent ones with ``slots``."""
        table_emb = self.registry.device_table().emb
        if slots is None:
            return self.programs.build_plain(trajs, table_emb)
        ring = (trajs,) if isinstance(trajs, Mapping) else tuple(trajs)
        return self.programs.build(ring, table_emb, slots)

    def unpayable_frac(self, instr_rows: np.ndarray) -> float:
        """Share of these table rows (e.g. a rollout's steps) whose instruction can never pay a reward."""
        return float(np.mean(~self.method.payable_rows()[np.asarray(instr_rows)]))

    def init_state(self) -> None:
        """Fresh parameters, optimiser state, envs and key for every seed, placed on the mesh."""
        t0 = time.time()
        key, k_net, k_env, k_run = self._initial_keys()
        worlds = self._worlds.result() if self._worlds is not None else self._initial_worlds()
        self._worlds = None
        self.runner = None
        self.train_state, self.runner = self._placed(*self._initial_state(k_net, k_env, k_run, self.env_params(),
                                                                          worlds))
        self.key = key
        self.startup["initial_state"] = time.time() - t0

    def _initial_keys(self) -> tuple[Any, Any, Any, Any]:
        """``(key, k_net, k_env, k_run)``, each global seed's the same in any process count."""
        n, lay = self.num_seeds, self.layout
        key = jax.random.PRNGKey(self.cfg.run.seed)
        key, *ks = jax.random.split(key, 1 + 3 * n)
        k_net = jnp.asarray(np.array(ks[:n])[self.seeds])
        blocks = slice(self.process_index * lay.blocks, (self.process_index + 1) * lay.blocks)
        k_env = jax.random.split(ks[n], lay.blocks * self.processes)[blocks]
        k_run = jax.random.split(ks[2 * n], lay.blocks * self.processes)[blocks]
        return key, k_net, k_env, k_run

    def _initial_worlds(self) -> Any:
        """The worlds :meth:`init_state` resets the envs to (they depend on the run's seed alone)."""
        _, _, k_env, _ = self._initial_keys()
        lay = self.layout
        return jax.block_until_ready(_world_generator()(k_env, F.default_craftax_params(), lay.envs_per_block,
                                              lay.pool_per_block))

    def _initial_state(self, k_net, k_env, k_run, env_params: F.EnvParams, worlds: Any = None) -> tuple[Any, tuple]:
        """``(train_state, runner)``, unplaced (``worlds=None``: generated in the reset's program)."""
        cfg, lay = self.cfg, self.layout
        train_state = self.programs.init_train_states(k_net)
        groups = jnp.repeat(jnp.arange(self.S), cfg.pqn.num_envs)
        obs, bstate = self.programs.reset(k_env, env_params, lay.envs_per_block,
                            lay.pool_per_block, None, cfg.env.obs_mode, groups, self.num_also_pays, worlds)
        carry = jax.vmap(lambda _: self.net.initial_carry(cfg.pqn.num_envs))(jnp.arange(self.S))
        done = jnp.ones((self.S * cfg.pqn.num_envs,), bool)
        return train_state, Runner(bstate, obs, carry, done, k_run)

    def placeholder_state(self, env_params: F.EnvParams) -> tuple[Any, tuple]:
        """A ``(train_state, runner)`` of zeros shaped and placed as :meth:`init_state` makes them."""
        blocks = jax.ShapeDtypeStruct((self.layout.blocks, 2), jnp.uint32)
        return self._placed(*placeholder(jax.eval_shape(
            self._initial_state, jax.ShapeDtypeStruct((self.S, 2), jnp.uint32), blocks, blocks, env_params)))

    def _placed(self, train_state: Any, runner: Runner) -> tuple[Any, Runner]:
        """The per-seed state put on the mesh (:class:`agents.pqn.sharding.Layout`)."""
        lay = self.layout
        return (lay.place(train_state, jax.tree_util.tree_map(lambda _: lay.seed_spec, train_state)),
                lay.place(runner, lay.runner_specs(runner)))

    def _arrays(self) -> dict[str, Any]:
        reg = self.registry.state_dict()
        return {
            "train_state": {"params": self.train_state.params, "opt_state": self.train_state.opt_state,
                            "step": self.train_state.step},
            "runner": tuple(self.runner), "key": self.key,
            "registry": {k: reg[k] for k in ("emb", "event_sim", "achievement", "sample_mask")},
        }

    def save(self, *, metrics: MetricsPosition | Mapping[str, Any] | None = None, keep: int | None = None,
             metrics_after_update: int | None = None) -> Path:
        """Checkpoint the state and rewrite the generated-instruction file; returns the checkpoint folder
        (``metrics``: the position a resume cuts back to, else ``metrics_after_update``)."""
        reg = self.registry.state_dict()
        pos = metrics.to_dict() if isinstance(metrics, MetricsPosition) else (dict(metrics) if metrics else None)
        host = {
            "config": self.cfg.to_dict(), "update": self.update_idx, "env_steps": self.env_steps,
            "buffers": [b.state_dict() for b in self.buffers],
            # bindings (event-bound grounding) as JSON; the registry rebuilds their pre_sim rows on load
            "registry": {k: reg[k] for k in ("capacity", "texts", "rows", "bindings")},
            "generated": self.method.state_dict(),
            "metrics": pos, "metrics_after_update": metrics_after_update,
        }
        folder = save_checkpoint(self.run_dir, self.update_idx, self._arrays(), host,
                                 keep=self.cfg.run.keep_checkpoints if keep is None else keep)
        self.write_generated()
        return folder

    def write_generated(self) -> Path | None:
        """Write the method's generated instructions with counts (oir: ``instructions.json``, ellm: ``goals.json``)."""
        payload = self.method.generated_payload()
        if payload is None or self.method_spec.generated_file is None:
            return None
        items = payload.pop("items")
        payload.update({"update": self.update_idx, "env_steps": self.env_steps, "distinct": len(items),
                        "total": int(sum(self.method.generated.values())), "items": items})
        return atomic_write_json(self.run_dir / self.method_spec.generated_file, payload)

    def load(self, path: str | os.PathLike | None = None) -> dict[str, Any]:
        """Restore a checkpoint (default: the run directory's newest); returns its host state. Raises
        ``CheckpointError`` (naming file and field) for a damaged, foreign or structurally different one."""
        arrays, host = load_checkpoint(path or self.run_dir)
        folder = Path(path) if path and (Path(path) / "manifest.json").exists() else latest_checkpoint(
            path or self.run_dir)
        host_file = folder / "host.json"
        try:
            saved = load_config(host["config"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(host_file, f"holds no valid run config ({e})") from None
        for k in STRUCTURAL_FIELDS:
            part, name = k.split(".")
            mine, theirs = getattr(getattr(self.cfg, part), name), getattr(getattr(saved, part), name)
            if mine != theirs:
                raise CheckpointError(host_file, f"the checkpoint has {k}={theirs!r}, this run {mine!r}")
        self.init_state()
        if isinstance(arrays, dict) and isinstance(arrays.get("runner"), dict):
            lay = self.layout
            arrays = {**arrays, "runner": relayout_runner(arrays["runner"], lay.blocks, lay.pool_per_block)}
        restored = restore_tree(self._arrays(), arrays, folder / "arrays.msgpack")
        ts = restored["train_state"]
        self.train_state = self.train_state.replace(params=jax.tree_util.tree_map(jnp.asarray, ts["params"]),
                                                    opt_state=jax.tree_util.tree_map(jnp.asarray, ts["opt_state"]),
                                                    step=jnp.asarray(ts["step"]))
        self.runner = Runner(*jax.tree_util.tree_map(jnp.asarray, restored["runner"]))
        self.key = jnp.asarray(restored["key"])
        # a checkpoint holds host arrays: spread them over this run's devices again
        self.train_state, self.runner = self._placed(self.train_state, self.runner)
        try:
            for b, sd in zip(self.buffers, host["buffers"], strict=True):
                b.load_state_dict(sd)
            self.registry.load_state_dict({**host["registry"], **restored["registry"]})
            # evaluation instructions the saved run lacked get rows in its table
            self._register_fixed_rows(protected=self.protected_rows)
            self.method.load_state_dict(host.get("generated") or {})
            self._history = []
            self.update_idx, self.env_steps = int(host["update"]), int(host["env_steps"])
        except (KeyError, ValueError, TypeError) as e:
            raise CheckpointError(host_file, f"host state is incomplete or inconsistent ({type(e).__name__}: {e})") \
                from None
        return host

    def iteration(self) -> IterationLog:
        """One rollout, batch and update; a non-finite update raises ``FloatingPointError``, changing nothing."""
        cfg = self.cfg
        t0 = time.time()
        for f in self._compiling:  # start_compiling's programs: wait, never compile twice
            if (err := f.exception()) is not None:
                self.log(f"compiling ahead failed ({err!r}); the update compiles its own programs")
        self._compiling = []
        env_params = self.env_params()
        self.runner, traj = self.programs.rollout(self.train_state.params, self.runner, env_params, self.env_steps)
        host = jax.device_get({k: traj[k] for k in ("instr", "events", "action", "done", "reward", "ep_return",
                                                      "success")})
        t_rollout = time.time()
        for s in range(self.S):
            t_idx, e_idx = np.nonzero(host["done"][s])
            rows = host["instr"][s, t_idx, e_idx]
            self.buffers[s].record_many([self.registry.text(r) for r in rows], host["ep_return"][s, t_idx, e_idx])
        metrics: dict[str, float] = {"curriculum/unpayable_step_frac": self.unpayable_frac(host["instr"])}
        metrics.update(self.event_rates(host["events"], host["done"]))
        step = self.method.step(self.update_idx, host, self.env_state)
        batch = self.method_batch(traj, step.slots)
        self._history = [traj, *self._history[: self.method.history_len - 2]] if self.method.history_len > 1 else []
        metrics.update(step.metrics)
        if step.slots is not None:  # a device scalar, read after the update started
            metrics["relabel/cut_steps"] = jnp.sum(batch["cuts"]) / self.S
        if step.pinned is not None:  # goals the envs run at their next reset (ELLM)
            self.env_state = F.set_pinned(self.env_state, jnp.asarray(step.pinned))
        if step.also_pays is not None:
            self.env_state = F.set_also_pays(self.env_state, jnp.asarray(step.also_pays))
        self.last_rollout, self.last_batch = host, batch
        self.key, k = jax.random.split(self.key)
        t_host = time.time()
        new_state, upd = self.programs.update(self.train_state, self._seed_keys(k), batch)
        upd = jax.device_get(upd)
        t_update = time.time()
        metrics = {k: float(v) for k, v in metrics.items()}  # device scalars, read after the update started
        if not (np.all(np.isfinite(upd["loss"])) and bool(self.programs.all_finite(new_state.params))):
            last = latest_checkpoint(self.run_dir)
            where = f"the last good checkpoint {last} is kept" if last else "no checkpoint had been written yet"
            raise FloatingPointError(
                f"non-finite loss or parameters at update {self.update_idx + 1} (env step {self.env_steps}); {where}: "
                "lower pqn.lr or pqn.max_grad_norm and resume")
        self.train_state = new_state
        self.update_idx += 1
        self.env_steps += cfg.batch_steps
        n_done = host["done"].sum()
        metrics.update({
            "loss": float(upd["loss"].mean()), "q_mean": float(upd["q_mean"].mean()),
            "epsilon": float(pqn.epsilon(cfg.pqn, cfg.run.total_timesteps, self.env_steps)),
            "train/episodes": float(n_done / self.S),
            "train/success_rate": float(host["success"].sum() / max(n_done, 1)),
            "train/reward_per_step": float(host["reward"].mean()),
            "sps": cfg.batch_steps * self.S / max(time.time() - t0, 1e-9),
            "time/rollout_s": t_rollout - t0, "time/host_s": t_host - t_rollout, "time/update_s": t_update - t_host,
        })
        metrics.update({f"seed{self.seed_offset + s}/loss": float(upd["loss"][s]) for s in range(self.S)})
        return IterationLog(self.update_idx, self.env_steps, metrics)

    def event_rates(self, events: np.ndarray, dones: np.ndarray) -> dict[str, float]:
        """Training rates of one rollout's events, per seed (``seed{i}/rate/...``) and over the seeds."""
        out: dict[str, float] = {}
        for s, window in enumerate(self.rate_windows):
            window.add(events[s], dones[s])
            out.update(window.metrics(prefix=f"seed{self.seed_offset + s}/"))
        out.update(pooled_metrics(self.rate_windows))
        for window in self.rate_windows:
            window.reset()
        return out

    def _seed_keys(self, key) -> jax.Array:
        return jax.random.split(key, self.num_seeds)[self.seeds]

    def evaluate(self, final: bool = False) -> list[EvalResult]:
        """Evaluate every seed's policy on the instruction sets (``final``: :attr:`final_eval_cfg`'s)."""
        return self._evaluation(final=final)()

    def _evaluation(self, policy_params: Any = None, final: bool = False) -> Callable[[], list[EvalResult]]:
        """The evaluation of ``policy_params`` (default: the current ones) as a call, its arguments read now."""
        policy = self.train_state.params if policy_params is None else policy_params
        which = ((self.final_rows, self.final_eval_cfg, self.final_texts, self.final_achs, self.final_sets) if final
                 else (self.eval_rows, self.eval_cfg, self.eval_texts, self.eval_achs, self.eval_sets))
        return self._evaluation_of(policy, self.registry.device_table(), *which)

    def evaluation_program(self, policy_params: Any = None) -> tuple[Any, tuple]:
        """The evaluation program (a :class:`~agents.pqn.sharding.PerDevice`) and its arguments for
        ``policy_params`` (default: the current ones)."""
        evaluator, keys, policy, env_params, rows, ecfg, _, achs, _ = self._evaluation(policy_params).args
        return evaluator, evaluator_args(keys, policy, env_params, rows, ecfg, achs)

    def start_compiling_evaluation(self, policy_params: Any = None, after: Future | None = None) -> Future:
        """Compile (or load) the evaluation program of ``policy_params`` on a side thread (:func:`prepare`);
        ``after``: its XLA compile waits for that job (it is traced and lowered at once)."""
        evaluator, args = self.evaluation_program(policy_params)
        wait = None if after is None else after.exception  # waits, raises nothing: a failed job was logged
        return side_threads("oir-eval-compile", lambda: evaluator.prepare(*args, wait=wait))[0]

    def update_args(self, train_state: Any, runner: Any, env_params: Any = None) -> tuple:
        """Arguments of the update program as the first update passes them (placeholder data, no relabels;
        ``env_params``: :meth:`env_params`'s, read now when not given)."""
        env_params = self.env_params() if env_params is None else env_params
        traj = placeholder(self.programs.rollout.eval_shape(train_state.params, runner, env_params,
                                                            self.env_steps)[1])
        keys = jax.random.split(jax.random.PRNGKey(0), self.S)
        return train_state, keys, self.method_batch(traj, self.method.warmup_slots())

    def start_compiling(self) -> list[Future]:
        """Compile (or load from the program cache) the run's programs on side threads (before
        :meth:`init_state`: for a placeholder state), changing no state: the rollout and the update side by
        side, the evaluation traced beside them and compiled once the rollout is (the first update waits for
        the rollout's compile, slower beside another; the first evaluation comes updates later). Programs
        without a cache compile by a throwaway call. A failure leaves the compile to the program's first use.
        Returns the jobs."""
        try:
            env_params, steps = self.env_params(), self.env_steps
            train_state, runner = (self.placeholder_state(env_params) if self.runner is None
                                   else (self.train_state, self.runner))
            params = train_state.params
        except Exception as e:  # noqa: BLE001 - an optimisation: training compiles its own programs
            self.log(f"compiling ahead failed ({e!r}); the first update compiles its own programs")
            return []

        def update() -> None:
            prepare(self.programs.update, *self.update_args(train_state, runner, env_params))
            prepare(self.programs.all_finite, params)

        self._compiling = side_threads("oir-compile", lambda: self.programs.rollout.prepare(
            params, runner, env_params, steps), update)
        try:
            evaluation = [self.start_compiling_evaluation(params, after=self._compiling[0])]
        except Exception as e:  # noqa: BLE001 - as above: the first evaluation compiles its program
            self.log(f"compiling the evaluation ahead failed ({e!r}); the first evaluation compiles it")
            evaluation = []
        return self._compiling + evaluation

    def close(self) -> None:
        """Stop the method's background workers (LLM relabeler or proposer)."""
        self.method.close()
