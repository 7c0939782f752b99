"""Training throughput: our PQN loop against a plain PQN-RNN on raw Craftax-Classic, in one run.

    python bench/pqn_throughput.py                    # CPU-sized: 16 envs x 64 steps, LSTM 128
    python bench/pqn_throughput.py --preset paper,fast --devices 2 --seeds 4   # two sizes, 2 GPUs
    python bench/pqn_throughput.py --preset paper --devices 1,2,4 --seeds-per-device 2 [--processes]

Loops, timed per update interleaved after ``--warmup`` untimed updates: (a) plain PQN-RNN on raw Craftax,
the same network (zero instruction) and update; (b) ``Trainer.iteration`` with ``gt``; (c) with ``oir``
(rules); (d) ``oir_lag``: (c) with ``oir.relabel_lag 1``. A list of device counts prints the scaling table;
``--processes`` runs one process per device.
"""

import argparse
import contextlib
import io
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

from common import int_arg, real_arg  # first: it puts this checkout on sys.path
from agents.run.multihost import initialize_distributed

if os.environ.get("JAX_COORDINATOR_ADDRESS"):  # a process of --processes: join before anything starts JAX
    initialize_distributed()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu", help="sizes, comma-separated: cpu, paper, fast")
    p.add_argument("--devices", default="1", help="devices the seeds are split over; a list (1,2) times each count")
    p.add_argument("--seeds", type=int_arg(1), default=None, help="seeds per loop (default: --devices)")
    p.add_argument("--seeds-per-device", type=int_arg(1), default=None, help="with a list of device counts")
    p.add_argument("--iterations", type=int_arg(1), default=6, help="timed updates per loop (median reported)")
    p.add_argument("--warmup", type=int_arg(1), default=3, help="untimed updates per loop (the first compiles)")
    p.add_argument("--loops", default="plain,gt,oir", help="comma-separated: plain, gt, oir, oir_lag")
    p.add_argument("--seed", type=int_arg(0), default=0)
    p.add_argument("--processes", action="store_true", help="one process per device; needs --seeds-per-device")
    p.add_argument("--timeout", type=real_arg(0, low_open=True), default=3600.0, help="with --processes: s per count")
    p.add_argument("--child-result", default=None, help=argparse.SUPPRESS)  # a process started by --processes
    return p.parse_args(argv)


SIZES = {
    "cpu": {"pqn.num_envs": 16, "pqn.num_steps": 64, "pqn.hidden_size": 128, "pqn.num_epochs": 2,
            "pqn.num_minibatches": 4},
    "paper": {"pqn.num_envs": 64, "pqn.num_steps": 128, "pqn.hidden_size": 512, "pqn.num_epochs": 8,
              "pqn.num_minibatches": 4, "pqn.scan_unroll": 8},
    "fast": {"pqn.num_envs": 1024, "pqn.num_steps": 128, "pqn.hidden_size": 512, "pqn.num_epochs": 4,
             "pqn.num_minibatches": 16, "pqn.scan_unroll": 8, "pqn.compute_dtype": "bfloat16"},
}
#: our loops: key -> (row label, the settings that differ from the bench's common ones)
OURS = {
    "gt": ("(b) ours, gt", {"run.method": "gt"}),
    "oir": ("(c) ours, oir (rules)", {"run.method": "oir", "oir.relabeler": "rules"}),
    "oir_lag": ("(d) ours, oir (rules), relabel lag 1",
                {"run.method": "oir", "oir.relabeler": "rules", "oir.relabel_lag": 1}),
}
PLAIN = "(a) plain PQN-RNN, raw Craftax"


