"""The relabeler's background queue behind :meth:`HindsightRelabeler.submit` / ``collect``.

A full queue follows ``on_full``: ``"rules"`` answers at once with ``overflow`` (``fallback="overflow"``),
``"skip"`` drops the new batch, ``"replace"`` the oldest queued one, ``"block"`` waits; drops are counted, and
batches still queued when :meth:`JobQueue.stop` runs out of time count as ``closed_in_flight``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Callable, Optional

from oir_gym.relabel.results import RelabelResult
from oir_gym.relabel.stats import RelabelStats
from oir_gym.trajectory import Trajectory

#: Default longest wait (seconds) of :meth:`HindsightRelabeler.close` for the queued batches.
CLOSE_TIMEOUT = 10.0

Job = tuple[list[Trajectory], list[int]]
#: ``(trajectories, request ids) -> results``
Process = Callable[[list[Trajectory], list[int]], list[RelabelResult]]
#: ``(trajectories, request ids, error text) -> empty results`` (an unexpected error of ``process``)
Fail = Callable[[list[Trajectory], list[int], str], list[RelabelResult]]


class JobQueue:
    """A bounded queue of relabeling batches and its worker thread: ``process`` relabels a batch on
    the worker, ``overflow`` at once without the LLM (``on_full="rules"``), ``fail`` gives the
    results of a batch whose ``process`` raised; ``size`` batches fit in the queue."""

    def __init__(self, process: Process, overflow: Process, fail: Fail, stats: RelabelStats, size: int,
                 on_full: str) -> None:
        self._process, self._overflow, self._fail, self._stats = process, overflow, fail, stats
        self.on_full = on_full
        self._queue: "queue.Queue[Optional[Job]]" = queue.Queue(max(1, size))
        self._done: deque[RelabelResult] = deque()
        self._done_cv = threading.Condition()
        self._pending = 0
        self._worker: Optional[threading.Thread] = None

    @property
    def pending(self) -> int:
        """Submitted trajectories whose results are not yet ready."""
        return self._pending

    def submit(self, trajs: list[Trajectory], ids: list[int]) -> None:
        """Queue one batch (see ``on_full`` for a full queue)."""
        self._stats.add(submitted=len(trajs))
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="oir-relabeler", daemon=True)
            self._worker.start()
        with self._done_cv:
            self._pending += len(trajs)
        if self.on_full == "replace":
            while True:  # discard the oldest queued batches while the queue is full
                try:
                    return self._queue.put_nowait((trajs, ids))
                except queue.Full:
                    try:
                        old_trajs, _ = self._queue.get_nowait()
                    except queue.Empty:  # the worker took one meanwhile: try again
                        continue
                    self._stats.add(overflow_replace=len(old_trajs))
                    self._forget(len(old_trajs))
        try:
            if self.on_full == "block":
                self._queue.put((trajs, ids))
            else:
                self._queue.put_nowait((trajs, ids))
        except queue.Full:
            self._stats.add({f"overflow_{self.on_full}": len(trajs)})
            if self.on_full == "rules":
                try:
                    res = self._overflow(trajs, ids)
                    for r in res:
                        r.fallback = "overflow"
                except Exception as e:  # noqa: BLE001
                    res = self._fail(trajs, ids, f"{type(e).__name__}: {e}")
                self._deliver(res, len(trajs))
            else:
                self._forget(len(trajs))

    def collect(self, block: bool = False, timeout: Optional[float] = None) -> list[RelabelResult]:
        """Finished results so far; ``block``: first wait until nothing is pending (or ``timeout``)."""
        with self._done_cv:
            if block:
                self._done_cv.wait_for(lambda: self._pending == 0, timeout=timeout)
            out = list(self._done)
            self._done.clear()
        return out

    def _forget(self, n: int, results: tuple | list = ()) -> None:
        with self._done_cv:
            self._done.extend(results)
            self._pending -= n
            self._done_cv.notify_all()

    def _deliver(self, results: list[RelabelResult], n: int) -> None:
        self._forget(n, results)
        self._stats.add(completed=len(results))

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            trajs, ids = job
            try:
                res = self._process(trajs, ids)
            except Exception as e:  # noqa: BLE001 - never kill the worker
                res = self._fail(trajs, ids, f"{type(e).__name__}: {e}")
            self._deliver(res, len(trajs))

    def stop(self, end: Optional[float]) -> None:
        """Let the worker finish the queued batches until ``end`` (``time.monotonic()``; ``None``: no
        limit), then drop what is still queued. Returns by ``end`` even while the worker is stuck in
        a call (then it is still running: :meth:`join` after cutting the call)."""
        if self._worker is None or not self._worker.is_alive():
            return
        while True:  # the stop marker goes behind the queued batches; no room by `end`: drop batches
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                self._queue.put(None, timeout=left)
                break
            except queue.Full:
                pass
            try:
                job = self._queue.get_nowait()
            except queue.Empty:  # the worker took one meanwhile: there is room now
                continue
            if job is not None:
                self._stats.add(closed_in_flight=len(job[0]))
                self._forget(len(job[0]))
        self._worker.join(None if end is None else max(0.0, end - time.monotonic()))

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the worker to end."""
        if self._worker is not None and self._worker.is_alive():
            self._worker.join(timeout)
