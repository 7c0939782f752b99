"""The relabelers of both trainers, built from the same settings so that ``rules``, ``llm`` and ``both`` mean the
same in both (:func:`make_relabeler`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from agents.run.config import LLMConfig, RelabelSettings
from agents.run.llm import backend_kwargs, check_llm

if TYPE_CHECKING:
    from oir_gym.relabel import RelabelerConfig
    from oir_gym.relabel.background import BackgroundRelabeler
    from oir_gym.relabel.rules import RuleBackend

#: What ``make_relabeler``'s ``kind`` accepts.
RELABELERS = ("rules", "llm", "both", "none")


def relabeler_config(kind: str, llm: Optional[LLMConfig] = None, *, k: int = 4, delta: float = 0.9,
                     grounding: str = "cosine", bind_threshold: float = 0.5, keep_ungrounded: bool = True,
                     use_rules: Optional[bool] = None, cache_path: Optional[str] = None,
                     queue_size: int = 8, on_full: str = "rules", fallback: str = "rules") -> "RelabelerConfig":
    """The :class:`~oir_gym.relabel.RelabelerConfig` of ``kind`` (``"rules"``, ``"llm"`` or ``"both"``, the LLM of
    ``llm``) and a trainer's settings; ``use_rules`` defaults to ``kind == "both"``."""
    from oir_gym.relabel import RelabelerConfig

    cfg = RelabelerConfig()
    cfg.selection.k = k
    cfg.selection.keep_ungrounded = keep_ungrounded
    cfg.grounding.mode, cfg.grounding.delta, cfg.grounding.bind_threshold = grounding, delta, bind_threshold
    cfg.llm.queue_size, cfg.llm.on_full, cfg.llm.fallback = queue_size, on_full, fallback
    if kind == "rules":
        cfg.llm.backend = "rules"
        cfg.cache.size = 0
        return cfg
    if kind not in ("llm", "both"):
        raise ValueError(f"unknown relabeler kind {kind!r}; expected 'rules', 'llm' or 'both'")
    llm = (llm or LLMConfig()).validate()
    cfg.llm.backend, cfg.llm.backend_kwargs, cfg.llm.timeout = llm.backend, backend_kwargs(llm), llm.call_timeout
    cfg.prompt.template = llm.template
    cfg.prompt.max_prompt_tokens = llm.max_prompt_tokens or None
    cfg.selection.use_rules = kind == "both" if use_rules is None else use_rules
    cfg.cache.path = cache_path
    return cfg


def oracle_rules(oracle: str = "canonical", *, seed: int = 0, pool: str = "", eval_files: Sequence[str] = (),
                 encoder: Any = None) -> "RuleBackend":
    """The rule backend of ``oracle``, its draws seeded by ``seed``; its wording pool, if any, is checked against
    every evaluation string (``eval_files`` too): ``ValueError`` naming a wording within cosine 0.85 of one."""
    from oir_gym.relabel.oracle import check_pool, evaluation_texts
    from oir_gym.relabel.rules import RuleBackend

    rules = RuleBackend(oracle=oracle, seed=seed, pool=pool or None)
    if rules.wording_pool is not None:
        if encoder is None:
            from oir_gym.encoder import get_encoder

            encoder = get_encoder()
        check_pool(rules.wording_pool, evaluation_texts(eval_files), encoder)
    return rules


