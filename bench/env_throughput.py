"""Environment throughput: InstructionCraftax against raw Craftax-Classic, on this machine.

Four ways of stepping a batch of envs with uniformly random actions:

(a) ``raw-scan``: raw Craftax-Classic (``craftax_step`` + Craftax's symbolic observation, vmapped)
    with the same optimistic resets as ours (finished envs take pre-generated worlds from a pool;
    ``pool_refresh`` pool slots are regenerated in steps where some env finished), ``lax.scan``
    over ``--steps`` steps in one jitted call.
(b) ``ours-scan``: our JAX core, ``oir_gym.functional.batch_step`` (instructions, event detection,
    cosine reward, success termination, step limit, episode statistics, optimistic resets) in
    the same ``lax.scan``.
(c) ``ours-gym``: the Gymnasium vector env ``InstructionCraftax`` stepped from Python (numpy
    actions in; writable numpy observations, rewards, terminations, truncations and ``infos``
    out).
(d) ``raw-python``: the raw batch of (a), one jitted step per Python call, its observation,
    reward and done copied to numpy (what any Python consumer of a JAX env must do).

Both ``lax.scan`` programs reduce the observation of every step into their carry, so XLA cannot
skip computing it. Each program is called twice before timing (the first output can carry
different weak types, which makes the second call compile again); the compile column is the
set-up time (world pool, reset) plus those two calls, less two steady-state calls. Timed runs
of the four variants are interleaved and the median is reported.

Usage::

    python bench/env_throughput.py --quick
    python bench/env_throughput.py --envs 64 256 --steps 128 --repeats 3
    python bench/env_throughput.py --no-cache ...   # true cold compile times (no persistent cache)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oir_gym.validation import int_arg  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envs", type=int_arg(1), nargs="+", default=[64, 256], help="batch sizes (default: 64 256)")
    p.add_argument("--steps", type=int_arg(1), default=128, help="steps per timed run (default: 128)")
    p.add_argument("--repeats", type=int_arg(1), default=3, help="timed runs per variant; the median is reported")
    p.add_argument("--obs-mode", default="paper", choices=["paper", "symbolic"], help="our observation mode")
    p.add_argument("--variants", nargs="+", default=["a", "b", "c", "d"], choices=["a", "b", "c", "d"])
    p.add_argument("--quick", action="store_true", help="--steps 32 --repeats 3 (for a loaded machine)")
    p.add_argument("--no-cache", action="store_true", help="disable JAX's persistent compilation cache")
    p.add_argument("--seed", type=int_arg(0), default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 32, 3
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.no_cache:
    os.environ["OIR_GYM_JAX_CACHE"] = "0"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import struct  # noqa: E402

import oir_gym  # noqa: E402

if ARGS is not None:
    oir_gym.enable_compilation_cache()  # a no-op under --no-cache (OIR_GYM_JAX_CACHE=0)
from oir_gym import functional as F  # noqa: E402
from oir_gym.craftax_compat import (  # noqa: E402
    NUM_ACTIONS,
    CraftaxParams,
    CraftaxState,
    CraftaxStaticParams,
    craftax_step,
    generate_world,
    render_craftax_symbolic,
)

STATIC = CraftaxStaticParams()
RAW_PARAMS = CraftaxParams()  # Craftax's defaults: episodes end at death, lava or 10,000 steps


# --------------------------------------------------------------------------- raw Craftax batch


@struct.dataclass
class RawBatch:
    env: CraftaxState  # leaves [B, ...]
    pool: CraftaxState  # leaves [P, ...]
    cursor: jax.Array


def _world(key):
    w = generate_world(key, RAW_PARAMS, STATIC)
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), w)


def _worlds(key, n):
    return jax.vmap(_world)(jax.random.split(key, n))


def _select(mask, a, b):
    return jax.tree_util.tree_map(lambda x, y: jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y), a, b)


def _game_over(s):
    in_lava = s.map[s.player_position[0], s.player_position[1]] == 14
    return (s.timestep >= RAW_PARAMS.max_timesteps) | in_lava | (s.player_health <= 0)


def raw_reset(key, num_envs: int, pool_size: int):
    k_env, k_pool = jax.random.split(key)
    env = _worlds(k_env, num_envs)
    obs = jax.vmap(render_craftax_symbolic)(env)
    return obs, RawBatch(env=env, pool=_worlds(k_pool, pool_size), cursor=jnp.zeros((), jnp.int32))


def raw_step(key, rb: RawBatch, actions, pool_refresh: int):
    """Step + symbolic obs + optimistic reset from the pool, the same mechanism as ``F.batch_step``."""
    n = actions.shape[0]
    k_step, k_pool = jax.random.split(key)
    env, reward = jax.vmap(craftax_step, in_axes=(0, 0, 0, None, None))(
        jax.random.split(k_step, n), rb.env, actions, RAW_PARAMS, STATIC
    )
    done = jax.vmap(_game_over)(env)
    obs = jax.vmap(render_craftax_symbolic)(env)

    def _reset(carry):
        env, pool, cursor, obs = carry
        pool_size = jax.tree_util.tree_leaves(pool)[0].shape[0]
        slot = (cursor + jnp.cumsum(done) - 1) % pool_size
        env = _select(done, jax.tree_util.tree_map(lambda p: p[slot], pool), env)
        idx = (cursor + jnp.arange(pool_refresh)) % pool_size
        pool = jax.tree_util.tree_map(lambda p, w: p.at[idx].set(w), pool, _worlds(k_pool, pool_refresh))
        obs = jnp.where(done[:, None], jax.vmap(render_craftax_symbolic)(env), obs)
        return env, pool, (cursor + pool_refresh) % pool_size, obs

    env, pool, cursor, obs = jax.lax.cond(jnp.any(done), _reset, lambda c: c, (env, rb.pool, rb.cursor, obs))
    return obs, RawBatch(env=env, pool=pool, cursor=cursor), reward, done


# --------------------------------------------------------------------------- scan programs


def make_raw_scan(num_envs: int, steps: int, pool_refresh: int):
    def run(key, rb):
        def body(carry, _):
            key, rb, acc = carry
            key, k_a, k_s = jax.random.split(key, 3)
            actions = jax.random.randint(k_a, (num_envs,), 0, NUM_ACTIONS)
            obs, rb, reward, done = raw_step(k_s, rb, actions, pool_refresh)
            return (key, rb, acc + jnp.sum(obs) + jnp.sum(reward) + jnp.sum(done)), None

        (key, rb, acc), _ = jax.lax.scan(body, (key, rb, jnp.zeros((), jnp.float32)), None, length=steps)
        return key, rb, acc

    return jax.jit(run)


def make_ours_scan(num_envs: int, steps: int, pool_refresh: int, obs_mode: str):
    def run(key, bstate, params):
        def body(carry, _):
            key, bs, acc = carry
            key, k_a, k_s = jax.random.split(key, 3)
            actions = jax.random.randint(k_a, (num_envs,), 0, NUM_ACTIONS)
            obs, bs, reward, term, trunc, info, final_obs = F.batch_step(
                k_s, bs, actions, params, obs_mode=obs_mode, pool_refresh=pool_refresh
            )
            acc = acc + jnp.sum(obs["obs"]) + jnp.sum(obs["instruction"]) + jnp.sum(reward)
            acc = acc + jnp.sum(term) + jnp.sum(trunc)
            return (key, bs, acc), None

        (key, bs, acc), _ = jax.lax.scan(body, (key, bstate, jnp.zeros((), jnp.float32)), None, length=steps)
        return key, bs, acc

    return jax.jit(run)


# --------------------------------------------------------------------------- timing
#
# Each variant is a runner: ``warm()`` compiles (two calls, see the module docstring) and
# returns the compile time; ``run()`` times ``steps`` env steps. The timed runs of the four
# variants are interleaved (a, b, c, d, a, b, ...) so that a change of machine load hits all of
# them alike, and the median over the repeats is reported.


def _block(x):
    return jax.tree_util.tree_map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, x)


class ScanRunner:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def _call(self):
        out = _block(self.fn(*self.args))
        self.args = (out[0], out[1], *self.args[2:])

    def warm(self) -> float:
        t = time.perf_counter()
        self._call()
        self._call()
        return time.perf_counter() - t

    def run(self) -> float:
        t = time.perf_counter()
        self._call()
        return time.perf_counter() - t


class RawScan(ScanRunner):
    def __init__(self, n, steps, pool_size, pool_refresh, seed):
        _, rb = jax.jit(raw_reset, static_argnums=(1, 2))(jax.random.PRNGKey(seed), n, pool_size)
        super().__init__(make_raw_scan(n, steps, pool_refresh), (jax.random.PRNGKey(seed + 1), rb))


class OursScan(ScanRunner):
    def __init__(self, env, steps, seed):
        env.reset(seed=seed)
        fn = make_ours_scan(env.num_envs, steps, env.pool_refresh, env.obs_mode)
        super().__init__(fn, (jax.random.PRNGKey(seed + 1), env.state, env.params))


class OursGym:
    def __init__(self, env, steps, seed):
        self.env, self.steps, self.rng = env, steps, np.random.default_rng(seed)
        self.seed = seed

    def warm(self) -> float:
        n = self.env.num_envs
        t = time.perf_counter()
        self.env.reset(seed=self.seed)
        self.env.step(self.rng.integers(0, NUM_ACTIONS, n))
        self.env.step(self.rng.integers(0, NUM_ACTIONS, n))
        return time.perf_counter() - t

    def run(self) -> float:
        acts = self.rng.integers(0, NUM_ACTIONS, (self.steps, self.env.num_envs))
        t = time.perf_counter()
        for a in acts:
            self.env.step(a)
        return time.perf_counter() - t


class RawPython:
    def __init__(self, n, steps, pool_size, pool_refresh, seed):
        self.n, self.steps, self.pool_size, self.pool_refresh = n, steps, pool_size, pool_refresh
        self.rng = np.random.default_rng(seed)
        self.key = jax.random.PRNGKey(seed)
        self._reset = jax.jit(raw_reset, static_argnums=(1, 2))
        self._step = jax.jit(raw_step, static_argnums=(3,))
        self.rb = None

    def _one(self):
        self.key, k = jax.random.split(self.key)
        actions = jnp.asarray(self.rng.integers(0, NUM_ACTIONS, self.n), jnp.int32)
        obs, self.rb, reward, done = self._step(k, self.rb, actions, self.pool_refresh)
        obs, reward, done = jax.device_get((obs, reward, done))
        return np.array(obs, np.float32), np.array(reward, np.float32), np.array(done, bool)

    def warm(self) -> float:
        t = time.perf_counter()
        _, self.rb = self._reset(self.key, self.n, self.pool_size)
        self._one()
        self._one()
        return time.perf_counter() - t

    def run(self) -> float:
        t = time.perf_counter()
        for _ in range(self.steps):
            self._one()
        return time.perf_counter() - t


# --------------------------------------------------------------------------- main


def main(args) -> list[dict]:
    from oir_gym.vector_env import InstructionCraftax

    print(f"# env throughput on {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"jax {jax.__version__} ({jax.default_backend()}), load average {os.getloadavg()[0]:.1f}; "
          f"steps={args.steps} repeats={args.repeats} obs_mode={args.obs_mode} "
          f"persistent cache={'off' if args.no_cache else 'on'}", flush=True)
    names = {"a": "(a) raw Craftax, lax.scan", "b": "(b) ours, lax.scan",
             "c": "(c) ours, Gymnasium from Python", "d": "(d) raw Craftax, jit from Python"}
    rows = []
    for n in args.envs:
        env = InstructionCraftax(num_envs=n, obs_mode=args.obs_mode, seed=args.seed)
        ps, pr = env.pool_size, env.pool_refresh
        make = {
            "a": lambda: RawScan(n, args.steps, ps, pr, args.seed),
            "b": lambda: OursScan(env, args.steps, args.seed),
            "c": lambda: OursGym(env, args.steps, args.seed),
            "d": lambda: RawPython(n, args.steps, ps, pr, args.seed),
        }
        runners, compile_s, times = {}, {}, {v: [] for v in args.variants}
        for v in args.variants:
            t = time.perf_counter()
            runners[v] = make[v]()
            warm = runners[v].warm() + (time.perf_counter() - t)
            # compile time: setup and the two warm-up calls, less two steady-state calls
            compile_s[v] = max(0.0, warm - 2 * runners[v].run() / (args.steps if v in "cd" else 1))
            print(f"  envs={n:4d} {names[v]:34s} compiled in {compile_s[v]:6.1f} s", flush=True)
        for _ in range(args.repeats):
            for v in args.variants:
                times[v].append(runners[v].run())
        res = {}
        for v in args.variants:
            res[v] = {"sps": n * args.steps / statistics.median(times[v]), "compile": compile_s[v]}
            rows.append({"envs": n, "variant": names[v], **res[v]})
            print(f"  envs={n:4d} {names[v]:34s} {res[v]['sps']:10.0f} env-steps/s", flush=True)
        if "a" in res and "b" in res:
            rows.append({"envs": n, "variant": "ratio (b)/(a)", "ratio": res["b"]["sps"] / res["a"]["sps"]})
        if "c" in res and "d" in res:
            rows.append({"envs": n, "variant": "ratio (c)/(d)", "ratio": res["c"]["sps"] / res["d"]["sps"]})
        env.close()

    print()
    print("| envs | variant | env-steps/s | compile (s) |")
    print("|---:|---|---:|---:|")
    for r in rows:
        if "ratio" in r:
            flag = "" if r["ratio"] >= 0.8 else " (below 0.8)"
            print(f"| {r['envs']} | **{r['variant']}** | **{r['ratio']:.2f}**{flag} | |")
        else:
            print(f"| {r['envs']} | {r['variant']} | {r['sps']:,.0f} | {r['compile']:.1f} |")
    return rows


if __name__ == "__main__":
    main(ARGS)
