"""The per-method part of a PQN iteration, behind one small interface.

:class:`~agents.pqn.trainer.Trainer` runs what every method shares (rollout, return bookkeeping, the
PQN update, evaluation, checkpoints) and asks its :class:`TrainingMethod` for the rest:

* which instructions new episodes draw (:meth:`TrainingMethod.draw_texts`),
* what to train on after a rollout (:meth:`TrainingMethod.step`: relabel slots, goals to pin the
  envs to, the method's metrics); the trainer builds the update batch itself,
* which instruction-table rows can pay a reward (:meth:`TrainingMethod.payable_rows`),
* its host state for checkpoints (:meth:`TrainingMethod.state_dict`) and the contents of the file
  of generated instructions it writes (:meth:`TrainingMethod.generated_payload`).

The methods: :class:`GroundTruth` (``gt``) and :class:`Cosine` (``cosine``) here, which train on
the 22 original instructions; :class:`agents.pqn.oir_method.OIRRelabeling` (``oir``) and
:class:`agents.pqn.ellm.ELLMProposals` (``ellm``). A method is built from a :class:`MethodContext`, the
narrow part of the run it may use (plain data: no calls back into the trainer), and holds no
Trainer; this module and the methods import nothing of the trainer. What the trainer needs to know of a method before it builds one (reward,
table size, generated file) and how to build it is a :class:`MethodSpec`, one per method name in
:data:`agents.pqn.trainer.METHOD_SPECS`.
"""

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
    """What a training method may use of the run that trains it, as plain data; the trainer
    (:class:`agents.pqn.trainer.Trainer`) builds one for its method, a test can build one without a trainer.

    What changes while training (the update count, the envs' state) comes with each
    :meth:`TrainingMethod.step`. The registry and the buffers are the run's own objects: a method
    registers instructions in the one and inserts into the others.
    """

    #: the run's configuration
    cfg: "TrainConfig"
    #: seeds of this process
    S: int
    #: the global index of this process's first seed (0 in a one-process run)
    seed_offset: int
    #: the instruction table shared with the envs
    registry: "InstructionRegistry"
    #: per seed of this process, its instruction buffer
    buffers: "list[InstructionBuffer]"
    #: the sentence encoder of the instruction table
    encoder: Any
    #: every evaluation instruction of the run (periodic and final), once each
    all_eval_texts: list[str]
    #: receives messages for the user
    log: Callable[[str], None]

    @property
    def fixed_texts(self) -> list[str]:
        """The evaluation and original instructions: they keep their own table rows."""
        from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

        return list(dict.fromkeys([*self.all_eval_texts, *ORIGINAL_INSTRUCTIONS]))

    def protected_rows(self, env_state: Any = None, extra: Iterable[int] = ()) -> list[int]:
        """Table rows a new instruction must not take: :attr:`fixed_texts`', the buffers', the envs'
        (:func:`protected_rows`) and ``extra``."""
        fixed = self.registry.find(self.fixed_texts).values()
        return protected_rows(self.registry, self.buffers, [*fixed, *extra], env_state)


def protected_rows(registry: "InstructionRegistry", buffers: "Sequence[InstructionBuffer]", fixed_rows: Iterable[int],
                   env_state: Any = None) -> list[int]:
    """Table rows that must not be reused for new instructions: ``fixed_rows``, the envs' current,
    pinned and also-paying rows (``env_state``: the envs' block state, :mod:`oir_gym.functional`),
    and every buffer's instructions."""
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
    """What a method hands back after a rollout; the trainer builds the batch and sets the envs.

    Attributes:
        metrics: the method's metrics of this update.
        slots: relabel slots (:func:`agents.pqn.trainer.build_batch`) indexing the trainer's recent rollouts
            by age (``None``: the batch is this rollout's trajectories only).
        pinned: ``[S * E]`` table rows to pin the envs to at their next reset (-1: none), or ``None``.
        also_pays: ``[S * E, n]`` rows that also pay each env (-1: none), or ``None``.
    """

    metrics: dict[str, float]
    slots: Optional[dict] = None
    pinned: Optional[np.ndarray] = None
    also_pays: Optional[np.ndarray] = None


