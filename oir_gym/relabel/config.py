"""The relabeler's settings: one dataclass in five parts following the pipeline, validated in one place."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Union

import numpy as np

from oir_gym.grounding import GROUNDING_MODES
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.prompts import PromptTemplate
from oir_gym.relabel.llm.child import ChildConfig
from oir_gym.relabel.llm.spec import BackendSpec
from oir_gym.relabel.segments import KEY_MODES
from oir_gym.validation import (
    ArgumentTypeError, check_bool, check_choice, check_instance, check_int, check_real, show,
)

#: Default prompt budget (tokens, template included; docs/relabeling.md, "Prompt length").
DEFAULT_MAX_PROMPT_TOKENS = 768

#: What :attr:`LLMSettings.on_full` accepts (see :meth:`HindsightRelabeler.submit`).
ON_FULL = ("rules", "skip", "replace", "block")
#: What :attr:`LLMSettings.fallback` accepts.
FALLBACKS = ("rules", "none")


@dataclass
class PromptSettings:
    """What is sent to the LLM: ``template`` (``"segments"``, ``"paper"``, a file or a :class:`PromptTemplate`),
    ``max_prompt_tokens`` (one prompt's budget, ``None``: never compacted), ``skip_idle`` (do not ask about
    trajectories where nothing but moving/waiting happened)."""

    template: Union[str, PromptTemplate] = "segments"
    max_prompt_tokens: Optional[int] = DEFAULT_MAX_PROMPT_TOKENS
    skip_idle: bool = True


@dataclass
class LLMSettings:
    """Who answers, within which deadline, and what happens when it cannot.

    ``backend``: ``"transformers"`` (the offline Gemma 3 270M), ``"llama_cpp"``, ``"openai"``,
    ``"vllm"``, ``"package.module:ClassName"``, a :class:`~oir_gym.relabel.llm.spec.BackendSpec`, or
    ``"rules"`` / ``None`` (no LLM); a backend object goes to ``HindsightRelabeler(..., llm=)``.
    ``backend_kwargs``: its constructor arguments. ``isolate``: run it in a child process (default:
    all but ``openai``), with ``child_config``. ``timeout``: seconds one batched call may take.
    ``samples``: completions per prompt. ``fallback``: ``"rules"`` answer when the LLM fails, or
    ``"none"``. ``warn_after``: failed calls in a row before the one console warning.
    ``queue_size``: pending batches of ``submit`` before ``on_full`` (``"rules"``, ``"skip"``,
    ``"replace"``, ``"block"``) applies.
    """

    backend: Union[str, BackendSpec, None] = "transformers"
    backend_kwargs: Optional[dict] = None
    isolate: Optional[bool] = None
    child_config: Optional[ChildConfig] = None
    timeout: Optional[float] = None
    samples: int = 1
    fallback: str = "rules"
    warn_after: int = 3
    queue_size: int = 8
    on_full: str = "rules"


@dataclass
class CacheSettings:
    """LLM answers reused across trajectories that behaved alike: ``size`` LRU entries (0: off),
    ``path`` of its JSON file, ``key`` mode (:func:`~oir_gym.relabel.segments.behaviour_key`) and
    new entries between saves (``save_every``)."""

    size: int = 4096
    path: Optional[Union[str, os.PathLike]] = None
    key: str = "behaviour"
    save_every: int = 256


@dataclass
class GroundingSettings:
    """Where a candidate is paid (:mod:`oir_gym.grounding`): ``mode`` ``"cosine"`` (the paper's) or
    ``"bound"``, the cosine threshold ``delta`` (strict ``>``) and ``bind_threshold`` (``"bound"``)."""

    mode: str = "cosine"
    delta: float = 0.9
    bind_threshold: float = 0.5


@dataclass
class SelectionSettings:
    """Which candidates a trajectory keeps: up to ``k``, with rule instructions merged in
    (``use_rules``), ungrounded ones filling up (``keep_ungrounded``), near-duplicates at cosine
    ``dedup_threshold`` dropped, texts passed through ``candidate_filter`` (default one)."""

    k: int = 4
    use_rules: bool = True
    keep_ungrounded: bool = True
    dedup_threshold: float = 0.95
    candidate_filter: Optional[CandidateFilter] = None


@dataclass
class RelabelerConfig:
    """Every setting of a :class:`~oir_gym.relabel.HindsightRelabeler`, in the pipeline's parts."""

    prompt: PromptSettings = field(default_factory=PromptSettings)
    llm: LLMSettings = field(default_factory=LLMSettings)
    cache: CacheSettings = field(default_factory=CacheSettings)
    grounding: GroundingSettings = field(default_factory=GroundingSettings)
    selection: SelectionSettings = field(default_factory=SelectionSettings)

    def validate(self) -> "RelabelerConfig":
        """Normalise in place and return ``self``; raise ``ValueError`` / ``TypeError`` naming the value
        (``k=2.5``) and its field (``(RelabelerConfig.selection.k)``) for one that would misbehave."""
        g, s, l, c, p = self.grounding, self.selection, self.llm, self.cache, self.prompt
        with _field("grounding.mode"):
            check_choice("grounding", g.mode, GROUNDING_MODES)
        with _field("grounding.bind_threshold"):
            g.bind_threshold = check_real("bind_threshold", g.bind_threshold, low=-1.0, high=1.0, hint=" (a cosine)")
        with _field("llm.fallback"):
            check_choice("fallback", l.fallback, FALLBACKS)
        with _field("llm.on_full"):
            check_choice("on_full", l.on_full, ON_FULL)
        with _field("selection.k"):
            s.k = check_int("k", s.k, minimum=1)
        with _field("grounding.delta"):
            g.delta = check_real("delta", g.delta, low=-1.0, high=1.0, low_open=True,
                                 hint=" (cosine similarity threshold)")
        with _field("llm.samples"):
            l.samples = check_int("samples", l.samples, minimum=1, hint=" (completions per prompt)")
        with _field("cache.size"):
            c.size = check_int("cache_size", c.size, minimum=0, hint=" (0 disables the cache)")
        with _field("selection.dedup_threshold"):
            if not (_real(s.dedup_threshold) and 0.0 < float(s.dedup_threshold) <= 1.0):
                raise ValueError(f"dedup_threshold={s.dedup_threshold!r} must be a cosine in (0, 1] "
                                 "(candidates at least this similar to an earlier one are dropped)")
        with _field("llm.timeout"):
            if l.timeout is not None and not (_real(l.timeout) and l.timeout > 0):
                raise ValueError(f"llm_timeout={l.timeout!r} must be a number of seconds > 0, or None (no limit)")
        with _field("llm.backend"):
            if not (l.backend is None or isinstance(l.backend, (str, BackendSpec))):
                raise ArgumentTypeError(f"backend={show(l.backend)} must be a backend name such as 'rules' or "
                                        "'transformers', 'package.module:ClassName' or a BackendSpec (a backend "
                                        "object goes to HindsightRelabeler(config, llm=...))")
        with _field("prompt.template"):
            check_instance("template", p.template, (str, PromptTemplate), what="a template name, a path or a PromptTemplate")
        with _field("cache.path"):
            check_instance("cache_path", c.path, (str, os.PathLike), none_ok=True, what="a path")
        with _field("selection.candidate_filter"):
            check_instance("candidate_filter", s.candidate_filter, CandidateFilter, none_ok=True)
        with _field("llm.backend_kwargs"):
            check_instance("backend_kwargs", l.backend_kwargs, dict, none_ok=True)
        with _field("llm.child_config"):
            check_instance("child_config", l.child_config, ChildConfig, none_ok=True)
        for part, name in ((s, "use_rules"), (s, "keep_ungrounded"), (p, "skip_idle")):
            with _field(f"{'selection' if part is s else 'prompt'}.{name}"):
                setattr(part, name, check_bool(name, getattr(part, name)))
        with _field("llm.isolate"):
            l.isolate = check_bool("isolate", l.isolate, none_ok=True)
        with _field("llm.queue_size"):
            l.queue_size = check_int("queue_size", l.queue_size, minimum=1)
        with _field("cache.save_every"):
            c.save_every = check_int("cache_save_every", c.save_every, minimum=1)
        with _field("llm.warn_after"):
            l.warn_after = check_int("warn_after", l.warn_after, minimum=1)
        with _field("prompt.max_prompt_tokens"):
            check_int("max_prompt_tokens", p.max_prompt_tokens, minimum=1, none_ok=True)
        with _field("cache.key"):
            check_choice("cache_key", c.key, KEY_MODES)
        return self


@contextmanager
def _field(path: str) -> Iterator[None]:
    try:
        yield
    except (TypeError, ValueError) as e:
        raise type(e)(f"{e} (RelabelerConfig.{path})") from None


def _real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and bool(np.isfinite(x))

