"""The relabeler's settings: one dataclass in five parts, validated in one place.

::

    from oir_gym.relabel import HindsightRelabeler, RelabelerConfig

    cfg = RelabelerConfig()                        # offline Gemma 3 270M + rules, K = 4
    cfg.selection.k = 8
    cfg.grounding.mode = "bound"
    relabeler = HindsightRelabeler(cfg)            # validates cfg first
    rules_only = HindsightRelabeler.rules(k=4)     # no LLM

The parts follow the pipeline (:mod:`oir_gym.relabel.pipeline`): :class:`PromptSettings` (what is
sent), :class:`LLMSettings` (who answers, how long it may take, what happens when it fails),
:class:`CacheSettings` (answers reused across batches), :class:`GroundingSettings` (where a
candidate is paid) and :class:`SelectionSettings` (which candidates are kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from oir_gym.grounding import GROUNDING_MODES
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.prompts import PromptTemplate
from oir_gym.relabel.segments import KEY_MODES
from oir_gym.relabel.llm.child import ChildConfig
from oir_gym.relabel.llm.spec import BackendSpec

#: Default prompt budget (tokens, template included): a longer ``segments`` prompt is compacted
#: (docs/relabeling.md, "Prompt length").
DEFAULT_MAX_PROMPT_TOKENS = 768

#: What :attr:`LLMSettings.on_full` accepts (see :meth:`HindsightRelabeler.submit`).
ON_FULL = ("rules", "skip", "replace", "block")
#: What :attr:`LLMSettings.fallback` accepts.
FALLBACKS = ("rules", "none")


@dataclass
class PromptSettings:
    """What is sent to the LLM."""

    template: Union[str, PromptTemplate] = "segments"
    """``"segments"`` (compressed, default) or ``"paper"`` (Appendix C, per-timestep), a path to a
    template file, or a :class:`~oir_gym.relabel.prompts.PromptTemplate`."""
    max_prompt_tokens: Optional[int] = DEFAULT_MAX_PROMPT_TOKENS
    """Token budget of one prompt, template included (the backend's tokenizer where it has one,
    else approximate): a longer ``segments`` prompt is compacted. ``None``: never compact."""
    skip_idle: bool = True
    """Do not ask the LLM about trajectories where nothing but moving/waiting happened."""


@dataclass
class LLMSettings:
    """Who answers, within which deadline, and what happens when it cannot."""

    backend: Union[str, BackendSpec, None] = "transformers"
    """A backend name (``"transformers"``: the offline Gemma 3 270M; ``"llama_cpp"``,
    ``"openai"``, ``"vllm"``), ``"package.module:ClassName"``, a
    :class:`~oir_gym.relabel.worker.BackendSpec`, or ``"rules"`` / ``None`` (no LLM). A backend
    object is passed to :class:`HindsightRelabeler` as ``llm=`` instead."""
    backend_kwargs: Optional[dict] = None
    """Constructor arguments of a named backend (model, server URL...)."""
    isolate: Optional[bool] = None
    """Run a named backend in a child process (default: every backend but ``openai``)."""
    child_config: Optional[ChildConfig] = None
    """The child's deadlines and restart backoff (default: from ``timeout`` when set)."""
    timeout: Optional[float] = None
    """Seconds one batched LLM call may take (``None``: the backend's own limit). For a child
    process it is the child's deadline (the child is killed past it and restarts); otherwise the
    call is abandoned on its thread."""
    samples: int = 1
    """Completions per prompt."""
    fallback: str = "rules"
    """``"rules"``: rule instructions answer when the LLM fails; ``"none"``: nothing does."""
    warn_after: int = 3
    """Failed LLM calls in a row before the one console warning of an outage."""
    queue_size: int = 8
    """Pending batches of :meth:`HindsightRelabeler.submit` before ``on_full`` applies."""
    on_full: str = "rules"
    """Full queue: ``"rules"``, ``"skip"``, ``"replace"`` or ``"block"`` (see ``submit``)."""


@dataclass
class CacheSettings:
    """LLM answers reused across trajectories that behaved alike."""

    size: int = 4096
    """LRU entries (0 disables the cache)."""
    path: Optional[Union[str, os.PathLike]] = None
    """JSON file the cache is loaded from and saved to (``None``: memory only)."""
    key: str = "behaviour"
    """How trajectories become keys: ``"behaviour"``, ``"events"`` (coarser) or ``"segments"``
    (exact, with timing); see :func:`~oir_gym.relabel.segments.behaviour_key`."""
    save_every: int = 256
    """New entries between saves to ``path``."""


