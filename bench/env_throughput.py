"""Environment throughput: InstructionCraftax against raw Craftax-Classic, on this machine.

Four ways of stepping a batch of envs with random actions: (a) raw Craftax-Classic in a ``lax.scan``;
(b) ``oir_gym.functional.batch_step`` in the same scan; (c) the Gymnasium vector env from Python; (d) (a)'s
batch, one jitted step per Python call. Timed runs are interleaved; the median is reported.

    python bench/env_throughput.py --quick
    python bench/env_throughput.py --envs 64 256 --steps 128 --repeats 3
    python bench/env_throughput.py --no-cache ...   # true cold compile times (no persistent cache)
"""

import argparse
import os
import platform
import statistics
import time

from common import int_arg, interleaved


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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

import oir_gym  # noqa: E402

if ARGS is not None:
    oir_gym.enable_compilation_cache()  # a no-op under --no-cache (OIR_GYM_JAX_CACHE=0)
from oir_gym import functional as F  # noqa: E402
from oir_gym.craftax_compat import NUM_ACTIONS, CraftaxParams, CraftaxStaticParams  # noqa: E402
from oir_gym.craftax_compat import craftax_step, render_craftax_symbolic  # noqa: E402

STATIC = CraftaxStaticParams()
RAW_PARAMS = CraftaxParams()  # Craftax's defaults: episodes end at death, lava or 10,000 steps


def _game_over(s):
    in_lava = s.map[s.player_position[0], s.player_position[1]] == 14
    return (s.timestep >= RAW_PARAMS.max_timesteps) | in_lava | (s.player_health <= 0)


def raw_reset(key, num_envs: int, pool_size: int):
    """Raw Craftax worlds and their pool, in a ``BatchState`` of Craftax states."""
    env, pool = F.batch_worlds(key, RAW_PARAMS, num_envs, pool_size)
    return jax.vmap(render_craftax_symbolic)(env), F.BatchState(env=env, pool=pool, cursor=jnp.zeros((), jnp.int32))


def raw_step(key, rb: F.BatchState, actions, pool_refresh: int):
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
        env = F.tree_select(done, jax.tree_util.tree_map(lambda p: p[slot], pool), env)
        idx = (cursor + jnp.arange(pool_refresh)) % pool_size
        new = F.batch_worlds(k_pool, RAW_PARAMS, pool_refresh, 0)[0]
        pool = jax.tree_util.tree_map(lambda p, w: p.at[idx].set(w), pool, new)
        obs = jnp.where(done[:, None], jax.vmap(render_craftax_symbolic)(env), obs)
        return env, pool, (cursor + pool_refresh) % pool_size, obs

    env, pool, cursor, obs = jax.lax.cond(jnp.any(done), _reset, lambda c: c, (env, rb.pool, rb.cursor, obs))
    return obs, F.BatchState(env=env, pool=pool, cursor=cursor), reward, done


def scan_call(num_envs: int, steps: int, step, args: list):
    """A call that scans ``step(key, state, actions, *rest) -> (state, total)`` from ``args`` (key, state, *rest)."""
    def run(key, state, *rest):
        def body(carry, _):
            key, state, acc = carry
            key, k_a, k_s = jax.random.split(key, 3)
            state, total = step(k_s, state, jax.random.randint(k_a, (num_envs,), 0, NUM_ACTIONS), *rest)
            return (key, state, acc + total), None

        return jax.lax.scan(body, (key, state, jnp.zeros((), jnp.float32)), None, length=steps)[0]

    fn = jax.jit(run)

    def one():
        key, state, _ = jax.block_until_ready(fn(*args))
        args[:2] = key, state

    return one


# Each variant is a set-up that returns ``(one, calls)``: ``one()`` is one call (a whole scan, or one
# step from Python) and a timed run is ``calls`` of them.
def raw_scan(n, steps, pool_size, pool_refresh, seed):
    def step(k, rb, actions):
        obs, rb, reward, done = raw_step(k, rb, actions, pool_refresh)
        return rb, jnp.sum(obs) + jnp.sum(reward) + jnp.sum(done)

    _, rb = jax.jit(raw_reset, static_argnums=(1, 2))(jax.random.PRNGKey(seed), n, pool_size)
    return scan_call(n, steps, step, [jax.random.PRNGKey(seed + 1), rb]), 1


def ours_scan(env, steps, seed):
    def step(k, bs, actions, params):
        obs, bs, reward, term, trunc, _, _ = F.batch_step(k, bs, actions, params, obs_mode=env.obs_mode,
                                                          pool_refresh=env.pool_refresh)
        return bs, jnp.sum(obs["obs"]) + jnp.sum(obs["instruction"]) + jnp.sum(reward) + jnp.sum(term) + jnp.sum(trunc)

    env.reset(seed=seed)
    return scan_call(env.num_envs, steps, step, [jax.random.PRNGKey(seed + 1), env.state, env.params]), 1


def ours_gym(env, steps, seed):
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    return (lambda: env.step(rng.integers(0, NUM_ACTIONS, env.num_envs))), steps


def raw_python(n, steps, pool_size, pool_refresh, seed):
    rng, step = np.random.default_rng(seed), jax.jit(raw_step, static_argnums=(3,))
    key = jax.random.PRNGKey(seed)
    state = [key, jax.jit(raw_reset, static_argnums=(1, 2))(key, n, pool_size)[1]]

    def one():
        state[0], k = jax.random.split(state[0])
        obs, state[1], reward, done = step(k, state[1], jnp.asarray(rng.integers(0, NUM_ACTIONS, n), jnp.int32),
                                           pool_refresh)
        obs, reward, done = jax.device_get((obs, reward, done))
        return np.array(obs, np.float32), np.array(reward, np.float32), np.array(done, bool)

    return one, steps


def main(args) -> None:
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
        make = {"a": lambda: raw_scan(n, args.steps, ps, pr, args.seed),
                "b": lambda: ours_scan(env, args.steps, args.seed), "c": lambda: ours_gym(env, args.steps, args.seed),
                "d": lambda: raw_python(n, args.steps, ps, pr, args.seed)}
        runs, compile_s = {}, {}

        def run(v: str) -> float:
            one, calls = runs[v]
            t = time.perf_counter()
            for _ in range(calls):
                one()
            return time.perf_counter() - t

        for v in args.variants:
            t = time.perf_counter()
            runs[v] = make[v]()
            for _ in range(2):
                runs[v][0]()
            warm = time.perf_counter() - t
            # compile time: setup and the two warm-up calls, less two steady-state calls
            compile_s[v] = max(0.0, warm - 2 * run(v) / runs[v][1])
            print(f"  envs={n:4d} {names[v]:34s} compiled in {compile_s[v]:6.1f} s", flush=True)
        times = interleaved({v: lambda v=v: run(v) for v in args.variants}, args.repeats)
        sps = {v: n * args.steps / statistics.median(times[v]) for v in args.variants}
        for v in args.variants:
            rows.append(f"| {n} | {names[v]} | {sps[v]:,.0f} | {compile_s[v]:.1f} |")
            print(f"  envs={n:4d} {names[v]:34s} {sps[v]:10.0f} env-steps/s", flush=True)
        for x, y in (("b", "a"), ("c", "d")):
            if x in sps and y in sps:
                r = sps[x] / sps[y]
                rows.append(f"| {n} | **ratio ({x})/({y})** | **{r:.2f}**{'' if r >= 0.8 else ' (below 0.8)'} | |")
        env.close()
    print("\n| envs | variant | env-steps/s | compile (s) |\n|---:|---|---:|---:|\n" + "\n".join(rows))


if __name__ == "__main__":
    main(ARGS)
