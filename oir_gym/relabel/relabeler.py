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
from typing import Any, Optional, Sequence, Union

import numpy as np

from oir_gym.captions import NUM_EVENTS, VOCAB
from oir_gym.relabel.backends import BackendTimeout, LLMBackend
from oir_gym.relabel.config import (
    DEFAULT_MAX_PROMPT_TOKENS, CacheSettings, GroundingSettings, LLMSettings, PromptSettings, RelabelerConfig,
    SelectionSettings,
)
from oir_gym.relabel.composite import CompositeBackend, Proposal
from oir_gym.relabel.rules import RuleBackend, rule_events, rule_final_event
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.filters import CandidateFilter, near_duplicate_mask
from oir_gym.relabel.parse import NOTE_REASONS, parse_candidates
from oir_gym.relabel.prompts import PromptTemplate, load_template
from oir_gym.relabel.tokens import backend_token_count
from oir_gym.relabel.results import Candidate, RelabelResult
from oir_gym.relabel.segments import behaviour_key, is_idle
from oir_gym.relabel.worker import (
    BackendSpec as LLMSpec, ChildConfig, ChildProcessBackend, LLMBusy, LLMHealth, OffThreadCaller,
    backend_identity, build_llm, close_llm, llm_process_stats, probe,
)
from oir_gym.grounding import (
    Binding, bind, bind_ordered, episode_starts_from_dones, first_paid_step, indicator_row,
    no_precondition, split_ordered,
)
from oir_gym.reward import event_similarity, match_steps
from oir_gym.trajectory import Trajectory

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
                config, obj = legacy_config(*(() if config is _UNSET else (config,)), *args, **legacy)
                llm = obj if llm is None else llm
        elif args or legacy:
            raise TypeError(f"HindsightRelabeler(config, ...) takes only llm=, encoder=, rules= after the config; "
                            f"got {len(args)} more positional and {sorted(legacy)} (set them on the config)")
        self.config = cfg = config.validate()
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
        self._share: deque = deque(maxlen=64)  # recent LLM-eligible trajectories: did the LLM answer?

        self._stats_lock = threading.Lock()
        self._s: Counter = Counter()
        self._dropped: Counter = Counter()
        self._errors: Counter = Counter()
        self._error_examples: dict[str, str] = {}  # error type -> its first message
        self._latency_total = 0.0
        self._token_method = "none"
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
        ``dedup_threshold`` (the grounding and selection fields that matter without an LLM).
        """
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
        return cls(cfg, encoder=encoder)

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

    def _encode(self, texts: list[str]) -> np.ndarray:
        with self._enc_lock:  # the shared encoder's string cache is not thread-safe
            if self._phrase_emb is None:
                self._phrase_emb = np.asarray(self.encoder.encode(list(VOCAB.phrases)), dtype=np.float32)
            if not texts:
                return np.zeros((0, self._phrase_emb.shape[1]), np.float32)
            return np.asarray(self.encoder.encode(list(texts)), dtype=np.float32)

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
        n, self._token_method = backend_token_count(self.backend.llm, prompt)
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

    def _premature(self, events: np.ndarray, text: str, sim: np.ndarray) -> bool:
        """True for a two-event rule instruction that the reward pays where its final event did not
        happen (the wording matches its first event's captions): it would teach the first half."""
        final = rule_final_event(text, getattr(self._rules, "pair_table", None))
        if final is None:
            return False
        paid = match_steps(events, sim, self.delta)
        return bool((paid & ~np.asarray(events[:, final], bool)).any())

    def _bind(self, text: str, src: str, sim: np.ndarray, traj: Trajectory, starts: np.ndarray,
              half_sims: dict[str, np.ndarray]) -> Optional[Binding]:
        """The event(s) of ``traj`` that candidate ``text`` is bound to (``grounding="bound"``)."""
        if src == "rules":
            ev = rule_events(text, getattr(self._rules, "pair_table", None))
            if ev is None:
                return None
            pre, final = ev
            step = first_paid_step(traj.events, indicator_row(final, NUM_EVENTS), indicator_row(pre, NUM_EVENTS),
                                   starts, self.delta)
            return Binding(final=final, pre=pre, step=step) if step >= 0 else None
        halves = split_ordered(text)
        if halves is not None:
            return bind_ordered(half_sims[halves[0]], half_sims[halves[1]], traj.events, starts,
                                threshold=self.bind_threshold)
        return bind(sim, traj.events, threshold=self.bind_threshold)

    # ------------------------------------------------------------------ sync API
    def relabel(self, trajectories: Sequence[Trajectory]) -> list[RelabelResult]:
        """Relabel a batch synchronously (lock-step, as in the paper).

        Never raises for LLM faults (see the failure policy); an unexpected internal error is
        warned about, counted under ``errors_by_type`` and answered with empty results.
        """
        trajs = list(trajectories)
        with self._stats_lock:
            ids = list(range(self._next_id, self._next_id + len(trajs)))
            self._next_id += len(trajs)
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
        n = len(trajs)
        use_llm = llm_allowed and self.backend.llm is not None
        # cache keys only matter for LLM answers (rules are cheaper than the key itself)
        keys: list = [self.cache_key(t) for t in trajs] if use_llm else [None] * n
        cached: list[Optional[list[str]]] = [None] * n
        prompts: list[Optional[str]] = [None] * n
        owner: dict[str, int] = {}  # key -> index of the trajectory that carries the prompt
        tokens = [0] * n
        s = Counter(trajectories=n)
        if use_llm:
            for i, (t, key) in enumerate(zip(trajs, keys)):
                if self.skip_idle and is_idle(t):
                    s["skipped_idle"] += 1
                    continue
                hit = self.cache.get(key) if self.cache.capacity > 0 else None
                if hit is not None:
                    cached[i] = hit
                    s["cache_hits"] += 1
                elif key in owner:
                    s["batch_dedup"] += 1  # same behaviour twice in one batch: one prompt
                else:
                    owner[key] = i
                    prompts[i], level, tokens[i] = self._render(t)
                    s["cache_misses"] += 1
                    s["prompts_compacted"] += level > 0
        else:
            s["rules_only"] += n

        t0 = time.perf_counter()
        props = self._propose(trajs, prompts if any(p is not None for p in prompts) else None)
        latency = time.perf_counter() - t0
        n_prompts = sum(p is not None for p in prompts)
        # close() cuts a call in flight (it stops the LLM): its failure is the shutdown, not the LLM's
        closing = self._closed
        if closing:
            for i in range(n):
                if prompts[i] is not None and props[i].error is not None:
                    s["closed_in_flight"] += 1
                    prompts[i] = None  # as if never asked: no error, no health change, no cache entry

        # parse fresh answers; cache them per key
        llm_cands: list[list[str]] = [[] for _ in range(n)]
        dropped = [Counter() for _ in range(n)]
        errors: list[Optional[str]] = [None] * n
        fresh: dict[str, tuple[list[str], Counter, Optional[str]]] = {}
        for i in range(n):
            if prompts[i] is None:
                continue
            err = props[i].error
            texts: list[str] = []
            reasons: Counter = Counter()
            if err is None:
                for raw in props[i].llm_raw:
                    c, r = parse_candidates(raw, self.filter)
                    texts.extend(c)
                    reasons += r
                texts = list(dict.fromkeys(texts))
                if texts:
                    self.cache.put(keys[i], texts)
                else:  # garbage, or only filtered words: a failed answer (not cached: ask again)
                    why = ", ".join(f"{k} {v}" for k, v in reasons.most_common(3)) or "empty"
                    err = f"UnusableAnswer: nothing usable in the LLM's answer ({why})"
            fresh[keys[i]] = (texts, reasons, err)
        for i in range(n):
            if cached[i] is not None:
                llm_cands[i] = cached[i]
            elif keys[i] in fresh and use_llm and not (self.skip_idle and is_idle(trajs[i])):
                texts, reasons, err = fresh[keys[i]]
                llm_cands[i] = texts
                errors[i] = err
                if prompts[i] is not None:  # count parse drops once per prompt
                    dropped[i] += reasons
            if errors[i] is not None:
                s["errors"] += 1
        eligible = [i for i in range(n) if use_llm and not (self.skip_idle and is_idle(trajs[i]))]
        asked = [i for i in range(n) if prompts[i] is not None]
        if asked:  # one LLM call: healthy when any prompt got a usable answer
            bad = [errors[i] for i in asked if errors[i] is not None]
            if len(bad) < len(asked):
                self.health.ok()
            else:
                self.health.failed(bad[0], permanent=getattr(self.backend.llm, "fatal", None) is not None)
            self.health.answers(len(asked), len(bad), Counter(bad).most_common(1)[0][0] if bad else None)

        # merge with rules, filter, de-duplicate
        merged: list[list[tuple[str, str]]] = []
        fallbacks: list[Optional[str]] = [None] * n
        for i in range(n):
            items = [(c, "llm") for c in llm_cands[i]]
            rules = props[i].rules
            if errors[i] is not None and self.fallback == "rules" and not rules:
                rules = self._rules.instructions(trajs[i])
            if errors[i] is not None and rules and self.fallback == "rules":
                fallbacks[i] = "rules"
            if rules and (self.use_rules or fallbacks[i]):
                kept, r = self.filter.filter(rules)
                dropped[i] += r
                items += [(c, "rules") for c in kept]
            seen: set[str] = set()
            uniq = []
            for text, src in items:
                if text in seen:
                    dropped[i]["duplicate"] += 1
                    continue
                seen.add(text)
                uniq.append((text, src))
            merged.append(uniq)

        # ground every candidate (oir_gym.grounding): cosine rows, or bound to this trajectory's events
        all_texts = list(dict.fromkeys(t for items in merged for t, _ in items))
        bound = self.grounding == "bound"
        halves = [h for t in all_texts for h in (split_ordered(t) or ())] if bound else []
        enc_texts = all_texts + [h for h in dict.fromkeys(halves) if h not in set(all_texts)]
        emb_all = self._encode(enc_texts)
        row = {t: j for j, t in enumerate(enc_texts)}
        sim_all = (
            np.asarray(event_similarity(emb_all, self._phrase_emb, VOCAB.phrase_event, NUM_EVENTS))
            if len(enc_texts) else np.zeros((0, NUM_EVENTS), np.float32)
        )
        half_sims = {h: sim_all[row[h]] for h in halves}
        emb = emb_all[: len(all_texts)]
        no_pre = no_precondition(NUM_EVENTS)
        results = []
        for i in range(n):
            starts = episode_starts_from_dones(trajs[i].dones)
            # Checks that remove a candidate run before the near-duplicate pass, or a removed
            # wording could shadow its valid reverse ("A then B" ~ "B then A"): bound mode binds
            # every candidate here (unbound: dropped), cosine mode drops premature rule compounds.
            bindings: dict[str, Binding] = {}
            if bound:
                for t, src in merged[i]:
                    b = self._bind(t, src, sim_all[row[t]], trajs[i], starts, half_sims)
                    if b is not None:
                        bindings[t] = b
                items = [(t, src) for t, src in merged[i] if t in bindings]
                reason = "unbound"
            else:
                items = [(t, src) for t, src in merged[i]
                         if not (src == "rules" and self._premature(trajs[i].events, t, sim_all[row[t]]))]
                reason = "premature"
            if len(items) < len(merged[i]):
                dropped[i][reason] += len(merged[i]) - len(items)
            rows = [row[t] for t, _ in items]
            if len(rows) > 1:
                keep = near_duplicate_mask(emb[rows], self.dedup_threshold)
                dropped[i]["near_duplicate"] += int((~keep).sum())
                items = [it for it, kk in zip(items, keep) if kk]
                rows = [r for r, kk in zip(rows, keep) if kk]
            happened = trajs[i].events.any(axis=0)
            cands = []
            for (text, src), r in zip(items, rows):
                sim = sim_all[r]
                best = min(1.0, float(sim[happened].max())) if happened.any() else -1.0
                if bound:
                    b = bindings[text]
                    final, pre = b.rows(NUM_EVENTS)
                    cands.append(Candidate(text, src, b.step, True, best, b, emb[r], final, pre))
                else:
                    step = first_paid_step(trajs[i].events, sim, no_pre, starts, self.delta)
                    cands.append(Candidate(text, src, step, step >= 0, best, None, emb[r], sim, no_pre))
            grounded = [c for c in cands if c.grounded]
            chosen = grounded + ([c for c in cands if not c.grounded] if self.keep_ungrounded else [])
            res = RelabelResult(
                trajectory=trajs[i], candidates=chosen[: self.k], request_id=ids[i], num_scored=len(cands),
                num_grounded=len(grounded), dropped=dropped[i], cache_hit=cached[i] is not None,
                error=errors[i], fallback=fallbacks[i], prompt_tokens=tokens[i],
            )
            results.append(res)
            s["candidates_scored"] += len(cands)
            s["candidates_grounded"] += len(grounded)
            s["candidates_kept"] += len(res.candidates)
            s["candidates_kept_grounded"] += len(res.grounded)
            s["candidates_llm"] += sum(c.source == "llm" for c in cands)
            s["candidates_rules"] += sum(c.source == "rules" for c in cands)
            s["fallbacks"] += fallbacks[i] is not None

        with self._stats_lock:
            self._s.update(s)
            if not closing:
                self._share.extend(bool(llm_cands[i]) and errors[i] is None for i in eligible)
            self._s["batches"] += 1
            if n_prompts:
                self._s["llm_calls"] += 1
                self._s["prompts"] += n_prompts
                self._s["prompt_tokens"] += sum(tokens)
                self._latency_total += latency
            for d in dropped:
                self._dropped.update(d)
            for e in {errors[i] for i in range(n) if errors[i]}:
                self._count_error(e)
        if self.cache.path is not None and self.cache.dirty >= self.cache_save_every:
            self.save_cache()
        return results

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
        trajs = list(trajectories)
        with self._stats_lock:
            ids = list(range(self._next_id, self._next_id + len(trajs)))
            self._next_id += len(trajs)
            self._s["submitted"] += len(trajs)
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
            with self._stats_lock:
                self._s[f"overflow_{self.on_full}"] += len(trajs)
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
                with self._stats_lock:
                    self._s["overflow_replace"] += len(old_trajs)
                with self._done_cv:
                    self._pending -= len(old_trajs)
                    self._done_cv.notify_all()

    def collect(self, block: bool = False, timeout: Optional[float] = None) -> list[RelabelResult]:
        """Finished results so far (any order of batches, each batch in submission order).

        Args:
            block: wait until every submitted trajectory is finished (or ``timeout`` passes).
            timeout: seconds to wait when ``block`` is True (``None``: no limit).
        """
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
        with self._stats_lock:
            self._s["errors"] += len(trajs)
            self._count_error(err)
        return [RelabelResult(trajectory=t, candidates=[], request_id=i, error=err) for t, i in zip(trajs, ids)]

    def _deliver(self, results: list[RelabelResult], n: int) -> None:
        with self._done_cv:
            self._done.extend(results)
            self._pending -= n
            self._done_cv.notify_all()
        with self._stats_lock:
            self._s["completed"] += len(results)

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
    def _count_error(self, err: str) -> None:
        """Count one failed call's error by type and keep the first message of each type (under
        ``_stats_lock``): the run's record of what went wrong, not only how often."""
        kind = err.split(":", 1)[0]
        self._errors[kind] += 1
        self._error_examples.setdefault(kind, err[:300])

    def stats(self) -> dict[str, Any]:
        """Counters for the run's metrics (flat dict; ``dropped``/``errors_by_type`` are dicts).

        Keys: ``calls`` (batched LLM calls), ``prompts`` (prompts sent), ``cache_hits``,
        ``cache_misses``, ``batch_dedup`` (trajectories sharing a prompt within a batch),
        ``cache_hit_rate`` (hits + batch duplicates over lookups), ``skipped_idle``, ``errors``
        (trajectories whose LLM answer failed), ``errors_by_type`` (failed LLM calls by exception
        type), ``error_examples`` (the first message of each type), ``fallbacks``,
        ``latency_mean_s`` (per LLM call), ``latency_per_prompt_s``,
        ``prompt_tokens`` (total) and ``prompt_tokens_mean`` with ``prompt_token_method``
        (``"llama"`` exact or ``"approx-regex"``), ``prompts_compacted`` (prompts whose trajectory
        was compacted to fit ``max_prompt_tokens``), ``candidates`` (scored), ``candidates_llm``,
        ``candidates_rules``, ``candidates_kept``, ``dropped`` (by reason, including the parser's
        notes such as ``salvaged_json``), ``dropped_total`` (without the notes),
        ``grounded_fraction`` (of scored candidates), ``kept_grounded_fraction``, and for async
        mode ``submitted``, ``completed``, ``pending``, ``overflow_rules``, ``overflow_skipped``,
        ``overflow_replaced``, ``closed_in_flight`` (trajectories whose LLM call :meth:`close` cut
        short, or still queued when it stopped waiting: not counted as errors), ``cache_save_failures`` (the cache file could not be written;
        warned once).

        LLM health: ``errors`` counts unusable answers too (``errors_by_type["UnusableAnswer"]``);
        ``failed_calls`` (LLM calls with no usable answer for any prompt), ``consecutive_failures``,
        ``llm_down`` (1 while the last call failed), ``down_seconds`` (from a failed call to the
        next good one, summed), ``llm_warnings`` (console warnings printed), ``share`` (of the last
        64 trajectories the LLM was asked about or answered from the cache, the fraction that got
        LLM candidates), and for a backend in a child process ``restarts`` and ``child_deaths``
        (by cause: ``SIGILL``, ``SIGKILL``, ``hang``, ``init:<error>``...).
        """
        with self._stats_lock:
            s = dict(self._s)
            dropped = dict(self._dropped)
            errors = dict(self._errors)
            examples = dict(self._error_examples)
            lat = self._latency_total
            share = sum(self._share) / len(self._share) if self._share else 0.0
        health = self.health.stats()
        child = llm_process_stats(self.backend.llm)
        calls = s.get("llm_calls", 0)
        lookups = s.get("cache_hits", 0) + s.get("cache_misses", 0) + s.get("batch_dedup", 0)
        scored = s.get("candidates_scored", 0)
        kept = s.get("candidates_kept", 0)
        return {
            "trajectories": s.get("trajectories", 0),
            "batches": s.get("batches", 0),
            "calls": calls,
            "prompts": s.get("prompts", 0),
            "cache_hits": s.get("cache_hits", 0),
            "cache_misses": s.get("cache_misses", 0),
            "cache_hit_rate": (s.get("cache_hits", 0) + s.get("batch_dedup", 0)) / lookups if lookups else 0.0,
            "cache_entries": len(self.cache),
            "batch_dedup": s.get("batch_dedup", 0),
            "skipped_idle": s.get("skipped_idle", 0),
            "errors": s.get("errors", 0),
            "errors_by_type": errors,
            "error_examples": examples,
            "fallbacks": s.get("fallbacks", 0),
            "latency_mean_s": lat / calls if calls else 0.0,
            "latency_per_prompt_s": lat / s["prompts"] if s.get("prompts") else 0.0,
            "prompt_tokens": s.get("prompt_tokens", 0),
            "prompt_tokens_mean": s.get("prompt_tokens", 0) / s["prompts"] if s.get("prompts") else 0.0,
            "prompt_token_method": self._token_method,
            "prompts_compacted": s.get("prompts_compacted", 0),
            "closed_in_flight": s.get("closed_in_flight", 0),
            "cache_save_failures": s.get("cache_save_failures", 0),
            "candidates": scored,
            "candidates_llm": s.get("candidates_llm", 0),
            "candidates_rules": s.get("candidates_rules", 0),
            "candidates_kept": kept,
            "dropped": dropped,
            "dropped_total": sum(v for k, v in dropped.items() if k not in NOTE_REASONS),
            "grounded_fraction": s.get("candidates_grounded", 0) / scored if scored else 0.0,
            "kept_grounded_fraction": s.get("candidates_kept_grounded", 0) / kept if kept else 0.0,
            "submitted": s.get("submitted", 0),
            "completed": s.get("completed", 0),
            "pending": self._pending,
            "overflow_rules": s.get("overflow_rules", 0),
            "overflow_skipped": s.get("overflow_skip", 0),
            "overflow_replaced": s.get("overflow_replace", 0),
            "share": share,
            "failed_calls": health["failures"],
            "consecutive_failures": health["consecutive_failures"],
            "llm_down": int(health["down"]),
            "down_seconds": health["down_seconds"],
            "llm_warnings": health["warnings"],
            "restarts": child["restarts"],
            "child_deaths": child["child_deaths"],
        }

    def save_cache(self) -> None:
        """Write the cache to ``cache_path`` (no-op without one)."""
        try:
            self.cache.save()
        except OSError as e:  # a full disk must not stop training: counted, warned once, not an LLM error
            with self._stats_lock:
                first = self._s["cache_save_failures"] == 0
                self._s["cache_save_failures"] += 1
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
            with self._stats_lock:
                self._s["closed_in_flight"] += len(trajs)
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
