"""The per-method part of a PQN iteration behind one interface, :class:`TrainingMethod` (``gt`` and ``cosine``
here, ``oir`` in :mod:`agents.pqn.oir_method`, ``ellm`` in :mod:`agents.pqn.ellm`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from agents.pqn.config import TrainConfig
    from oir_gym.buffer import InstructionBuffer
    from oir_gym.instruction_registry import InstructionRegistry


@dataclass(frozen=True)
class MethodContext:
    """What a training method may use of its run (the table and buffers are the trainer's own objects)."""

    cfg: "TrainConfig"
    S: int
    seed_offset: int
    registry: "InstructionRegistry"
    buffers: "list[InstructionBuffer]"
    encoder: Any
    all_eval_texts: list[str]
    log: Callable[[str], None]

    @property
    def fixed_texts(self) -> list[str]:
        """The evaluation and original instructions: they keep their own table rows."""
        from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

        return list(dict.fromkeys([*self.all_eval_texts, *ORIGINAL_INSTRUCTIONS]))

    def protected_rows(self, env_state: Any = None, extra: Iterable[int] = ()) -> list[int]:
        """:func:`protected_rows` of :attr:`fixed_texts` and ``extra``."""
        fixed = self.registry.find(self.fixed_texts).values()
        return protected_rows(self.registry, self.buffers, [*fixed, *extra], env_state)


def protected_rows(registry: "InstructionRegistry", buffers: "Sequence[InstructionBuffer]", fixed_rows: Iterable[int],
                   env_state: Any = None) -> list[int]:
    """Table rows new instructions must not take: ``fixed_rows``, the envs' (``env_state``) and the buffers'."""
    rows = {int(r) for r in fixed_rows}
    if env_state is not None:
        rows |= set(np.asarray(env_state.env.instr).reshape(-1).tolist())
        rows |= {r for r in np.asarray(env_state.env.pinned).reshape(-1).tolist() if r >= 0}
        rows |= {r for r in np.asarray(env_state.env.also_pays).reshape(-1).tolist() if r >= 0}
    for b in buffers:
        rows |= set(registry.find(b.contents()).values())
    return sorted(rows)


@dataclass(frozen=True)
class MethodStep:
    """A method's answer after a rollout: ``metrics``, relabel ``slots``, ``[S * E]`` rows ``pinned`` at the
    envs' next reset and ``[S * E, n]`` rows that ``also_pays`` (-1: none; ``None``: nothing to set)."""

    metrics: dict[str, float]
    slots: Optional[dict] = None
    pinned: Optional[np.ndarray] = None
    also_pays: Optional[np.ndarray] = None


#: ``factory(ctx, relabeler, proposer)``: the method; ``relabeler``/``proposer``: the Trainer's (``None``: from cfg)
MethodFactory = Callable[[MethodContext, Any, Any], "TrainingMethod"]


@dataclass(frozen=True)
class MethodSpec:
    """One training method by name (:data:`agents.pqn.method_specs.METHOD_SPECS`); ``reward_mode``: 0 cosine, 1 gt."""

    factory: MethodFactory
    reward_mode: int = 0
    generated_file: str | None = None
    table_capacity: Callable[["TrainConfig", int], int] = lambda cfg, n_eval: cfg.env.table_capacity
    also_pays_slots: Callable[["TrainConfig"], int] = lambda cfg: 0


class TrainingMethod:
    """Train on the original instructions with the env's reward (the base of every method)."""

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        #: generated instruction text -> count (oir: offered to the buffers; ellm: proposed)
        self.generated: Counter = Counter()

    #: recent rollouts the trainer keeps for :attr:`MethodStep.slots` (newest first)
    history_len: int = 1

    def draw_texts(self, seed: int) -> Optional[list[str]]:
        """Instructions new episodes of seed ``seed`` draw from (``None``: the 22 original ones)."""
        return None

    def step(self, update: int, host: dict, env_state: Any) -> MethodStep:
        """What to train on after a rollout (``host``: its ``[S, T, E, ...]`` host arrays)."""
        return MethodStep({})

    def warmup_slots(self) -> Optional[dict]:
        """Relabel slots shaped as :meth:`step`'s, none valid (``None``: it hands none back)."""
        return None

    def payable_rows(self) -> np.ndarray:
        """``[capacity]`` bool: table rows whose instruction some caption can pay (above delta)."""
        return self.ctx.registry.event_sim.max(axis=1) > self.cfg.env.delta

    def state_dict(self) -> dict[str, Any]:
        """JSON host state for checkpoints."""
        return {"counts": dict(self.generated)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generated = Counter(state.get("counts", {}))

    def generated_payload(self) -> dict[str, Any] | None:
        """Contents of the method's :attr:`MethodSpec.generated_file` (``None``: none)."""
        return None

    def close(self) -> None:
        """Stop background workers (LLM clients)."""


class Cosine(TrainingMethod):
    """``cosine``: PQN with the cosine reward on the 22 original instructions."""


class GroundTruth(TrainingMethod):
    """``gt``: PQN with the ground-truth reward (the instruction's achievement) on the 22 original instructions."""

    def payable_rows(self) -> np.ndarray:
        return self.ctx.registry.achievement >= 0
