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

from oir_gym.captions import NUM_EVENTS, VOCAB
from oir_gym.relabel.backends import BackendTimeout, LLMBackend
from oir_gym.relabel.composite import CompositeBackend, Proposal
from oir_gym.relabel.oracle import check_oracle
from oir_gym.relabel.rules import RuleBackend, rule_events, rule_final_event
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.filters import CandidateFilter, near_duplicate_mask
from oir_gym.relabel.parse import NOTE_REASONS, parse_candidates
from oir_gym.relabel.prompts import PromptTemplate, load_template
from oir_gym.relabel.tokens import backend_token_count
from oir_gym.relabel.results import Candidate, RelabelResult
from oir_gym.relabel.segments import KEY_MODES, behaviour_key, is_idle
from oir_gym.relabel.worker import (
    BackendSpec as LLMSpec, ChildConfig, ChildProcessBackend, LLMBusy, LLMHealth, OffThreadCaller,
    backend_identity, build_llm, close_llm, llm_process_stats, probe,
)
from oir_gym.grounding import (
    GROUNDING_MODES, Binding, bind, bind_ordered, episode_starts_from_dones, first_paid_step, indicator_row,
    no_precondition, split_ordered,
)
from oir_gym.reward import event_similarity, match_steps
from oir_gym.trajectory import Trajectory
from oir_gym.validation import (
    ArgumentTypeError, check_bool, check_choice, check_instance, check_int, check_real, show,
)

#: Default longest wait (seconds) of :meth:`HindsightRelabeler.close` for the background worker to
#: finish the queued batches; then queued batches are dropped and an LLM the relabeler started is
#: stopped (see :meth:`~HindsightRelabeler.close` for the whole bound).
CLOSE_TIMEOUT = 10.0

#: Default prompt budget (tokens, template included) of :class:`HindsightRelabeler`: a longer
#: ``segments`` prompt is compacted (docs/relabeling.md, "Prompt length").
DEFAULT_MAX_PROMPT_TOKENS = 768

BackendArg = Union[str, LLMSpec, LLMBackend, CompositeBackend, None]


