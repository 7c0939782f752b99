"""Training methods are built by name from a narrow context of plain data
(``agents.pqn.methods.MethodContext``), not from the Trainer: a method works from a context made without
any trainer, hands back what to train on (``MethodStep``), and the trainer's own method keeps no
Trainer."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from agents.pqn.config import METHODS, preset  # noqa: E402
from agents.pqn.methods import Cosine, GroundTruth, MethodContext, MethodStep  # noqa: E402
from agents.pqn.trainer import METHOD_SPECS, Trainer, method_spec  # noqa: E402
from agents.pqn.oir_method import OIRRelabeling  # noqa: E402
from oir_gym.buffer import InstructionBuffer  # noqa: E402
from oir_gym.encoder import get_encoder  # noqa: E402
from oir_gym.instruction_registry import InstructionRegistry  # noqa: E402
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS  # noqa: E402
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory  # noqa: E402


def test_every_configurable_method_has_a_spec_and_an_unknown_name_is_refused():
    assert tuple(METHOD_SPECS) == METHODS
    assert (method_spec("gt").reward_mode, method_spec("cosine").reward_mode) == (1, 0)
    assert [method_spec(m).generated_file for m in METHODS] == [None, None, "instructions.json", "goals.json"]
    with pytest.raises(ValueError, match=r"run.method='ppo'; expected one of \('gt', 'cosine', 'oir', 'ellm'\)"):
        method_spec("ppo")


def test_methods_are_built_from_a_context_without_a_trainer():
    cfg = preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "rules", "pqn.num_envs": 2, "oir.k": 4})
    encoder = get_encoder()
    registry = InstructionRegistry(encoder, capacity=cfg.env.table_capacity)
    orig = registry.rows(list(ORIGINAL_INSTRUCTIONS), list(range(len(ORIGINAL_INSTRUCTIONS))))
    buffers = [InstructionBuffer(cfg.oir.instruction_buffer_size, cfg.oir.tau_low, cfg.oir.tau_high, seed=0)]
    ctx = MethodContext(cfg=cfg, S=1, seed_offset=0, registry=registry, buffers=buffers, encoder=encoder,
                        all_eval_texts=[], log=print)

    gt = method_spec("gt").factory(ctx, None, None)
    assert type(gt) is GroundTruth and gt.ctx is ctx
    assert gt.draw_texts(0) is None  # new episodes draw the 22 originals
    assert gt.payable_rows()[orig].all() and gt.payable_rows().sum() == len(orig)
    assert gt.step(5, {}, None) == MethodStep({})  # nothing relabeled, no goals: the batch is the rollout
    assert type(method_spec("cosine").factory(ctx, None, None)) is Cosine

    oir = method_spec("oir").factory(ctx, None, None)  # its rule relabeler built from ctx.cfg
    assert type(oir) is OIRRelabeling
    trajs = [make_trajectory(WOOD_TABLE_PICKAXE, cfg.pqn.num_steps, texts=False, seed=e, env_id=e) for e in range(2)]
    host = {"events": np.stack([t.events for t in trajs], axis=1)[None],  # [S, T, E, Ev]
            "action": np.stack([t.actions for t in trajs], axis=1)[None],
            "done": np.stack([t.dones for t in trajs], axis=1)[None],
            "instr": np.broadcast_to(orig[0], (1, cfg.pqn.num_steps, 2))}
    try:
        assert {t.meta["update"] for t in oir.trajectories(host, 5)} == {5}
        step = oir.step(5, host, None)
        stats, slots = step.metrics, step.slots
        assert stats["relabel/rows"] > 0 and (np.asarray(slots["src"]) == 0).all()  # this rollout's copies
        assert step.pinned is None and step.also_pays is None
        assert "make wood pickaxe" in buffers[0].contents()  # grounded candidates went into the context's buffer
        assert oir.draw_texts(0) == buffers[0].contents()
        assert oir.state_dict()["offers"]["total"] > 0
    finally:
        oir.close()


def test_the_trainers_method_holds_no_reference_to_the_trainer(tmp_path):
    """The method's context is plain data (no calls back into the trainer): nothing the method
    holds keeps the Trainer alive."""
    cfg = preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "rules"})
    tr = Trainer(cfg, tmp_path, log=lambda s: None)
    method = tr.method
    assert method.ctx.registry is tr.registry and method.ctx.buffers is tr.buffers
    assert [f.name for f in dataclasses.fields(method.ctx) if callable(getattr(method.ctx, f.name))] == ["log"]
    assert not any(v is tr for v in vars(method).values())
    assert sorted(method.ctx.protected_rows()) == sorted(tr.protected_rows())  # the same rule, from data
    alive = weakref.ref(tr)
    del tr
    gc.collect()
    try:
        assert alive() is None
    finally:
        method.close()
