"""``BackgroundRelabeler``: the one meaning of "LLM + rules" (``both``) for every trainer.

The rules answer at once; the LLM's answers join when they arrive:

* :meth:`BackgroundRelabeler.submit` relabels the batch with the rule relabeler right away (or,
  with ``rules_lag=1``, on a side thread whose results come with the next ``submit``) and queues
  the trajectories the LLM should read (``ask``; default all of them) on the LLM relabeler's
  background worker.
* :meth:`BackgroundRelabeler.collect` hands back the rules' results, then the LLM's results that
  have arrived (of this or earlier batches). An LLM candidate whose text the rules already gave
  for the same trajectory is dropped (it would be a second copy of the same relabeled row),
  counted as ``llm_repeats_rules`` (with ``rules_lag=1``, only once the rules' results of its
  batch have come back: an LLM answer that comes first is kept whole).

**Queue policy when full.** The LLM relabeler's queue holds ``queue_size`` batches (default 1).
When the LLM is still busy and the queue is full, the *oldest* queued batch is dropped and the
new one queued (``on_full="replace"`` of :meth:`HindsightRelabeler.submit
<oir_gym.relabel.relabeler.HindsightRelabeler.submit>`, counted as ``overflow_replaced``): the LLM
always reads the freshest rollouts, and answers that would come too late to train on are never
asked for. The rules have already answered for a dropped batch, so no trajectory goes without
instructions.

:meth:`close` is bounded like :meth:`HindsightRelabeler.close`: a rule relabeling in flight
finishes, then the LLM relabeler gets ``timeout`` seconds for its queue and is stopped.

Either half may be absent: ``BackgroundRelabeler(rules)`` is a rule relabeler (with the same lag
option), ``BackgroundRelabeler(None, llm)`` the LLM alone (its own fallback rules aside).
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, Sequence

from oir_gym.relabel.jobs import CLOSE_TIMEOUT
from oir_gym.relabel.results import RelabelResult
from oir_gym.trajectory import Trajectory
from oir_gym.validation import ArgumentTypeError, check_bool, check_instance, check_int, check_real, show

#: Trajectories whose rule texts are remembered until their LLM answer arrives (oldest forgotten
#: first; an LLM batch dropped from the queue never answers).
REMEMBERED = 4096


def _trajectories(name: str, value: Any) -> list[Trajectory]:
    """``value`` as a list of :class:`Trajectory` (a list, tuple or other iterable of them)."""
    if isinstance(value, (Trajectory, str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"{name}={show(value)} must be a list of Trajectory, got {type(value).__name__}")
    out = list(value)
    for i, t in enumerate(out):
        check_instance(f"{name}[{i}]", t, Trajectory)
    return out


class BackgroundRelabeler:
    """Rules now, the LLM's answers when they arrive (see the module docstring).

    Args:
        rules: a synchronous relabeler (``relabel(list[Trajectory])``: a rule
            :class:`~oir_gym.relabel.HindsightRelabeler` or a
            :class:`~oir_gym.relabel.parallel.ParallelRelabeler`), or ``None``.
        llm: an LLM :class:`~oir_gym.relabel.HindsightRelabeler` used through its background queue
            (``submit``/``collect``; build it with ``selection.use_rules=False`` and
            ``llm.on_full="replace"``), or ``None``.
        rules_lag: 0: the rules relabel in :meth:`submit`; 1: on a side thread, their results
            arriving with the next :meth:`submit` (the trainer does not wait for them).

    Both relabelers belong to this object: :meth:`close` closes them. Give them one
    :class:`~oir_gym.relabel.encoding.SharedEncoder` (``HindsightRelabeler(..., encoder=shared)``)
    when they share an encoder: the rules (in the caller's thread) and the LLM's worker then never
    encode at the same time.
    """

    def __init__(self, rules: Any = None, llm: Any = None, *, rules_lag: int = 0) -> None:
        if rules is None and llm is None:
            raise ValueError("BackgroundRelabeler needs a rule relabeler, an LLM relabeler, or both")
        check_int("rules_lag", rules_lag, minimum=0, maximum=1)
        if llm is not None and not all(callable(getattr(llm, m, None)) for m in ("submit", "collect")):
            raise TypeError(f"llm={type(llm).__name__} must have submit() and collect() (a HindsightRelabeler)")
        self.rules = rules
        self.llm = llm
        self.rules_lag = int(rules_lag)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="oir-rules") if rules_lag and rules is not None else None
        self._lagged: Optional[Future] = None
        self._ready: list[RelabelResult] = []
        # id(trajectory) -> (a weak reference to it, its rule texts): an id is reused once its object is gone
        self._rule_texts: "OrderedDict[int, tuple[Any, set[str]]]" = OrderedDict()
        self._lock = threading.Lock()
        self._counts = {"rules_results": 0, "llm_results": 0, "llm_repeats_rules": 0}
        self._closed = False

    # ------------------------------------------------------------------ relabeling
    def submit(self, trajectories: Sequence[Trajectory], *, ask: Optional[Sequence[Trajectory]] = None) -> None:
        """Relabel ``trajectories`` with the rules (now, or lagged) and queue ``ask`` (default:
        ``trajectories``) for the LLM. Never waits for the LLM."""
        if self._closed:
            raise RuntimeError("relabeler is closed")
        trajs = _trajectories("trajectories", trajectories)
        ask = None if ask is None else _trajectories("ask", ask)
        if self.rules is not None:
            if self._pool is None:
                self._keep(self.rules.relabel(trajs))
            else:
                previous, self._lagged = self._lagged, self._pool.submit(self.rules.relabel, trajs)
                if previous is not None:
                    self._keep(previous.result())
        if self.llm is not None:
            asked = trajs if ask is None else list(ask)
            if asked:
                self.llm.submit(asked)

    def collect(self, block: bool = False, timeout: Optional[float] = None) -> list[RelabelResult]:
        """The rules' results so far, then the LLM's arrived results (``block``: wait up to
        ``timeout`` seconds for every queued LLM batch)."""
        rules, llm = self.collect_by_source(block, timeout)
        return rules + llm

    def collect_by_source(self, block: bool = False,
                          timeout: Optional[float] = None) -> tuple[list[RelabelResult], list[RelabelResult]]:
        """:meth:`collect` as ``(rule results, LLM results)``."""
        check_bool("block", block)
        check_real("timeout", timeout, low=0, none_ok=True)
        with self._lock:
            rules, self._ready = self._ready, []
        llm = [] if self.llm is None else [self._without_repeats(r) for r in self.llm.collect(block=block,
                                                                                             timeout=timeout)]
        with self._lock:
            self._counts["llm_results"] += len(llm)
        return rules, llm

    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """:meth:`submit` then :meth:`collect` (not blocking): the rules' results for this batch
        (the previous one with ``rules_lag=1``) and whatever the LLM has answered so far."""
        self.submit(trajectories)
        return self.collect()

    __call__ = relabel

    def _keep(self, results: list[RelabelResult]) -> None:
        with self._lock:
            self._ready.extend(results)
            self._counts["rules_results"] += len(results)
            if self.llm is not None:
                for r in results:
                    self._rule_texts[id(r.trajectory)] = (weakref.ref(r.trajectory), {c.text for c in r.candidates})
                while len(self._rule_texts) > REMEMBERED:
                    self._rule_texts.popitem(last=False)

    def _without_repeats(self, result: RelabelResult) -> RelabelResult:
        """``result`` without the LLM candidates whose text the rules gave for its trajectory."""
        with self._lock:
            entry = self._rule_texts.pop(id(result.trajectory), None)
        seen = entry[1] if entry is not None and entry[0]() is result.trajectory else None
        if not seen:
            return result
        kept = [c for c in result.candidates if c.text not in seen]
        if len(kept) < len(result.candidates):
            with self._lock:
                self._counts["llm_repeats_rules"] += len(result.candidates) - len(kept)
            result.candidates = kept
        return result

    # ------------------------------------------------------------------ what the trainers read
    @property
    def pending(self) -> int:
        """LLM trajectories queued or in flight."""
        return 0 if self.llm is None else int(self.llm.pending)

    @property
    def encoder(self) -> Any:
        """The sentence encoder of the LLM relabeler (the rule relabeler's without an LLM)."""
        return getattr(self.llm if self.llm is not None else self.rules, "encoder", None)

    def encode(self, texts: Sequence[str]) -> Any:
        """``[n, dim]`` embeddings of ``texts``, serialised with the relabelers' background work
        (:meth:`HindsightRelabeler.encode <oir_gym.relabel.relabeler.HindsightRelabeler.encode>`)."""
        return (self.llm if self.llm is not None else self.rules).encode(texts)

    @property
    def backend(self) -> Any:
        """The LLM relabeler's backend (the rule relabeler's without an LLM)."""
        return getattr(self.llm if self.llm is not None else self.rules, "backend", None)

    def stats(self) -> dict[str, Any]:
        """The LLM relabeler's counters (:data:`oir_gym.relabel.stats.STAT_KEYS`; the rule
        relabeler's without an LLM), plus ``rules_results``, ``llm_results`` (results handed back by
        each half) and ``llm_repeats_rules`` (LLM candidates dropped as repeats of a rule text)."""
        base = self.llm if self.llm is not None else self.rules
        out = dict(base.stats()) if hasattr(base, "stats") else {}
        with self._lock:
            out.update(self._counts)
        return out

    def check_llm(self, timeout: Optional[float] = None) -> Optional[str]:
        """The LLM relabeler's start-up call (``None`` without an LLM); see
        :meth:`HindsightRelabeler.check_llm <oir_gym.relabel.relabeler.HindsightRelabeler.check_llm>`."""
        return None if self.llm is None else self.llm.check_llm(timeout)

    def close(self, timeout: Optional[float] = CLOSE_TIMEOUT) -> None:
        """Let a lagged rule relabeling finish, close the LLM relabeler (bounded by ``timeout`` as
        :meth:`HindsightRelabeler.close` is), close the rule relabeler. Idempotent."""
        check_real("timeout", timeout, low=0, none_ok=True)
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self.llm is not None:
            self.llm.close(timeout)
        if self.rules is not None and hasattr(self.rules, "close"):
            self.rules.close()

    def __enter__(self) -> "BackgroundRelabeler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BackgroundRelabeler(rules={self.rules!r}, llm={self.llm!r}, rules_lag={self.rules_lag})"