@dataclass
class GroundingSettings:
    """Where a candidate is paid on its trajectory (:mod:`oir_gym.grounding`)."""

    mode: str = "cosine"
    """``"cosine"`` (the paper's rule) or ``"bound"`` (event-bound)."""
    delta: float = 0.9
    """Cosine threshold (strict ``>``), as the env's reward."""
    bind_threshold: float = 0.5
    """Loosest similarity between a candidate and an event that binds it (``"bound"``)."""


@dataclass
class SelectionSettings:
    """Which candidates a trajectory keeps."""

    k: int = 4
    """Candidates kept per trajectory (the paper's K; also the answer schema's list length)."""
    use_rules: bool = True
    """Merge rule instructions into the LLM's candidates (after them)."""
    keep_ungrounded: bool = True
    """Fill up to ``k`` with ungrounded candidates after the grounded ones."""
    dedup_threshold: float = 0.95
    """Cosine at or above which a later candidate is a near-duplicate of an earlier one."""
    candidate_filter: Optional[CandidateFilter] = None
    """Text filter (forbidden words, lengths); ``None``: the default
    :class:`~oir_gym.relabel.filters.CandidateFilter`."""


@dataclass
class RelabelerConfig:
    """Every setting of a :class:`~oir_gym.relabel.HindsightRelabeler`, in the pipeline's parts."""

    prompt: PromptSettings = field(default_factory=PromptSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    grounding: GroundingSettings = field(default_factory=GroundingSettings)
    selection: SelectionSettings = field(default_factory=SelectionSettings)

    def validate(self) -> "RelabelerConfig":
        """Raise ``ValueError`` for a value that would silently misbehave (the message names the
        value, its keyword and its field here, and the allowed range); returns ``self``."""
        g, s, l, c, p = self.grounding, self.selection, self.llm, self.cache, self.prompt
        if g.mode not in GROUNDING_MODES:
            raise ValueError(f"grounding must be one of {GROUNDING_MODES}, got {g.mode!r} (grounding.mode)")
        if not (_real(g.bind_threshold) and -1.0 <= float(g.bind_threshold) <= 1.0):
            raise ValueError(f"bind_threshold={g.bind_threshold} must be a cosine in [-1, 1] "
                             "(grounding.bind_threshold)")
        if not (_real(g.delta) and -1.0 < float(g.delta) <= 1.0):
            raise ValueError(f"delta={g.delta!r} is outside the allowed range (-1, 1] "
                             "(cosine similarity threshold; grounding.delta)")
        if l.fallback not in FALLBACKS:
            raise ValueError(f"fallback must be 'rules' or 'none', got {l.fallback!r} (llm.fallback)")
        if l.on_full not in ON_FULL:
            raise ValueError(f"on_full must be 'rules', 'skip', 'replace' or 'block', got {l.on_full!r} (llm.on_full)")
        if s.k < 1:
            raise ValueError(f"k must be >= 1, got {s.k} (selection.k)")
        if not (_whole(l.samples) and l.samples >= 1):
            raise ValueError(f"samples={l.samples!r} must be an integer >= 1 (completions per prompt; llm.samples)")
        if not (_whole(c.size) and c.size >= 0):
            raise ValueError(f"cache_size={c.size!r} must be an integer >= 0 (0 disables the cache; cache.size)")
        if not (_real(s.dedup_threshold) and 0.0 < float(s.dedup_threshold) <= 1.0):
            raise ValueError(f"dedup_threshold={s.dedup_threshold!r} must be a cosine in (0, 1] "
                             "(candidates at least this similar to an earlier one are dropped; "
                             "selection.dedup_threshold)")
        if l.timeout is not None and not (_real(l.timeout) and l.timeout > 0):
            raise ValueError(f"llm_timeout={l.timeout!r} must be a number of seconds > 0, or None (no limit; "
                             "llm.timeout)")
        mpt = p.max_prompt_tokens
        if mpt is not None and not (isinstance(mpt, int) and not isinstance(mpt, bool) and mpt >= 1):
            raise ValueError(f"max_prompt_tokens must be a positive int or None, got {mpt!r} "
                             "(prompt.max_prompt_tokens)")
        if c.key not in KEY_MODES:
            raise ValueError(f"cache_key must be one of {KEY_MODES}, got {c.key!r} (cache.key)")
        return self


def _real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _whole(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)
