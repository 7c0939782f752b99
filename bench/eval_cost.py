"""Cost of one evaluation (the PQN trainer's jitted evaluator) against the episodes per instruction.

    python bench/eval_cost.py --episodes 4 16 32 --horizon 1 100 --repeats 3

Timed is ``Trainer.evaluate`` for one seed: 155 instructions x ``episodes`` envs, ``horizon`` greedy steps;
two horizons separate the fixed part (world generation) from the per-step part.
"""

import argparse
import math
import os
import platform
import resource
import statistics
import sys
import time

from common import int_arg


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int_arg(1), nargs="+", default=[4, 16, 32], help="episodes per instruction")
    p.add_argument("--horizon", type=int_arg(1), nargs="+", default=[1000], help="steps per episode")
    p.add_argument("--hidden", type=int_arg(1), default=128, help="LSTM / dense units of the network")
    p.add_argument("--repeats", type=int_arg(1), default=1, help="timed evaluations per episode count (median)")
    p.add_argument("--no-control", action="store_true", help="evaluate without the control's neutral episodes")
    return p.parse_args(argv)


def bench_one(episodes: int, horizon: int, args, encoder) -> str:
    """The table row of one evaluation's cost."""
    import jax
    import jax.numpy as jnp

    from agents.pqn import network as pqn
    from oir_gym import functional as F
    from oir_gym.craftax_compat import NUM_ACTIONS
    from oir_gym.evaluation import EvalConfig, eval_instructions, eval_keys, eval_params, evaluate_jax_seeds
    from oir_gym.evaluation import make_jax_evaluator
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.observation import obs_dim

    cfg = EvalConfig(episodes=episodes, horizon=horizon, control=not args.no_control)
    texts, achs, sets = eval_instructions(cfg)
    registry = InstructionRegistry(encoder, capacity=len(texts) + 8)
    rows = registry.rows(texts, achs)
    pcfg = pqn.PQNConfig(hidden_size=args.hidden, num_layers=1)
    net = pqn.make_network(pcfg, NUM_ACTIONS)
    params = jax.vmap(lambda k: pqn.create_train_state(k, pcfg, net, obs_dim("paper"), encoder.dim, 1).params)(
        jax.random.split(jax.random.PRNGKey(0), 1))

    def greedy(p, carry, obs, done_prev, key):  # as Trainer.evaluate's policy, epsilon 0
        carry, q = net.apply(p, carry, obs["obs"][None], obs["instruction"][None], done_prev[None])
        return carry, pqn.eps_greedy(key, q[0], 0.0)

    n_envs = len(texts) * episodes
    evaluator = make_jax_evaluator(greedy, net.initial_carry, n_envs, horizon)
    seeds = jax.jit(jax.vmap(evaluator, in_axes=(0, 0, None, None)))
    env_params = F.EnvParams(table=registry.device_table())

    # what the scan carries for this batch (grows with the episodes)
    obs_state = jax.eval_shape(lambda k: F.batch_reset(k, env_params, n_envs, 1, None, "paper"), jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_leaves((obs_state, net.initial_carry(n_envs)))
    carry_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves) + n_envs * (22 + 2)

    t0 = time.perf_counter()
    pinned = jnp.repeat(jnp.asarray(rows, jnp.int32), episodes)
    compiled = seeds.lower(eval_keys(0, 1), params, eval_params(env_params, rows, achs), pinned).compile()
    compile_s = time.perf_counter() - t0

    times = []
    for update in range(1, args.repeats + 1):
        t0 = time.perf_counter()
        res = evaluate_jax_seeds(compiled, eval_keys(0, 1, update), params, env_params, rows, cfg, texts, achs, sets)
        assert len(res) == 1 and len(res[0].rates["original"]) == 22
        times.append(time.perf_counter() - t0)
    steps, rss = n_envs * horizon, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return (f"| {episodes} | {horizon} | {n_envs:,} | {steps:,} | {compile_s:.1f} | {min(times):.2f} | "
            f"{statistics.median(times):.2f} | {steps / min(times):,.0f} | {carry_bytes / 2**20:.0f} | {rss:.2f} |")


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    import oir_gym  # noqa: F401  (compilation cache)
    from oir_gym.encoder import get_encoder

    encoder = get_encoder()
    dev = jax.devices()[0]
    print(f"# bench/eval_cost.py: {platform.machine()}, {os.cpu_count()} CPU cores, JAX {jax.__version__} on "
          f"{dev.platform} ({dev.device_kind}); load average {os.getloadavg()[0]:.1f} at start")
    print(f"# LSTM {args.hidden}, 1 seed, original + simple + complex"
          f"{'' if args.no_control else ' + the neutral control'}, {args.repeats} timed evaluation(s) each\n")
    print("| episodes / instruction | horizon | envs | env steps | compile (s) | s per evaluation: fastest | median | "
          "env-steps/s | scan state (MiB) | peak RSS (GiB) |\n" + "|---:" * 10 + "|")
    for e in args.episodes:
        for h in args.horizon:
            print(bench_one(e, h, args, encoder), flush=True)
    print(f"\n# load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
