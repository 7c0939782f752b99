"""One run driver for both trainers (a :class:`Recipe` each, the same run flags :class:`RunOptions`)::

    main(PQN, ["smoke", "--run-dir", "runs/smoke"])     # examples/train_pqn.py (agents.pqn.recipe.PQN)

SIGINT / SIGTERM stop after the current update with a checkpoint; a second signal ends the process at once
(status 128 + its number). Exit status: 0 done, stopped or nothing to do; 1 a non-finite update; 2 a usage,
config or run directory error (nothing written or deleted).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence

from agents.run.resume import eval_only_config, eval_plan, label_pool, named_on_command_line, pool_overlap_warning
from agents.run.run_dir import CorruptFileError, RunDir, RunDirError, check_user_tag, require_wandb


@dataclass
class IterationLog:
    """What :meth:`RunTrainer.iteration` returns: the update's number, the env steps so far, its metrics."""

    update: int
    env_steps: int
    metrics: dict[str, float]


class RunTrainer(Protocol):
    """The interface the driver trains through (``seed_offset``: the global index of this process's first seed)."""

    update_idx: int
    env_steps: int
    process_index: int
    startup: dict[str, float]

    @property
    def seed_offset(self) -> int: ...
    def init_state(self) -> None: ...
    def load(self, path: Any) -> dict[str, Any]: ...
    def iteration(self) -> IterationLog: ...
    def evaluate(self, final: bool = False) -> list: ...
    def save(self, *, metrics: Any = None) -> Any: ...
    def close(self) -> None: ...


@dataclass
class RunOptions:
    """The driver's own options, the same in both scripts (the trainer's settings are ``config``)."""

    run_dir: Optional[str] = None
    """Output folder (default runs/<method>_<time>; SB3: runs/sb3_<algo>_<relabeler>_<time>)."""
    resume: bool = False
    """Continue the run in --run-dir from its newest checkpoint."""
    overwrite: bool = False
    """Replace the run already in --run-dir (its outputs are deleted)."""
    max_updates: Optional[int] = None
    """Stop (with a checkpoint) after this many updates in total; resume later."""
    time_limit: Optional[float] = None
    """Stop (with a checkpoint) after this many seconds; resume later."""
    eval_only: Optional[str] = None
    """No training: evaluate the newest checkpoint into eval_TAG.json/.md (which sets: docs/evaluation.md)"""
    wandb: bool = False
    """Also log to Weights & Biases (config = config.json; needs the wandb package)."""
    progress: bool = True
    """A progress bar with ETA (off: one line per update)."""
    log_every: int = 1
    """Updates between printed summary lines (evaluations are always printed)."""


class Recipe:
    """What one trainer brings to the driver: options, config file, checkpoints, construction, output lines."""

    name = ""
    script = ""  # named in the "continue with" line
    multi_process = False  # a run may span several processes (jax.distributed)
    tensorboard: Optional[bool] = None  # the metrics writer's TensorBoard events (None: when installed)
    compiles = True  # the first update compiles programs

    def parse(self, argv: list[str], description: str | None = None) -> Any:
        """The command line as this trainer's options (a :class:`RunOptions` with a ``config``)."""

    def num_updates(self, cfg: Any) -> int:
        return cfg.num_updates

    def default_run_dir(self, cfg: Any) -> str: ...

    def checkpoint_place(self, own_dir: Path) -> Path:
        return own_dir

    def checkpoints(self, own_dir: Path) -> dict[int, Path]:
        """The checkpoints this process holds, by update."""

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """Verify the checkpoint at ``path`` and return its host state (``update``, ``metrics``)."""

    def no_checkpoint(self, own_dir: Path) -> None:
        """A resume found no checkpoint: raise if what is there cannot be resumed at all."""

    def drop_newer(self, own_dir: Path, update: int) -> None:
        """Before resuming from ``update``: remove newer checkpoints."""

    def build(self, cfg: Any, own_dir: Path, eval_only: bool, fresh: bool = False) -> RunTrainer:
        """The trainer (``eval_only``: no LLM started; ``fresh``: the run starts from update 0)."""

    def write_config(self, run: RunDir, cfg: Any) -> None:
        run.write_config(cfg.to_dict())

    def header(self, cfg: Any, trainer: RunTrainer, procs: int, run: RunDir) -> str: ...

    def summary_line(self, row: dict[str, Any], num_updates: int) -> str: ...

    def on_row(self, trainer: RunTrainer, row: dict[str, Any]) -> None:
        """After each metrics row is written."""

    def label(self, cfg: Any) -> str:
        """The run's name in plots and tables."""

    def eval_title(self, cfg: Any, trainer: RunTrainer, tag: str | None) -> str:
        """The heading of eval_final.md (``tag`` None) or of an ``--eval-only`` evaluation."""

    def compile_ahead(self, trainer: RunTrainer) -> bool:
        return False

    def completion_info(self, trainer: RunTrainer) -> dict[str, Any]:
        """What complete.json records besides the update and env steps."""
        return {}

    def write_diversity(self, trainer: RunTrainer, folder: Path, cfg: Any) -> None:
        """Write and print the relabeling's diversity report, where the trainer has one."""

    def final_extras(self, trainer: RunTrainer) -> dict[str, float]:
        """Columns the last update's row adds."""
        return {}