def configured_table_capacity(cfg: "TrainConfig", n_eval: int) -> int:
    """The instruction table's rows as configured (``env.table_capacity``)."""
    return cfg.env.table_capacity


def no_also_pays(cfg: "TrainConfig") -> int:
    """No extra rows per env pay a reward."""
    return 0


#: ``factory(ctx, relabeler, proposer)``: the method built from its context; ``relabeler`` (oir) and
#: ``proposer`` (ellm) are what a caller handed the Trainer (``None``: built from the config), and
#: methods without one ignore them
MethodFactory = Callable[[MethodContext, Any, Any], "TrainingMethod"]


@dataclass(frozen=True)
class MethodSpec:
    """One training method as the trainer looks it up by name (:data:`agents.pqn.trainer.METHOD_SPECS`)."""

    factory: MethodFactory
    #: the env's reward: 0 cosine similarity of captions to the instruction, 1 the ground truth
    reward_mode: int = 0
    #: file of the instructions the method generates, in the run directory (``None``: none)
    generated_file: str | None = None
    #: ``table_capacity(cfg, n_eval)``: rows of the instruction table the method needs (``n_eval``
    #: evaluation and original rows included)
    table_capacity: Callable[["TrainConfig", int], int] = configured_table_capacity
    #: ``also_pays_slots(cfg)``: extra rows per env whose captions also pay (ELLM's other proposed goals)
    also_pays_slots: Callable[["TrainConfig"], int] = no_also_pays


class TrainingMethod:
    """Train on the original instructions with the env's reward (the base of every method).

    Args:
        ctx: what the method may use of its run.
    """

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx
        self.cfg = ctx.cfg
        #: generated instruction text -> count (oir: offered to the buffers; ellm: proposed)
        self.generated: Counter = Counter()

    #: recent rollouts the trainer keeps for :attr:`MethodStep.slots` (newest first)
    history_len: int = 1

    # ------------------------------------------------------------ per iteration
    def draw_texts(self, seed: int) -> Optional[list[str]]:
        """Instructions new episodes of seed ``seed`` draw from (``None``: the 22 original ones)."""
        return None

    def step(self, update: int, host: dict, env_state: Any) -> MethodStep:
        """What to train on after this iteration's rollout, and the method's metrics.

        Args:
            update: updates done so far.
            host: host copies of ``instr``, ``events``, ``action``, ``done``, ``reward``, ``ep_return``,
                ``success`` (leaves ``[S, T, E, ...]``, see :func:`agents.pqn.trainer.make_rollout`).
            env_state: the envs' block state after the rollout (:mod:`oir_gym.functional`).
        """
        return MethodStep({})

    def warmup_slots(self) -> Optional[dict]:
        """Relabel slots shaped as :meth:`step`'s, nothing relabeled (``None``: it hands none back):
        what :meth:`agents.pqn.trainer.Trainer.start_compiling` compiles the batch program with."""
        return None

    def payable_rows(self) -> np.ndarray:
        """``[capacity]`` bool: table rows whose instruction some caption can pay (above delta)."""
        return self.ctx.registry.event_sim.max(axis=1) > self.cfg.env.delta

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON host state for checkpoints."""
        return {"counts": dict(self.generated)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generated = Counter(state.get("counts", {}))

    def generated_payload(self) -> dict[str, Any] | None:
        """Contents of the method's generated-instruction file (:attr:`MethodSpec.generated_file`;
        ``None``: the method writes none)."""
        return None

    def close(self) -> None:
        """Stop background workers (LLM clients)."""


class Cosine(TrainingMethod):
    """``cosine``: PQN with the cosine reward on the 22 original instructions."""


class GroundTruth(TrainingMethod):
    """``gt``: PQN with the ground-truth reward (the instruction's achievement) on the 22 original instructions."""

    def payable_rows(self) -> np.ndarray:
        return self.ctx.registry.achievement >= 0
