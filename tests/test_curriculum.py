"""``oir_gym.InstructionCurriculum``: the step after relabeling, one for every trainer. Its rows,
buffer inserts and metrics, its failure paths, and that PQN's method and the SB3 callback leave
the same instruction buffer after the same results."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import oir_gym
from oir_gym.captions import NUM_EVENTS
from oir_gym.buffer import InstructionBuffer
from oir_gym.curriculum import OFFER_METRICS, CurriculumConfig, InstructionCurriculum
from oir_gym.instruction_registry import InstructionRegistry
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.relabel import HindsightRelabeler
from oir_gym.relabel.synthetic import random_trajectories


@pytest.fixture(scope="module")
def results(encoder):
    trajs = random_trajectories(6, length=48, seed=2, texts=False)
    with HindsightRelabeler.rules(k=2, encoder=encoder) as rl:
        return rl.relabel(trajs)


def _curriculum(encoder, **kw) -> InstructionCurriculum:
    buf = InstructionBuffer(8, 0.1, 0.9, initial=list(ORIGINAL_INSTRUCTIONS)[:3], seed=0)
    return InstructionCurriculum([buf], InstructionRegistry(encoder, capacity=64), CurriculumConfig(k=2, **kw))


def test_apply_gives_rows_inserts_and_the_documented_metrics(encoder, results):
    cur = _curriculum(encoder)
    offer = cur.apply(results, now=0, rows_per_group=5)
    assert len(offer.rows) == 1 and len(offer.rows[0]) == 5
    grounded = [row.candidate.grounded for row in offer.rows[0]]
    assert grounded == sorted(grounded, reverse=True)  # grounded rows first
    assert set(offer.metrics) == set(OFFER_METRICS) and offer.metrics["relabel/rows"] == 5
    assert set(offer.inserted[0]) <= set(offer.offered[0]) and set(offer.inserted[0]) <= set(cur.buffers[0].contents())
    assert cur.buffers[0].num_tracked() == 0  # no hindsight return recorded for any candidate
    again = cur.apply(results, now=1)
    assert again.metrics["relabel/new_instructions"] == 0  # offered before
    state = cur.state_dict()
    fresh = _curriculum(encoder)
    fresh.load_state_dict(state)
    assert fresh.diversity() == cur.diversity() and fresh.report() == cur.report()


def test_bad_input_is_refused_with_what_to_fix(encoder, results):
    with pytest.raises(ValueError, match="k=0 must be an integer >= 1"):
        CurriculumConfig(k=0)
    with pytest.raises(ValueError, match="grounding='soft'"):
        CurriculumConfig(k=1, grounding="soft")
    with pytest.raises(TypeError, match="InstructionBuffer"):
        InstructionCurriculum([], None, CurriculumConfig(k=1))
    cur = _curriculum(encoder)
    results[0].trajectory.meta["seed"] = 3
    try:
        with pytest.raises(ValueError, match=r"meta\['seed'\]=3, but the curriculum holds 1 buffer"):
            cur.apply(results)
    finally:
        del results[0].trajectory.meta["seed"]
    from oir_gym.relabel.results import Candidate, RelabelResult
    bare = RelabelResult(results[0].trajectory, [Candidate("collect wood", "llm", 0, True, 0.9)])
    with pytest.raises(ValueError, match="carries no embedding or grounding rows"):
        cur.apply([bare])
    assert cur.buffers[0].contents() == list(ORIGINAL_INSTRUCTIONS)[:3]  # refused before any insert


def test_pqn_method_and_sb3_callback_leave_the_same_buffer(encoder, results):
    """The same relabeling results through PQN's method ``oir`` and through the SB3 callback: the
    same texts in the same buffer order, and neither records a return for a candidate."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("jax")
    from stable_baselines3 import DQN

    from agents.pqn.config import preset
    from agents.pqn.methods import MethodContext
    from agents.pqn.oir_method import OIRRelabeling
    from curriculum_golden import Delivered
    from oir_gym.sb3 import HindsightRelabelCallback, SB3VecEnv
    from oir_gym.vector_env import InstructionCraftax

    venv = SB3VecEnv(InstructionCraftax(num_envs=2, seed=0, max_episode_steps=50, encoder=encoder))
    try:
        model = DQN("MultiInputPolicy", venv, learning_starts=10**9, buffer_size=100)
        with HindsightRelabeler.rules(k=2, encoder=encoder) as rl:
            cb = HindsightRelabelCallback(rl, mode="curriculum", asynchronous=False)
            cb.init_callback(model)
            env_buf = venv.buffer
            # three original instructions, solved: the relabeled texts have room and take their places
            env_buf.load_state_dict(InstructionBuffer(env_buf.capacity, env_buf.tau_low, env_buf.tau_high,
                                                      initial=["drink water", "eat plant", "wake up"]).state_dict())
            env_buf.record_many(env_buf.contents(), [1.0] * len(env_buf))
            start = env_buf.state_dict()
            cfg = preset("smoke").replace(**{"run.method": "oir", "pqn.num_envs": len(results), "oir.k": 2,
                                              "oir.instruction_buffer_size": env_buf.capacity,
                                              "oir.tau_low": env_buf.tau_low, "oir.tau_high": env_buf.tau_high})
            pqn_buf = InstructionBuffer(env_buf.capacity, env_buf.tau_low, env_buf.tau_high)
            pqn_buf.load_state_dict(start)
            ctx = MethodContext(cfg=cfg, S=1, seed_offset=0, registry=InstructionRegistry(encoder, capacity=128),
                                buffers=[pqn_buf], encoder=encoder, all_eval_texts=[], log=print)
            method = OIRRelabeling(ctx, Delivered())
            method.relabeler.now = (results, [])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                n = len(results)  # the rollout itself goes to the (delivering) relabeler only
                method.relabel({"instr": np.zeros((1, 1, n), np.int32), "events": np.zeros((1, 1, n, NUM_EVENTS), bool),
                                "action": np.zeros((1, 1, n)), "done": np.zeros((1, 1, n))}, update=0)
                cb.process_results(results)
            before = InstructionBuffer(env_buf.capacity, env_buf.tau_low, env_buf.tau_high)
            before.load_state_dict(start)
            assert env_buf.contents() == pqn_buf.contents() != before.contents()
            # no hindsight returns on either side: only the returns recorded above
            assert env_buf.num_tracked() == pqn_buf.num_tracked() == before.num_tracked()
            assert cb.metrics().keys() == set(OFFER_METRICS)
    finally:
        venv.close()


def test_the_curriculum_is_public():
    assert oir_gym.InstructionCurriculum is InstructionCurriculum
    assert {"InstructionCurriculum", "CurriculumConfig", "Offer"} <= set(oir_gym.__all__)