def _mean_table(per_seed: list[dict]) -> str:
    """Markdown table of per-seed evaluation dicts (``EvalResult.to_dict()``), rates averaged over seeds."""
    import numpy as np

    from oir_gym.evaluation import EvalResult

    res = EvalResult()
    for s in per_seed[0]:
        res.texts[s] = per_seed[0][s]["texts"]
        res.achievements[s] = per_seed[0][s]["achievements"]
        res.rates[s] = np.mean([f[s]["rates"] for f in per_seed], axis=0)
    return res.to_markdown()


def compact_table(markdown: str) -> str:
    """:meth:`~oir_gym.evaluation.EvalResult.to_markdown`'s tables for a terminal: rows at 0 in every column become
    one count line per set, a retention table without a learned achievement one line."""
    import re

    zero = re.compile(r"[+-]?0(\.0+)?")
    out: list[str] = []
    for block in markdown.rstrip("\n").split("\n\n"):
        lines = block.split("\n")
        if lines[0].startswith("| instruction |"):
            rows = lines[2:]
            kept = [r for r in rows if not all(zero.fullmatch(c.strip().split(" ")[0])
                                               for c in r.strip("|").split("|")[1:])]
            name = out.pop()[:-1] if out and out[-1].startswith("Set ") else "Set original, per instruction"
            if kept:
                out += [f"{name} ({len(rows) - len(kept)} of {len(rows)} at 0 not shown):", "\n".join(lines[:2] + kept)]
            else:
                out.append(f"{name}: all {len(rows)} at 0")
        elif lines[0].startswith("| set | retention") and all(r.split("|")[2].strip() == "-" for r in lines[2:]):
            out[-1] = "Paraphrase retention: - (no achievement learned on the original set)"
        else:
            out.append(block)
    return "\n\n".join(out)


def _metrics_resume(host: dict[str, Any]) -> dict[str, Any]:
    """How a resume cuts metrics.jsonl back to checkpoint state ``host`` (``{}``: no checkpoint, every row)."""
    if not host:
        return {"after_update": 0}
    if host.get("metrics"):
        return {"position": host["metrics"]}
    return {"after_update": int(host.get("metrics_after_update") or host["update"])}


class _NoMetrics:
    """The metrics writer of a process other than 0 (process 0 writes the rows)."""

    write = sync = close = staticmethod(lambda *args: None)


