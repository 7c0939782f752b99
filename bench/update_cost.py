"""The PQN update program alone: how its LSTM and its scan settings change its time, in one run.

    python bench/update_cost.py                       # CPU-sized (LSTM 128, 64 x 16 trajectories)
    python bench/update_cost.py --preset fast         # the fast preset's update: 3 seeds x 5,120 trajectories
    python bench/update_cost.py --preset fast --unroll 8,16 --dtype float32,bfloat16
    python bench/update_cost.py --preset fast --variants sequence:8:float32,cell:8:float32,sequence:8:bfloat16
    python bench/update_cost.py --preset fast --variants sequence:8:bfloat16 --trace /tmp/update_trace
    python bench/update_cost.py --preset fast --variants sequence:8:bfloat16 --valid-rows 0.82 --skip-padding off,on

The update (:func:`agents.pqn.network.update`, vmapped over seeds and jitted as the trainer does) runs on random
trajectories of the preset's shape. Variants (LSTM ``sequence`` or flax's per-step ``cell``; GRAD ``hoisted`` or
``autodiff``) are timed interleaved; each one's median, ratio to the first, FLOP/s and share of the card's dense
peak (bfloat16, or TF32 for float32) are reported, over every row and over the rows that train (``--valid-rows``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time

from common import int_arg, interleaved

SIZES = {
    "cpu": dict(seeds=1, trajectories=64, steps=16, hidden=128, epochs=2, minibatches=4),
    "paper": dict(seeds=1, trajectories=64 * 5, steps=128, hidden=512, epochs=8, minibatches=4),
    "fast": dict(seeds=3, trajectories=1024 * 5, steps=128, hidden=512, epochs=4, minibatches=16),
}
#: Dense tensor-core peaks (FLOP/s) by device kind: (bfloat16, TF32); NVIDIA's datasheets (SXM).
PEAKS = {"H100": (989e12, 494e12), "H200": (989e12, 494e12), "A100": (312e12, 156e12)}


def update_flops(seeds: int, trajectories: int, steps: int, hidden: int, epochs: int, in_dim: int,
                 num_actions: int) -> float:
    """Matmul FLOPs of one update: forward, input and weight gradients (not the first layer's input gradient)."""
    rows = trajectories * (steps + 1)
    first = 2 * rows * in_dim * hidden
    rest = 2 * rows * (hidden * 4 * hidden * 2 + hidden * num_actions)  # LSTM input and recurrent, Q head
    return float(seeds * epochs * (2 * first + 3 * rest))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu", choices=sorted(SIZES))
    p.add_argument("--lstm", default="sequence,cell", help="LSTM implementations, comma-separated")
    p.add_argument("--unroll", default="8", help="scan unrolls, comma-separated")
    p.add_argument("--dtype", default="float32", help="compute dtypes, comma-separated (float32, bfloat16)")
    p.add_argument("--variants", default=None, help="explicit variants LSTM:UNROLL:DTYPE[:GRAD], comma-separated "
                   "(instead of every combination of the three options)")
    p.add_argument("--lstm-kernel", default="scan", help="LSTM recurrences (pqn.lstm_kernel; pallas/R/U/K/S/W sets the "
                   "kernel's row, unit and chunk blocks, stages, warps and optionally the backward's unit block), "
                   "comma-separated (scan, pallas)")
    p.add_argument("--valid-rows", type=float, default=1.0, help="share of the batch's rows that train (the rest "
                   "are padding, weighted 0 as unfilled relabel slots are)")
    p.add_argument("--skip-padding", default="off", help="pqn.skip_padding settings, comma-separated (off, on)")
    p.add_argument("--iterations", type=int_arg(1), default=5, help="timed updates per variant (median reported)")
    p.add_argument("--parts", action="store_true",
                   help="also time the first variant's parts: one minibatch's update (times the update's "
                        "minibatches), and the LSTM recurrence alone (forward and backward) on one minibatch")
    p.add_argument("--trace", default=None, metavar="DIR",
                   help="also record a jax.profiler trace of the first variant's timed updates in DIR and print "
                        "where its GPU time goes, kernel by kernel (bench/trace_summary.py)")
    return p.parse_args(argv)


def cell_network(num_actions: int, hidden: int, unroll: int):
    """The Q-network with flax's cell called at every step (the other implementation)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class CellQNetwork(nn.Module):
        @nn.compact
        def __call__(self, carry, obs, instruction, resets):
            x = nn.LayerNorm()(jnp.concatenate([obs, instruction], axis=-1))
            x = nn.relu(nn.LayerNorm()(nn.Dense(hidden)(x)))

            def scan_fn(cell, carry, inp):
                x_t, reset_t = inp
                carry = jax.tree_util.tree_map(lambda c: jnp.where(reset_t[:, None], 0.0, c), carry)
                return cell(carry, x_t)

            scan = nn.scan(scan_fn, variable_broadcast="params", split_rngs={"params": False}, unroll=unroll)
            carry, y = scan(nn.OptimizedLSTMCell(hidden), carry, (x, resets))
            return carry, nn.Dense(num_actions)(y)

    return CellQNetwork()


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp
    from flax.training.train_state import TrainState

    from agents.pqn import lstm_pallas
    from agents.pqn import network as pqn
    from agents.pqn.config import PQNConfig, TrainConfig
    from oir_gym.craftax_compat import NUM_ACTIONS
    from oir_gym.observation import obs_dim

    size = SIZES[args.preset]
    S, N, T, H = size["seeds"], size["trajectories"], size["steps"], size["hidden"]
    cfg = PQNConfig(hidden_size=H, num_epochs=size["epochs"], num_minibatches=size["minibatches"])
    D = obs_dim(TrainConfig().env.obs_mode)
    k = jax.random.PRNGKey(0)
    batch = {
        "obs": jax.random.normal(k, (S, T, N, D)), "instr": jax.random.normal(k, (S, T, N, 384)),
        "actions": jax.random.randint(k, (S, T, N), 0, NUM_ACTIONS), "rewards": jnp.zeros((S, T, N)),
        "dones": jax.random.uniform(k, (S, T, N)) < 0.01, "resets": jax.random.uniform(k, (S, T, N)) < 0.01,
        "cuts": jnp.zeros((S, T, N), bool),
        "weights": jnp.broadcast_to((jnp.arange(N) < round(args.valid_rows * N)).astype(jnp.float32), (S, N)),
        "next_obs_last": jnp.zeros((S, N, D)), "next_instr_last": jnp.zeros((S, N, 384)),
        "carry0": (jnp.zeros((S, N, H)), jnp.zeros((S, N, H))),
    }
    if args.variants:
        variants = [(lstm, int(unroll), dtype, (grad or ["hoisted"])[0])
                    for lstm, unroll, dtype, *grad in (v.split(":") for v in args.variants.split(","))]
    else:
        variants = [(*v, "hoisted") for v in itertools.product(
            args.lstm.split(","), [int(u) for u in args.unroll.split(",")], args.dtype.split(","))]
    variants = [(*v, kern, skip) for v in variants for kern in args.lstm_kernel.split(",")
                if kern == "scan" or v[0] == "sequence" and v[3] == "hoisted" for skip in args.skip_padding.split(",")]
    programs = {}
    tiling_names = ("MAX_ROWS", "MAX_UNITS", "MAX_CHUNK", "NUM_STAGES", "NUM_WARPS", "MAX_BWD_UNITS")
    module_tiling = [getattr(lstm_pallas, n) for n in tiling_names]

    def use_tiling(kern: str) -> None:
        """pallas/ROWS/UNITS/CHUNK/STAGES/WARPS[/BWD_UNITS]: that tiling, the module's own for what it leaves out."""
        given = [int(x) for x in kern.split("/")[1:]]
        for name, value in zip(tiling_names, given + module_tiling[len(given):]):
            setattr(lstm_pallas, name, value)

    for lstm, unroll, dtype, grad, kern, skip in list(variants):
        use_tiling(kern)
        vcfg = dataclasses.replace(cfg, skip_padding=skip == "on")
        net = (pqn.QNetwork(NUM_ACTIONS, H, 1, True, unroll, jnp.dtype(dtype), grad, kern.split("/")[0])
               if lstm == "sequence" else cell_network(NUM_ACTIONS, H, unroll))

        def init(key, net=net):
            params = net.init(key, pqn.QNetwork(NUM_ACTIONS, H).initial_carry(1), jnp.zeros((1, 1, D)),
                              jnp.zeros((1, 1, 384)), jnp.zeros((1, 1), bool))
            return TrainState.create(apply_fn=net.apply, params=params, tx=pqn.make_optimizer(cfg, 100))

        state = jax.jit(jax.vmap(init))(jax.random.split(k, S))
        fn = jax.jit(jax.vmap(lambda ts, key, b, vcfg=vcfg: pqn.update(ts, vcfg, key, b)))
        t = time.time()
        try:
            compiled = fn.lower(state, jax.random.split(k, S), batch).compile()
        except Exception as e:  # noqa: BLE001 - a tiling the card cannot run: say so, time the others
            print(f"# {kern}: did not compile ({str(e).splitlines()[0][:200]})")
            variants.remove((lstm, unroll, dtype, grad, kern, skip))
            continue
        programs[(lstm, unroll, dtype, grad, kern, skip)] = (compiled, state, time.time() - t)
        jax.block_until_ready(compiled(state, jax.random.split(k, S), batch))  # warm-up
    keys = jax.random.split(k, S)
    times = interleaved({v: lambda p=programs[v]: jax.block_until_ready(p[0](p[1], keys, batch)) for v in variants},
                        args.iterations)
    print(f"# update program, preset {args.preset}: {S} seed(s) x {N} trajectories x {T} steps, LSTM {H}, "
          f"{size['epochs']} epochs x {size['minibatches']} minibatches; {jax.devices()[0].device_kind}, "
          f"median of {args.iterations}; {args.valid_rows:.0%} of the rows train")
    flops = update_flops(S, N, T, H, size["epochs"], D + 384, NUM_ACTIONS)
    kind = jax.devices()[0].device_kind
    print(f"# matmul FLOPs per update: {flops / 1e9:,.1f} GFLOP")
    print("| lstm | unroll | dtype | grad | kernel | skip padding | compile s | update s | ratio to first | TFLOP/s | "
          "of peak | TFLOP/s on rows that train |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = statistics.median(times[variants[0]])
    for v in variants:
        med = statistics.median(times[v])
        top = next((p[v[2] != "bfloat16"] for name, p in PEAKS.items() if name in kind), None)
        frac = f"{flops / med / top:.1%}" if top else "-"
        print(f"| {v[0]} | {v[1]} | {v[2]} | {v[3]} | {v[4]} | {v[5]} | {programs[v][2]:.1f} | {med:.3f} | "
              f"{med / base:.2f} | {flops / med / 1e12:.1f} | {frac} | {flops * args.valid_rows / med / 1e12:.1f} |")
    if args.parts:
        use_tiling(variants[0][4])
        print_parts(variants[0], programs[variants[0]][1], cfg, batch, S, N, T, H, args.iterations)
    if args.trace:
        print_trace(args.trace, programs[variants[0]], batch, S, args.iterations)
    return 0


def print_trace(trace_dir: str, program, batch, S: int, iterations: int) -> None:
    """Run ``program`` ``iterations`` times under ``jax.profiler.trace`` and print its kernels' times."""
    import jax

    import trace_summary

    compiled, state, _ = program
    keys = jax.random.split(jax.random.PRNGKey(0), S)
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(iterations):
            jax.block_until_ready(compiled(state, keys, batch))
    print(f"# the first variant's {iterations} traced updates, kernel by kernel (trace in {trace_dir})")
    print(trace_summary.report(trace_dir, iterations))


def print_parts(variant, state, cfg, batch, S, N, T, H, iterations: int) -> None:
    """Where one update's time goes (``state``: the variant's): a minibatch's update, and its LSTM recurrence."""
    import jax
    import jax.numpy as jnp

    from agents.pqn import network as pqn
    from agents.pqn.lstm_pallas import lstm_scan_pallas

    def median_s(fn, *a) -> float:
        jax.block_until_ready(fn(*a))  # compiles
        return statistics.median(interleaved({0: lambda: jax.block_until_ready(fn(*a))}, iterations)[0])

    lstm, unroll, dtype, grad, kern, _ = variant
    mb = N // cfg.num_minibatches
    steps = cfg.num_epochs * cfg.num_minibatches
    one = dataclasses.replace(cfg, num_epochs=1, num_minibatches=1)
    small = {k: jax.tree_util.tree_map(lambda x: x[:, :mb], v) if k in ("weights", "next_obs_last", "next_instr_last",
             "carry0") else v[:, :, :mb] for k, v in batch.items()}
    k = jax.random.PRNGKey(0)
    keys = jax.random.split(k, S)
    minibatch = jax.jit(jax.vmap(lambda ts, key, b: pqn.update(ts, one, key, b)))
    t_mb = median_s(minibatch, state, keys, small)

    x_proj = jax.random.normal(k, (S, T, mb, 4 * H))  # the update's recurrence: T steps
    resets = jax.random.uniform(k, (S, T, mb)) < 0.01
    kernel = jax.random.normal(k, (S, H, 4 * H)) * 0.05
    bias = jnp.zeros((S, 4 * H))
    carry = (jnp.zeros((S, mb, H)), jnp.zeros((S, mb, H)))
    cdt = jnp.dtype(dtype)

    def recurrence(kernel, bias, x_proj, resets, carry):
        if grad == "hoisted":
            scan = lstm_scan_pallas if kern.startswith("pallas") else pqn.lstm_scan
            return scan(kernel, bias, x_proj, resets, carry, cdt, unroll)[1].sum()
        return pqn.lstm_forward(kernel, bias, x_proj, resets, carry, cdt, unroll)[1][0].sum()

    t_rec, t_fwd = (median_s(jax.jit(jax.vmap(f)), kernel, bias, x_proj, resets, carry)
                    for f in (jax.grad(recurrence, argnums=(0, 1, 2)), recurrence))
    per_step = t_rec / (2 * T)
    print(f"# parts of the first variant ({lstm}, unroll {unroll}, {dtype}, {grad}, {kern}); {steps} minibatches per update")
    print("| part | s | x minibatches per update |\n|---|---|---|")
    print(f"| one minibatch's update ({S} x {mb} trajectories) | {t_mb:.4f} | {t_mb * steps:.3f} |")
    print(f"| the LSTM recurrence, forward and backward | {t_rec:.4f} | {t_rec * steps:.3f} |")
    print(f"| the LSTM recurrence, forward only | {t_fwd:.4f} | {t_fwd * steps:.3f} |")
    print(f"# {per_step * 1e6:.1f} us per sequential LSTM step (forward and backward: {2 * T} steps per minibatch)")


if __name__ == "__main__":
    sys.exit(main())
