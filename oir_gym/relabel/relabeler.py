"""The HindsightRelabeler: trajectories in, grounded relabeled instructions out (paper section 4.1).

Pipeline for a batch of trajectories:

1. **Key and cache.** Each trajectory's behaviour key (:func:`~oir_gym.relabel.segments.behaviour_key`:
   the ordered non-idle events, without timing) is looked up in an LRU cache of LLM answers;
   trajectories with the same key in one batch share one prompt. Idle trajectories (nothing but
   moving/waiting) are not sent to the LLM by default (``skip_idle``): nothing happened to relabel.
2. **Generate.** One batched ``generate`` call on the LLM backend for the remaining prompts,
   with the template's JSON schema for constrained decoding.
3. **Parse and filter.** :func:`~oir_gym.relabel.parse.parse_candidates`; rule instructions are
   merged in (LLM candidates first); exact and embedding near-duplicates are dropped.
4. **Ground** (:mod:`oir_gym.grounding`). Each candidate is encoded once and compared with the
   caption vocabulary (:func:`oir_gym.reward.event_similarity`). With ``grounding="cosine"`` (the
   paper's rule) ``first_step`` is its first step with a caption above ``delta``; a two-event rule
   instruction ("A then B", "sleep and wake up") that would be paid where its final event did not
   happen is dropped (``dropped["premature"]``): its wording matches the first event's captions,
   so it would teach only the first half. With ``grounding="bound"`` it is bound to the event(s)
   of this trajectory it names (:func:`~oir_gym.grounding.bind`: the best event that happened,
   at least ``bind_threshold`` similar; "A then B" to an ordered pair; rule instructions to their
   exact events), and pays exactly there; a candidate that binds to nothing is dropped
   (``dropped["unbound"]``). Each candidate carries its embedding and grounding rows.
5. **Select.** Up to ``k`` candidates per trajectory: grounded ones first (in source order: LLM,
   then rules), then, if ``keep_ungrounded``, ungrounded ones. Ungrounded candidates never pay
   off in the buffer, so they are only used to fill up to ``k`` (the paper keeps all K LLM
   answers); they are always counted in :meth:`HindsightRelabeler.stats`.

Failure policy: nothing is ever raised into the training loop. When the LLM backend raises,
exceeds ``llm_timeout`` or answers nothing usable, the error is counted and
(``fallback="rules"``) the rule instructions answer instead. Native backends (``llama_cpp``,
``transformers``, ``vllm``, ``"module:Class"`` specs) run in a child process
(:mod:`oir_gym.relabel.worker`): a crash or a hang of the LLM library ends only the child, which
is restarted with backoff. After ``warn_after`` failed LLM calls in a row one console warning
names the cause and the remedy; :meth:`HindsightRelabeler.check_llm` makes one tiny real call
for a clear error before training starts.

Modes: :meth:`~HindsightRelabeler.relabel` (or calling the object) is synchronous, the paper's
lock-step behaviour. :meth:`~HindsightRelabeler.submit` / :meth:`~HindsightRelabeler.collect` run
the same pipeline on a background thread with a bounded queue; when the queue is full,
``on_full`` decides: ``"rules"`` answers at once with rule instructions only (cheap, no LLM),
``"skip"`` drops the new batch, ``"replace"`` drops the oldest queued one (fresh rollouts win),
``"block"`` waits for room; drops are counted.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from collections import Counter, deque
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from oir_gym.captions import VOCAB
from oir_gym.relabel.backends import BackendTimeout, LLMBackend
from oir_gym.relabel.config import (
    DEFAULT_MAX_PROMPT_TOKENS, CacheSettings, GroundingSettings, LLMSettings, PromptSettings, RelabelerConfig,
    SelectionSettings,
)
from oir_gym.relabel.composite import CompositeBackend, Proposal
from oir_gym.relabel.rules import RuleBackend
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.oracle import check_oracle
from oir_gym.relabel.pipeline import Answers, ground, merge_rules, plan_prompts, read_answers, select
from oir_gym.relabel.stats import RelabelStats
from oir_gym.relabel.prompts import PromptTemplate, load_template
from oir_gym.relabel.tokens import backend_token_count
from oir_gym.relabel.results import RelabelResult
from oir_gym.relabel.segments import behaviour_key
from oir_gym.relabel.llm.build import build_llm, probe
from oir_gym.relabel.llm.caller import OffThreadCaller
from oir_gym.relabel.llm.child import ChildConfig, ChildProcessBackend, llm_process_stats
from oir_gym.relabel.llm.health import LLMHealth
from oir_gym.relabel.llm.spec import BackendSpec as LLMSpec, LLMBusy, backend_identity, close_llm
from oir_gym.trajectory import Trajectory
from oir_gym.validation import ArgumentTypeError, check_bool, check_instance, check_real, show

#: Default longest wait (seconds) of :meth:`HindsightRelabeler.close` for the background worker to
#: finish the queued batches; then queued batches are dropped and an LLM the relabeler started is
#: stopped (see :meth:`~HindsightRelabeler.close` for the whole bound).
CLOSE_TIMEOUT = 10.0


_UNSET: Any = object()  # no positional argument: tells the config form from the keyword form

BackendArg = Union[str, LLMSpec, LLMBackend, CompositeBackend, None]


class HindsightRelabeler:
    """LLM hindsight instruction relabeling as a library component.

    Args:
        config: every setting (:class:`~oir_gym.relabel.config.RelabelerConfig`; validated here).
            Default: ``RelabelerConfig()``, the offline Gemma 3 270M with rules beside it.
        llm: an LLM backend object to use as is, in this process (an
            :class:`~oir_gym.relabel.backends.LLMBackend`, or a
            :class:`~oir_gym.relabel.composite.CompositeBackend`), instead of building
            ``config.llm.backend``; it belongs to the caller (not closed here).
        encoder: sentence encoder with ``encode(list[str]) -> [n, D]`` unit-norm (default: the
            shared all-MiniLM-L6-v2 of :func:`oir_gym.encoder.get_encoder`, loaded on first use).
        rules: the rule instructions (:class:`~oir_gym.relabel.rules.RuleBackend`; default one).

    The keyword form of earlier releases (``HindsightRelabeler(backend="rules", k=4, delta=0.9,
    ...)``) still works for one release and emits a ``DeprecationWarning``; its keywords map onto
    the config as :func:`legacy_config` shows.
    """

    def __init__(self, config: Union[RelabelerConfig, BackendArg] = _UNSET, *args: Any, llm: Any = None,
                 encoder: Any = None, rules: Optional[RuleBackend] = None, **legacy: Any) -> None:
        if not isinstance(config, RelabelerConfig):
            if config is _UNSET and not args and not legacy:
                config = RelabelerConfig()
            else:
                warnings.warn("HindsightRelabeler(backend, k=..., ...) is deprecated: pass a RelabelerConfig "
                              "(oir_gym.relabel.config), or use HindsightRelabeler.rules(k=...)",
                              DeprecationWarning, stacklevel=2)
                oracle = legacy.pop("oracle", None)
                config, obj = legacy_config(*(() if config is _UNSET else (config,)), *args, **legacy)
                llm = obj if llm is None else llm
                if oracle is not None:  # the keyword form's oracle=: the rule backend's variant
                    if rules is not None:
                        raise ValueError("give the oracle variant either as oracle= or in "
                                         "rules=RuleBackend(oracle=...), not both")
                    rules = RuleBackend(oracle=oracle)
        elif args or legacy:
            raise TypeError(f"HindsightRelabeler(config, ...) takes only llm=, encoder=, rules= after the config; "
                            f"got {len(args)} more positional and {sorted(legacy)} (set them on the config)")
        self.config = cfg = config.validate()
        _check_objects(llm=llm, encoder=encoder, rules=rules)
        p, lc, cc, g, sel = cfg.prompt, cfg.llm, cfg.cache, cfg.grounding, cfg.selection
        self.grounding = g.mode
        self.bind_threshold = float(g.bind_threshold)
        self.k = int(sel.k)
        self.template = p.template if isinstance(p.template, PromptTemplate) else load_template(str(p.template))
        self.schema = self.template.schema(self.k)
        self.delta = float(g.delta)
        self.samples = int(lc.samples)
        self.keep_ungrounded = sel.keep_ungrounded
        self.dedup_threshold = float(sel.dedup_threshold)
        self.fallback = lc.fallback
        self.llm_timeout = lc.timeout
        self.skip_idle = p.skip_idle
        self.max_prompt_tokens = p.max_prompt_tokens
        self.filter = sel.candidate_filter or CandidateFilter()
        self.on_full = lc.on_full
        self.cache_save_every = int(cc.save_every)
        self.cache_key_mode = cc.key
        self._rules = rules or RuleBackend()
        check_oracle(getattr(self._rules, "oracle", "canonical"), g.mode)

        # a backend built here is closed here; objects passed in belong to the caller
        backend: Any = lc.backend if llm is None else llm
        self._owns_llm = llm is None and isinstance(backend, (str, LLMSpec))
        if isinstance(backend, CompositeBackend):
            self.backend = backend
        else:
            child_config = lc.child_config
            if child_config is None and lc.timeout is not None:
                child_config = ChildConfig(timeout=float(lc.timeout), per_prompt_timeout=0.0)
            built = build_llm(backend, lc.backend_kwargs, isolate=lc.isolate, config=child_config)
            self.backend = CompositeBackend(built, self._rules if (sel.use_rules or built is None) else None)
        self.use_rules = self.backend.rules is not None
        self.backend_name = (backend if isinstance(backend, str) else backend.name if isinstance(backend, LLMSpec)
                             else type(self.backend.llm or self._rules).__name__)
        self.health = LLMHealth("relabeler", lc.warn_after, fallback="relabeling with rules meanwhile"
                                if lc.fallback == "rules" else "those trajectories get no instructions")

        self._encoder = encoder
        self._phrase_emb: Optional[np.ndarray] = None
        self._enc_lock = threading.Lock()
        self.cache = LRUCache(cc.size, cc.path)
        self._caller = OffThreadCaller("oir-llm")
        self._stats = RelabelStats()
        self._id_lock = threading.Lock()
        self._next_id = 0

        # async state
        self._queue: "queue.Queue[Optional[tuple[list[Trajectory], list[int]]]]" = queue.Queue(max(1, lc.queue_size))
        self._done: deque[RelabelResult] = deque()
        self._done_cv = threading.Condition()
        self._pending = 0
        self._worker: Optional[threading.Thread] = None
        self._closed = False

    @classmethod
    def rules(cls, k: int = 4, *, encoder: Any = None, **settings: Any) -> "HindsightRelabeler":
        """A rule relabeler (no LLM, no cache) keeping ``k`` candidates per trajectory.

        ``settings``: ``delta``, ``grounding``, ``bind_threshold``, ``keep_ungrounded``,
        ``dedup_threshold`` (the grounding and selection fields that matter without an LLM), and
        ``oracle`` (the rule backend's variant, :mod:`oir_gym.relabel.oracle`; ``"diverse"`` and
        ``"noisy"`` need ``grounding="bound"``).
        """
        oracle = settings.pop("oracle", None)
        cfg = RelabelerConfig()
        cfg.llm.backend = "rules"
        cfg.cache.size = 0
        cfg.selection.k = k
        for name, value in settings.items():
            part = {"delta": cfg.grounding, "bind_threshold": cfg.grounding, "grounding": cfg.grounding,
                    "keep_ungrounded": cfg.selection, "dedup_threshold": cfg.selection}.get(name)
            if part is None:
                raise TypeError(f"HindsightRelabeler.rules() got an unexpected setting {name!r}")
            setattr(part, "mode" if name == "grounding" else name, value)
        return cls(cfg, encoder=encoder, rules=None if oracle is None else RuleBackend(oracle=oracle))

    # ------------------------------------------------------------------ helpers
    @property
    def _backend_id(self) -> str:
        return backend_identity(self.backend.llm)

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from oir_gym.encoder import get_encoder

            self._encoder = get_encoder()
        return self._encoder

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[n, dim]`` float32 embeddings of ``texts`` by the relabeler's encoder, serialised with
        its background worker (which shares the encoder): safe to call from any thread."""
        return self._encode(list(texts))

    def _phrases(self) -> np.ndarray:
        """Embeddings of the caption vocabulary (encoded once)."""
        with self._enc_lock:  # the shared encoder's string cache is not thread-safe
            if self._phrase_emb is None:
                self._phrase_emb = np.asarray(self.encoder.encode(list(VOCAB.phrases)), dtype=np.float32)
            return self._phrase_emb

    def _encode(self, texts: list[str]) -> np.ndarray:
        phrases = self._phrases()
        with self._enc_lock:
            if not texts:
                return np.zeros((0, phrases.shape[1]), np.float32)
            return np.asarray(self.encoder.encode(list(texts)), dtype=np.float32)

    def _take_ids(self, n: int) -> list[int]:
        with self._id_lock:
            ids = list(range(self._next_id, self._next_id + n))
            self._next_id += n
        return ids

    def cache_key(self, traj: Trajectory) -> str:
        """Cache key: backend, template, k, key mode and the normalised behaviour of the trajectory."""
        return (f"{self._backend_id}|{self.template.name}|k={self.k}|{self.cache_key_mode}|"
                f"{behaviour_key(traj, self.cache_key_mode)}")

    def render_prompt(self, traj: Trajectory) -> str:
        """The prompt this relabeler would send for ``traj`` (compacted to ``max_prompt_tokens``)."""
        return self._render(traj)[0]

    def _render(self, traj: Trajectory) -> tuple[str, int, int]:
        """``(prompt, compaction level, prompt tokens)``: each text counted once, in the backend's
        own tokens where it can count them."""
        counts: dict[str, int] = {}

        def count(text: str) -> int:
            if text not in counts:
                counts[text] = self._count_tokens(text)
            return counts[text]

        prompt, level = self.template.render_fit(traj, self.k, self.max_prompt_tokens, count)
        return prompt, level, count(prompt)

    def _count_tokens(self, prompt: str) -> int:
        n, self._stats.token_method = backend_token_count(self.backend.llm, prompt)
        return n

    def _propose(self, trajs: list[Trajectory], prompts: Optional[list[Optional[str]]]) -> list[Proposal]:
        llm = self.backend.llm
        # a child process keeps its own deadline (it is killed past it): no thread needed
        if self.llm_timeout is None or llm is None or prompts is None or isinstance(llm, ChildProcessBackend):
            return self.backend.propose(trajs, prompts, self.samples, self.schema)
        try:
            return self._caller.call(self.backend.propose, trajs, prompts, self.samples, self.schema,
                                     timeout=self.llm_timeout)
        except BackendTimeout as e:
            # the call keeps running on its thread; its answer is discarded
            err = (f"LLMBusy: {e}" if isinstance(e, LLMBusy)
                   else f"{BackendTimeout.__name__}: LLM call exceeded llm_timeout={self.llm_timeout}s")
            props = [Proposal(rules=self._rules.instructions(t) if self.backend.rules else []) for t in trajs]
            for p, pr in zip(props, prompts):
                p.error = err if pr is not None else None
            return props

    # ------------------------------------------------------------------ sync API
    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """Relabel a batch synchronously (lock-step, as in the paper).

        Never raises for LLM faults (see the failure policy); an unexpected internal error is
        warned about, counted under ``errors_by_type`` and answered with empty results.
        """
        trajs = _check_trajectories(trajectories)
        ids = self._take_ids(len(trajs))
        try:
            return self._process(trajs, ids, llm_allowed=True)
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            warnings.warn(f"HindsightRelabeler: relabeling failed ({type(e).__name__}: {e}); "
                          "returning empty results", RuntimeWarning, stacklevel=2)
            return self._empty_results(trajs, ids, f"{type(e).__name__}: {e}")

    __call__ = relabel

    def instructions(self, trajectories: Sequence[Trajectory]) -> list[list[str]]:
        """Just the kept instruction texts per trajectory (convenience for simple loops)."""
        return [r.instructions for r in self.relabel(trajectories)]

    def _process(self, trajs: list[Trajectory], ids: list[int], llm_allowed: bool) -> list[RelabelResult]:
        """The pipeline (:mod:`oir_gym.relabel.pipeline`) over one batch, with its one LLM call."""
        use_llm = llm_allowed and self.backend.llm is not None
        lookup = self.cache.get if self.cache.capacity > 0 else (lambda key: None)
        plan = plan_prompts(trajs, use_llm=use_llm, skip_idle=self.skip_idle, key_of=self.cache_key,
                            lookup=lookup, render=self._render)
        t0 = time.perf_counter()
        props = self._propose(trajs, plan.asked)
        latency = time.perf_counter() - t0
        # close() cuts a call in flight (it stops the LLM): its failure is the shutdown, not the LLM's
        closing = self._closed
        answers = read_answers(plan, props, self.filter, closing=closing)
        for key, texts in answers.to_cache:
            self.cache.put(key, texts)
        self._report_health(answers)
        merged = merge_rules(trajs, answers, [p.rules for p in props], rules_of=self._rules.instructions,
                             use_rules=self.use_rules, fallback=self.fallback, candidate_filter=self.filter)
        grounded = ground(trajs, merged, encode=self._encode, phrase_emb=self._phrases(), mode=self.grounding,
                          delta=self.delta, bind_threshold=self.bind_threshold,
                          pair_table=getattr(self._rules, "pair_table", None),
                          rule_table=getattr(self._rules, "label_events", None))
        chosen = [select(g, k=self.k, keep_ungrounded=self.keep_ungrounded, dedup_threshold=self.dedup_threshold)
                  for g in grounded]

        s = plan.counts + answers.counts
        results, dropped = [], []
        for i, (traj, g, sel) in enumerate(zip(trajs, grounded, chosen)):
            d = answers.dropped[i] + merged.dropped[i] + g.dropped + sel.dropped
            for c in (merged.dropped[i], g.dropped, sel.dropped):  # keep reasons counted as 0 (Counter + drops them)
                for key in c:
                    d.setdefault(key, 0)
            dropped.append(d)
            res = RelabelResult(
                trajectory=traj, candidates=sel.chosen, request_id=ids[i], num_scored=len(sel.scored),
                num_grounded=len(sel.grounded), dropped=d, cache_hit=plan.cached[i] is not None,
                error=answers.errors[i], fallback=merged.fallbacks[i], prompt_tokens=plan.tokens[i],
            )
            results.append(res)
            s["candidates_scored"] += len(sel.scored)
            s["candidates_grounded"] += len(sel.grounded)
            s["candidates_kept"] += len(res.candidates)
            s["candidates_kept_grounded"] += len(res.grounded)
            s["candidates_kept_llm"] += sum(c.source == "llm" for c in res.candidates)
            s["candidates_llm"] += sum(c.source == "llm" for c in sel.scored)
            s["candidates_rules"] += sum(c.source == "rules" for c in sel.scored)
            s["fallbacks"] += merged.fallbacks[i] is not None
        share = None if closing else [bool(answers.llm[i]) and answers.errors[i] is None
                                      for i in range(len(trajs)) if plan.eligible[i]]
        self._stats.record_batch(s, dropped=dropped, errors={e for e in answers.errors if e}, share=share,
                                 prompts=sum(p is not None for p in plan.prompts), tokens=sum(plan.tokens),
                                 latency=latency)
        if self.cache.path is not None and self.cache.dirty >= self.cache_save_every:
            self.save_cache()
        return results

    def _report_health(self, answers: Answers) -> None:
        """One LLM call's outcome for :class:`LLMHealth`: healthy when any prompt got a usable answer."""
        if not answers.asked:
            return
        bad = [answers.errors[i] for i in answers.asked if answers.errors[i] is not None]
        if len(bad) < len(answers.asked):
            self.health.ok()
        else:
            self.health.failed(bad[0], permanent=getattr(self.backend.llm, "fatal", None) is not None)
        self.health.answers(len(answers.asked), len(bad), Counter(bad).most_common(1)[0][0] if bad else None)

    # ------------------------------------------------------------------ async API
    def submit(self, trajectories: Sequence[Trajectory]) -> list[int]:
        """Queue a batch for background relabeling; returns one request id per trajectory.

        Never blocks unless ``on_full="block"``. When the queue is full: ``"rules"`` relabels the
        batch right away with rule instructions only (results appear in the next :meth:`collect`,
        marked ``fallback="overflow"``); ``"skip"`` drops the *new* batch (counted as
        ``overflow_skipped``); ``"replace"`` drops the *oldest* queued batch instead, so the LLM
        always works on the freshest rollouts (counted as ``overflow_replaced``); ``"block"``
        waits for room. Dropped batches produce no results.
        """
        if self._closed:
            raise RuntimeError("relabeler is closed")
        trajs = _check_trajectories(trajectories)
        ids = self._take_ids(len(trajs))
        self._stats.add(submitted=len(trajs))
        self._ensure_worker()
        with self._done_cv:
            self._pending += len(trajs)
        if self.on_full == "replace":
            self._put_replacing((trajs, ids))
            return ids
        try:
            if self.on_full == "block":
                self._queue.put((trajs, ids))
            else:
                self._queue.put_nowait((trajs, ids))
        except queue.Full:
            self._stats.add({f"overflow_{self.on_full}": len(trajs)})
            if self.on_full == "rules":
                try:
                    res = self._process(trajs, ids, llm_allowed=False)
                    for r in res:
                        r.fallback = "overflow"
                except Exception as e:  # noqa: BLE001
                    res = self._empty_results(trajs, ids, f"{type(e).__name__}: {e}")
                self._deliver(res, len(trajs))
            else:
                with self._done_cv:
                    self._pending -= len(trajs)
                    self._done_cv.notify_all()
        return ids

    def _put_replacing(self, job: tuple[list[Trajectory], list[int]]) -> None:
        """Enqueue ``job``, discarding the oldest queued batches while the queue is full."""
        while True:
            try:
                self._queue.put_nowait(job)
                return
            except queue.Full:
                try:
                    old_trajs, _ = self._queue.get_nowait()
                except queue.Empty:  # the worker took one meanwhile: try again
                    continue
                self._stats.add(overflow_replace=len(old_trajs))
                with self._done_cv:
                    self._pending -= len(old_trajs)
                    self._done_cv.notify_all()

    def collect(self, block: bool = False, timeout: Optional[float] = None) -> list[RelabelResult]:
        """Finished results so far (any order of batches, each batch in submission order).

        Args:
            block: wait until every submitted trajectory is finished (or ``timeout`` passes).
            timeout: seconds to wait when ``block`` is True (``None``: no limit).
        """
        block = check_bool("block", block)
        timeout = check_real("timeout", timeout, low=0.0, none_ok=True)
        with self._done_cv:
            if block:
                self._done_cv.wait_for(lambda: self._pending == 0, timeout=timeout)
            out = list(self._done)
            self._done.clear()
        return out

    @property
    def pending(self) -> int:
        """Submitted trajectories whose results are not yet ready."""
        return self._pending

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._work, name="oir-relabeler", daemon=True)
            self._worker.start()

    def _empty_results(self, trajs: list[Trajectory], ids: list[int], err: str) -> list[RelabelResult]:
        self._stats.add(errors=len(trajs))
        self._stats.count_error(err)
        return [RelabelResult(trajectory=t, candidates=[], request_id=i, error=err) for t, i in zip(trajs, ids)]

    def _deliver(self, results: list[RelabelResult], n: int) -> None:
        with self._done_cv:
            self._done.extend(results)
            self._pending -= n
            self._done_cv.notify_all()
        self._stats.add(completed=len(results))

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            trajs, ids = job
            try:
                res = self._process(trajs, ids, llm_allowed=True)
            except Exception as e:  # noqa: BLE001 - never kill the worker
                res = self._empty_results(trajs, ids, f"{type(e).__name__}: {e}")
            self._deliver(res, len(trajs))

    # ------------------------------------------------------------------ stats and lifecycle
    def stats(self) -> dict[str, Any]:
        """The run's counters: one flat dict with the keys of :data:`oir_gym.relabel.stats.STAT_KEYS`
        (each documented there); ``dropped``, ``errors_by_type``, ``error_examples`` and
        ``child_deaths`` are dicts. Safe to call from any thread."""
        return self._stats.snapshot(cache_entries=len(self.cache), pending=self._pending, health=self.health.stats(),
                                    child=llm_process_stats(self.backend.llm))

    def save_cache(self) -> None:
        """Write the cache to ``cache_path`` (no-op without one)."""
        try:
            self.cache.save()
        except OSError as e:  # a full disk must not stop training: counted, warned once, not an LLM error
            first = self._stats.increment("cache_save_failures") == 1
            if first:
                warnings.warn(f"could not save the relabel cache to {self.cache.path} ({type(e).__name__}: {e}); "
                              "training goes on with the cache in memory (stats()['cache_save_failures'])",
                              RuntimeWarning, stacklevel=2)

    def check_llm(self, timeout: Optional[float] = None) -> Optional[str]:
        """One tiny real LLM call (a child process first starts and loads its model).

        Returns the completion (``None`` without an LLM) within ``timeout`` seconds. Default: for
        an LLM in a child process :data:`~oir_gym.relabel.worker.CHILD_CHECK_TIMEOUT` (start, model
        load and one call); for one in this process (``openai``) ``llm_timeout`` when set, else
        :data:`~oir_gym.relabel.worker.CHECK_TIMEOUT`. Raises
        :class:`~oir_gym.relabel.worker.LLMCheckError` (a ``RuntimeError``) with a one-line cause
        and remedy when the backend cannot be built, crashes, hangs, passes the timeout, cannot be
        reached, or is not an LLM server. Call it before training when the run needs the LLM.
        """
        llm = self.backend.llm
        if llm is None:
            return None
        if timeout is None and self.llm_timeout is not None and not isinstance(llm, ChildProcessBackend):
            timeout = self.llm_timeout
        return probe(llm, timeout)

    def close(self, timeout: Optional[float] = CLOSE_TIMEOUT) -> None:
        """Stop the worker, stop an LLM this relabeler started, save the cache. Idempotent.

        The worker first finishes the queued batches, for up to ``timeout`` seconds in all
        (``None``: as long as they take); batches still queued then are dropped (no results;
        counted in ``closed_in_flight``). Then an LLM this relabeler built is stopped, which fails
        a call in flight at once: an HTTP request is aborted; a child process is asked to stop (or,
        inside a call, terminated) and, if it still does not end (a hung or stopped child),
        killed, each step waiting at most ``ChildConfig.grace``. So with a ``timeout``, ``close``
        returns within about ``timeout + 3 * grace + 1`` seconds whatever the LLM does.
        """
        if self._closed:
            return
        self._closed = True
        end = None if timeout is None else time.monotonic() + timeout
        if self._worker is not None and self._worker.is_alive():
            self._stop_worker(end)
            self._worker.join(None if end is None else max(0.0, end - time.monotonic()))
        self._caller.close(0)
        if self._owns_llm:
            close_llm(self.backend.llm)  # a call still running fails now, so the worker ends
        if self._worker is not None and self._worker.is_alive():
            self._worker.join(1.0)
        self.save_cache()

    def _stop_worker(self, end: Optional[float]) -> None:
        """Queue the worker's stop marker behind the queued batches. When there is no room by
        ``end`` (the worker is stuck in an LLM call), drop queued batches to make room: a full
        queue never holds up :meth:`close`."""
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                self._queue.put(None, timeout=left)
                return
            except queue.Full:
                pass
            try:
                job = self._queue.get_nowait()
            except queue.Empty:  # the worker took one meanwhile: there is room now
                continue
            if job is None:
                continue
            trajs, _ = job
            self._stats.add(closed_in_flight=len(trajs))
            with self._done_cv:
                self._pending -= len(trajs)
                self._done_cv.notify_all()

    def __enter__(self) -> "HindsightRelabeler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"HindsightRelabeler(backend={self.backend!r}, k={self.k}, template={self.template.name!r}, "
                f"use_rules={self.use_rules}, delta={self.delta})")