class _StopRequest:
    """SIGINT / SIGTERM: the first asks the loop to stop after the current update, a second ends the process at
    once. A thread reads them from ``signal.set_wakeup_fd``'s pipe: Python's handler waits while the main thread
    is inside C (a compile, a device transfer)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._seen = False
        self._old = {sig: signal.getsignal(sig) for sig in self.SIGNALS}

    def __enter__(self) -> "_StopRequest":
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C handler must never block
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in self.SIGNALS:  # the loop's next check sees the request even before the thread runs
            signal.signal(sig, lambda signum, _: setattr(self, "requested",
                                                          self.requested or signal.Signals(signum).name))
        threading.Thread(target=self._watch, args=(read_fd,), name="stop-request", daemon=True).start()
        return self

    def _watch(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while data := pipe.read(64):  # b"": __exit__ closed the write end
                for signum in (s for s in data if s in self.SIGNALS):  # not another signal with a Python handler
                    name = signal.Signals(signum).name
                    if self._seen:
                        print(f"\n{name}, a second signal: exiting now; the newest checkpoint on disk is the last "
                              "state", file=sys.stderr, flush=True)
                        os._exit(128 + signum)
                    self._seen = True
                    self.requested = self.requested or name
                    print(f"\n{name}: stopping after this update with a checkpoint (send it again to stop at once)",
                          file=sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._write_fd)


@dataclass
class _Run:
    """One invocation's state, shared by the steps of :func:`main`."""

    recipe: Recipe
    opts: Any
    cfg: Any
    procs: int
    me: int
    num_updates: int = 0
    resume: bool = False
    run: Any = None
    own_dir: Any = None

    @property
    def flag(self) -> str:
        return "--eval-only" if self.evaluating else "--resume"

    @property
    def evaluating(self) -> bool:
        return self.opts.eval_only is not None


class _Exit(Exception):
    """Ends :func:`main` with ``code`` after printing ``message`` (if any) to stderr."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _fail(problem: str | None) -> None:
    """Stop every process with status 2 when any process has a ``problem`` (after the exchange)."""
    from agents.run.multihost import allgather_json

    problem = next((p for p in allgather_json(problem) if p), None)
    if problem:
        raise _Exit(2, problem)


def main(recipe: Recipe, argv: list[str] | None = None, started: float | None = None,
         description: str | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) with ``recipe``'s trainer; returns the exit status.
    ``started``: the process's start time, from which ``time`` and ``--time-limit`` count."""
    try:
        return _main(recipe, list(sys.argv[1:] if argv is None else argv), started, description)
    except _Exit as e:
        if e.message:
            print(e.message, file=sys.stderr, flush=True)
        return e.code


def _main(recipe: Recipe, argv: list[str], started: float | None, description: str | None) -> int:
    r, labels = _parse_and_join(recipe, argv, description)
    _check_options(r)
    _prepare_run_dir(r)
    start = _resume_point(r) if r.resume else None
    if start is False:  # the run is already complete
        return 0
    from oir_gym import enable_compilation_cache

    enable_compilation_cache()
    t0 = time.time()
    if started is not None and started <= t0:  # the wall clock starts with the process
        t0 = started
    imports = time.time() - t0
    trainer = _build(r, start, t0)
    if r.me == 0:
        print(recipe.header(r.cfg, trainer, r.procs, r.run), flush=True)
    host = _start(r, trainer, start, t0, imports, labels)
    run_eval = _evaluation(r, trainer)
    if r.evaluating:  # the run's metrics, config and TensorBoard files stay as they are
        return _evaluate_only(r, trainer, run_eval)
    # process 0 writes the run's metrics (every process's rows merged); the others keep none
    metrics = r.run.open_metrics(**(_metrics_resume(host) if r.resume else {}), wandb=r.opts.wandb,
                                 tensorboard=recipe.tensorboard) if r.me == 0 else _NoMetrics()
    stopped: str | None = None
    try:
        stopped = _train(recipe, trainer, r.num_updates, metrics, r.opts, run_eval, t0)
    except FloatingPointError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        trainer.close()
        metrics.close()
    if stopped:
        recipe.write_diversity(trainer, r.own_dir, r.cfg)  # a stopped run's buffer is reported too (it may never resume)
        if r.me:
            return 0
        r.run.write_csv()
        print(f"stopped ({stopped}) at update {trainer.update_idx}/{r.num_updates}; continue with: "
              f"python {recipe.script} --run-dir {r.run.path} --resume", flush=True)
        return 0
    _finish(recipe, trainer, r.run, r.cfg, run_eval, r.own_dir)
    if r.me == 0:
        print(f"\ndone in {time.time() - t0:.0f}s; outputs in {r.run.path}/", flush=True)
    return 0


