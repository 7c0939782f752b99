"""One run driver for both trainers: parse, prepare the run directory, agree across processes, train
(evaluations, checkpoints, stop requests and signals), write the final outputs.

    from agents.run.train import main
    from agents.pqn.recipe import PQN
    from agents.sb3.trainer import SB3
    main(PQN, ["smoke", "--run-dir", "runs/smoke"])     # what examples/train_pqn.py runs
    main(SB3, ["smoke", "--run-dir", "runs/sb3"])       # what examples/train_sb3.py runs

``python -m agents.run.train ARGS`` is ``examples/train_pqn.py ARGS``. This package imports no
trainer: the command line finds the PQN recipe through the registry :data:`TRAINERS` (module names,
imported when it runs).

A trainer is anything with the small interface of :class:`RunTrainer` (``init_state``, ``load``,
``iteration``, ``evaluate``, ``save``, ``close``): :class:`agents.pqn.trainer.Trainer` (PQN) and
:class:`agents.sb3.trainer.SB3Trainer`. What differs between the two (their config, presets and
checkpoint format, the header and progress lines) is a :class:`Recipe`; everything else, the
command-line options of :class:`RunOptions` included, is one code path, so both scripts accept
the same run flags (``--run-dir``, ``--resume``, ``--overwrite``, ``--max-updates``,
``--time-limit``, ``--eval-only``, ``--wandb``, ``--progress``, ``--log-every``) with one meaning.

A run directory (:mod:`agents.run.run_dir`) gets config.json, metrics.jsonl / metrics.csv, TensorBoard
events, the trainer's checkpoints, eval_<update>.json, eval_final.md, PNG plots and complete.json
last. SIGINT and SIGTERM stop after the current update with a checkpoint; a second signal ends the
process at once (exit status 128 + the signal's number; the newest checkpoint on disk is the last
state).

Exit status: 0 done, stopped or nothing to do; 1 a non-finite update; 2 a usage, config or run
directory error (nothing written or deleted).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol, Sequence

from agents.run.run_dir import CorruptFileError, RunDir, RunDirError, check_user_tag, require_wandb


@dataclass
class IterationLog:
    """What :meth:`RunTrainer.iteration` returns: the update's number, the env steps so far, its
    metrics (:class:`agents.pqn.trainer.IterationLog` has the same fields)."""

    update: int
    env_steps: int
    metrics: dict[str, float]


class RunTrainer(Protocol):
    """The interface the driver trains through (both trainers implement it).

    Attributes: ``update_idx`` and ``env_steps`` (progress), ``seed_offset`` (global index of this
    process's first seed), ``process_index``, ``startup`` (seconds per start-up part, printed).
    """

    update_idx: int
    env_steps: int
    process_index: int
    startup: dict[str, float]

    @property
    def seed_offset(self) -> int: ...

    def init_state(self) -> None:
        """A fresh training state (update 0)."""

    def load(self, path: Any) -> dict[str, Any]:
        """Restore the checkpoint at ``path``; returns its host state (``update``, ``metrics`` position...)."""

    def iteration(self) -> IterationLog:
        """One update: its row of metrics."""

    def evaluate(self, final: bool = False) -> list:
        """Every seed's :class:`~oir_gym.evaluation.EvalResult` (``final``: the final evaluation's settings)."""

    def save(self, *, metrics: Any = None) -> Any:
        """A checkpoint, recording the metrics position ``metrics``."""

    def close(self) -> None:
        """Release workers, envs and files."""


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
    """No training: evaluate the newest checkpoint on exactly --eval.sets and the sets of --eval.instruction-files
    (--eval.sets with no name: the files' sets only; --eval.final-sets adds packaged held-out or ordered sets when
    named), eval.final_episodes per instruction, and write eval_TAG.json/.md (TAG: up to 64 letters, digits, '.',
    '_', '-'; not 'final' or a number, the run's own evaluations)."""
    wandb: bool = False
    """Also log to Weights & Biases (config = config.json; needs the wandb package)."""
    progress: bool = True
    """A progress bar with ETA (off: one line per update)."""
    log_every: int = 1
    """Updates between printed summary lines (evaluations are always printed)."""


class Recipe:
    """What one trainer brings to the driver: its options type, config file format, checkpoints,
    construction and lines of output. :data:`PQN` and :data:`SB3` are the two."""

    #: the trainer's name in messages
    name = ""
    #: the script that runs it (named in the "continue with" line)
    script = ""
    #: whether a run may span several processes (``jax.distributed``)
    multi_process = False
    #: whether the metrics writer writes TensorBoard events (None: when the package is installed)
    tensorboard: Optional[bool] = None
    #: whether the first update compiles programs (said in the start-up lines)
    compiles = True

    def parse(self, argv: list[str], description: str | None = None) -> Any:
        """The command line as this trainer's options (a :class:`RunOptions` with a ``config``)."""
        raise NotImplementedError

    def num_updates(self, cfg: Any) -> int:
        """Updates of the whole run."""
        raise NotImplementedError

    def default_run_dir(self, cfg: Any) -> str:
        """The folder of a run started without ``--run-dir``."""
        raise NotImplementedError

    def checkpoint_place(self, own_dir: Path) -> Path:
        """Where the checkpoints live (named in messages)."""
        return own_dir

    def checkpoints(self, own_dir: Path) -> dict[int, Path]:
        """The checkpoints this process holds, by update."""
        raise NotImplementedError

    def read_checkpoint(self, path: Path) -> dict[str, Any]:
        """Verify the checkpoint at ``path`` and return its host state (``update``, ``metrics``)."""
        raise NotImplementedError

    def no_checkpoint(self, own_dir: Path) -> None:
        """A resume found no checkpoint: raise if what is there cannot be resumed at all."""

    def drop_newer(self, own_dir: Path, update: int) -> None:
        """Before resuming from ``update``: remove newer checkpoints (their updates run again)."""

    def build(self, cfg: Any, own_dir: Path, eval_only: bool, fresh: bool = False) -> RunTrainer:
        """The trainer (``eval_only``: for an evaluation, no LLM started; ``fresh``: a run that starts
        from update 0, not from a checkpoint)."""
        raise NotImplementedError

    def write_config(self, run: RunDir, cfg: Any) -> None:
        """Write the run's ``config.json``."""
        run.write_config(cfg.to_dict())

    def header(self, cfg: Any, trainer: RunTrainer, procs: int, run: RunDir) -> str:
        """The first line of a run."""
        raise NotImplementedError

    def summary_line(self, row: dict[str, Any], num_updates: int) -> str:
        """The one-line progress summary of a metrics row."""
        raise NotImplementedError

    def on_row(self, trainer: RunTrainer, row: dict[str, Any]) -> None:
        """After each metrics row is written (e.g. into the trainer's own logger)."""

    def label(self, cfg: Any) -> str:
        """The run's name in plots and tables (method or algorithm)."""
        raise NotImplementedError

    def eval_title(self, cfg: Any, trainer: RunTrainer, tag: str | None) -> str:
        """The heading of eval_final.md (``tag`` None) or of an ``--eval-only`` evaluation."""
        raise NotImplementedError

    def compile_ahead(self, trainer: RunTrainer) -> bool:
        """Whether to start the trainer's compiles beside its initial state."""
        return False

    def completion_info(self, trainer: RunTrainer) -> dict[str, Any]:
        """What complete.json records besides the update and env steps."""
        return {}

    def write_diversity(self, trainer: RunTrainer, folder: Path, cfg: Any) -> None:
        """Write and print the relabeling's diversity report, where the trainer has one."""

    def final_extras(self, trainer: RunTrainer) -> dict[str, float]:
        """Columns the last update's row adds (e.g. the relabeled instructions' diversity)."""
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
    """The evaluation tables of :meth:`~oir_gym.evaluation.EvalResult.to_markdown` for a terminal:
    per-instruction rows that are 0 in every column become one count line per set (a short or
    untrained run prints a few lines, not a row per instruction), and a retention table without a
    learned achievement one line. The run's eval_*.md keeps every row."""
    import re

    zero = re.compile(r"^[+-]?0(\.0+)?$")
    lines, out, i = markdown.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("| instruction |"):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            rows = lines[i + 2:j]
            kept = [r for r in rows if not all(zero.match(c.strip().split(" ")[0])
                                               for c in r.strip("|").split("|")[1:])]
            heading = out[-2] if len(out) >= 2 and out[-2].startswith("Set ") else None
            if heading is not None:
                out = out[:-2]
            name = heading[:-1] if heading else "Set original, per instruction"
            if kept:
                out += [f"{name} ({len(rows) - len(kept)} of {len(rows)} at 0 not shown):", "", *lines[i:i + 2], *kept]
            else:
                out.append(f"{name}: all {len(rows)} at 0")
            i = j
            continue
        if line.startswith("Paraphrase retention:") and i + 3 < len(lines) and lines[i + 2].startswith("| set |"):
            j = i + 4
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            if all(r.split("|")[2].strip() == "-" for r in lines[i + 4:j]):
                out.append("Paraphrase retention: - (no achievement learned on the original set)")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _metrics_resume(host: dict[str, Any]) -> dict[str, Any]:
    """How a resume cuts metrics.jsonl back to a checkpoint: its recorded position, or (a checkpoint
    converted from a legacy pickle) the rows up to its update; no checkpoint (``{}``): every row."""
    if not host:
        return {"after_update": 0}
    if host.get("metrics"):
        return {"position": host["metrics"]}
    return {"after_update": int(host.get("metrics_after_update") or host["update"])}


def _any_problem(problem: str | None) -> str | None:
    """The first process's problem (an error message) or None: every process stops on it alike."""
    from agents.run.multihost import allgather_json

    return next((p for p in allgather_json(problem) if p), None)


class _NoMetrics:
    """The metrics writer of a process other than 0 in a multi-process run: process 0 writes the rows."""

    def write(self, row: dict[str, Any]) -> None:
        pass

    def sync(self) -> None:
        return None

    def close(self) -> None:
        pass


class _StopRequest:
    """SIGINT / SIGTERM: the first asks the loop to stop after the current update (with a checkpoint);
    a second one ends the process at once with exit status 128 + its number (the newest checkpoint
    on disk stays the last state), whatever the main thread is doing.

    Python runs a signal handler only on the main thread, between two bytecodes: while that thread
    waits in C (a compile, a device transfer, a program that never finishes) the handler would wait
    with it. So a watcher thread counts the signals: the C-level handler writes each signal's number
    to a pipe (``signal.set_wakeup_fd``) and the watcher, blocked on that pipe, runs as soon as it
    arrives (JAX's compiles and transfers release the GIL).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, Any] = {}
        self._old_wakeup = -1
        self._write_fd = -1

    def __enter__(self) -> "_StopRequest":
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # the C handler must never block
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in self.SIGNALS:
            self._old[sig] = signal.signal(sig, self._handle)
        threading.Thread(target=self._watch, args=(read_fd,), name="stop-request", daemon=True).start()
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        # the watcher counts and reports; this (main-thread) handler only makes sure that the loop's
        # next check sees the request even if the watcher has not run yet
        self.requested = self.requested or signal.Signals(signum).name

    def _watch(self, read_fd: int) -> None:
        count = 0
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while data := pipe.read(64):  # b"": __exit__ closed the write end
                for signum in data:
                    if signum not in self.SIGNALS:  # another signal with a Python handler
                        continue
                    name = signal.Signals(signum).name
                    count += 1
                    if count == 1:
                        self.requested = self.requested or name
                        print(f"\n{name}: stopping after this update with a checkpoint (send it again to stop "
                              "at once)", file=sys.stderr, flush=True)
                    else:
                        print(f"\n{name}, a second signal: exiting now; the newest checkpoint on disk is the last "
                              "state", file=sys.stderr, flush=True)
                        os._exit(128 + signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self._write_fd)


def main(recipe: Recipe, argv: list[str] | None = None, started: float | None = None,
         description: str | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``) with the trainer of ``recipe``.

    ``started``: when the process started (``time.time()``), so that the metrics' ``time`` column and
    ``--time-limit`` count the imports too (default: from this call); ``description``: the ``--help``
    text. Returns the exit status (module docstring).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = recipe.parse(argv, description)
    cfg = opts.config
    labels = None  # an evaluation: the run's label pool, to warn about a user's texts close to it
    if opts.eval_only is not None:
        labels = label_pool(cfg)
        cfg = opts.config = eval_only_config(cfg, final_sets=named_on_command_line(argv, "eval.final_sets"))
    from agents.run.multihost import allgather_json, check_processes, merge_evals, newest_common_update, process_dir
    from agents.run.multihost import initialize_distributed

    # a multi-host job (scheduler env vars) joins before JAX starts its backend (which
    # validating a config's instruction files would: oir_gym imports Craftax); every process
    # trains its share of the seeds (agents.run.multihost), process 0 writes the run's merged files
    if initialize_distributed():
        import jax

        procs, me = jax.process_count(), jax.process_index()
    else:
        procs, me = 1, 0

    # every check before anything is written or deleted
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
        if procs > 1 and not recipe.multi_process:
            raise ValueError(f"the {recipe.name} trainer runs in one process ({procs} joined)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.eval_only is not None and opts.overwrite:
        print("error: --eval-only reads a run; it cannot be combined with --overwrite", file=sys.stderr)
        return 2
    num_updates = recipe.num_updates(cfg)
    resume = opts.resume or opts.eval_only is not None
    run_path = Path(opts.run_dir or recipe.default_run_dir(cfg))
    if opts.run_dir is None and procs > 1:
        print("error: a run over several processes needs --run-dir (one directory every host sees)", file=sys.stderr)
        return 2
    if recipe.multi_process:
        try:
            check_processes(cfg.run.num_seeds, procs)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    flag = "--eval-only" if opts.eval_only is not None else "--resume"
    problem = None
    if me == 0:
        try:
            run = RunDir.prepare(run_path, resume=resume, overwrite=opts.overwrite)
        except RunDirError as e:
            problem = f"error: {str(e).replace('--resume', flag)}"
    problem = _any_problem(problem)  # process 0 prepared the directory (or refused): every process knows
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if me:
        run = RunDir(run_path)
    own_dir = process_dir(run.path, procs, me)  # this process's checkpoints (the run directory itself alone)
    own_dir.mkdir(parents=True, exist_ok=True)

    from agents.run.checkpoint import CheckpointError
    from oir_gym import enable_compilation_cache

    done = None
    start: Path | None = None  # the checkpoint this process continues from (None: update 0)
    if resume:
        # the newest checkpoint every process holds: a process that stopped between its save and
        # the others' holds a newer one, which the resume replays and replaces
        try:
            mine = recipe.checkpoints(own_dir)
        except (CorruptFileError, ValueError) as e:
            mine, problem = {}, f"error: {e}"
        common = newest_common_update(allgather_json(sorted(mine)))
        # verify the checkpoint and the metrics it covers before anything is written
        try:
            if problem:
                pass
            elif common is not None:
                start = mine[common]
                saved = recipe.read_checkpoint(start)
            else:
                recipe.no_checkpoint(own_dir)
                if opts.eval_only is not None:
                    raise FileNotFoundError(own_dir)
                saved = {}  # killed before its first checkpoint: the run starts again with its saved config
                done = run.completion()
                if me == 0 and not (done is not None and done.get("update", 0) >= num_updates):
                    # ... only if its files agree: a run whose checkpoints were moved away is not restarted
                    run.check_before_first_checkpoint(
                        min(cfg.run.checkpoint_every, num_updates), num_updates,
                        recipe.checkpoint_place(own_dir) if procs == 1 else f"{run.path}/process*/checkpoints")
            if not problem and opts.eval_only is None and me == 0:
                run.check_metrics(**_metrics_resume(saved))
            done = run.completion()
        except FileNotFoundError:
            problem = f"error: {flag} given but {recipe.checkpoint_place(own_dir)} holds no checkpoint"
        except (CorruptFileError, CheckpointError, ValueError, RunDirError) as e:
            problem = f"error: {e}"
        problem = _any_problem(problem)
        if problem:
            print(problem, file=sys.stderr)
            return 2
        if opts.eval_only is None and done is not None and done.get("update", 0) >= num_updates:
            print(f"{run.path} is already complete ({done['update']}/{num_updates} updates, final evaluation, "
                  "CSV and plots written); nothing to resume. Evaluate it again with --eval-only TAG.", flush=True)
            return 0
    enable_compilation_cache()

    from agents.run.llm import LLMCheckError, check_deadline

    t0 = time.time()
    if started is not None and started <= t0:  # the wall clock starts with the process
        t0 = started
    imports = time.time() - t0
    if opts.eval_only is not None:
        # evaluation needs no relabeler or goal proposer: never an LLM (nor a backend the run's
        # files name: nothing of it may be imported)
        trainer = recipe.build(cfg, own_dir, eval_only=True)
    else:
        try:
            # an LLM is checked here, within --time-limit
            limit = opts.time_limit
            with check_deadline(t0 + limit if limit else None, f"--time-limit {limit:g}" if limit else ""):
                trainer = recipe.build(cfg, own_dir, eval_only=False, fresh=start is None)
        except (LLMCheckError, ValueError) as e:  # ValueError: e.g. a wording pool too close to an evaluation string
            problem = f"error: {e}"
        problem = _any_problem(problem)
        if problem:
            print(problem, file=sys.stderr)
            return 2
        if me == 0:
            run.clear_complete()
            recipe.write_config(run, cfg)
    if me == 0:
        print(recipe.header(cfg, trainer, procs, run), flush=True)
    host: dict[str, Any] = {}
    compile_ahead = opts.eval_only is None and recipe.compile_ahead(trainer)
    try:
        if start is not None:
            if opts.eval_only is None:
                recipe.drop_newer(own_dir, int(start.name) if start.name.isdigit() else 0)
            host = trainer.load(start)
            if opts.eval_only is not None:
                if me == 0:
                    print(f"evaluating the checkpoint {start} (update {trainer.update_idx}, {trainer.env_steps:,} env "
                          f"steps) on {eval_plan(cfg)}", flush=True)
            else:
                print(f"resumed from update {trainer.update_idx} ({trainer.env_steps:,} env steps)", flush=True)
            if compile_ahead and trainer.update_idx < num_updates:
                trainer.start_compiling()  # type: ignore[attr-defined]
        else:
            if resume:  # no checkpoint every process holds: the run starts again
                recipe.drop_newer(own_dir, 0)
                if me == 0:
                    why = (f"{recipe.checkpoint_place(own_dir)} holds no checkpoint yet (the run stopped before its "
                           "first)" if procs == 1 else "the processes hold no checkpoint of the same update")
                    print(f"{why}: starting the run from update 0 with its saved config", flush=True)
            if compile_ahead:
                trainer.start_compiling()  # type: ignore[attr-defined]
            trainer.init_state()
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f} s"
                          for k, v in {"imports": imports, **trainer.startup}.items() if k != "imports" or v >= 0.5)
        print(f"ready after {time.time() - t0:.0f} s ({parts})"
              f"{'; the first update compiles' if recipe.compiles and opts.eval_only is None else ''}", flush=True)
        if labels is not None and me == 0 and (warning := pool_overlap_warning(labels, cfg.eval.instruction_files)):
            print(warning, file=sys.stderr, flush=True)
    except (CheckpointError, CorruptFileError, ValueError) as e:
        trainer.close()
        print(f"error: {e}", file=sys.stderr)
        return 2

    def run_eval(tag: str, final: bool = False) -> tuple[list[dict], dict[str, float]]:
        """Every seed's evaluation (process 0 writes the run's eval file with all of them) and this
        process's metrics row part (its seeds' columns and their means); ``final``: the final
        evaluation (eval.final_sets, eval.final_episodes)."""
        results = trainer.evaluate(final=final)
        row: dict[str, float] = {}
        for s, r in enumerate(results):
            for k, v in r.flat_metrics().items():
                row[f"seed{trainer.seed_offset + s}/{k}"] = v
        row.update(seed_means([r.flat_metrics() for r in results]))
        every = merge_evals(allgather_json([r.to_dict() for r in results]))
        if me == 0:
            run.write_eval(tag, every)
        return every, row

    if opts.eval_only is not None:  # the run's metrics, config and TensorBoard files stay as they are
        trainer.close()
        results, _ = run_eval(opts.eval_only, final=True)
        if me:
            return 0
        table = _mean_table(results)
        run.write_eval(opts.eval_only, results, markdown=f"{recipe.eval_title(cfg, trainer, opts.eval_only)}\n\n{table}\n")
        print(table + f"\nwrote {run.eval_path(opts.eval_only)}", flush=True)
        return 0

    # process 0 writes the run's metrics (every process's rows merged); the others keep none
    metrics = run.open_metrics(**(_metrics_resume(host) if resume else {}), wandb=opts.wandb,
                                tensorboard=recipe.tensorboard) if me == 0 \
        else _NoMetrics()
    stopped: str | None = None
    try:
        stopped = _train(recipe, trainer, num_updates, metrics, opts, run_eval, t0)
    except FloatingPointError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        trainer.close()
        metrics.close()
    if stopped:
        recipe.write_diversity(trainer, own_dir, cfg)  # a stopped run's buffer is reported too (it may never resume)
        if me:
            return 0
        run.write_csv()
        print(f"stopped ({stopped}) at update {trainer.update_idx}/{num_updates}; continue with: "
              f"python {recipe.script} --run-dir {run.path} --resume", flush=True)
        return 0
    _finish(recipe, trainer, run, cfg, run_eval, own_dir)
    if me:
        return 0
    print(f"\ndone in {time.time() - t0:.0f}s; outputs in {run.path}/", flush=True)
    return 0


def seed_means(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each metric's mean over the seeds' rows that hold it: a seed may lack one (a paraphrase
    retention is left out where the seed learned no achievement), so the keys are every row's."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for k, v in row.items():
            values.setdefault(k, []).append(float(v))
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
            while trainer.update_idx < n:
                log = trainer.iteration()
                row = {"update": log.update, "env_steps": log.env_steps, "time": time.time() - t0, **log.metrics}
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
                if bar is None and opts.progress and not quiet:  # started after the first update: its rate leaves out the compile
                    bar = tqdm(total=n, initial=log.update, unit="update", dynamic_ncols=True, file=sys.stderr,
                               disable=None)  # None: off when stderr is not a terminal (then lines are printed)
                elif bar is not None:
                    bar.update(log.update - bar.n)
                if bar is not None and not bar.disable:
                    bar.set_postfix_str(f"{row.get('sps', 0.0):.0f} sps, loss {row.get('loss', float('nan')):.4f}",
                                        refresh=False)
                    if log.update % opts.log_every == 0 or "eval/original/mean_success_rate" in row:
                        bar.write(line)
                elif not quiet and (log.update % opts.log_every == 0 or "eval/original/mean_success_rate" in row
                                    or last):
                    print(line, flush=True)
                if log.update % cfg.run.checkpoint_every == 0 or last:
                    trainer.save(metrics=metrics.sync())
                if why:
                    if not last:
                        trainer.save(metrics=metrics.sync())
                    return why
        finally:
            if bar is not None:
                bar.close()
    return None


def _finish(recipe: Recipe, trainer: RunTrainer, run: RunDir, cfg: Any, run_eval: Any, own_dir: Path) -> None:
    """The final outputs (evaluation, CSV, plots, table), then the completion marker, in that order
    (process 0; the others evaluate with it and write their diversity.json)."""
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
    """A script's entry: :func:`main` with ``sys.argv``, then exit with its status; a process of a
    multi-process run that lost another ends with one line."""
    from agents.run.multihost import ProcessLost, process_count

    quiet_xla_logs()
    try:
        code = main(recipe, started=started, description=description)
    except ProcessLost as e:
        print(f"error: {e}; this process stops too, every checkpoint is kept: continue the run with --resume "
              "in every process", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # at once: jax.distributed's exit barrier would wait for the lost process, then abort with a stack dump
        os._exit(3)
    except Exception:
        if "jax" not in sys.modules or process_count() == 1:
            raise
        # an unexpected error in one process of a multi-process run: exiting normally would stop at
        # jax.distributed's exit barrier, which waits for the other processes while they wait for
        # this one at their next exchange (a hang); ended at once, they stop there with one line
        import jax
        import traceback

        traceback.print_exc()
        print(f"error: process {jax.process_index()} of {process_count()} failed (above); the other processes stop "
              "at their next exchange, every checkpoint is kept: continue the run with --resume in every process",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    sys.exit(code)


def quiet_xla_logs() -> None:
    """A script's process prints no XLA C++ log lines (the "Very slow compile?" banner, the
    constant-folding alarm: a CPU compile is slow, not broken; XLA's errors reach Python as
    exceptions). ``TF_CPP_MIN_LOG_LEVEL`` set by the user wins (0 shows them all). A script calls
    this before JAX is imported; importing the library changes nothing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


