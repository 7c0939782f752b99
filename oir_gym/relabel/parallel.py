"""Relabel a large batch of trajectories over worker processes (synchronous relabelers).

:class:`ParallelRelabeler` relabels contiguous chunks in ``spawn`` workers, each holding a relabeler built by
``factory`` (picklable, e.g. ``functools.partial(HindsightRelabeler.rules, k=4)``): the same results, in order,
as in process. Until the workers are ready, for batches below ``min_batch``, and after a worker died (warned
once), the calling process relabels. Workers run JAX on the CPU (``WORKER_ENV``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import pickle
import sys
import threading
import time
import warnings
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional, Sequence

from oir_gym.relabel.results import Closing, RelabelResult
from oir_gym.trajectory import Trajectory

#: seconds a worker waits for the others to start before the pool counts as failed to start
START_TIMEOUT = 300.0

#: Environment variables a worker process starts with (module docstring).
WORKER_ENV = {"JAX_PLATFORMS": "cpu"}

_WORKER_RELABELER: Any = None
_WORKER_BARRIER: Any = None
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(changes: dict[str, str]):
    """``os.environ`` with ``changes`` while inside (processes started inside inherit them)."""
    with _ENV_LOCK:
        before = {k: os.environ.get(k) for k in changes}
        os.environ.update(changes)
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _init_worker(factory: Any, barrier: Any) -> None:
    global _WORKER_RELABELER, _WORKER_BARRIER
    # one core per worker: the workers are the parallelism (torch reads this when imported)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:  # imported already (by the parent's main module): too late for the variable
        torch.set_num_threads(1)
    _WORKER_BARRIER = barrier
    _WORKER_RELABELER = pickle.loads(bytes(factory))()


def _relabel_chunk(trajs: list[Trajectory]) -> list[RelabelResult]:
    results = _WORKER_RELABELER.relabel(trajs)
    # the caller has the trajectories: do not send them back
    return [dataclasses.replace(r, trajectory=None) for r in results]


def _warmup() -> int:
    # no worker is idle before every worker has started: the pool starts a process per warm-up task
    _WORKER_BARRIER.wait(START_TIMEOUT)
    return os.getpid()


def default_workers(cpus: Optional[int] = None) -> int:
    """Worker processes for ``cpus`` cores: 0 below 4 cores, else ``min(8, cpus - 2)``."""
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    return 0 if cpus < 4 else min(8, cpus - 2)


class ParallelRelabeler(Closing):
    """A synchronous relabeler whose :meth:`relabel` runs over ``workers`` processes (module docstring).

    Args:
        factory: picklable zero-argument callable returning a relabeler with ``relabel(trajs)``.
        workers: worker processes (>= 1).
        min_batch: batches with fewer trajectories are relabeled in process.

    Raises:
        ValueError: ``workers < 1`` or ``min_batch < 1``.
        pickle.PicklingError, TypeError, AttributeError: ``factory`` does not pickle.
    """

    def __init__(self, factory: Callable[[], Any], workers: int, min_batch: int = 64) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers={workers!r} must be an integer >= 1 (0 workers: use the relabeler itself)")
        if not isinstance(min_batch, int) or min_batch < 1:
            raise ValueError(f"min_batch={min_batch!r} must be an integer >= 1")
        # pickled here (an unpicklable factory fails at once), passed in shared memory (module docstring)
        blob = pickle.dumps(factory)
        self.factory = factory
        self.workers = workers
        self.min_batch = min_batch
        self.local = factory()
        ctx = multiprocessing.get_context("spawn")
        shared = ctx.RawArray(ctypes.c_ubyte, len(blob))
        ctypes.memmove(shared, blob, len(blob))
        self._barrier = ctx.Barrier(workers)
        self._pool: Optional[ProcessPoolExecutor] = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(shared, self._barrier))
        self.broken: Optional[str] = None
        self._counts: Counter = Counter()
        self._next_id = 0
        self._t0 = time.perf_counter()
        self._ready_s: Optional[float] = None
        # one warm-up task per worker, submitted from a side thread (each submit starts a process)
        self._warmups: list[Future] = []
        self._start_error: Optional[BaseException] = None
        self._starter = threading.Thread(target=self._start_workers, args=(self._pool,),
                                         name="ParallelRelabeler-start", daemon=True)
        self._starter.start()

    def _start_workers(self, pool: ProcessPoolExecutor) -> None:
        try:
            with _environment(WORKER_ENV):
                for _ in range(self.workers):
                    self._warmups.append(pool.submit(_warmup))
        except Exception as e:  # closed meanwhile (or the interpreter exits), or a worker died
            self._start_error = e
            self._barrier.abort()  # the workers started so far stop waiting for the others

    def _workers_ready(self) -> bool:
        if self._ready_s is not None:
            return True
        if self._pool is None or self._starter.is_alive() or not all(f.done() for f in self._warmups):
            return False
        errors = [self._start_error] + [f.exception() for f in self._warmups]
        error = next((e for e in errors if e is not None), None)
        if error is not None or len(self._warmups) < self.workers:
            self._give_up(f"the relabel worker processes did not start ({error!r})")
            return False
        self._ready_s = time.perf_counter() - self._t0
        return True

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Wait up to ``timeout`` s until every worker is ready; ``False`` if not (or given up)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._starter.join(timeout)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        concurrent.futures.wait(list(self._warmups), timeout=remaining)
        return self._workers_ready()

    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """Relabel ``trajectories``; the results are in their order and hold these very objects."""
        trajs = list(trajectories)
        if len(trajs) >= self.min_batch and not self._workers_ready() and self._pool is not None:
            # the workers are still starting: no batch waits for them
            self._counts["in_process_warming"] += len(trajs)
            return self._numbered(self.local.relabel(trajs), trajs)
        if self._pool is None or len(trajs) < self.min_batch:
            self._counts["in_process"] += len(trajs)
            return self.local.relabel(trajs)
        n = min(self.workers, len(trajs))
        bounds = [len(trajs) * i // n for i in range(n + 1)]
        try:
            futures = [self._pool.submit(_relabel_chunk, trajs[a:b]) for a, b in zip(bounds, bounds[1:])]
            chunks = [f.result() for f in futures]
        except BrokenProcessPool as e:
            self._give_up(f"a relabel worker process died ({e})")
            return self.local.relabel(trajs)
        self._counts["in_workers"] += len(trajs)
        return self._numbered([r for chunk in chunks for r in chunk], trajs)

    __call__ = relabel

    def _numbered(self, results: list[RelabelResult], trajs: list[Trajectory]) -> list[RelabelResult]:
        first, self._next_id = self._next_id, self._next_id + len(trajs)
        return [dataclasses.replace(r, trajectory=t, request_id=first + i)
                for i, (r, t) in enumerate(zip(results, trajs))]

    def _give_up(self, why: str) -> None:
        self.broken = why
        warnings.warn(f"ParallelRelabeler: {why}; relabeling in the training process from now on (slower)",
                      RuntimeWarning, stacklevel=3)
        pool, self._pool = self._pool, None
        if pool is not None:
            self._barrier.abort()  # a worker waiting for the others stops waiting
            pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        """Trajectories relabeled ``in_workers``, ``in_process``, ``in_process_warming``; ``ready_s`` and ``broken`` when set."""
        return {"workers": self.workers if self._pool is not None else 0, **self._counts,
                **({"ready_s": round(self._ready_s, 3)} if self._ready_s is not None else {}),
                **({"broken": self.broken} if self.broken else {})}

    def close(self) -> None:
        """Stop the worker processes (idempotent; also while they start)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            self._barrier.abort()  # closed while starting: no worker waits for the others
            pool.shutdown(wait=True, cancel_futures=True)
        self._starter.join()
        if hasattr(self.local, "close"):
            self.local.close()

    def __repr__(self) -> str:
        return f"ParallelRelabeler(workers={self.workers}, factory={self.factory!r})"