def legacy_config(
    backend: BackendArg = "transformers",
    k: int = 4,
    template: Union[str, PromptTemplate] = "segments",
    use_rules: bool = True,
    delta: float = 0.9,
    cache_size: int = 4096,
    cache_path: Optional[str | os.PathLike] = None,
    *,
    samples: int = 1,
    keep_ungrounded: bool = True,
    dedup_threshold: float = 0.95,
    fallback: str = "rules",
    llm_timeout: Optional[float] = None,
    skip_idle: bool = True,
    candidate_filter: Optional[CandidateFilter] = None,
    queue_size: int = 8,
    on_full: str = "rules",
    cache_save_every: int = 256,
    cache_key: str = "behaviour",
    backend_kwargs: Optional[dict] = None,
    isolate: Optional[bool] = None,
    child_config: Optional[ChildConfig] = None,
    warn_after: int = 3,
    grounding: str = "cosine",
    bind_threshold: float = 0.5,
    max_prompt_tokens: Optional[int] = DEFAULT_MAX_PROMPT_TOKENS,
) -> tuple[RelabelerConfig, Any]:
    """The deprecated keyword constructor's arguments as ``(RelabelerConfig, backend object or None)``
    (``encoder`` and ``rules`` are keywords of :class:`HindsightRelabeler` in both forms)."""
    obj = None if isinstance(backend, (str, LLMSpec)) or backend is None else backend
    if obj is not None and not (isinstance(obj, CompositeBackend) or callable(getattr(obj, "generate", None))):
        raise ArgumentTypeError(f"backend={show(backend)} must be a backend name such as 'rules' or 'transformers', "
                                "'package.module:ClassName', a BackendSpec, or an object with a generate() method")
    cfg = RelabelerConfig(
        prompt=PromptSettings(template=template, max_prompt_tokens=max_prompt_tokens, skip_idle=skip_idle),
        llm=LLMSettings(backend=None if obj is not None else backend, backend_kwargs=backend_kwargs,
                        isolate=isolate, child_config=child_config, timeout=llm_timeout, samples=samples,
                        fallback=fallback, warn_after=warn_after, queue_size=queue_size, on_full=on_full),
        cache=CacheSettings(size=cache_size, path=cache_path, key=cache_key, save_every=cache_save_every),
        grounding=GroundingSettings(mode=grounding, delta=delta, bind_threshold=bind_threshold),
        selection=SelectionSettings(k=k, use_rules=use_rules, keep_ungrounded=keep_ungrounded,
                                    dedup_threshold=dedup_threshold, candidate_filter=candidate_filter),
    )
    return cfg, obj