#: Config fields that say where a run connects or what it reads outside its folder, with the flag that
#: sets each. A resumed run takes them from its ``config.json`` only when its command line names them
#: again (anyone who can write the folder can change that file: a ``llm.base_url`` of theirs would
#: receive every request with the API key), as it takes a module-path LLM backend.
OUTSIDE_FIELDS: dict[str, str] = {
    "llm.base_url": "--llm.base-url", "llm.template": "--llm.template", "llm.model": "--llm.model",
    "oir.oracle_pool": "--oir.oracle-pool", "eval.instruction_files": "--eval.instruction-files",
}


def named_on_command_line(argv: Sequence[str], field: str) -> bool:
    """Whether ``argv`` passes the flag of config field ``field`` (``"llm.base_url"``: ``--llm.base-url``
    or ``--llm.base_url``, with its value after it or after ``=``)."""
    part, _, name = field.partition(".")
    spellings = {f"--{part}.{name}", f"--{part}.{name.replace('_', '-')}"}
    return any(a.partition("=")[0] in spellings for a in argv)


def _points_outside(field: str, value: Any, default: Any) -> bool:
    if field == "llm.template":  # a packaged template's name is data; a file path is read
        from oir_gym.relabel.prompts import TEMPLATE_NAMES

        return value not in TEMPLATE_NAMES and value != default
    if field == "llm.model":  # a model name is data; a local folder is read (transformers, llama.cpp, vLLM)
        return bool(value) and (str(value).startswith(("/", ".", "~")) or Path(str(value)).expanduser().exists())
    return value != default


