"""The bench scripts: bench/gpu_repro.sh builds the right commands (DRY_RUN starts nothing); the
throughput scripts run at their smallest sizes."""

from __future__ import annotations

import os
import sys
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_repro_launch_builds_one_job_per_spec_with_its_card_run_dir_and_flags(tmp_path):
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_repro.sh"), "launch", str(tmp_path), "900", "gt:0",
         "oir:1:oir_b:--run.num-seeds+1+--run.seed+1000"],
        capture_output=True, text=True, env={**os.environ, "DRY_RUN": "1"}, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    jobs = out.stdout.split("export CUDA_VISIBLE_DEVICES=")[1:]
    assert len(jobs) == 2
    gt, oir = jobs
    assert gt.startswith("0") and f"paper --run.method gt --run.num-seeds 3 --run-dir {tmp_path}/gt " in gt
    assert "--time-limit 900" in gt and f"touch {tmp_path}/gt/DONE" in gt
    assert oir.startswith("1") and f"--run-dir {tmp_path}/oir_b " in oir
    assert "--run.num-seeds 1 --run.seed 1000" in oir  # given after --run.num-seeds 3: the last one counts
    assert "--eval-only end_greedy --eval.epsilon 0 &" in oir  # both evaluations at once
    assert "--eval-only end_eps0.05 --eval.epsilon 0.05" in oir and "wait" in oir
    assert not list(tmp_path.glob("*.log"))  # nothing was started


