"""The relabelers and goal proposers of both trainers, built from plain settings.

The PQN trainer (:mod:`agents.pqn.trainer`) and the SB3 trainer (:mod:`agents.sb3.models`) build what
relabels their trajectories here, from the same settings, so ``rules``, ``llm`` and ``both``
mean the same in both:

* :func:`make_relabeler`: a :class:`~oir_gym.relabel.background.BackgroundRelabeler`:
  ``rules``: the rule relabeler alone; ``llm``: the LLM relabeler alone (rule instructions only
  where the LLM fails: its fallback); ``both``: the rules answer at once, the LLM's answers join
  when they arrive (its queue holds ``queue_size`` batches and drops the oldest when full); ``none``:
  ``None``.
* :func:`make_rules_relabeler`: the synchronous rule relabeler (over worker processes for a large
  batch).
* :func:`relabeler_config`: the one mapping of the trainers' settings onto a
  :class:`~oir_gym.relabel.RelabelerConfig`.
* :func:`oracle_rules`: the rule backend of an oracle variant, its wording pool checked against
  the evaluation strings.

A factory that builds an LLM makes its start-up call (:func:`agents.run.llm.check_llm`) when given
the command-line ``flag`` that chose it: ``llm`` stops with the cause, ``both`` warns and goes on.
"""

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

__all__ = ["RELABELERS", "RelabelerOptions", "make_relabeler", "make_rules_relabeler", "oracle_rules",
           "relabeler_config"]

#: What ``make_relabeler``'s ``kind`` accepts.
RELABELERS = ("rules", "llm", "both", "none")


def relabeler_config(kind: str, llm: Optional[LLMConfig] = None, *, k: int = 4, delta: float = 0.9,
                     grounding: str = "cosine", bind_threshold: float = 0.5, keep_ungrounded: bool = True,
                     use_rules: Optional[bool] = None, cache_path: Optional[str] = None,
                     queue_size: int = 8, on_full: str = "rules", fallback: str = "rules") -> "RelabelerConfig":
    """The :class:`~oir_gym.relabel.RelabelerConfig` of a trainer's settings.

    Args:
        kind: ``"rules"`` (no LLM, no cache), ``"llm"`` or ``"both"`` (the LLM of ``llm``:
            backend, model, server URL, template, call timeout, prompt budget).
        use_rules: rule instructions beside the LLM's in this one relabeler (default:
            ``kind == "both"``; :func:`make_relabeler` keeps them in a separate rule relabeler).
        queue_size, on_full: the background queue (:meth:`~oir_gym.relabel.HindsightRelabeler.submit`).
        fallback: what answers when the LLM fails: ``"rules"`` or ``"none"``.
    """
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
    """The rule backend of ``oracle`` (:mod:`oir_gym.relabel.oracle`), its draws seeded by ``seed``.

    A wording pool (``pool``, or the packaged one of ``diverse`` and ``noisy``) is checked here
    against every evaluation string (those of ``eval_files`` too) with ``encoder`` (default: the
    shared one): no wording within cosine 0.85 of one, else ``ValueError`` naming the wording.
    """
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
    """The synchronous rule relabeler keeping ``k`` candidates per trajectory; over ``workers``
    processes (:class:`~oir_gym.relabel.parallel.ParallelRelabeler`) when a batch of ``batch``
    trajectories holds at least 64, else in process. The workers share one table of the rules'
    texts embedded here (:class:`~oir_gym.relabel.encoding.TableEncoder`): none loads the sentence
    model unless a label falls outside it."""
    from oir_gym.relabel import HindsightRelabeler
    from oir_gym.relabel.parallel import ParallelRelabeler

    rcfg = relabeler_config("rules", k=k, delta=delta, keep_ungrounded=keep_ungrounded, grounding=grounding,
                            bind_threshold=bind_threshold)
    if workers > 0 and batch >= 64:
        from oir_gym.relabel.encoding import SharedEncoder, TableEncoder
        from oir_gym.relabel.rules import RuleBackend

        # the parent embeds what the rules can say, once; a worker loads the model only for a text
        # outside that table
        shared = encoder if isinstance(encoder, SharedEncoder) else SharedEncoder(encoder)
        table = TableEncoder.of(shared, (rules or RuleBackend()).vocabulary())
        return ParallelRelabeler(functools.partial(HindsightRelabeler, rcfg, rules=rules, encoder=table),
                                 workers=workers, min_batch=64)
    return HindsightRelabeler(rcfg, encoder=encoder, rules=rules)


@dataclass(frozen=True)
class RelabelerOptions:
    """What a trainer adds to the shared :class:`~agents.run.config.RelabelSettings` to build its relabeler.

    Attributes:
        keep_ungrounded: keep candidates that paid no reward on their own trajectory.
        oracle_pool, seed, eval_files: the rule backend's wording pool, its draws' seed, and the
            user's evaluation files the pool is checked against (:func:`oracle_rules`).
        rules_k: candidates the rule relabeler keeps (default ``settings.k``).
        workers, batch: rule relabeling over worker processes (:func:`make_rules_relabeler`).
        rules_lag: 1: the rules relabel on a side thread, a batch's results arriving with the next.
        cache_path: where the LLM relabeler keeps its answer cache.
        queue_size: LLM batches queued before the oldest is dropped.
        flag: the command-line flag that chose the relabeler: an LLM gets its start-up call
            (:func:`agents.run.llm.check_llm`; ``llm`` stops on failure, ``both`` warns).
    """

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
    """The relabeler of ``kind`` (``"rules"``, ``"llm"``, ``"both"`` or ``"none"``; see the module).

    Args:
        settings: K and grounding (``k``, ``grounding``, ``bind_threshold``; :mod:`oir_gym.grounding`)
            and the rule backend's ``oracle`` (default: :class:`~agents.run.config.RelabelSettings`).
        llm: the LLM part (:class:`~agents.run.config.LLMConfig`; default: the offline transformers backend).
        delta: the reward threshold.
        encoder: the sentence encoder (default: the shared one).
        options: the rest (:class:`RelabelerOptions`).
    """
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
    # the LLM half: its rules are the other half's (both) or only its fallback (llm); "replace":
    # while the LLM is busy, newer batches replace older ones instead of piling up answers that
    # would arrive too late to train on
    rcfg = relabeler_config("llm", llm, k=k, use_rules=False, cache_path=o.cache_path, queue_size=o.queue_size,
                            on_full="replace", fallback="none" if kind == "both" else "rules", **grounding_kw)
    relabeler = BackgroundRelabeler(rules, HindsightRelabeler(rcfg, encoder=encoder), rules_lag=o.rules_lag)
    if o.flag is not None:
        check_llm(relabeler, kind == "llm", o.flag)
    return relabeler
