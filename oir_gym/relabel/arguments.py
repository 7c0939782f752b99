"""Checks of the relabeler's arguments: a caller's mistake raises here, naming the argument."""

from __future__ import annotations

from typing import Any, Iterable

from oir_gym.relabel.composite import CompositeBackend
from oir_gym.relabel.config import RelabelerConfig
from oir_gym.relabel.rules import RuleBackend
from oir_gym.trajectory import Trajectory
from oir_gym.validation import ArgumentTypeError, check_instance, show


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


def check_trajectories(trajectories: Any) -> list[Trajectory]:
    """The batch as a list of :class:`Trajectory`; anything else raises."""
    if isinstance(trajectories, (Trajectory, str, bytes, dict)) or not isinstance(trajectories, Iterable):
        raise ArgumentTypeError(f"trajectories={show(trajectories)} must be a list of oir_gym.Trajectory "
                                f"(e.g. TrajectoryRecorder(envs).trajectories()), got {type(trajectories).__name__}")
    trajs = list(trajectories)
    for i, t in enumerate(trajs):
        if not isinstance(t, Trajectory):
            raise ArgumentTypeError(f"trajectories[{i}]={show(t)} must be an oir_gym.Trajectory, got {type(t).__name__}")
    return trajs


def check_objects(*, llm: Any, encoder: Any, rules: Any) -> None:
    """Raise for an object argument of the wrong kind."""
    if not (llm is None or isinstance(llm, CompositeBackend) or callable(getattr(llm, "generate", None))):
        raise ArgumentTypeError(f"llm={show(llm)} must be an object with a generate() method (the backend "
                                "protocol), a CompositeBackend, or None (build config.llm.backend)")
    if encoder is not None and not callable(getattr(encoder, "encode", None)):
        raise ArgumentTypeError(f"encoder={show(encoder)} must have an encode(list[str]) -> [n, dim] array method "
                                "(e.g. oir_gym.get_encoder()) or be None")
    check_instance("rules", rules, RuleBackend, none_ok=True)