def _parse_and_join(recipe: Recipe, argv: list[str], description: str | None) -> tuple[_Run, str | None]:
    """The parsed command line and this process's place in the job; for an evaluation, the run's label pool."""
    opts = recipe.parse(argv, description)
    cfg = opts.config
    labels = None
    if opts.eval_only is not None:
        labels = label_pool(cfg)
        cfg = opts.config = eval_only_config(cfg, final_sets=named_on_command_line(argv, "eval.final_sets"))
    from agents.run.multihost import initialize_distributed

    # a multi-host job joins before JAX starts its backend (validating the config would start it)
    if initialize_distributed():
        import jax

        procs, me = jax.process_count(), jax.process_index()
    else:
        procs, me = 1, 0
    return _Run(recipe, opts, cfg, procs, me), labels


def _check_options(r: _Run) -> None:
    """Every check before anything is written or deleted."""
    from agents.run.multihost import check_processes

    opts, cfg = r.opts, r.cfg
    try:
        if opts.eval_only is not None:
            check_user_tag(opts.eval_only)  # before anything runs: a bad tag would fail after the evaluation
        cfg.validate()
        for name in ("max_updates", "log_every"):
            v = getattr(opts, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')}={v} must be >= 1")
        if opts.time_limit is not None and not opts.time_limit > 0:
            raise ValueError(f"--time-limit={opts.time_limit} must be > 0")
        if opts.wandb:
            require_wandb()
        if r.procs > 1 and not r.recipe.multi_process:
            raise ValueError(f"the {r.recipe.name} trainer runs in one process ({r.procs} joined)")
    except ValueError as e:
        raise _Exit(2, f"error: {e}") from None
    if opts.eval_only is not None and opts.overwrite:
        raise _Exit(2, "error: --eval-only reads a run; it cannot be combined with --overwrite")
    r.num_updates = r.recipe.num_updates(cfg)
    r.resume = opts.resume or opts.eval_only is not None
    if opts.run_dir is None and r.procs > 1:
        raise _Exit(2, "error: a run over several processes needs --run-dir (one directory every host sees)")
    if r.recipe.multi_process:
        try:
            check_processes(cfg.run.num_seeds, r.procs)
        except ValueError as e:
            raise _Exit(2, f"error: {e}") from None


def _prepare_run_dir(r: _Run) -> None:
    """Process 0 prepares the run directory (or refuses: every process knows); this process's folder."""
    from agents.run.multihost import process_dir

    run_path = Path(r.opts.run_dir or r.recipe.default_run_dir(r.cfg))
    problem = None
    if r.me == 0:
        try:
            r.run = RunDir.prepare(run_path, resume=r.resume, overwrite=r.opts.overwrite)
        except RunDirError as e:
            problem = f"error: {str(e).replace('--resume', r.flag)}"
    _fail(problem)
    if r.me:
        r.run = RunDir(run_path)
    r.own_dir = process_dir(r.run.path, r.procs, r.me)
    r.own_dir.mkdir(parents=True, exist_ok=True)


def _resume_point(r: _Run) -> Path | None | bool:
    """The checkpoint this process continues from (the newest every process holds), verified with its metrics
    before anything is written; None: update 0; False: the run is complete (said so)."""
    from agents.run.checkpoint import CheckpointError
    from agents.run.multihost import allgather_json, newest_common_update

    recipe, run, own_dir, me = r.recipe, r.run, r.own_dir, r.me
    problem = None
    start: Path | None = None
    try:
        mine = recipe.checkpoints(own_dir)
    except (CorruptFileError, ValueError) as e:
        mine, problem = {}, f"error: {e}"
    common = newest_common_update(allgather_json(sorted(mine)))
    try:
        if problem:
            pass
        elif common is not None:
            start = mine[common]
            saved = recipe.read_checkpoint(start)
        else:
            recipe.no_checkpoint(own_dir)
            if r.evaluating:
                raise FileNotFoundError(own_dir)
            saved = {}  # killed before its first checkpoint: the run starts again with its saved config
            done = run.completion()
            if me == 0 and not (done is not None and done.get("update", 0) >= r.num_updates):
                # ... only if its files agree: a run whose checkpoints were moved away is not restarted
                run.check_before_first_checkpoint(
                    min(r.cfg.run.checkpoint_every, r.num_updates), r.num_updates,
                    recipe.checkpoint_place(own_dir) if r.procs == 1 else f"{run.path}/process*/checkpoints")
        if not problem and not r.evaluating and me == 0:
            run.check_metrics(**_metrics_resume(saved))
        done = run.completion()
    except FileNotFoundError:
        problem = f"error: {r.flag} given but {recipe.checkpoint_place(own_dir)} holds no checkpoint"
    except (CorruptFileError, CheckpointError, ValueError, RunDirError) as e:
        problem = f"error: {e}"
    _fail(problem)
    if not r.evaluating and done is not None and done.get("update", 0) >= r.num_updates:
        print(f"{run.path} is already complete ({done['update']}/{r.num_updates} updates, final evaluation, "
              "CSV and plots written); nothing to resume. Evaluate it again with --eval-only TAG.", flush=True)
        return False
    return start


def _build(r: _Run, start: Path | None, t0: float) -> RunTrainer:
    """The trainer (an evaluation's starts no LLM); a training run's LLM is checked within ``--time-limit``, then
    process 0 writes the config."""
    from agents.run.llm import LLMCheckError, check_deadline

    if r.evaluating:
        return r.recipe.build(r.cfg, r.own_dir, eval_only=True)
    problem = None
    try:
        limit = r.opts.time_limit
        with check_deadline(t0 + limit if limit else None, f"--time-limit {limit:g}" if limit else ""):
            trainer = r.recipe.build(r.cfg, r.own_dir, eval_only=False, fresh=start is None)
    except (LLMCheckError, ValueError) as e:  # ValueError: e.g. a wording pool too close to an evaluation string
        problem = f"error: {e}"
    _fail(problem)
    if r.me == 0:
        r.run.clear_complete()
        r.recipe.write_config(r.run, r.cfg)
    return trainer


def _start(r: _Run, trainer: RunTrainer, start: Path | None, t0: float, imports: float,
           labels: str | None) -> dict[str, Any]:
    """Load the checkpoint ``start`` (or the initial state); returns the checkpoint's host state."""
    from agents.run.checkpoint import CheckpointError

    recipe, cfg, me, own_dir = r.recipe, r.cfg, r.me, r.own_dir
    host: dict[str, Any] = {}
    compile_ahead = not r.evaluating and recipe.compile_ahead(trainer)
    try:
        if start is not None:
            if not r.evaluating:
                recipe.drop_newer(own_dir, int(start.name) if start.name.isdigit() else 0)
            host = trainer.load(start)
            if r.evaluating:
                if me == 0:
                    print(f"evaluating the checkpoint {start} (update {trainer.update_idx}, {trainer.env_steps:,} env "
                          f"steps) on {eval_plan(cfg)}", flush=True)
            else:
                print(f"resumed from update {trainer.update_idx} ({trainer.env_steps:,} env steps)", flush=True)
            if compile_ahead and trainer.update_idx < r.num_updates:
                trainer.start_compiling()  # type: ignore[attr-defined]
        else:
            if r.resume:  # no checkpoint every process holds: the run starts again
                recipe.drop_newer(own_dir, 0)
                if me == 0:
                    why = (f"{recipe.checkpoint_place(own_dir)} holds no checkpoint yet (the run stopped before its "
                           "first)" if r.procs == 1 else "the processes hold no checkpoint of the same update")
                    print(f"{why}: starting the run from update 0 with its saved config", flush=True)
            if compile_ahead:
                trainer.start_compiling()  # type: ignore[attr-defined]
            trainer.init_state()
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f} s"
                          for k, v in {"imports": imports, **trainer.startup}.items() if k != "imports" or v >= 0.5)
        print(f"ready after {time.time() - t0:.0f} s ({parts})"
              f"{'; the first update compiles' if recipe.compiles and not r.evaluating else ''}", flush=True)
        if labels is not None and me == 0 and (warning := pool_overlap_warning(labels, cfg.eval.instruction_files)):
            print(warning, file=sys.stderr, flush=True)
    except (CheckpointError, CorruptFileError, ValueError) as e:
        trainer.close()
        raise _Exit(2, f"error: {e}") from None
    return host


