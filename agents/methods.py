"""The per-method part of a PQN iteration, behind one small interface.

:class:`~agents.oir.Trainer` runs what every method shares (rollout, return bookkeeping, the
PQN update, evaluation, checkpoints) and asks its :class:`TrainingMethod` for the rest:

* which instructions new episodes draw (:meth:`TrainingMethod.buffer_rows`),
* the update batch built from a rollout, and the method's own metrics (:meth:`TrainingMethod.update_batch`),
* which instruction-table rows can pay a reward (:meth:`TrainingMethod.payable_rows`),
* its host state for checkpoints (:meth:`TrainingMethod.state_dict`) and the contents of the file
  of generated instructions it writes (:meth:`TrainingMethod.generated_payload`).

The methods: :class:`GroundTruth` (``gt``) and :class:`Cosine` (``cosine``) here, which train on
the 22 original instructions; :class:`agents.oir_method.OIRRelabeling` (``oir``) and
:class:`agents.ellm.ELLMProposals` (``ellm``). A method is built from a :class:`MethodContext`, the
narrow part of the run it may use, and holds no Trainer; this module and the methods import
nothing of the trainer. What the trainer needs to know of a method before it builds one (reward,
table size, generated file) and how to build it is a :class:`MethodSpec`, one per method name in
:data:`agents.oir.METHOD_SPECS`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from agents.config import TrainConfig
    from oir_gym.buffer import InstructionBuffer
    from oir_gym.instruction_registry import InstructionRegistry


@dataclass(frozen=True)
class MethodContext:
    """What a training method may use of the run that trains it; the trainer
    (:class:`agents.oir.Trainer`) builds one for its method, a test can build one without a trainer.

    Fixed values are held as they are; what changes while training (the update count, the envs'
    state, the original instructions' rows, which a loaded checkpoint's table may move) is read
    through a call. The registry and the buffers are the run's own objects: a method registers
    instructions in the one and inserts into the others.
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
    #: the table rows of the 22 original instructions
    orig_rows: Callable[[], np.ndarray]
    #: updates done so far
    update_idx: Callable[[], int]
    #: the envs' block state (:mod:`oir_gym.functional`), read and replaced between updates (ELLM
    #: pins its goals there)
    get_env_state: Callable[[], Any]
    set_env_state: Callable[[Any], None]
    #: ``build_batch(trajs, slots=None)``: the update batch of all seeds from a rollout (or recent
    #: rollouts, newest first, with relabel ``slots``; :meth:`agents.oir.Trainer.build_batch`)
    build_batch: Callable[..., dict]
    #: table rows that must not be reused for new instructions (:meth:`agents.oir.Trainer.protected_rows`)
    protected_rows: Callable[[], list[int]]


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
    """One training method as the trainer looks it up by name (:data:`agents.oir.METHOD_SPECS`)."""

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

    # ------------------------------------------------------------ per iteration
    def buffer_rows(self, seed: int) -> np.ndarray:
        """Table rows new episodes of seed ``seed`` draw their instruction from."""
        return self.ctx.orig_rows()

    def update_batch(self, traj: dict, host: dict) -> tuple[dict, dict[str, float]]:
        """The PQN update batch from this iteration's rollout, and the method's metrics.

        Args:
            traj: the rollout on device (leaves ``[S, T, E, ...]``, see :func:`agents.oir.make_rollout`).
            host: host copies of ``instr``, ``events``, ``action``, ``done``, ``reward``, ``ep_return``, ``success``.
        """
        return self.ctx.build_batch(traj), {}

    def warmup_batch(self, traj: dict) -> dict:
        """An update batch shaped as :meth:`update_batch`'s, from a rollout of zeros and nothing
        relabeled: what :meth:`agents.oir.Trainer.start_compiling` compiles the batch and update
        programs with (no host work, no state touched)."""
        return self.ctx.build_batch(traj)

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
