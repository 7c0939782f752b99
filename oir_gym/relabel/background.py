"""``BackgroundRelabeler``: the one meaning of "LLM + rules" (``both``) for every trainer.

:meth:`BackgroundRelabeler.submit` relabels the batch with the rules at once (or, with
``rules_lag=1``, on a side thread whose results come with the next ``submit``) and queues ``ask``
on the LLM relabeler's worker; :meth:`BackgroundRelabeler.collect` hands back the rules' results,
then the LLM's that have arrived, without LLM candidates the rules already gave for the same
trajectory (``llm_repeats_rules``). With the LLM queue full, the oldest queued batch is dropped
(``on_full="replace"``). Either half may be ``None``.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional, Sequence

from oir_gym.relabel.jobs import CLOSE_TIMEOUT
from oir_gym.relabel.results import Closing, RelabelResult
from oir_gym.trajectory import Trajectory
from oir_gym.validation import ArgumentTypeError, check_bool, check_instance, check_int, check_real, show

#: Trajectories whose rule texts are remembered until their LLM answer arrives (oldest forgotten first).
REMEMBERED = 4096


def _trajectories(name: str, value: Any) -> list[Trajectory]:
    """``value`` as a list of :class:`Trajectory`."""
    if isinstance(value, (Trajectory, str, bytes)) or not hasattr(value, "__iter__"):
        raise ArgumentTypeError(f"{name}={show(value)} must be a list of Trajectory, got {type(value).__name__}")
    out = list(value)
    for i, t in enumerate(out):
        check_instance(f"{name}[{i}]", t, Trajectory)
    return out


class BackgroundRelabeler(Closing):
    """Rules now, the LLM's answers when they arrive (see the module docstring).

    Args:
        rules: a synchronous relabeler (a rule :class:`~oir_gym.relabel.HindsightRelabeler` or a
            :class:`~oir_gym.relabel.parallel.ParallelRelabeler`), or ``None``.
        llm: an LLM :class:`~oir_gym.relabel.HindsightRelabeler` used through ``submit``/``collect``
            (``selection.use_rules=False``, ``llm.on_full="replace"``), or ``None``.
        rules_lag: 0: the rules relabel in :meth:`submit`; 1: on a side thread, results with the next one.

    :meth:`close` closes both. Give them one :class:`~oir_gym.relabel.encoding.SharedEncoder` when
    they share an encoder, so they never encode at the same time.
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

    def submit(self, trajectories: Sequence[Trajectory], *, ask: Optional[Sequence[Trajectory]] = None) -> None:
        """Relabel ``trajectories`` with the rules and queue ``ask`` (default: all) for the LLM; never waits for it."""
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
        """The rules' results so far, then the LLM's (``block``: wait up to ``timeout`` s for its queue)."""
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
        """:meth:`submit` then :meth:`collect` (not blocking)."""
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

    @property
    def pending(self) -> int:
        """LLM trajectories queued or in flight."""
        return 0 if self.llm is None else int(self.llm.pending)

    @property
    def encoder(self) -> Any:
        """The LLM relabeler's sentence encoder (the rule relabeler's without an LLM)."""
        return getattr(self.llm if self.llm is not None else self.rules, "encoder", None)

    def encode(self, texts: Sequence[str]) -> Any:
        """``[n, dim]`` embeddings of ``texts``, serialised with the relabelers' background work."""
        return (self.llm if self.llm is not None else self.rules).encode(texts)

    @property
    def backend(self) -> Any:
        """The LLM relabeler's backend (the rule relabeler's without an LLM)."""
        return getattr(self.llm if self.llm is not None else self.rules, "backend", None)

    def stats(self) -> dict[str, Any]:
        """The LLM (else rule) relabeler's counters plus ``rules_results``, ``llm_results``, ``llm_repeats_rules``."""
        base = self.llm if self.llm is not None else self.rules
        out = dict(base.stats()) if hasattr(base, "stats") else {}
        with self._lock:
            out.update(self._counts)
        return out

    def check_llm(self, timeout: Optional[float] = None) -> Optional[str]:
        """The LLM relabeler's :meth:`~oir_gym.relabel.HindsightRelabeler.check_llm` (``None`` without an LLM)."""
        return None if self.llm is None else self.llm.check_llm(timeout)

    def close(self, timeout: Optional[float] = CLOSE_TIMEOUT) -> None:
        """Let a lagged rule relabeling finish, close the LLM relabeler (within ``timeout``), then the rules. Idempotent."""
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

    def __repr__(self) -> str:
        return f"BackgroundRelabeler(rules={self.rules!r}, llm={self.llm!r}, rules_lag={self.rules_lag})"