def _check_trajectories(trajectories: Any) -> list[Trajectory]:
    """The batch as a list of :class:`Trajectory` (anything else is a caller's mistake, not an LLM fault:
    it raises here instead of becoming a warning and empty results)."""
    if isinstance(trajectories, (Trajectory, str, bytes, dict)) or not isinstance(trajectories, Iterable):
        raise ArgumentTypeError(f"trajectories={show(trajectories)} must be a list of oir_gym.Trajectory "
                                f"(e.g. TrajectoryRecorder(envs).trajectories()), got {type(trajectories).__name__}")
    trajs = list(trajectories)
    for i, t in enumerate(trajs):
        if not isinstance(t, Trajectory):
            raise ArgumentTypeError(f"trajectories[{i}]={show(t)} must be an oir_gym.Trajectory, got {type(t).__name__}")
    return trajs


def _check_objects(*, llm: Any, encoder: Any, rules: Any) -> None:
    """The object arguments of the constructor: the right kinds, or an error naming the argument."""
    if not (llm is None or isinstance(llm, CompositeBackend) or callable(getattr(llm, "generate", None))):
        raise ArgumentTypeError(f"llm={show(llm)} must be an object with a generate() method (the backend "
                                "protocol), a CompositeBackend, or None (build config.llm.backend)")
    if encoder is not None and not callable(getattr(encoder, "encode", None)):
        raise ArgumentTypeError(f"encoder={show(encoder)} must have an encode(list[str]) -> [n, dim] array method "
                                "(e.g. oir_gym.get_encoder()) or be None")
    check_instance("rules", rules, RuleBackend, none_ok=True)
