"""The relabeler's arguments: the config or the deprecated keyword form, and the checks of the
objects and batches it is given (a caller's mistake raises here, naming the argument, instead of
becoming a warning and empty results)."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Union

from oir_gym.relabel.backends import LLMBackend
from oir_gym.relabel.composite import CompositeBackend
from oir_gym.relabel.config import (
    DEFAULT_MAX_PROMPT_TOKENS, CacheSettings, GroundingSettings, LLMSettings, PromptSettings, RelabelerConfig,
    SelectionSettings,
)
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.llm.child import ChildConfig
from oir_gym.relabel.llm.spec import BackendSpec as LLMSpec
from oir_gym.relabel.prompts import PromptTemplate
from oir_gym.relabel.rules import RuleBackend
from oir_gym.trajectory import Trajectory
from oir_gym.validation import ArgumentTypeError, check_instance, show

BackendArg = Union[str, LLMSpec, LLMBackend, CompositeBackend, None]

#: no positional argument: tells the config form from the keyword form
UNSET: Any = object()


def resolve(config: Any, args: tuple, legacy: dict[str, Any], llm: Any,
            rules: Optional[RuleBackend]) -> tuple[RelabelerConfig, Any, Optional[RuleBackend]]:
    """``(config, llm, rules)`` of :class:`~oir_gym.relabel.HindsightRelabeler`'s arguments: the
    config form as given, the keyword form mapped by :func:`legacy_config` (its ``oracle=`` becomes
    ``RuleBackend(oracle=...)``)."""
    if isinstance(config, RelabelerConfig):
        if args or legacy:
            raise TypeError(f"HindsightRelabeler(config, ...) takes only llm=, encoder=, rules= after the config; "
                            f"got {len(args)} more positional and {sorted(legacy)} (set them on the config)")
        return config, llm, rules
    if config is UNSET and not args and not legacy:
        return RelabelerConfig(), llm, rules
    oracle = legacy.pop("oracle", None)
    config, obj = legacy_config(*(() if config is UNSET else (config,)), *args, **legacy)
    llm = obj if llm is None else llm
    if oracle is not None:  # the keyword form's oracle=: the rule backend's variant
        if rules is not None:
            raise ValueError("give the oracle variant either as oracle= or in rules=RuleBackend(oracle=...), not both")
        rules = RuleBackend(oracle=oracle)
    return config, llm, rules


def is_legacy(config: Any, args: tuple, legacy: dict[str, Any]) -> bool:
    """Whether the arguments are the deprecated keyword form."""
    return not isinstance(config, RelabelerConfig) and not (config is UNSET and not args and not legacy)


def rules_config(k: int = 4, **settings: Any) -> RelabelerConfig:
    """The config of a rule relabeler (no LLM, no cache) keeping ``k`` candidates per trajectory;
    ``settings``: ``delta``, ``grounding``, ``bind_threshold``, ``keep_ungrounded``, ``dedup_threshold``."""
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
    return cfg


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


def check_trajectories(trajectories: Any) -> list[Trajectory]:
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


def check_objects(*, llm: Any, encoder: Any, rules: Any) -> None:
    """The object arguments of the constructor: the right kinds, or an error naming the argument."""
    if not (llm is None or isinstance(llm, CompositeBackend) or callable(getattr(llm, "generate", None))):
        raise ArgumentTypeError(f"llm={show(llm)} must be an object with a generate() method (the backend "
                                "protocol), a CompositeBackend, or None (build config.llm.backend)")
    if encoder is not None and not callable(getattr(encoder, "encode", None)):
        raise ArgumentTypeError(f"encoder={show(encoder)} must have an encode(list[str]) -> [n, dim] array method "
                                "(e.g. oir_gym.get_encoder()) or be None")
    check_instance("rules", rules, RuleBackend, none_ok=True)
