"""The HindsightRelabeler: trajectories in, grounded relabeled instructions out (paper section 4.1).

An LLM that raises, times out or answers nothing usable is counted, never raised into the training loop.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from typing import Any, Optional, Sequence

import numpy as np

from oir_gym.relabel.arguments import check_objects, check_trajectories, rules_config
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.composite import CompositeBackend
from oir_gym.relabel.encoding import SharedEncoder
from oir_gym.relabel.config import RelabelerConfig
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.jobs import CLOSE_TIMEOUT, JobQueue
from oir_gym.relabel.llm.build import probe
from oir_gym.relabel.llm.caller import OffThreadCaller
from oir_gym.relabel.llm.child import ChildProcessBackend, llm_process_stats
from oir_gym.relabel.llm.health import LLMHealth
from oir_gym.relabel.llm.spec import BackendSpec as LLMSpec, backend_identity, close_llm
from oir_gym.relabel.oracle import check_oracle
from oir_gym.relabel.pipeline import assemble, ground, merge_rules, plan_prompts, read_answers, select
from oir_gym.relabel.prompts import PromptTemplate, load_template
from oir_gym.relabel.results import Closing, RelabelResult
from oir_gym.relabel.rules import RuleBackend
from oir_gym.relabel.segments import behaviour_key
from oir_gym.relabel.stats import RelabelStats
from oir_gym.relabel.tokens import backend_token_count
from oir_gym.trajectory import Trajectory
from oir_gym.validation import check_bool, check_instance, check_real

__all__ = ["CLOSE_TIMEOUT", "HindsightRelabeler"]


class HindsightRelabeler(Closing):
    """LLM hindsight instruction relabeling as a library component.

    Args:
        config: every setting (:class:`~oir_gym.relabel.config.RelabelerConfig`, validated here; default: the
            offline Gemma 3 270M with rules beside it).
        llm: an :class:`~oir_gym.relabel.backends.LLMBackend` or :class:`~oir_gym.relabel.composite.CompositeBackend`
            used as is in this process instead of building ``config.llm.backend`` (the caller closes it).
        encoder: sentence encoder with unit-norm ``encode(list[str]) -> [n, D]`` (default: the shared one of
            :func:`oir_gym.encoder.get_encoder`), or a :class:`~oir_gym.relabel.encoding.SharedEncoder`.
        rules: the rule instructions (:class:`~oir_gym.relabel.rules.RuleBackend`; default one).
    """

    def __init__(self, config: Optional[RelabelerConfig] = None, *, llm: Any = None, encoder: Any = None,
                 rules: Optional[RuleBackend] = None) -> None:
        check_instance("config", config, RelabelerConfig, none_ok=True,
                       what="a RelabelerConfig (or use HindsightRelabeler.rules(k=...) for rules only)")
        config = config or RelabelerConfig()
        self.config = cfg = config.validate()
        check_objects(llm=llm, encoder=encoder, rules=rules)
        p, lc, cc, g, sel = cfg.prompt, cfg.llm, cfg.cache, cfg.grounding, cfg.selection
        # read by tests, BackgroundRelabeler and the trainers; the other settings are read from self.config
        self.grounding, self.k, self.delta = g.mode, int(sel.k), float(g.delta)
        self.template = p.template if isinstance(p.template, PromptTemplate) else load_template(str(p.template))
        self.keep_ungrounded, self.llm_timeout = sel.keep_ungrounded, lc.timeout
        self.max_prompt_tokens = p.max_prompt_tokens
        self.filter = sel.candidate_filter or CandidateFilter()
        self._rules = rules or RuleBackend()
        check_oracle(getattr(self._rules, "oracle", "canonical"), g.mode)

        # a backend built here is closed here; objects passed in belong to the caller
        backend: Any = lc.backend if llm is None else llm
        self._owns_llm = llm is None and isinstance(backend, (str, LLMSpec))
        self.backend = CompositeBackend.build(backend, lc, self._rules, sel.use_rules)
        self.use_rules = self.backend.rules is not None
        self.health = LLMHealth("relabeler", lc.warn_after, fallback="relabeling with rules meanwhile"
                                if lc.fallback == "rules" else "those trajectories get no instructions")

        # one SharedEncoder passed to several relabelers (BackgroundRelabeler's halves) serialises them all
        self._enc = encoder if isinstance(encoder, SharedEncoder) else SharedEncoder(encoder)
        self.cache = LRUCache(cc.size, cc.path)
        self._caller = OffThreadCaller("oir-llm")
        self._stats = RelabelStats()
        self._id_lock = threading.Lock()
        self._next_id = 0

        self._closed = False
        self._jobs = JobQueue(functools.partial(self._process, llm_allowed=True),
                              functools.partial(self._process, llm_allowed=False), self._empty_results,
                              self._stats, lc.queue_size, lc.on_full)

    @classmethod
    def rules(cls, k: int = 4, *, encoder: Any = None, **settings: Any) -> "HindsightRelabeler":
        """A rule relabeler (no LLM, no cache) keeping ``k`` candidates per trajectory; ``settings``: ``delta``,
        ``grounding``, ``bind_threshold``, ``keep_ungrounded``, ``dedup_threshold``, ``oracle`` (the rule variant)."""
        oracle = settings.pop("oracle", None)
        return cls(rules_config(k, **settings), encoder=encoder,
                   rules=None if oracle is None else RuleBackend(oracle=oracle))

    @property
    def _backend_id(self) -> str:
        return backend_identity(self.backend.llm)

    @property
    def encoder(self) -> Any:
        """The sentence encoder (loaded on first use)."""
        return self._enc.encoder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[n, dim]`` float32 embeddings of ``texts`` (thread-safe)."""
        return self._enc.encode(list(texts))

    def _take_ids(self, n: int) -> list[int]:
        with self._id_lock:
            self._next_id += n
            return list(range(self._next_id - n, self._next_id))

    def cache_key(self, traj: Trajectory) -> str:
        """Cache key: backend, template, k, key mode and the normalised behaviour of the trajectory."""
        mode = self.config.cache.key
        return f"{self._backend_id}|{self.template.name}|k={self.k}|{mode}|{behaviour_key(traj, mode)}"

    def render_prompt(self, traj: Trajectory) -> str:
        """The prompt this relabeler would send for ``traj`` (compacted to ``max_prompt_tokens``)."""
        return self._render(traj)[0]

    def _render(self, traj: Trajectory) -> tuple[str, int, int]:
        return self.template.render_counted(traj, self.k, self.max_prompt_tokens, self._count_tokens)

    def _count_tokens(self, prompt: str) -> int:
        n, self._stats.token_method = backend_token_count(self.backend.llm, prompt)
        return n

    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """Relabel a batch synchronously; an internal error is warned about and answered with empty results."""
        trajs = check_trajectories(trajectories)
        ids = self._take_ids(len(trajs))
        try:
            return self._process(trajs, ids, llm_allowed=True)
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            warnings.warn(f"HindsightRelabeler: relabeling failed ({type(e).__name__}: {e}); "
                          "returning empty results", RuntimeWarning, stacklevel=2)
            return self._empty_results(trajs, ids, f"{type(e).__name__}: {e}")

    __call__ = relabel

    def instructions(self, trajectories: Sequence[Trajectory]) -> list[list[str]]:
        """Just the kept instruction texts per trajectory."""
        return [r.instructions for r in self.relabel(trajectories)]

    def _process(self, trajs: list[Trajectory], ids: list[int], llm_allowed: bool) -> list[RelabelResult]:
        use_llm = llm_allowed and self.backend.llm is not None
        lookup = self.cache.get if self.cache.capacity > 0 else (lambda key: None)
        cfg = self.config
        plan = plan_prompts(trajs, use_llm=use_llm, skip_idle=cfg.prompt.skip_idle, key_of=self.cache_key,
                            lookup=lookup, render=self._render)
        t0 = time.perf_counter()
        props = self.backend.propose_within(self._caller, self.llm_timeout, trajs, plan.asked, cfg.llm.samples,
                                           self.template.schema(self.k))
        latency = time.perf_counter() - t0
        # close() cuts a call in flight (it stops the LLM): its failure is the shutdown, not the LLM's
        closing = self._closed
        answers = read_answers(plan, props, self.filter, closing=closing)
        for key, texts in answers.to_cache:
            self.cache.put(key, texts)
        self.health.call([answers.errors[i] for i in answers.asked],
                         permanent=getattr(self.backend.llm, "fatal", None) is not None)
        merged = merge_rules(trajs, answers, [p.rules for p in props], rules_of=self._rules.instructions,
                             use_rules=self.use_rules, fallback=cfg.llm.fallback, candidate_filter=self.filter)
        grounded = ground(trajs, merged, encode=self._enc.encode, phrase_emb=self._enc.phrases(), mode=self.grounding,
                          delta=self.delta, bind_threshold=cfg.grounding.bind_threshold,
                          pair_table=getattr(self._rules, "pair_table", None),
                          rule_table=getattr(self._rules, "label_events", None))
        chosen = [select(g, k=self.k, keep_ungrounded=self.keep_ungrounded,
                         dedup_threshold=cfg.selection.dedup_threshold) for g in grounded]

        results, s, dropped = assemble(trajs, ids, plan, answers, merged, grounded, chosen)
        share = None if closing else [bool(answers.llm[i]) and answers.errors[i] is None
                                      for i in range(len(trajs)) if plan.eligible[i]]
        self._stats.record_batch(s, dropped=dropped, errors={e for e in answers.errors if e}, share=share,
                                 prompts=sum(p is not None for p in plan.prompts), tokens=sum(plan.tokens),
                                 latency=latency)
        if self.cache.path is not None and self.cache.dirty >= cfg.cache.save_every:
            self.save_cache()
        return results

    def submit(self, trajectories: Sequence[Trajectory]) -> list[int]:
        """Queue a batch for background relabeling; one request id per trajectory. A full queue follows
        ``on_full``: ``"rules"`` relabels with rules at once, ``"skip"`` drops the batch, ``"replace"`` the oldest,
        ``"block"`` waits."""
        if self._closed:
            raise RuntimeError("relabeler is closed")
        trajs = check_trajectories(trajectories)
        ids = self._take_ids(len(trajs))
        self._jobs.submit(trajs, ids)
        return ids

    def collect(self, block: bool = False, timeout: Optional[float] = None) -> list[RelabelResult]:
        """Finished results so far; ``block``: wait for every submitted one (up to ``timeout`` s)."""
        block = check_bool("block", block)
        timeout = check_real("timeout", timeout, low=0.0, none_ok=True)
        return self._jobs.collect(block, timeout)

    @property
    def pending(self) -> int:
        """Submitted trajectories whose results are not yet ready."""
        return self._jobs.pending

    def _empty_results(self, trajs: list[Trajectory], ids: list[int], err: str) -> list[RelabelResult]:
        self._stats.add(errors=len(trajs))
        self._stats.count_error(err)
        return [RelabelResult(trajectory=t, candidates=[], request_id=i, error=err) for t, i in zip(trajs, ids)]

    def stats(self) -> dict[str, Any]:
        """The run's counters, keyed by :data:`oir_gym.relabel.stats.STAT_KEYS` (thread-safe)."""
        return self._stats.snapshot(cache_entries=len(self.cache), pending=self._jobs.pending, health=self.health.stats(),
                                    child=llm_process_stats(self.backend.llm))

    def save_cache(self) -> None:
        """Write the cache to ``cache_path`` (no-op without one)."""
        try:
            self.cache.save()
        except OSError as e:  # a full disk must not stop training: counted, warned once, not an LLM error
            if self._stats.increment("cache_save_failures") == 1:
                warnings.warn(f"could not save the relabel cache to {self.cache.path} ({type(e).__name__}: {e}); "
                              "training goes on with the cache in memory (stats()['cache_save_failures'])",
                              RuntimeWarning, stacklevel=2)

    def check_llm(self, timeout: Optional[float] = None) -> Optional[str]:
        """One tiny real LLM call: the completion (``None`` without an LLM) within ``timeout`` seconds; raises
        :class:`~oir_gym.relabel.llm.spec.LLMCheckError` (a ``RuntimeError``) with the cause and remedy."""
        llm = self.backend.llm
        if llm is None:
            return None
        if timeout is None and self.llm_timeout is not None and not isinstance(llm, ChildProcessBackend):
            timeout = self.llm_timeout
        return probe(llm, timeout)

    def close(self, timeout: Optional[float] = CLOSE_TIMEOUT) -> None:
        """Finish queued batches for up to ``timeout`` s, stop an LLM this relabeler built, save the cache;
        idempotent, returns within about ``timeout + 3 * ChildConfig.grace + 1`` s whatever the LLM does."""
        if self._closed:
            return
        self._closed = True
        self._jobs.stop(None if timeout is None else time.monotonic() + timeout)
        self._caller.close(0)
        if self._owns_llm:
            close_llm(self.backend.llm)  # a call still running fails now, so the worker ends
        self._jobs.join(1.0)
        self.save_cache()

    def __repr__(self) -> str:
        return (f"HindsightRelabeler(backend={self.backend!r}, k={self.k}, template={self.template.name!r}, "
                f"use_rules={self.use_rules}, delta={self.delta})")

