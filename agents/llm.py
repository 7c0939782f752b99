"""The LLM part both trainers share: what an :class:`~agents.config.LLMConfig` becomes.

One implementation for the PQN trainer (:mod:`agents.oir`: the OIR relabeler and the ELLM goal
proposer) and the SB3 trainer (:mod:`agents.sb3_agents`):

* :func:`backend_kwargs`: the LLM backend's constructor arguments (model, server URL);
* :func:`relabeler_config`: the one mapping of the trainers' settings (the PQN trainer's
  :class:`~agents.config.TrainConfig`, the SB3 trainer's settings) onto a
  :class:`~oir_gym.relabel.RelabelerConfig`;
* :func:`make_llm_relabeler`: a :class:`~oir_gym.relabel.HindsightRelabeler` on ``llm.backend``
  with the config's template and call timeout (the caller adds what differs between trainers:
  rules beside the LLM, queueing, grounding);
* :func:`check_llm`: the start-up check, one tiny real LLM call before training. A run that
  asked for the LLM alone stops with the cause and the fix (:class:`LLMCheckError`); one with
  rules beside it (``both``) warns on stderr and goes on with rules (the LLM is retried with
  backoff).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Optional

from agents.config import LLMConfig
from oir_gym.relabel.worker import LLMCheckError

if TYPE_CHECKING:
    from oir_gym.relabel import RelabelerConfig

__all__ = ["LLMCheckError", "backend_kwargs", "check_llm", "make_llm_relabeler", "relabeler_config"]


def backend_kwargs(llm: LLMConfig) -> dict[str, Any]:
    """Constructor arguments of ``llm.backend`` from ``llm.model`` and ``llm.base_url``."""
    from oir_gym.relabel.backends import backend_kwargs as of_backend

    return of_backend(llm.backend, llm.model, llm.base_url)


def relabeler_config(kind: str, llm: Optional[LLMConfig] = None, *, k: int = 4, delta: float = 0.9,
                     grounding: str = "cosine", bind_threshold: float = 0.5, keep_ungrounded: bool = True,
                     use_rules: Optional[bool] = None, cache_path: Optional[str] = None,
                     queue_size: int = 8, on_full: str = "rules") -> "RelabelerConfig":
    """The :class:`~oir_gym.relabel.RelabelerConfig` of a trainer's settings.

    Both trainers call this one function: the PQN trainer with its
    :class:`~agents.config.TrainConfig` fields (``oir.k``, ``env.delta``, ``oir.grounding``,
    ``oir.bind_threshold``, ``oir.keep_ungrounded``, ``llm``), the SB3 trainer with its settings
    (``k``, ``delta``, ``grounding``, ``bind_threshold``, ``llm``).

    Args:
        kind: ``"rules"`` (no LLM, no cache), ``"llm"`` or ``"both"`` (the LLM of ``llm``:
            backend, model, server URL, template, call timeout, prompt budget).
        use_rules: rule instructions beside the LLM's in this relabeler (default: ``kind == "both"``;
            the PQN trainer merges a separate rule relabeler instead and passes ``False``).
        queue_size, on_full: the background queue (:meth:`~oir_gym.relabel.HindsightRelabeler.submit`).
    """
    from oir_gym.relabel import RelabelerConfig

    cfg = RelabelerConfig()
    cfg.selection.k = k
    cfg.selection.keep_ungrounded = keep_ungrounded
    cfg.grounding.mode, cfg.grounding.delta, cfg.grounding.bind_threshold = grounding, delta, bind_threshold
    cfg.llm.queue_size, cfg.llm.on_full = queue_size, on_full
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


def make_llm_relabeler(llm: LLMConfig, *, encoder: Any = None, **settings: Any):
    """A relabeler on the LLM of ``llm`` (validated first; ``ValueError`` names the field).

    ``settings``: the keywords of :func:`relabeler_config` (``k``, ``delta``, ``use_rules``,
    ``grounding``...). The LLM is not called here: :func:`check_llm` makes the start-up call.
    """
    from oir_gym.relabel import HindsightRelabeler

    return HindsightRelabeler(relabeler_config("llm", llm, **settings), encoder=encoder)


def check_llm(component: Any, required: bool, flag: str) -> None:
    """One tiny real LLM call of ``component`` (a relabeler or goal proposer; nothing without an LLM).

    Args:
        component: has ``check_llm()`` (raises :class:`LLMCheckError`) and ``close()``.
        required: the run asked for the LLM alone (``FLAG llm``): a failure closes ``component``
            and raises :class:`LLMCheckError` naming the flag and the rule alternative. Otherwise
            (``FLAG both``) a warning on stderr, and the run relabels with rules meanwhile.
        flag: the command-line flag that chose the LLM (``--oir.relabeler``, ``--relabeler``...).
    """
    try:
        component.check_llm()
    except LLMCheckError as e:
        if required:
            component.close()
            raise LLMCheckError(f"{flag} llm: {e} (or train without the LLM: {flag} rules)") from None
        print(f"oir-gym: WARNING: {flag} both: {e}; relabeling with rules, the LLM is retried with backoff",
              file=sys.stderr, flush=True)