def _error(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child_result:
        return child_main(args)
    names = [n.strip() for n in args.preset.split(",") if n.strip()]
    if not names or set(names) - set(SIZES):
        return _error(f"--preset {args.preset!r}: expected some of {sorted(SIZES)}, comma-separated")
    try:
        counts = [int(d) for d in str(args.devices).split(",") if d.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        return _error(f"--devices {args.devices!r}: expected device counts >= 1, comma-separated")
    if (len(counts) > 1 or args.processes) and not (args.seeds_per_device and args.seeds is None):
        who = "--processes" if args.processes else "a list of device counts"
        return _error(f"{who} needs --seeds-per-device K (K >= 1, the seeds per device) instead of --seeds")
    loops = [x.strip() for x in args.loops.split(",") if x.strip()]
    if not loops or set(loops) - {"plain", *OURS}:
        return _error(f"--loops {args.loops!r}: choose from plain, {', '.join(OURS)}")
    if args.processes:
        return processes_main(args, names, counts)
    plan = [(d, d * args.seeds_per_device if args.seeds_per_device else (args.seeds or d)) for d in counts]
    from agents.pqn.sharding import check_layout

    try:  # the layout before anything compiles
        for n in names:
            for d, seeds in plan:
                check_layout(seeds, SIZES[n]["pqn.num_envs"], d)
    except ValueError as e:
        return _error(str(e).replace("--run.num-devices", "--devices").replace("--run.num-seeds", "--seeds"))
    for n in names:
        medians = {(d, seeds): {loop: statistics.median(t) for loop, t in bench_size(args, n, seeds, d).items()}
                   for d, seeds in plan}
        if len(plan) > 1:
            print(scaling_table(n, SIZES[n]["pqn.num_envs"] * SIZES[n]["pqn.num_steps"], medians), flush=True)
    return 0


def gpu_ids() -> list[str]:
    """This host's GPUs as ``CUDA_VISIBLE_DEVICES`` entries, found without initialising a backend."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [x.strip() for x in visible.split(",") if x.strip() and x.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, _ in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


def processes_main(args, names: list[str], counts: list[int]) -> int:
    """``--processes``: per size and device count d, d processes of one device each, then the scaling table."""
    from agents.pqn.sharding import check_layout

    K, gpus = args.seeds_per_device, gpu_ids()
    visible = len(gpus) if gpus else max(counts)  # on the CPU every process has its own CPU device
    try:
        for n in names:
            check_layout(K, SIZES[n]["pqn.num_envs"], 1, visible=1)
        if max(counts) > visible:
            raise ValueError(f"--devices {max(counts)} with --processes but this host has {visible} GPU(s); "
                             f"use --devices {visible} or fewer")
    except ValueError as e:
        return _error(str(e).replace("--run.num-seeds", "--seeds-per-device"))
    order = process_order(counts)
    for n in names:
        medians: dict[tuple[int, int], dict[str, float]] = {}
        baseline_runs: dict[str, list[float]] = {}  # per loop, the baseline count's median in each of its runs
        for j, d in enumerate(order):
            if (results := run_processes(args, n, d, gpus)) is None:
                return 1
            run = f", run {order[:j + 1].count(d)} of {order.count(d)}" if order.count(d) > 1 else ""
            for i, r in enumerate(results):
                print(f"\n### process {i} of {d} ({n} sizes{run})\n{r['table']}", flush=True)
            # an update of d processes ends when the slowest does: per update the max, then the median
            medians[(d, d * K)] = med = {
                loop: statistics.median(max(r["times"][loop][u] for r in results) for u in range(args.iterations))
                for loop in results[0]["times"]}
            if d == order[0]:
                for loop, m in med.items():
                    baseline_runs.setdefault(loop, []).append(m)
        print(scaling_table(n, SIZES[n]["pqn.num_envs"] * SIZES[n]["pqn.num_steps"],
                            {(d, d * K): medians[(d, d * K)] for d in counts}, processes=True,
                            baseline_runs=baseline_runs if len(order) > 1 else None), flush=True)
    return 0


def process_order(counts: list[int]) -> list[int]:
    """The baseline (first) count before, between and after the others: ``[1, 2, 4]`` -> ``[1, 2, 1, 4, 1]``."""
    return [counts[0]] + [x for d in counts[1:] for x in (d, counts[0])]


def run_processes(args, size: str, d: int, gpus: list[str]) -> Optional[list[dict]]:
    """The results of ``d`` processes of this script; ``None`` (after saying why) if one fails or times out."""
    tmp = tempfile.mkdtemp(prefix="oir_bench_procs_")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, os.path.abspath(__file__), "--preset", size, "--devices", "1",
           "--seeds", str(args.seeds_per_device), "--iterations", str(args.iterations), "--warmup", str(args.warmup),
           "--loops", args.loops, "--seed", str(args.seed)]
    procs = []
    # SIGTERM to the bench: end as Ctrl-C does, through the finally below
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for i in range(d):
            pin = {"CUDA_VISIBLE_DEVICES": gpus[i]} if gpus else {"JAX_PLATFORMS": "cpu"}
            env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(d),
                       JAX_PROCESS_ID=str(i), **pin)
            log = os.path.join(tmp, f"process{i}")
            with open(log + ".out", "w") as out, open(log + ".err", "w") as err:
                procs.append(subprocess.Popen(cmd + ["--child-result", log + ".json"], env=env, stdout=out,
                                              stderr=err, cwd=Path(__file__).resolve().parents[1],
                                              start_new_session=True))  # a group of its own, with its workers
        print(f"{size} sizes: {d} process(es) of 1 device each started (logs in {tmp})", file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.timeout
        while (all(p.poll() in (None, 0) for p in procs) and any(p.poll() is None for p in procs)
               and time.monotonic() <= deadline):
            time.sleep(0.2)
        failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)),
                      "timeout" if any(p.poll() is None for p in procs) else None)
    finally:  # no process (nor its relabel workers) is left running, whatever happened here
        for p in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            if p.poll() is None:
                p.wait(timeout=60)
        signal.signal(signal.SIGTERM, previous)
    if failed == "timeout":
        print(f"error: the {d} processes ({size} sizes) ran past --timeout {args.timeout:g} s and were killed "
              f"(logs in {tmp})", file=sys.stderr)
        return None
    if failed is not None:
        tail = Path(tmp, f"process{failed}.err").read_text().splitlines()[-20:]
        print("\n".join(tail), file=sys.stderr)
        code = procs[failed].returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        print(f"error: process {failed} of {d} ({size} sizes) {how} ({'its last lines above, ' if tail else ''}"
              f"logs in {tmp}); the others were stopped", file=sys.stderr)
        return None
    return [json.loads(Path(tmp, f"process{i}.json").read_text()) for i in range(d)]


def child_main(args) -> int:
    """One process of ``--processes``: its table and every update's time go to ``--child-result``."""
    from agents.run.multihost import ProcessLost, allgather_json, process_count

    try:
        with contextlib.redirect_stdout(table := io.StringIO()):
            times = bench_size(args, args.preset, args.seeds, 1, meet=lambda: allgather_json(0))
        sys.stdout.write(table.getvalue())
        Path(args.child_result).write_text(json.dumps({"table": table.getvalue().strip(), "times": times}))
    except ProcessLost as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        os._exit(3)  # at once: jax.distributed's exit barrier would wait for the lost process
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        if process_count() > 1:
            os._exit(1)  # not the exit barrier: the others stop at their next meeting (agents.run.train.script)
        raise
    return 0


def scaling_table(size: str, steps_per_seed: int, medians: dict[tuple[int, int], dict[str, float]],
                  processes: bool = False, baseline_runs: Optional[dict[str, list[float]]] = None) -> str:
    """Markdown: per loop, seed-steps/s at each (devices, seeds) and the ratio to the first column."""
    plan = list(medians)
    unit = "process(es)" if processes else "device(s)"
    d0, s0 = plan[0]
    runs_of = f", mean of {len(next(iter(baseline_runs.values())))} runs" if baseline_runs else ""
    head = " | ".join([f"{d0} {unit} x {s0} seeds{runs_of} (s/update, seed-steps/s)"]
                      + [f"{d} {unit} x {s} seeds (s/update, seed-steps/s)" for d, s in plan[1:]])
    extra = f" {d0} {unit}: each run (s/update) | spread of its seed-steps/s |" if baseline_runs else ""
    how = "one process per device" if processes else "one process over the devices"
    against = ("the mean of the first column's runs (in brackets: against its slowest and fastest run)"
               if baseline_runs else "the first column")
    lines = [f"\nScaling | {size} sizes | {how} | seed-steps/s against {against}\n",
             f"| loop | {head} |{extra}" + "".join(f" {d} / {d0} {unit} |" for d, _ in plan[1:]),
             "|---" * (2 + 2 * (len(plan) - 1) + (2 if baseline_runs else 0)) + "|"]
    for loop in medians[plan[0]]:
        rate = {k: k[1] * steps_per_seed / medians[k][loop] for k in plan}
        cells = [f"{medians[k][loop]:.3f}, {rate[k]:,.0f}" for k in plan]
        if not baseline_runs:
            lines.append(f"| {loop} | " + " | ".join(cells + [f"{rate[k] / rate[plan[0]]:.2f}x" for k in plan[1:]])
                         + " |")
            continue
        runs = baseline_runs[loop]
        base = [s0 * steps_per_seed / t for t in runs]
        mean = s0 * steps_per_seed / statistics.fmean(runs)  # the seed-steps/s of the runs' mean s/update
        cells[0] = f"{statistics.fmean(runs):.3f}, {mean:,.0f}"
        spread = f"{min(base):,.0f}-{max(base):,.0f} ({(max(base) - min(base)) / mean:.0%})"
        ratios = [f"{rate[k] / mean:.2f}x ({rate[k] / max(base):.2f}-{rate[k] / min(base):.2f}x)" for k in plan[1:]]
        lines.append(f"| {loop} | " + " | ".join(cells + [", ".join(f"{t:.3f}" for t in runs), spread] + ratios)
                     + " |")
    return "\n".join(lines)


def bench_size(args, size: str, S: int, devices: int, meet: Callable[[], object] = lambda: None) -> dict[str, list]:
    """Print the tables of one size and return each loop's timed s/update; ``meet()`` ends each update."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from agents.pqn import network as pqn
    from agents.pqn.config import TrainConfig
    from agents.pqn.trainer import Trainer
    from agents.pqn.sharding import AXIS, shard_leading
    from env_throughput import raw_reset, raw_step
    from oir_gym.craftax_compat import NUM_ACTIONS
    from oir_gym.observation import obs_dim
    from oir_gym.relabel.parallel import ParallelRelabeler, default_workers

    P = jax.process_count()  # the trainer's run.num_seeds counts every process's seeds
    common = {"run.total_timesteps": 10_000_000, "env.obs_mode": "symbolic", "eval.every": 10**9,
              "run.checkpoint_every": 10**9, "pqn.lr": 1e-5, "run.seed": args.seed, "run.num_seeds": S * P,
              "run.num_devices": devices, **SIZES[size]}
    if P > 1:  # processes sharing a host share its cores: 1/P of the relabel workers one process would start
        common["oir.relabel_workers"] = -(-default_workers() // P)
    cfg = TrainConfig().replace(**{"run.method": "gt", **common}).validate()
    E, T, D = cfg.pqn.num_envs, cfg.pqn.num_steps, obs_dim("symbolic")

    # (a) plain PQN-RNN
    net = pqn.make_network(cfg.pqn, NUM_ACTIONS)
    mesh = jax.sharding.Mesh(np.asarray(jax.local_devices()[:devices]), (AXIS,))  # this process's devices
    seed_keys = jax.random.split(jax.random.PRNGKey(args.seed), S)
    ts = pqn.create_train_states(seed_keys, cfg.pqn, net, D, 384, cfg.num_updates)
    zero_instr = jnp.zeros((E, 384))

    def rollout(params, runner, env_steps):
        def step(c, t):
            rb, obs, carry, done_prev, key = c
            key, k_act, k_env = jax.random.split(key, 3)
            carry, q = net.apply(params, carry, obs[None], zero_instr[None], done_prev[None])
            action = pqn.eps_greedy(k_act, q[0], pqn.epsilon(cfg.pqn, cfg.run.total_timesteps, env_steps + t * E))
            next_obs, rb, reward, done = raw_step(k_env, rb, action, 4)
            rec = dict(obs=obs, actions=action, rewards=reward, dones=done, resets=done_prev)
            return (rb, next_obs, carry, done, key), rec

        carry0 = runner[2]
        runner, tr = jax.lax.scan(step, runner, jnp.arange(T))
        return runner, dict(tr, instr=jnp.broadcast_to(zero_instr, (T, E, 384)), next_obs_last=runner[1],
                            next_instr_last=zero_instr, weights=jnp.ones(E), carry0=carry0)

    # seeds vmapped, the seed axis split over the devices (DESIGN 7: purejaxql's own multi-GPU form)
    rollout = jax.jit(jax.vmap(rollout, in_axes=(0, 0, None)))
    update = jax.jit(jax.vmap(lambda ts, k, b: pqn.update(ts, cfg.pqn, k, b)))
    obs, rb = jax.jit(jax.vmap(raw_reset, in_axes=(0, None, None)), static_argnums=(1, 2))(seed_keys, E, 2 * E)
    runner = (rb, obs, jax.vmap(lambda _: net.initial_carry(E))(jnp.arange(S)), jnp.ones((S, E), bool),
              jax.random.split(jax.random.PRNGKey(1), S))
    plain = {"ts": shard_leading(ts, mesh, (S,)), "runner": shard_leading(runner, mesh, (S,)),
             "steps": 0, "key": jax.random.PRNGKey(2)}

    def plain_iteration():
        plain["runner"], batch = rollout(plain["ts"].params, plain["runner"], plain["steps"])
        plain["key"], k = jax.random.split(plain["key"])
        plain["ts"], m = update(plain["ts"], jax.random.split(k, S), batch)
        jax.device_get(m["loss"])
        plain["steps"] += E * T

    # (b)-(d) ours
    tmp, chosen = tempfile.mkdtemp(prefix="oir_bench_"), [x.strip() for x in args.loops.split(",")]
    ours = {key: Trainer(TrainConfig().replace(**{**common, **spec}), os.path.join(tmp, key), log=lambda s: None)
            for key, (_, spec) in OURS.items() if key in chosen}
    for tr in ours.values():
        tr.init_state()
    parts: dict[str, list[dict]] = {}  # ours: each update's metrics (time/* among them)

    def ours_iteration(key: str):
        parts.setdefault(OURS[key][0], []).append(ours[key].iteration().metrics)

    loops = {PLAIN: plain_iteration} if "plain" in chosen else {}
    loops.update({OURS[key][0]: (lambda key=key: ours_iteration(key)) for key in ours})

    def timed(fn) -> float:
        t = time.perf_counter()
        fn()
        meet()
        return time.perf_counter() - t

    warm = {name: [timed(fn) for _ in range(args.warmup)] for name, fn in loops.items()}  # loop by loop
    rel = getattr(getattr(ours.get("oir", ours.get("oir_lag")), "method", None), "relabeler", None)
    rules = getattr(rel, "rules", rel)  # a BackgroundRelabeler's rule half
    rules = rules if isinstance(rules, ParallelRelabeler) else None  # the rule relabeler's worker processes
    warming = rules.stats().get("in_process_warming", 0) if rules is not None else 0
    times = {name: [] for name in loops}
    for i in range(args.iterations):
        for name, fn in loops.items():
            times[name].append(timed(fn))
            print(f"  iteration {i + 1}/{args.iterations} {name}: {times[name][-1]:.3f}s", file=sys.stderr, flush=True)
    where = _relabeled_where(rules, warming)
    for tr in ours.values():
        tr.close()

    dev = jax.devices()[0]
    print(f"\nPQN training throughput | {size} sizes: {E} envs x {T} steps, LSTM {cfg.pqn.hidden_size}, "
          f"{cfg.pqn.num_epochs} epochs x {cfg.pqn.num_minibatches} minibatches | {S} seed(s) on {devices} "
          f"device(s) {dev.platform} ({getattr(dev, 'device_kind', '')}) | {os.cpu_count()} CPUs, "
          f"{platform.machine()} | rule relabeler in {where} | median of {args.iterations} interleaved updates "
          f"after {args.warmup} untimed\n")
    medians = {name: statistics.median(times[name]) for name in loops}
    base = medians.get(PLAIN)  # no (a): no ratio column values
    print(f"| loop | s / update | env steps / s | ratio to (a) | compile + first {args.warmup} updates (s) |\n"
          "|---|---|---|---|---|")
    for name, med in medians.items():
        ratio = f"{med / base:.2f}" if base else "- (no plain loop)"
        print(f"| {name} | {med:.3f} | {S * E * T / med:,.0f} | {ratio} | {sum(warm[name]):.1f} |", flush=True)
    print(f"\nEach update (s): the {args.warmup} untimed (the first compiles) | the {args.iterations} timed"
          + (" | host work of the timed (time/host_s)" if parts else "") + "\n")
    for name in loops:
        host = [r["time/host_s"] for r in parts.get(name, [])[args.warmup:]]
        print(f"- {name}: {_times(warm[name])} | {_times(times[name])}" + (f" | {_times(host)}" if host else ""))
    if parts:
        print("\nWhere ours spend an update (median s over the timed updates): waiting for the rollout, host work "
              "(episode records, relabeling, the batch program's dispatch), the update program (dispatch and wait)\n")
        print("| loop | rollout | host | update |\n|---|---|---|---|")
        for name, rows in parts.items():
            med = [statistics.median(r[f"time/{k}_s"] for r in rows[args.warmup:])
                   for k in ("rollout", "host", "update")]
            print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in med) + " |", flush=True)
    return times


def _times(xs: list[float]) -> str:
    return ", ".join(f"{x:.3f}" for x in xs)


def _relabeled_where(rules, warming_before_timing: int) -> str:
    """Where the oir loops' rule relabeler ran (with workers: when they were ready)."""
    if rules is None:
        return "the training process"
    st = rules.stats()
    if "broken" in st:
        return f"the training process (the worker processes were given up: {st['broken']})"
    ready = f"ready {st['ready_s']:.1f} s after construction" if "ready_s" in st else "not ready by the end"
    warming = st.get("in_process_warming", 0)
    return (f"{st['workers']} worker processes ({ready}; {warming} trajectories relabeled in process while they "
            f"started, {warming - warming_before_timing} of them in the timed updates)")


if __name__ == "__main__":
    sys.exit(main())