def _evaluation(r: _Run, trainer: RunTrainer) -> Any:
    """``run_eval(tag, final=False)``: every seed's evaluation (process 0 writes the eval file) and this process's
    metrics row part."""
    from agents.run.multihost import allgather_json, merge_evals

    def run_eval(tag: str, final: bool = False) -> tuple[list[dict], dict[str, float]]:
        results = trainer.evaluate(final=final)
        row = {f"seed{trainer.seed_offset + s}/{k}": v for s, res in enumerate(results)
               for k, v in res.flat_metrics().items()}
        row.update(seed_means([res.flat_metrics() for res in results]))
        every = merge_evals(allgather_json([res.to_dict() for res in results]))
        if r.me == 0:
            r.run.write_eval(tag, every)
        return every, row

    return run_eval


def _evaluate_only(r: _Run, trainer: RunTrainer, run_eval: Any) -> int:
    """``--eval-only TAG``: the final evaluation sets into eval_TAG.json / .md."""
    trainer.close()
    results, _ = run_eval(r.opts.eval_only, final=True)
    if r.me:
        return 0
    table = _mean_table(results)
    r.run.write_eval(r.opts.eval_only, results,
                     markdown=f"{r.recipe.eval_title(r.cfg, trainer, r.opts.eval_only)}\n\n{table}\n")
    print(table + f"\nwrote {r.run.eval_path(r.opts.eval_only)}", flush=True)
    return 0