def outside_references(cfg: Any) -> dict[str, Any]:
    """The fields of :data:`OUTSIDE_FIELDS` that ``cfg`` (a PQN or SB3 config) sets to a server or a
    file of its own (not the default, a packaged name or a model name), with their values."""
    import dataclasses

    out: dict[str, Any] = {}
    for field in OUTSIDE_FIELDS:
        part, name = field.split(".")
        section = getattr(cfg, part, None)
        if section is None or name not in {f.name for f in dataclasses.fields(section)}:
            continue
        value, default = getattr(section, name), getattr(type(section)(), name)
        if _points_outside(field, value, default):
            out[field] = value
    return out


def _repeat(refs: Mapping[str, Any]) -> str:
    """The flags that pass ``refs`` (field -> value) again, quoted for a shell."""
    import shlex

    parts = []
    for field, value in refs.items():
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        parts.append(" ".join([OUTSIDE_FIELDS[field], *(shlex.quote(str(v)) for v in values)]))
    return " ".join(parts)


def eval_only_config(cfg: Any, *, final_sets: bool) -> Any:
    """The config an ``--eval-only`` evaluation runs with: ``eval.final_sets`` only when the command
    line names them (``final_sets``), so that exactly ``eval.sets`` and the files are evaluated
    otherwise; the run's training labels (``oir.oracle``, its pool) replaced by the canonical ones,
    which nothing of an evaluation reads (a user's file close to the run's pool is warned about,
    :func:`pool_overlap_warning`, not refused)."""
    changes: dict[str, Any] = {} if final_sets else {"eval.final_sets": ()}
    oir = getattr(cfg, "oir", None)
    if oir is not None and hasattr(oir, "oracle"):
        changes["oir.oracle"] = "canonical"
        if hasattr(oir, "oracle_pool"):
            changes["oir.oracle_pool"] = ""
    return cfg.replace(**changes)


