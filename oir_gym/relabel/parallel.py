"""Relabel a large batch of trajectories over worker processes (synchronous relabelers).

A rule relabeler spends about 0.7 ms of Python per trajectory (filters, grounding, binding): at
1,024 envs x 3 seeds that is about 2 s of every update, on one core, while the GPU waits.
:class:`ParallelRelabeler` cuts the batch into contiguous chunks and relabels them in worker
processes, each holding its own relabeler built by ``factory`` (a picklable callable, e.g.
``functools.partial(HindsightRelabeler, "rules", k=4)``), and returns the results in the
batch's order, with the caller's own :class:`~oir_gym.trajectory.Trajectory` objects: the same
candidates as in process, their embeddings and cosine rows equal to float rounding (the encoder
batches texts differently in each process).

Workers start with the ``spawn`` method (the parent may hold JAX or CUDA state, which ``fork``
would copy half-initialised). A batch smaller than ``min_batch`` is relabeled in the calling
process by a relabeler of the same factory. If a worker dies, the batch is relabeled in process,
a warning says so once, and every later batch stays in process: training goes on, slower.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Optional, Sequence

from oir_gym.relabel.results import RelabelResult
from oir_gym.trajectory import Trajectory

_WORKER_RELABELER: Any = None


def _init_worker(factory: Callable[[], Any]) -> None:
    global _WORKER_RELABELER
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per worker: the workers are the parallelism
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # a relabeler without an encoder needs no torch
        pass
    _WORKER_RELABELER = factory()


def _relabel_chunk(trajs: list[Trajectory]) -> list[RelabelResult]:
    results = _WORKER_RELABELER.relabel(trajs)
    # the caller has the trajectories: do not send them back
    return [dataclasses.replace(r, trajectory=None) for r in results]


def _warmup() -> int:
    return os.getpid()


def default_workers(cpus: Optional[int] = None) -> int:
    """Worker processes for a machine with ``cpus`` cores: 0 (in process) below 4 cores, else
    ``min(8, cpus - 2)`` (two cores stay for the training loop and the accelerator's driver)."""
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    return 0 if cpus < 4 else min(8, cpus - 2)


class ParallelRelabeler:
    """A synchronous relabeler whose :meth:`relabel` runs over ``workers`` processes.

    Args:
        factory: picklable zero-argument callable returning a relabeler with ``relabel(trajs)``
            (each worker builds one; the calling process builds one for small batches).
        workers: worker processes (>= 1).
        min_batch: batches with fewer trajectories are relabeled in process (a chunk must be
            worth the round trip: about 10 ms for pickling and scheduling).

    Raises:
        ValueError: ``workers < 1`` or ``min_batch < 1``.
    """

    def __init__(self, factory: Callable[[], Any], workers: int, min_batch: int = 64) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers={workers!r} must be an integer >= 1 (0 workers: use the relabeler itself)")
        if not isinstance(min_batch, int) or min_batch < 1:
            raise ValueError(f"min_batch={min_batch!r} must be an integer >= 1")
        self.factory = factory
        self.workers = workers
        self.min_batch = min_batch
        self.local = factory()
        self._pool: Optional[ProcessPoolExecutor] = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker, initargs=(factory,))
        # start the workers now (imports and the encoder take seconds), not at the first batch
        for _ in range(workers):
            self._pool.submit(_warmup)
        self.broken: Optional[str] = None
        self._counts: Counter = Counter()
        self._next_id = 0

    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """Relabel ``trajectories``; the results are in their order and hold these very objects."""
        trajs = list(trajectories)
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
        flat = [r for chunk in chunks for r in chunk]
        first, self._next_id = self._next_id, self._next_id + len(trajs)
        return [dataclasses.replace(r, trajectory=t, request_id=first + i) for i, (r, t) in enumerate(zip(flat, trajs))]

    __call__ = relabel

    def _give_up(self, why: str) -> None:
        self.broken = why
        warnings.warn(f"ParallelRelabeler: {why}; relabeling in the training process from now on (slower)",
                      RuntimeWarning, stacklevel=3)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> dict[str, Any]:
        """Trajectories relabeled in workers / in process, and why the workers were given up (if so)."""
        return {"workers": self.workers if self._pool is not None else 0, **self._counts,
                **({"broken": self.broken} if self.broken else {})}

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if hasattr(self.local, "close"):
            self.local.close()

    def __enter__(self) -> "ParallelRelabeler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ParallelRelabeler(workers={self.workers}, factory={self.factory!r})"