def make_rules_relabeler(k: int = 4, *, delta: float = 0.9, grounding: str = "cosine", bind_threshold: float = 0.5,
                         keep_ungrounded: bool = True, rules: Optional["RuleBackend"] = None, encoder: Any = None,
                         workers: int = 0, batch: int = 0):
    """The synchronous rule relabeler keeping ``k`` candidates per trajectory; over ``workers`` processes when a
    batch of ``batch`` trajectories holds at least 64, else in process."""
    from oir_gym.relabel import HindsightRelabeler
    from oir_gym.relabel.parallel import ParallelRelabeler

    rcfg = relabeler_config("rules", k=k, delta=delta, keep_ungrounded=keep_ungrounded, grounding=grounding,
                            bind_threshold=bind_threshold)
    if workers > 0 and batch >= 64:
        from oir_gym.relabel.encoding import SharedEncoder, TableEncoder
        from oir_gym.relabel.rules import RuleBackend

        # the rules' texts embedded once here: a worker loads the model only for a text outside them
        shared = encoder if isinstance(encoder, SharedEncoder) else SharedEncoder(encoder)
        table = TableEncoder.of(shared, (rules or RuleBackend()).vocabulary())
        return ParallelRelabeler(functools.partial(HindsightRelabeler, rcfg, rules=rules, encoder=table),
                                 workers=workers, min_batch=64)
    return HindsightRelabeler(rcfg, encoder=encoder, rules=rules)


@dataclass(frozen=True)
class RelabelerOptions:
    """What a trainer adds to :class:`~agents.run.config.RelabelSettings` to build its relabeler (``rules_k``
    default: ``settings.k``; ``flag``: the option that chose it, an LLM then gets its start-up check)."""

    keep_ungrounded: bool = True
    oracle_pool: str = ""
    seed: int = 0
    eval_files: Sequence[str] = ()
    rules_k: Optional[int] = None
    workers: int = 0
    batch: int = 0
    rules_lag: int = 0
    cache_path: Optional[str] = None
    queue_size: int = 1
    flag: Optional[str] = None


def make_relabeler(kind: str, settings: Optional[RelabelSettings] = None, llm: Optional[LLMConfig] = None, *,
                   delta: float = 0.9, encoder: Any = None,
                   options: RelabelerOptions = RelabelerOptions()) -> Optional["BackgroundRelabeler"]:
    """The relabeler of ``kind``: ``"rules"``; ``"llm"`` (rules only as its fallback); ``"both"`` (the rules at
    once, the LLM's answers when they arrive); ``"none"``: None. ``settings``: K, grounding and oracle."""
    settings = settings or RelabelSettings()
    k, o = settings.k, options
    if kind not in RELABELERS:
        raise ValueError(f"unknown relabeler {kind!r}; expected one of {RELABELERS}")
    if kind == "none":
        return None
    from oir_gym.relabel import HindsightRelabeler
    from oir_gym.relabel.background import BackgroundRelabeler
    from oir_gym.relabel.encoding import SharedEncoder

    llm = (llm or LLMConfig()).validate()
    # one lock for both halves: the rules (training thread) and the LLM's worker share the encoder
    encoder = encoder if isinstance(encoder, SharedEncoder) else SharedEncoder(encoder)
    grounding_kw = dict(delta=delta, grounding=settings.grounding, bind_threshold=settings.bind_threshold,
                        keep_ungrounded=o.keep_ungrounded)
    rules = None
    if kind in ("rules", "both"):
        backend = oracle_rules(settings.oracle, seed=o.seed, pool=o.oracle_pool, eval_files=o.eval_files,
                               encoder=encoder)
        rules = make_rules_relabeler(k if o.rules_k is None else o.rules_k, rules=backend, encoder=encoder,
                                     workers=o.workers, batch=o.batch, **grounding_kw)
    if kind == "rules":
        return BackgroundRelabeler(rules, rules_lag=o.rules_lag)
    # "replace": while the LLM is busy, newer batches replace older ones (later answers would come too late)
    rcfg = relabeler_config("llm", llm, k=k, use_rules=False, cache_path=o.cache_path, queue_size=o.queue_size,
                            on_full="replace", fallback="none" if kind == "both" else "rules", **grounding_kw)
    relabeler = BackgroundRelabeler(rules, HindsightRelabeler(rcfg, encoder=encoder), rules_lag=o.rules_lag)
    if o.flag is not None:
        check_llm(relabeler, kind == "llm", o.flag)
    return relabeler