def label_pool(cfg: Any) -> str | None:
    """The wording pool file the run's labels came from (``""``: the packaged pool), or None when
    its labels use none (``oir.oracle`` not one of the pool oracles)."""
    from oir_gym.relabel.oracle import USES_POOL

    oir = getattr(cfg, "oir", None)
    if getattr(cfg, "run", None) is not None and getattr(cfg.run, "method", "oir") != "oir":
        return None
    if oir is None or getattr(oir, "oracle", "canonical") not in USES_POOL:
        return None
    return getattr(oir, "oracle_pool", "")


def pool_overlap_warning(pool_file: str, instruction_files: Sequence[str]) -> str | None:
    """One warning line naming the texts of ``instruction_files`` within cosine
    :data:`~oir_gym.relabel.oracle.MAX_EVAL_COSINE` (0.85) of a wording of the run's label pool
    (``pool_file``; ``""``: the packaged one), or None when none is: their success measures wordings
    the run was trained on, not held-out ones."""
    import numpy as np

    from oir_gym import get_encoder
    from oir_gym.instructions import load_instruction_files
    from oir_gym.relabel.oracle import MAX_EVAL_COSINE, load_pool

    texts = list(dict.fromkeys(i.text for items in load_instruction_files(instruction_files).values() for i in items))
    if not texts:
        return None
    pool = load_pool(pool_file or None)
    words = list(pool.owner())
    enc = get_encoder()
    sim = np.asarray(enc.encode(texts), np.float32) @ np.asarray(enc.encode(words), np.float32).T
    close = [(texts[i], words[int(sim[i].argmax())], float(sim[i].max())) for i in range(len(texts))
             if sim[i].max() >= MAX_EVAL_COSINE]
    if not close:
        return None
    shown = "; ".join(f"{t!r} ({c:.2f} to {w!r})" for t, w, c in close[:8]) + (" ..." if len(close) > 8 else "")
    return (f"warning: {len(close)} of the {len(texts)} texts of your instruction files are within cosine "
            f"{MAX_EVAL_COSINE} of a wording of the run's label pool ({pool.source}), so they are not held out from "
            f"what it was trained on: {shown}")


