"""The per-method part of a PQN iteration, behind one small interface.

:class:`~agents.oir.Trainer` runs what every method shares (rollout, return bookkeeping, the
PQN update, evaluation, checkpoints) and asks its :class:`TrainingMethod` for the rest:

* which instructions new episodes draw (:meth:`TrainingMethod.buffer_rows`),
* the update batch built from a rollout, and the method's own metrics (:meth:`TrainingMethod.update_batch`),
* which instruction-table rows can pay a reward (:meth:`TrainingMethod.payable_rows`),
* its host state for checkpoints (:meth:`TrainingMethod.state_dict`) and the file of generated
  instructions it writes (:meth:`TrainingMethod.generated_payload`).

The methods: :class:`GroundTruth` (``gt``) and :class:`Cosine` (``cosine``) here, which train on
the 22 original instructions; :class:`agents.oir_method.OIRRelabeling` (``oir``) and
:class:`agents.ellm.ELLMProposals` (``ellm``). A method talks to the trainer only through
:class:`MethodContext`, so this module and the methods import nothing of the trainer.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from agents.config import TrainConfig


class MethodContext(Protocol):
    """What a training method may see of the trainer that runs it (:class:`agents.oir.Trainer`
    provides it): the run's config and seeds, the instruction table and buffers, the encoder,
    the batch builder, the protected rows and the envs' state. A method reads and calls these;
    the only state it writes back is :attr:`env_state` (ELLM pins its goals there)."""

    cfg: "TrainConfig"
    #: seeds of this process
    S: int
    registry: Any
    buffers: list
    encoder: Any
    #: table rows of the 22 original instructions
    orig_rows: np.ndarray
    #: updates done so far
    update_idx: int
    log: Callable[[str], None]
    #: the envs' state (``oir_gym.functional`` block state), read and replaced between updates
    env_state: Any

    @property
    def seed_offset(self) -> int: ...

    @property
    def all_eval_texts(self) -> list[str]: ...

    def build_batch(self, trajs: Any, slots: dict | None = None) -> dict: ...

    def protected_rows(self) -> list[int]: ...

    def unpayable_frac(self, instr_rows: np.ndarray) -> float: ...


class TrainingMethod:
    """Train on the original instructions with the env's reward (the base of every method).

    Args:
        trainer: the trainer this method belongs to, seen through :class:`MethodContext`.
    """

    name: ClassVar[str] = ""
    #: the env's reward: 0 cosine similarity of captions to the instruction, 1 the ground truth
    reward_mode: ClassVar[int] = 0
    #: file of the instructions this method generated (``None``: none)
    generated_file: ClassVar[str | None] = None

    def __init__(self, trainer: MethodContext) -> None:
        self.trainer = trainer
        self.cfg = trainer.cfg
        #: generated instruction text -> count (oir: offered to the buffers; ellm: proposed)
        self.generated: Counter = Counter()

    # ------------------------------------------------------------ sizes (before the trainer exists)
    @staticmethod
    def table_capacity(cfg: "TrainConfig", n_eval: int) -> int:
        """Rows of the instruction table this method needs (``n_eval`` evaluation rows included)."""
        return cfg.env.table_capacity

    @staticmethod
    def also_pays_slots(cfg: "TrainConfig") -> int:
        """Extra rows per env whose captions also pay (ELLM's other proposed goals); 0 for the rest."""
        return 0

    # ------------------------------------------------------------ per iteration
    def buffer_rows(self, seed: int) -> np.ndarray:
        """Table rows new episodes of seed ``seed`` draw their instruction from."""
        return self.trainer.orig_rows

    def update_batch(self, traj: dict, host: dict) -> tuple[dict, dict[str, float]]:
        """The PQN update batch from this iteration's rollout, and the method's metrics.

        Args:
            traj: the rollout on device (leaves ``[S, T, E, ...]``, see :func:`agents.oir.make_rollout`).
            host: host copies of ``instr``, ``events``, ``action``, ``done``, ``reward``, ``ep_return``, ``success``.
        """
        return self.trainer.build_batch(traj), {}

    def warmup_batch(self, traj: dict) -> dict:
        """An update batch shaped as :meth:`update_batch`'s, from a rollout of zeros and nothing
        relabeled: what :meth:`agents.oir.Trainer.start_compiling` compiles the batch and update
        programs with (no host work, no state touched)."""
        return self.trainer.build_batch(traj)

    def payable_rows(self) -> np.ndarray:
        """``[capacity]`` bool: table rows whose instruction some caption can pay (above delta)."""
        reg = self.trainer.registry
        return reg.event_sim.max(axis=1) > self.cfg.env.delta

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON host state for checkpoints."""
        return {"counts": dict(self.generated)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generated = Counter(state.get("counts", {}))

    def generated_payload(self) -> dict[str, Any] | None:
        """Contents of :attr:`generated_file` (``None``: the method writes none)."""
        return None

    def close(self) -> None:
        """Stop background workers (LLM clients)."""


class Cosine(TrainingMethod):
    """``cosine``: PQN with the cosine reward on the 22 original instructions."""

    name = "cosine"


class GroundTruth(TrainingMethod):
    """``gt``: PQN with the ground-truth reward (the instruction's achievement) on the 22 original instructions."""

    name = "gt"
    reward_mode = 1

    def payable_rows(self) -> np.ndarray:
        return self.trainer.registry.achievement >= 0
