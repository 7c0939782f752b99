"""A program's cold compile under XLA options: compile seconds and run seconds, in one process.

    OIR_GYM_JAX_CACHE=0 python bench/compile_options.py --preset fast --program rollout \
        --options default "xla_gpu_autotune_level=0" "xla_llvm_disable_expensive_passes=true"

After one untimed compile (a process's first holds one-off start-up work), each option set (``name=value``
pairs joined by ``,``; ``default``: none) compiles the same lowered program
(``--program``: the preset trainer's rollout, update or evaluation; run with ``OIR_GYM_JAX_CACHE=0``: JAX's
persistent cache would answer the second compile), then runs it ``--runs`` times; the table gives the median
run and the ratios to the first set.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from common import interleaved


def parse_options(text: str) -> dict:
    pairs = [pair.split("=", 1) for pair in text.split(",")] if text != "default" else []
    return {k: {"true": True, "false": False}.get(v.lower(), int(v) if v.isdigit() else v) for k, v in pairs}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="fast")
    p.add_argument("--program", choices=("rollout", "update", "evaluate"), default="rollout")
    p.add_argument("--options", nargs="+", default=["default"])
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    import jax

    from agents.pqn.config import preset
    from agents.pqn.trainer import Trainer

    trainer = Trainer(preset(a.preset), tempfile.mkdtemp(), log=lambda m: None)
    env_params = trainer.env_params()
    train_state, runner = trainer.placeholder_state(env_params)
    t = time.time()
    if a.program == "rollout":
        program, args = trainer.programs.rollout.program, (train_state.params, runner, env_params, trainer.env_steps)
    elif a.program == "update":
        program, args = trainer.programs.update, trainer.update_args(train_state, runner)
    else:
        evaluator, args = trainer.evaluation_program(train_state.params)
        program = evaluator.program
    lowered = program.lower(*args)
    print(f"# {a.program} of preset {a.preset} on {jax.devices()[0].device_kind}; traced and lowered in "
          f"{time.time() - t:.1f} s; median of {a.runs} runs", flush=True)
    t = time.time()  # untimed: the process's first compile holds one-off start-up work the table should not
    lowered.compile(compiler_options=parse_options(a.options[0]))
    print(f"# a first, untimed compile with {a.options[0]}: {time.time() - t:.1f} s", flush=True)
    print("| options | compile s | run s | compile ratio | run ratio |\n|---|---|---|---|---|", flush=True)
    first = None
    for text in a.options:
        t = time.time()
        try:
            compiled = lowered.compile(compiler_options=parse_options(text))
        except Exception as e:  # noqa: BLE001 - an option this XLA does not know
            print(f"| {text} | failed: {type(e).__name__}: {str(e)[:120]} | | | |", flush=True)
            continue
        compile_s = time.time() - t
        run_s = statistics.median(interleaved({0: lambda: jax.block_until_ready(compiled(*args))}, a.runs)[0])
        first = first or (compile_s, run_s)
        print(f"| {text} | {compile_s:.1f} | {run_s:.3f} | {compile_s / first[0]:.2f} | {run_s / first[1]:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