class HindsightRelabeler:
    """LLM hindsight instruction relabeling as a library component.

    Args:
        backend: a backend name for :func:`~oir_gym.relabel.make_backend` (``"transformers"``, the
            default: the offline Gemma 3 270M; ``"llama_cpp"``, ``"openai"``, ``"vllm"``...), ``"package.module:ClassName"``
            of any class with the backend protocol, ``"rules"`` (no LLM), a
            :class:`~oir_gym.relabel.worker.BackendSpec`, an
            :class:`~oir_gym.relabel.backends.LLMBackend` object (used as is, in this process), or a
            :class:`~oir_gym.relabel.backends.CompositeBackend`.
        k: candidates kept per trajectory (the paper's K).
        template: ``"segments"`` (default, compressed) or ``"paper"`` (Appendix C, per-timestep),
            a path to a template file, or a :class:`PromptTemplate`.
        use_rules: merge rule instructions into the LLM candidates.
        delta: grounding threshold (strict ``>``), as the env's reward.
        encoder: sentence encoder with ``encode(list[str]) -> [n, D]`` unit-norm (default: the
            shared all-MiniLM-L6-v2 of :func:`oir_gym.encoder.get_encoder`, loaded on first use).
        cache_size: LRU entries (0 disables the cache).
        cache_path: JSON file the cache is loaded from and saved to (on :meth:`close`,
            :meth:`save_cache`, and every ``cache_save_every`` new entries; after a failed save,
            counted in ``cache_save_failures``, the unsaved entries stay due and the next call tries again).
        cache_key: how trajectories are normalised into cache keys (see
            :func:`~oir_gym.relabel.segments.behaviour_key`): ``"behaviour"`` (default, ordered
            events without timing), ``"events"`` (coarser: no repeat counts) or ``"segments"``
            (exact segment text with timing). Coarser keys hit more often; a reused answer that
            does not fit a trajectory simply ends up ungrounded, since grounding is per trajectory.
        samples: completions per prompt (``n`` of the backend protocol).
        keep_ungrounded: fill up to ``k`` with ungrounded candidates after the grounded ones.
        dedup_threshold: cosine at or above which a later candidate is a near-duplicate.
        fallback: ``"rules"`` (answer with rule instructions when the LLM fails) or ``"none"``.
        llm_timeout: seconds one batched LLM call may take (``None``: no limit beyond the backend's).
            For a backend this relabeler runs in a child process it is the child's deadline (a
            call past it kills the child, which restarts); otherwise the call is abandoned on its
            thread (later calls fail at once while it still runs).
        skip_idle: do not ask the LLM about trajectories where nothing but moving/waiting happened.
        candidate_filter: text filter (forbidden words, lengths).
        queue_size: pending batches in async mode before ``on_full`` applies.
        on_full: async overflow policy: ``"rules"``, ``"skip"``, ``"replace"`` or ``"block"``
            (see :meth:`submit`).
        backend_kwargs: passed to the backend constructor when ``backend`` is a name.
        isolate: run a named backend in a child process (default: every backend but ``openai``,
            whose HTTP client does no native work; ``False`` builds it in this process, for debugging).
        child_config: the child's deadlines and restart backoff (:class:`~oir_gym.relabel.worker.ChildConfig`).
        warn_after: failed LLM calls in a row before the one console warning of an outage.
        grounding: ``"cosine"`` (the paper's rule, default) or ``"bound"`` (event-bound; see
            :mod:`oir_gym.grounding`).
        bind_threshold: loosest similarity between a candidate and an event of its trajectory that
            binds it (``grounding="bound"``).
        oracle: build the rule relabeler as this oracle variant (``"canonical"``, ``"diverse"``,
            ``"tasks"``, ``"compound"`` or ``"noisy"``; :mod:`oir_gym.relabel.oracle`), e.g.
            ``HindsightRelabeler("rules", oracle="diverse", grounding="bound")``; same as passing
            ``rules=RuleBackend(oracle=...)``. ``"diverse"`` and ``"noisy"`` need ``grounding="bound"``.
        max_prompt_tokens: token budget of one prompt, template included, counted with the
            backend's tokenizer when it has one (else approximately): a ``segments`` prompt above
            it is compacted (:func:`~oir_gym.relabel.segments.compact_text`: background events
            merged into idle runs, then idle runs left out, then one line per distinct event,
            then lines cut). Default :data:`DEFAULT_MAX_PROMPT_TOKENS`; ``None``: never compact.
            Long prompts make Gemma 3 270M ignore the trajectory (docs/relabeling.md).
    """

    def __init__(
        self,
        backend: BackendArg = "transformers",
        k: int = 4,
        template: Union[str, PromptTemplate] = "segments",
        use_rules: bool = True,
        delta: float = 0.9,
        encoder: Any = None,
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
        rules: Optional[RuleBackend] = None,
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
        oracle: Optional[str] = None,
    ) -> None:
        check_choice("grounding", grounding, GROUNDING_MODES)
        bind_threshold = check_real("bind_threshold", bind_threshold, low=-1.0, high=1.0, hint=" (a cosine)")
        self.grounding = grounding
        self.bind_threshold = float(bind_threshold)
        check_choice("fallback", fallback, ("rules", "none"))
        check_choice("on_full", on_full, ("rules", "skip", "replace", "block"))
        k = check_int("k", k, minimum=1)
        _check_args(delta=delta, samples=samples, cache_size=cache_size, dedup_threshold=dedup_threshold,
                    llm_timeout=llm_timeout)
        _check_more(backend=backend, template=template, encoder=encoder, cache_path=cache_path, rules=rules,
                    candidate_filter=candidate_filter, backend_kwargs=backend_kwargs, child_config=child_config)
        use_rules, keep_ungrounded, skip_idle = (check_bool(n, v) for n, v in (
            ("use_rules", use_rules), ("keep_ungrounded", keep_ungrounded), ("skip_idle", skip_idle)))
        isolate = check_bool("isolate", isolate, none_ok=True)
        queue_size = check_int("queue_size", queue_size, minimum=1)
        cache_save_every = check_int("cache_save_every", cache_save_every, minimum=1)
        warn_after = check_int("warn_after", warn_after, minimum=1)
        self.k = int(k)
        self.template = template if isinstance(template, PromptTemplate) else load_template(str(template))
        self.schema = self.template.schema(self.k)
        self.delta = float(delta)
        self.samples = int(samples)
        self.keep_ungrounded = keep_ungrounded
        self.dedup_threshold = float(dedup_threshold)
        self.fallback = fallback
        self.llm_timeout = llm_timeout
        self.skip_idle = skip_idle
        check_int("max_prompt_tokens", max_prompt_tokens, minimum=1, none_ok=True)
        self.max_prompt_tokens = max_prompt_tokens
        self.filter = candidate_filter or CandidateFilter()
        self.on_full = on_full
        self.cache_save_every = int(cache_save_every)
        check_choice("cache_key", cache_key, KEY_MODES)
        self.cache_key_mode = cache_key
        if oracle is not None and rules is not None:
            raise ValueError("give the oracle variant either as oracle= or in rules=RuleBackend(oracle=...), not both")
        self._rules = rules or RuleBackend(oracle=oracle or "canonical")
        check_oracle(getattr(self._rules, "oracle", "canonical"), grounding)

        # a backend built here is closed here; objects passed in belong to the caller
        self._owns_llm = isinstance(backend, (str, LLMSpec))
        if isinstance(backend, CompositeBackend):
            self.backend = backend
        else:
            if child_config is None and llm_timeout is not None:
                child_config = ChildConfig(timeout=float(llm_timeout), per_prompt_timeout=0.0)
            llm = build_llm(backend, backend_kwargs, isolate=isolate, config=child_config)
            self.backend = CompositeBackend(llm, self._rules if (use_rules or llm is None) else None)
        self.use_rules = self.backend.rules is not None
        self.backend_name = (backend if isinstance(backend, str) else backend.name if isinstance(backend, LLMSpec)
                             else type(self.backend.llm or self._rules).__name__)
        self.health = LLMHealth("relabeler", warn_after, fallback="relabeling with rules meanwhile"
                                if fallback == "rules" else "those trajectories get no instructions")

        self._encoder = encoder
        self._phrase_emb: Optional[np.ndarray] = None
        self._enc_lock = threading.Lock()
        self.cache = LRUCache(cache_size, cache_path)
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
        self._queue: "queue.Queue[Optional[tuple[list[Trajectory], list[int]]]]" = queue.Queue(max(1, queue_size))
        self._done: deque[RelabelResult] = deque()
        self._done_cv = threading.Condition()
        self._pending = 0
        self._worker: Optional[threading.Thread] = None
        self._closed = False

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

    def _rule_table(self, traj: Trajectory) -> Optional[dict[str, tuple[int, int]]]:
        """``{text: (pre, final)}`` of the rule labels of ``traj`` when the rules can say it
        (:meth:`RuleBackend.label_events`: any wording binds to its own event), else ``None``."""
        label_events = getattr(self._rules, "label_events", None)
        return label_events(traj) if callable(label_events) else None

    def _bind(self, text: str, src: str, sim: np.ndarray, traj: Trajectory, starts: np.ndarray,
              half_sims: dict[str, np.ndarray], rule_table: Optional[dict[str, tuple[int, int]]] = None
              ) -> Optional[Binding]:
        """The event(s) of ``traj`` that candidate ``text`` is bound to (``grounding="bound"``)."""
        if src == "rules":
            ev = (rule_table.get(text) if rule_table is not None
                  else rule_events(text, getattr(self._rules, "pair_table", None)))
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
        trajs = _check_trajectories(trajectories)
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
                table = self._rule_table(trajs[i]) if any(src == "rules" for _, src in merged[i]) else None
                for t, src in merged[i]:
                    b = self._bind(t, src, sim_all[row[t]], trajs[i], starts, half_sims, table)
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
        trajs = _check_trajectories(trajectories)
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


