"""The PQN training methods by name (:data:`METHOD_SPECS`) and the factories of the relabeler and the
goal proposer a config names."""

from __future__ import annotations

from typing import Any

from agents.pqn import ellm, ellm_proposer
from agents.pqn.config import TrainConfig
from agents.pqn.ellm import ELLMProposals
from agents.pqn.methods import Cosine, GroundTruth, MethodSpec
from agents.pqn.oir_method import OIRRelabeling
from agents.run import relabeling
from oir_gym.encoder import get_encoder


#: ``run.method`` (:data:`agents.pqn.config.METHODS`) -> how the trainer builds the method
METHOD_SPECS: dict[str, MethodSpec] = {
    "gt": MethodSpec(lambda ctx, relabeler, proposer: GroundTruth(ctx), reward_mode=1),
    "cosine": MethodSpec(lambda ctx, relabeler, proposer: Cosine(ctx)),
    "oir": MethodSpec(lambda ctx, relabeler, proposer: OIRRelabeling(
        ctx, relabeler or make_relabeler(ctx.cfg, ctx.encoder)), generated_file="instructions.json"),
    "ellm": MethodSpec(lambda ctx, relabeler, proposer: ELLMProposals(ctx, proposer or make_proposer(ctx.cfg)),
                       generated_file="goals.json", table_capacity=ellm.table_capacity,
                       also_pays_slots=ellm.also_pays_slots),
}


def method_spec(name: str) -> MethodSpec:
    """The :class:`~agents.pqn.methods.MethodSpec` of method ``name`` (ValueError naming the known ones)."""
    if name not in METHOD_SPECS:
        raise ValueError(f"run.method={name!r}; expected one of {tuple(METHOD_SPECS)}")
    return METHOD_SPECS[name]


def make_proposer(cfg: TrainConfig):
    """The ELLM goal proposer of ``cfg.ellm.proposer`` (:func:`agents.pqn.ellm_proposer.make_proposer`)."""
    return ellm_proposer.make_proposer(cfg.ellm.proposer, cfg.llm, k=cfg.ellm.k, timeout=cfg.ellm.timeout,
                                    max_prompts=cfg.llm.per_update * cfg.run.num_seeds)


def make_relabeler(cfg: TrainConfig, encoder: Any = None):
    """The relabeler of ``cfg.oir.relabeler`` (:func:`agents.run.relabeling.make_relabeler`; an LLM is
    checked with one real call); with ``oir.relabel_balance`` the rules keep every grounded event."""
    from oir_gym.relabel.parallel import default_workers

    o = cfg.oir
    options = relabeling.RelabelerOptions(
        keep_ungrounded=o.keep_ungrounded, oracle_pool=o.oracle_pool, seed=cfg.run.seed,
        eval_files=cfg.eval.instruction_files, rules_k=64 if o.relabel_balance else o.k,
        workers=default_workers() if o.relabel_workers < 0 else o.relabel_workers,
        batch=cfg.run.num_seeds * cfg.pqn.num_envs, rules_lag=o.relabel_lag, flag="--oir.relabeler")
    return relabeling.make_relabeler(o.relabeler, o, cfg.llm, delta=cfg.env.delta, encoder=encoder or get_encoder(),
                                     options=options)