def eval_plan(cfg: Any) -> str:
    """What an evaluation of ``cfg`` runs, in words: its sets and episodes."""
    from oir_gym.instructions import load_instruction_files

    ev = cfg.eval
    sets = list(dict.fromkeys([*ev.sets, *ev.final_sets, *load_instruction_files(ev.instruction_files)]))
    return f"the sets {', '.join(sets)} ({ev.final_episodes} episode(s) per instruction)"


def parse_with_base(argv: list[str], description: str | None, options_type: type, cli: Any, load_config: Any,
                    check_saved_backend: Any) -> Any:
    """The command line as ``options_type`` (parsed by ``cli``, :func:`agents.pqn.config.cli`'s signature):
    ``--resume`` / ``--eval-only`` start from the run's saved config (read by ``load_config``; flags
    override it), otherwise from the preset named first.

    What a run's files may not decide: a module-path LLM backend is refused unless the flags name it
    (``check_saved_backend``), and so is a field of :data:`OUTSIDE_FIELDS` that points outside
    (another server, a template, model, pool or instruction file): ``--resume`` refuses, naming the
    flags to repeat; ``--eval-only``, which starts no LLM and evaluates the files its command line
    names, leaves them at their defaults with a warning."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--run-dir", "--run_dir")
    pre.add_argument("--resume", action="store_true")
    pre.add_argument("--eval-only", "--eval_only")
    pre.add_argument("--llm.backend", dest="llm_backend")
    known, _ = pre.parse_known_args(argv)
    if (known.resume or known.eval_only) and known.run_dir and (Path(known.run_dir) / "config.json").is_file():
        file = Path(known.run_dir) / "config.json"
        try:
            base = load_config(RunDir(known.run_dir).read_config())
        except (ValueError, CorruptFileError) as e:
            raise SystemExit(f"error: {file}: {e}") from None
        if known.eval_only is None:  # an evaluation starts no LLM (the recipe replaces the backend)
            try:
                check_saved_backend(base.llm, file, on_command_line=known.llm_backend is not None)
            except ValueError as e:
                raise SystemExit(f"error: {e}") from None
        refs = {f: v for f, v in outside_references(base).items() if not named_on_command_line(argv, f)}
        if refs:
            names = ", ".join(f"{f}={v!r}" for f, v in refs.items())
            if known.eval_only is None:
                raise SystemExit(
                    f"error: {file} sets {names}: a resumed run takes where it connects and what it reads outside "
                    "its folder from its command line only, never from its files (anyone who can write the folder "
                    f"can change them); repeat {_repeat(refs)} to use them again, or pass other values")
            print(f"warning: --eval-only does not use {names} of {file} (an evaluation takes files from its command "
                  f"line only; pass {_repeat(refs)} to use them)", file=sys.stderr, flush=True)
            base = base.replace(**{f: getattr(type(getattr(base, f.split('.')[0]))(), f.split(".")[1]) for f in refs})
        return cli(options_type, argv, base=base, description=description)
    return cli(options_type, argv, description=description)


#: The trainers the driver runs from its own command line (``python -m agents.run.train``), by name:
#: the module and the :class:`Recipe` in it. A registry of names, imported only when run, so this
#: package imports no trainer (``agents.pqn`` and ``agents.sb3`` import it).
TRAINERS: dict[str, tuple[str, str]] = {"pqn": ("agents.pqn.recipe", "PQN"), "sb3": ("agents.sb3.trainer", "SB3")}


def recipe(name: str) -> Recipe:
    """The :class:`Recipe` of trainer ``name`` (a key of :data:`TRAINERS`), imported now."""
    import importlib

    if name not in TRAINERS:
        raise ValueError(f"unknown trainer {name!r}; expected one of {sorted(TRAINERS)}")
    module, attr = TRAINERS[name]
    return getattr(importlib.import_module(module), attr)


def run_module(prog: str) -> None:
    """``python -m agents.run.train ARGS`` (``prog`` names the command as typed): the PQN trainer's
    command line, ``examples/train_pqn.py ARGS``."""
    started = time.time()
    sys.argv[0] = prog  # the usage and error lines name the command as typed
    script(recipe("pqn"), started=started, description=(
        "Train PQN with OIR or a baseline on Craftax-Classic: the command line of examples/train_pqn.py "
        f"({prog} smoke --run-dir runs/smoke; examples/train_sb3.py trains the SB3 agents)."))


if __name__ == "__main__":
    # the run goes through the imported agents.run.train, the module the trainers use (not this __main__ copy)
    from agents.run.train import run_module as _run_module

    _run_module("python -m agents.run.train")