def _check_more(*, backend: Any, template: Any, encoder: Any, cache_path: Any, rules: Any, candidate_filter: Any,
                backend_kwargs: Any, child_config: Any) -> None:
    """The object arguments of the constructor: the right kinds, or an error naming the argument."""
    if not (backend is None or isinstance(backend, (str, LLMSpec, CompositeBackend))
            or callable(getattr(backend, "generate", None))):
        raise ArgumentTypeError(f"backend={show(backend)} must be a backend name such as 'rules' or 'transformers', "
                                "'package.module:ClassName', a BackendSpec, or an object with a generate() method")
    check_instance("template", template, (str, PromptTemplate), what="a template name, a path or a PromptTemplate")
    if encoder is not None and not callable(getattr(encoder, "encode", None)):
        raise ArgumentTypeError(f"encoder={show(encoder)} must have an encode(list[str]) -> [n, dim] array method "
                                "(e.g. oir_gym.get_encoder()) or be None")
    check_instance("cache_path", cache_path, (str, os.PathLike), none_ok=True, what="a path")
    check_instance("rules", rules, RuleBackend, none_ok=True)
    check_instance("candidate_filter", candidate_filter, CandidateFilter, none_ok=True)
    check_instance("backend_kwargs", backend_kwargs, dict, none_ok=True)
    check_instance("child_config", child_config, ChildConfig, none_ok=True)


def _check_args(*, delta: Any, samples: Any, cache_size: Any, dedup_threshold: Any, llm_timeout: Any) -> None:
    """Refuse constructor values that would silently misbehave (each error names the value and the range)."""
    def real(x: Any) -> bool:
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and np.isfinite(x)

    def whole(x: Any) -> bool:
        return isinstance(x, (int, np.integer)) and not isinstance(x, bool)

    if not (real(delta) and -1.0 < float(delta) <= 1.0):
        raise ValueError(f"delta={delta!r} is outside the allowed range (-1, 1] (cosine similarity threshold)")
    if not (whole(samples) and samples >= 1):
        raise ValueError(f"samples={samples!r} must be an integer >= 1 (completions per prompt)")
    if not (whole(cache_size) and cache_size >= 0):
        raise ValueError(f"cache_size={cache_size!r} must be an integer >= 0 (0 disables the cache)")
    if not (real(dedup_threshold) and 0.0 < float(dedup_threshold) <= 1.0):
        raise ValueError(f"dedup_threshold={dedup_threshold!r} must be a cosine in (0, 1] "
                         "(candidates at least this similar to an earlier one are dropped)")
    if llm_timeout is not None and not (real(llm_timeout) and llm_timeout > 0):
        raise ValueError(f"llm_timeout={llm_timeout!r} must be a number of seconds > 0, or None (no limit)")