@pytest.mark.slow  # compiles the evaluation in a fresh process (about a minute on 2 cores)
def test_eval_cost_bench_runs_and_prints_its_table():
    """The benchmarks are scripts nobody imports: run the cheapest size so a broken call shows here."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "eval_cost.py"), "--episodes", "1", "--horizon", "3",
                          "--hidden", "16", "--no-control"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| 1 | 3 |" in out.stdout


@pytest.mark.slow
def test_compile_options_bench_compiles_the_smoke_rollout_under_each_option_set_and_reports_unknown_ones():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_options.py"), "--preset", "smoke", "--runs", "1",
                          "--options", "default", "xla_cpu_enable_fast_math=false", "xla_no_such_option=1"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "OIR_GYM_JAX_CACHE": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| ") and "options" not in line]
    assert [r[0].strip() for r in rows] == ["default", "xla_cpu_enable_fast_math=false", "xla_no_such_option=1"]
    assert rows[0][3].strip() == "1.00" and "xla_no_such_option" in rows[2][1]  # its ratio to itself; the refusal


def test_compile_options_parses_name_value_pairs():
    sys.path.insert(0, str(ROOT / "bench"))
    from compile_options import parse_options

    assert parse_options("default") == {}
    assert parse_options("a=true,b=16,c=x") == {"a": True, "b": 16, "c": "x"}


@pytest.mark.slow
def test_pqn_throughput_bench_prints_ratios_and_where_an_update_goes():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pqn_throughput.py"), "--iterations", "3"],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| (c) ours, oir (rules) |" in out.stdout
    rows = [ln for ln in out.stdout.split("Where ours spend an update")[1].splitlines() if ln.startswith("| (")]
    assert [r.split("|")[1].strip() for r in rows] == ["(b) ours, gt", "(c) ours, oir (rules)"]


@pytest.mark.slow
def test_pqn_throughput_without_the_plain_loop_says_so_instead_of_a_nan_ratio():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pqn_throughput.py"), "--iterations", "2",
                          "--loops", "gt,oir_lag"], capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| (b) ours, gt |" in out.stdout and "- (no plain loop)" in out.stdout and "nan" not in out.stdout
    # the lagged relabeling loop (oir.relabel_lag 1) is timed and broken down like the others
    assert out.stdout.count("| (d) ours, oir (rules), relabel lag 1 |") == 2


def test_pqn_throughput_scaling_table_and_its_argument_checks(capsys):
    """--devices 1,2 --seeds-per-device K: one table row per loop with each count's seed-steps/s and
    the ratio to one device; a list of counts with --seeds, a count of 0, or no untimed update
    (--warmup 0) is refused at once."""
    sys.path.insert(0, str(ROOT / "bench"))
    import pqn_throughput

    med = {(1, 2): {"(b) ours, gt": 0.5}, (2, 4): {"(b) ours, gt": 0.55}}
    table = pqn_throughput.scaling_table("paper", 64 * 128, med)
    rate1, rate2 = 2 * 64 * 128 / 0.5, 4 * 64 * 128 / 0.55
    assert f"| (b) ours, gt | 0.500, {rate1:,.0f} | 0.550, {rate2:,.0f} | {rate2 / rate1:.2f}x |" in table
    assert pqn_throughput.main(["--devices", "1,2", "--seeds", "4"]) == 2
    assert pqn_throughput.main(["--devices", "0"]) == 2
    assert "--seeds-per-device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the first untimed update compiles: never timed
        pqn_throughput.main(["--warmup", "0"])
    assert e.value.code == 2 and "argument --warmup: 0 must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_relabel_throughput_bench_reports_the_llms_echo_of_its_prompt():
    """The real packaged Gemma on two synthetic trajectories: the table carries the echo share."""
    pytest.importorskip("transformers")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "relabel_throughput.py"), "--n-paper", "0",
                          "--n-segments", "2", "--n-speed", "1", "--skip-cache"],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    header = next(ln for ln in out.stdout.splitlines() if ln.startswith("| template |"))
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("| segments | 2 |"))
    assert header.split("|")[-2].strip() == "LLM echo share"
    assert 0.0 <= float(row.split("|")[-2]) <= 1.0


@pytest.mark.slow  # compiles three update variants in a fresh process
def test_update_cost_bench_prints_each_variant_with_its_ratio_to_the_first(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "update_cost.py"), "--iterations", "1",
                          "--variants", "sequence:1:float32,sequence:1:bfloat16:autodiff,cell:1:float32",
                          "--trace", str(tmp_path / "trace")],
                         capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| sequence", "| cell"))]
    cells = [[c.strip() for c in r.split("|")[1:-1]] for r in rows]
    assert [c[:4] for c in cells] == [["sequence", "1", "float32", "hoisted"], ["sequence", "1", "bfloat16", "autodiff"],
                                      ["cell", "1", "float32", "hoisted"]]
    assert cells[0][8] == "1.00" and all(float(c[9]) >= 0 for c in cells)  # ratio to the first, TFLOP/s
    assert "GFLOP" in out.stdout  # the update's matmul FLOPs, counted from the shapes
    assert "no device kernels" in out.stdout  # --trace: recorded and read; the CPU has no GPU kernels


def test_pqn_throughput_processes_runs_the_baseline_before_between_and_after_the_others():
    """--processes never rests a ratio on one run of the baseline: the first count of --devices runs
    before, between and after the others, and the table gives each of its runs, their spread, and
    the ratios against their mean with the range against the slowest and fastest run."""
    sys.path.insert(0, str(ROOT / "bench"))
    import pqn_throughput

    assert pqn_throughput.process_order([1, 2, 4]) == [1, 2, 1, 4, 1]
    assert pqn_throughput.process_order([1, 2]) == [1, 2, 1]
    assert pqn_throughput.process_order([2]) == [2]
    loop = "(a) plain PQN-RNN, raw Craftax"
    med = {(1, 2): {loop: 0.7}, (2, 4): {loop: 0.6}, (4, 8): {loop: 0.8}}
    table = pqn_throughput.scaling_table("paper", 64 * 128, med, processes=True,
                                         baseline_runs={loop: [0.75, 0.60, 0.65]})
    assert "1 process(es) x 2 seeds, mean of 3 runs" in table and "against the mean of the first column's runs" in table
    steps = 64 * 128
    mean = 2 * steps / (2.0 / 3)  # the rate of the mean s/update (0.75 + 0.60 + 0.65) / 3
    slow, fast = 2 * steps / 0.75, 2 * steps / 0.60
    r4 = 8 * steps / 0.8
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| {loop} |"))
    assert row == (f"| {loop} | 0.667, {mean:,.0f} | 0.600, {4 * steps / 0.6:,.0f} | 0.800, {r4:,.0f} "
                   f"| 0.750, 0.600, 0.650 | {slow:,.0f}-{fast:,.0f} ({(fast - slow) / mean:.0%}) "
                   f"| {4 * steps / 0.6 / mean:.2f}x ({4 * steps / 0.6 / fast:.2f}-{4 * steps / 0.6 / slow:.2f}x) "
                   f"| {r4 / mean:.2f}x ({r4 / fast:.2f}-{r4 / slow:.2f}x) |")


@pytest.mark.slow  # starts four processes that each compile the plain loop: about 3 min on 2 cores
def test_pqn_throughput_processes_prints_the_scaling_table_of_one_process_per_device():
    """--processes --devices 1,2: one process, then two joined by jax.distributed (CPU, gloo), each
    with its own seed, then one process again; the scaling table of one process per device has both
    columns, the baseline's two runs and the ratio against their mean."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pqn_throughput.py"), "--processes", "--devices", "1,2",
                          "--seeds-per-device", "1", "--preset", "cpu", "--loops", "plain", "--iterations", "1",
                          "--warmup", "1"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "one process per device" in out.stdout
    assert "### process 1 of 2" in out.stdout  # each process's own table
    assert "### process 0 of 1 (cpu sizes, run 1 of 2)" in out.stdout and "(cpu sizes, run 2 of 2)" in out.stdout
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("| (a) plain PQN-RNN") and ln.endswith("x) |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # loop, 1 process (mean of its runs), 2 processes, each baseline run, their spread, the ratio
    assert len(cells) == 6 and len(cells[3].split(", ")) == 2 and cells[5].endswith("x)")
    assert "| loop | 1 process(es) x 1 seeds, mean of 2 runs" in out.stdout and "2 process(es) x 2 seeds" in out.stdout


def test_pqn_throughput_processes_refuses_seeds_and_unknown_loops_in_one_line(capsys):
    """--processes needs --seeds-per-device (each process's seeds), not --seeds: one line, exit 2."""
    sys.path.insert(0, str(ROOT / "bench"))
    import pqn_throughput

    assert pqn_throughput.main(["--processes", "--devices", "2", "--seeds", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--processes needs --seeds-per-device" in err[0]
    assert pqn_throughput.main(["--processes", "--devices", "2", "--seeds-per-device", "1", "--loops", "nope"]) == 2
    assert "--loops 'nope'" in capsys.readouterr().err


def test_pqn_throughput_processes_that_run_past_the_timeout_are_killed_with_one_line():
    """No hang: processes still running at --timeout are killed and the bench exits 1 saying so."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "pqn_throughput.py"), "--processes", "--devices", "2",
                          "--seeds-per-device", "1", "--loops", "plain", "--timeout", "1"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("error: the 2 processes (cpu sizes) ran past --timeout 1 s")


def _trace_events():
    """A trace as jax.profiler writes it: metadata naming a host and a GPU process, then kernels."""
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/device:GPU:0"}}]
    kernels = [("sm90_xmma_gemm_bf16bf16_f32", 0, 40), ("loop_fusion_3", 50, 20), ("input_reduce_fusion", 80, 10),
               ("sm90_xmma_gemm_bf16bf16_f32", 100, 40), ("loop_fusion_3", 150, 20), ("memcpy32_post", 190, 10)]
    host = [{"ph": "X", "pid": 1, "name": "PjitFunction(update)", "ts": 0, "dur": 500}]
    return meta + host + [{"ph": "X", "pid": 7, "name": n, "ts": ts, "dur": d} for n, ts, d in kernels]


def test_trace_summary_splits_gpu_kernel_time_by_kind_and_name_per_iteration():
    sys.path.insert(0, str(ROOT / "bench"))
    import trace_summary

    kernels = trace_summary.device_kernels(_trace_events())
    assert len(kernels) == 6  # the host's event is not a kernel
    s = trace_summary.summarise(kernels, iterations=2)
    assert s["busy_us"] == 70 and s["span_us"] == 100 and s["count"] == 3
    assert s["kinds"] == {"matmul": (40, 1), "fused elementwise": (20, 1), "reduction": (5, 0.5),
                          "copy / memset": (5, 0.5)}
    assert s["names"]["loop_fusion_3"] == (20, 1)
    text = trace_summary.format_summary(s, top=2)
    assert "device busy 70%" in text and "| matmul | 0.0 | 57.1% | 1 |" in text
    assert text.count("| `") == 2  # --top 2 kernels
    assert "| 0-99 | 0.1 | 100.0% | 3 | 4 |" in text  # by frequency: every kernel ran at most once per iteration
    assert trace_summary.kernel_kind("nvjet_sm90_tss_192x128_64x5_1x2_h_bz_coopB_NNT") == "matmul"  # cuBLASLt
    assert [trace_summary.call_bucket(c) for c in (8192, 1000, 999, 64, 0.5)] == [
        ">= 1,000", ">= 1,000", "100-999", "0-99", "0-99"]
    assert "no device kernels" in trace_summary.format_summary(trace_summary.summarise([], 1))
    with pytest.raises(ValueError, match="iterations"):
        trace_summary.summarise(kernels, iterations=0)


def test_trace_summary_reads_a_real_cpu_trace_and_says_it_holds_no_device_kernels(tmp_path, capsys):
    """A real jax.profiler trace on this CPU: found and read; the CPU backend records no kernels.
    A folder without a trace is a one-line error."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(ROOT / "bench"))
    import trace_summary

    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path / "tr"), create_perfetto_trace=True):
        f(x).block_until_ready()
    assert trace_summary.main([str(tmp_path / "tr")]) == 0
    assert "no device kernels" in capsys.readouterr().out
    assert trace_summary.main([str(tmp_path / "empty")]) == 2
    assert "create_perfetto_trace=True" in capsys.readouterr().err


# Every bench CLI refuses numbers of the wrong kind at the command line, naming the flag: NaN,
# negative or zero sizes and limits, fractions for counts (oir_gym.validation.int_arg / real_arg).
_REFUSED = {  # (module, entry point): [(argv, message)]
    ("pqn_throughput", "main"): [
        (["--timeout", "nan"], "argument --timeout: nan is outside the allowed range > 0"),
        (["--timeout", "-1"], "argument --timeout: -1.0 is outside the allowed range > 0"),
        (["--timeout", "inf"], "argument --timeout: inf is outside"),
        (["--iterations", "0"], "argument --iterations: 0 must be an integer >= 1"),
        (["--seeds", "2.5"], "argument --seeds: '2.5' is not an integer"),
        (["--seeds-per-device", "-1"], "argument --seeds-per-device: -1 must be"),
        (["--seed", "-3"], "argument --seed: -3 must be an integer >= 0")],
    ("update_cost", "main"): [(["--iterations", "0"], "argument --iterations: 0 must be an integer >= 1")],
    ("eval_cost", "main"): [(["--episodes", "4", "0"], "argument --episodes: 0 must be an integer >= 1"),
                            (["--horizon", "-5"], "argument --horizon: -5 must be")],
    ("grounding_cost", "main"): [(["--repeats", "0"], "argument --repeats: 0 must be an integer >= 1"),
                                 (["--n", "1e3"], "argument --n: '1e3' is not an integer")],
    ("relabel_throughput", "main"): [(["--k", "0"], "argument --k: 0 must be an integer >= 1"),
                                     (["--n-threads", "-2"], "argument --n-threads: -2 must be")],
    ("trace_summary", "main"): [(["somewhere", "--top", "0"], "argument --top: 0 must be an integer >= 1")],
    ("env_throughput", "parse_args"): [(["--envs", "64", "0"], "argument --envs: 0 must be an integer >= 1"),
                                       (["--steps", "nan"], "argument --steps: 'nan' is not an integer")],
}
BAD_ARGUMENTS = [(module, entry, argv, message) for (module, entry), cases in _REFUSED.items()
                 for argv, message in cases]


@pytest.mark.parametrize("module, entry, argv, message", BAD_ARGUMENTS,
                         ids=[f"{m}{' '.join(a)}" for m, _, a, _ in BAD_ARGUMENTS])
def test_bench_clis_refuse_numbers_of_the_wrong_kind_naming_the_flag(module, entry, argv, message, capsys):
    import importlib

    sys.path.insert(0, str(ROOT / "bench"))
    with pytest.raises(SystemExit) as e:
        getattr(importlib.import_module(module), entry)(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def _processes_with(marker: str) -> list[int]:
    """Pids of this machine's processes whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@pytest.mark.slow  # the bench and its two processes import JAX
def test_pqn_throughput_processes_are_killed_when_the_bench_gets_sigterm():
    """SIGTERM to ``--processes`` (a job scheduler's stop) ends the processes it started too."""
    import signal
    import time

    bench = subprocess.Popen([sys.executable, str(ROOT / "bench" / "pqn_throughput.py"), "--processes", "--devices", "2",
                              "--seeds-per-device", "1", "--loops", "plain"], stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        line = ""
        while "started (logs in " not in line:
            line = bench.stderr.readline()
            assert line, "the bench ended before it started its processes"
        tmp = line.split("(logs in ")[1].rstrip(")\n")
        children = _processes_with(tmp)
        assert len(children) == 2  # the two processes, each with its --child-result in tmp
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) != 0
        deadline = time.monotonic() + 30  # killed and waited for before the bench exits; a margin for /proc
        while _processes_with(tmp) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_with(tmp) == []
    finally:
        if bench.poll() is None:
            bench.kill()
        bench.stderr.close()
