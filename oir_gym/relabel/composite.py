"""An optional LLM backend plus optional rules: what the relabeler asks for each trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from oir_gym.relabel.backends.base import BackendError, BackendTimeout, LLMBackend
from oir_gym.relabel.config import LLMSettings
from oir_gym.relabel.llm.build import build_llm
from oir_gym.relabel.llm.caller import OffThreadCaller
from oir_gym.relabel.llm.child import ChildConfig, ChildProcessBackend
from oir_gym.relabel.llm.spec import LLMBusy
from oir_gym.relabel.rules import RuleBackend
from oir_gym.trajectory import Trajectory

@dataclass
class Proposal:
    """What the backends proposed for one trajectory: raw LLM completions, rule instructions, and
    why the LLM produced nothing (``error``; ``None`` when it answered or was not asked)."""

    llm_raw: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    error: Optional[str] = None


class CompositeBackend:
    """An optional :class:`LLMBackend` plus an optional :class:`RuleBackend` (at least one)."""

    def __init__(self, llm: Optional[LLMBackend] = None, rules: Optional[RuleBackend] = None) -> None:
        if llm is None and rules is None:
            raise ValueError("CompositeBackend needs an LLM backend, rules, or both")
        self.llm = llm
        self.rules = rules

    @classmethod
    def build(cls, backend: Any, settings: LLMSettings, rules: RuleBackend, use_rules: bool) -> "CompositeBackend":
        """``backend`` built by :func:`~oir_gym.relabel.llm.build.build_llm` (a composite as is),
        with ``rules`` beside it when ``use_rules`` or when there is no LLM."""
        if isinstance(backend, CompositeBackend):
            return backend
        child_config = settings.child_config
        if child_config is None and settings.timeout is not None:
            child_config = ChildConfig(timeout=float(settings.timeout), per_prompt_timeout=0.0)
        built = build_llm(backend, settings.backend_kwargs, isolate=settings.isolate, config=child_config)
        return cls(built, rules if (use_rules or built is None) else None)

    def __repr__(self) -> str:
        return f"CompositeBackend(llm={self.llm!r}, rules={self.rules!r})"

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """The LLM part of the protocol (so a composite can stand where a backend is expected)."""
        if self.llm is None:
            return [[] for _ in prompts]
        return self.llm.generate(prompts, n, schema=schema)

    def propose(
        self, trajectories: Sequence[Trajectory], prompts: Optional[Sequence[Optional[str]]] = None,
        n: int = 1, schema: Optional[dict] = None,
    ) -> list[Proposal]:
        """Rules for every trajectory and LLM completions for those whose prompt is not ``None``; LLM
        errors are recorded in each affected :attr:`Proposal.error`, not raised."""
        props = self._rule_proposals(trajectories)
        if self.llm is None or prompts is None:
            return props
        idx = [i for i, p in enumerate(prompts) if p is not None]
        if not idx:
            return props
        try:
            raw = self.llm.generate([prompts[i] for i in idx], n, schema=schema)
            if len(raw) != len(idx):
                raise BackendError(f"backend returned {len(raw)} results for {len(idx)} prompts")
            for i, r in zip(idx, raw):
                props[i].llm_raw = list(r) if isinstance(r, (list, tuple)) else [r]
        except Exception as e:  # noqa: BLE001 - recorded; the relabeler decides on a fallback
            msg = f"{type(e).__name__}: {e}"
            for i in idx:
                props[i].error = msg
        return props

    def propose_within(self, caller: OffThreadCaller, timeout: Optional[float], trajectories: Sequence[Trajectory],
                       prompts: Optional[Sequence[Optional[str]]] = None, n: int = 1,
                       schema: Optional[dict] = None) -> list[Proposal]:
        """:meth:`propose` on ``caller``'s thread within ``timeout`` seconds (``None``: the backend's own
        limit); past it the answer is discarded and the trajectories get the rules and the error
        ``BackendTimeout`` (``LLMBusy`` while an earlier call runs). A child process keeps its own deadline."""
        if timeout is None or self.llm is None or prompts is None or isinstance(self.llm, ChildProcessBackend):
            return self.propose(trajectories, prompts, n, schema)
        try:
            return caller.call(self.propose, trajectories, prompts, n, schema, timeout=timeout)
        except BackendTimeout as e:
            err = (f"LLMBusy: {e}" if isinstance(e, LLMBusy)
                   else f"{BackendTimeout.__name__}: LLM call exceeded llm_timeout={timeout}s")
            props = self._rule_proposals(trajectories)
            for p, pr in zip(props, prompts):
                p.error = err if pr is not None else None
            return props

    def _rule_proposals(self, trajectories: Sequence[Trajectory]) -> list[Proposal]:
        return [Proposal(rules=self.rules.instructions(t) if self.rules else []) for t in trajectories]