def seed_means(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each metric's mean over the seeds' rows that hold it (a seed may lack one)."""
    values = {k: [float(r[k]) for r in rows if k in r] for k in dict.fromkeys(k for r in rows for k in r)}
    return {k: sum(vs) / len(vs) for k, vs in values.items()}


def _train(recipe: Recipe, trainer: RunTrainer, n: int, metrics: Any, opts: RunOptions, run_eval: Any,
           t0: float) -> str | None:
    """The training loop; returns why it stopped early (None: it reached the last update)."""
    from tqdm import tqdm

    from agents.run.multihost import allgather_json, merge_rows

    cfg = opts.config  # type: ignore[attr-defined]
    bar = None
    quiet = trainer.process_index > 0  # process 0 prints the run's progress
    with _StopRequest() as stop:
        try:
            if trainer.update_idx < n and not quiet and recipe.compiles:
                print(f"update {trainer.update_idx + 1}: compiling the rollout and update programs (the first "
                      "update of a process takes tens of seconds on a CPU)...", flush=True)
            first = True
            while trainer.update_idx < n:
                log = trainer.iteration()
                row = {"update": log.update, "env_steps": log.env_steps, "time": time.time() - t0, **log.metrics}
                if first:  # how long a user waits for the first update, compile and start-up included
                    row["time/first_update_s"] = row["time"]
                    if not quiet:
                        cache = getattr(getattr(trainer, "programs", None), "cache", None)
                        note = cache.summary() if cache is not None else ""
                        print(f"first update done {row['time']:.0f} s after launch{f' ({note})' if note else ''}",
                              flush=True)
                    first = False
                last = log.update >= n
                if log.update % cfg.eval.every == 0 or last:
                    t_eval = time.time()
                    _, erow = run_eval("final" if last else f"{log.update:06d}", final=last)
                    row.update(erow)
                    row["time/eval_s"] = time.time() - t_eval  # after this row's "time" (training time = time minus earlier evaluations)
                if last:
                    row.update(recipe.final_extras(trainer))
                why = stop.requested
                if not why and opts.max_updates and trainer.update_idx >= opts.max_updates and not last:
                    why = f"--max-updates {opts.max_updates}"
                if not why and opts.time_limit and time.time() - t0 > opts.time_limit and not last:
                    why = f"--time-limit {opts.time_limit:g}s"
                # every process's row and stop reason (one process stopping stops them all)
                gathered = allgather_json([row, why])
                row = merge_rows([r for r, _ in gathered])
                why = next((w for _, w in gathered if w), None)
                metrics.write(row)
                recipe.on_row(trainer, row)
                line = recipe.summary_line(row, n)
                shown = log.update % opts.log_every == 0 or "eval/original/mean_success_rate" in row
                if bar is None and opts.progress and not quiet:  # after the first update: no compile in its rate
                    bar = tqdm(total=n, initial=log.update, unit="update", dynamic_ncols=True, file=sys.stderr,
                               disable=None)  # None: off when stderr is not a terminal (then lines are printed)
                elif bar is not None:
                    bar.update(log.update - bar.n)
                if bar is not None and not bar.disable:
                    bar.set_postfix_str(f"{row.get('sps', 0.0):.0f} sps, loss {row.get('loss', float('nan')):.4f}",
                                        refresh=False)
                    if shown:
                        bar.write(line)
                elif not quiet and (shown or last):
                    print(line, flush=True)
                if log.update % cfg.run.checkpoint_every == 0 or last or why:
                    trainer.save(metrics=metrics.sync())
                if why:
                    return why
        finally:
            if bar is not None:
                bar.close()
    return None


def _finish(recipe: Recipe, trainer: RunTrainer, run: RunDir, cfg: Any, run_eval: Any, own_dir: Path) -> None:
    """The final outputs (evaluation, CSV, plots, table), then the completion marker (process 0)."""
    from agents.run.multihost import allgather_json
    from oir_gym import analysis

    if allgather_json(not run.eval_path("final").exists())[0]:  # killed between the last checkpoint and its evaluation file
        run_eval("final", final=True)
    if trainer.process_index > 0:
        recipe.write_diversity(trainer, own_dir, cfg)
        return
    run.write_csv()
    rows = run.read_metrics()
    label = recipe.label(cfg)
    analysis.plot_training(rows, run.path / "training.png")
    analysis.plot_learning_curves({label: [rows]}, run.path / "learning_curves.png")
    final = run.read_eval("final")
    analysis.plot_instruction_bars({label: final}, run.path / "instruction_success.png",
                                   episodes=cfg.eval.final_episodes)
    analysis.write_overview_plots({label: [rows]}, run.path)  # success.png, gain.png, relabeling.png
    table = _mean_table(final)
    run.write_eval("final", final, markdown=f"{recipe.eval_title(cfg, trainer, None)}\n\n{table}\n")
    print(f"\nFinal evaluation (mean over seeds; every row in {run.eval_path('final', 'md')}):\n"
          + compact_table(table))
    recipe.write_diversity(trainer, own_dir, cfg)
    run.mark_complete(update=trainer.update_idx, env_steps=trainer.env_steps, **recipe.completion_info(trainer))


def script(recipe: Recipe, description: str | None = None, started: float | None = None) -> None:
    """A script's entry: :func:`main` with ``sys.argv``, then exit with its status."""
    from agents.run.multihost import ProcessLost, process_count

    quiet_xla_logs()
    try:
        code = main(recipe, started=started, description=description)
    except Exception as e:
        lost = isinstance(e, ProcessLost)
        if not lost and ("jax" not in sys.modules or process_count() == 1):
            raise
        # at once: jax.distributed's exit barrier would wait for the lost or failed process (then abort)
        import jax
        import traceback

        if not lost:
            traceback.print_exc()
        print(f"error: {e}; this process stops too" if lost else f"error: process {jax.process_index()} of "
              f"{process_count()} failed (above); the other processes stop at their next exchange",
              ", every checkpoint is kept: continue the run with --resume in every process", sep="", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os._exit(3 if lost else 1)
    sys.exit(code)


def quiet_xla_logs() -> None:
    """No XLA C++ log lines (errors reach Python anyway) unless ``TF_CPP_MIN_LOG_LEVEL`` is set; call before JAX."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


#: Trainer name -> (module, :class:`Recipe`), imported only when run: this package imports no trainer.
TRAINERS: dict[str, tuple[str, str]] = {"pqn": ("agents.pqn.recipe", "PQN"), "sb3": ("agents.sb3.trainer", "SB3")}


def run_module(prog: str) -> None:
    """``python -m agents.run.train ARGS`` (``prog``: the command as typed) is ``examples/train_pqn.py ARGS``."""
    import importlib

    started = time.time()
    sys.argv[0] = prog  # the usage and error lines name the command as typed
    module, attr = TRAINERS["pqn"]
    script(getattr(importlib.import_module(module), attr), started=started, description=(
        "Train PQN with OIR or a baseline on Craftax-Classic: the command line of examples/train_pqn.py "
        f"({prog} smoke --run-dir runs/smoke; examples/train_sb3.py trains the SB3 agents)."))


if __name__ == "__main__":
    # the run goes through the imported agents.run.train, the module the trainers use (not this __main__ copy)
    from agents.run.train import run_module as _run_module

    _run_module("python -m agents.run.train")
