"""BackgroundRelabeler: "LLM + rules" (``both``) means the rules at once and the LLM's answers later.

The LLM of the first tests is :class:`Gated`, a scripted backend whose answers (one wording of its
own, one repeating a rule instruction) wait until the test releases them, so "later" is a step the
test controls instead of a race. The factory test runs :class:`llm_child_backends.SegmentsBackend`,
a real (tiny) backend in a child process. The hung LLM of the close test is a child process that
never answers (fault injection: a real model cannot hang on demand).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from oir_gym.encoder import get_encoder
from oir_gym.relabel import HindsightRelabeler, RelabelerConfig
from oir_gym.relabel.background import BackgroundRelabeler
from oir_gym.relabel.llm.child import ChildConfig
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory


#: one wording of the LLM's own and one the rules also give for :func:`traj`
ANSWER = json.dumps({"Mid-Level": ["chop down a tree to get some wood", "collect wood"], "High-Level": []})


class Gated:
    """Answers :data:`ANSWER` once :attr:`gate` is set (counts the prompts it read)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.prompts = 0

    def generate(self, prompts, n=1, *, schema=None):
        self.started.set()
        assert self.gate.wait(30), "the test never released the LLM"
        self.prompts += len(prompts)
        return [[ANSWER] * n for _ in prompts]


@pytest.fixture(scope="module")
def encoder():
    return get_encoder()


def traj(shift: int = 0):
    return make_trajectory([(t + shift, e) for t, e in WOOD_TABLE_PICKAXE], 128, seed=shift)


def llm_half(llm, encoder, **settings) -> HindsightRelabeler:
    """The LLM relabeler of ``both`` as agents.run.relabeling builds it: no rules of its own, no fallback,
    one queued batch, the oldest dropped when full."""
    cfg = RelabelerConfig()
    cfg.selection.use_rules = False
    cfg.llm.fallback, cfg.llm.queue_size, cfg.llm.on_full = "none", 1, "replace"
    cfg.cache.size = 0
    for name, value in settings.items():
        setattr(cfg.llm, name, value)
    return HindsightRelabeler(cfg, llm=llm, encoder=encoder)


def test_the_rules_answer_at_once_and_the_llm_answers_join_when_they_arrive(encoder):
    llm = Gated()
    with BackgroundRelabeler(HindsightRelabeler.rules(k=4, encoder=encoder), llm_half(llm, encoder)) as bg:
        t = traj()
        bg.submit([t])
        rules = bg.collect()
        assert len(rules) == 1 and rules[0].trajectory is t and rules[0].candidates
        assert {c.source for c in rules[0].candidates} == {"rules"}
        assert bg.pending == 1 and bg.collect() == []  # the LLM has not answered
        llm.gate.set()
        (late,) = bg.collect(block=True, timeout=30)
        assert late.trajectory is t and late.error is None
        # "collect wood" is the rules' already: a second copy of the same relabeled row, dropped
        assert "collect wood" in rules[0].instructions
        assert late.instructions == ["chop down a tree to get some wood"]
        assert {c.source for c in late.candidates} == {"llm"}
        s = bg.stats()
        assert (s["rules_results"], s["llm_results"], s["llm_repeats_rules"], s["pending"]) == (1, 1, 1, 0)
        assert s["calls"] == 1 and llm.prompts == 1


def test_a_full_llm_queue_drops_its_oldest_batch_and_counts_it(encoder):
    llm = Gated()
    bg = BackgroundRelabeler(HindsightRelabeler.rules(k=4, encoder=encoder), llm_half(llm, encoder))
    a, b, c = [traj(s) for s in (0, 3, 6)]
    bg.submit([a])
    assert llm.started.wait(30)  # the worker holds a in its LLM call
    bg.submit([b])  # queued
    bg.submit([c])  # the queue holds one batch: b is dropped, c queued
    rules, _ = bg.collect_by_source()
    assert [r.trajectory for r in rules] == [a, b, c]  # every trajectory got the rules' answer
    llm.gate.set()
    _, late = bg.collect_by_source(block=True, timeout=30)
    assert sorted(id(r.trajectory) for r in late) == sorted([id(a), id(c)])
    assert bg.stats()["overflow_replaced"] == 1 and bg.pending == 0
    bg.close()


def test_lagged_rules_arrive_with_the_next_batch(encoder):
    with BackgroundRelabeler(HindsightRelabeler.rules(k=2, encoder=encoder), rules_lag=1) as bg:
        a, b = traj(0), traj(2)
        assert bg.relabel([a]) == []
        assert [r.trajectory for r in bg.relabel([b])] == [a]
        assert bg.check_llm() is None and bg.pending == 0


def test_close_is_bounded_while_the_llm_hangs(encoder):
    grace = 1.0
    hung = llm_half(None, encoder, backend="llm_child_backends:HangsInGenerate",
                    child_config=ChildConfig(timeout=3600, grace=grace))
    bg = BackgroundRelabeler(HindsightRelabeler.rules(k=2, encoder=encoder), hung)
    bg.submit([traj(0)])
    bg.submit([traj(1)])
    t0 = time.monotonic()
    bg.close(timeout=1.0)
    assert time.monotonic() - t0 < 1.0 + 3 * grace + 1 + 2  # close's documented bound, with slack
    with pytest.raises(RuntimeError, match="closed"):
        bg.submit([traj(2)])


def test_bad_arguments():
    with pytest.raises(ValueError, match="needs a rule relabeler"):
        BackgroundRelabeler()
    with pytest.raises(ValueError, match="rules_lag"):
        BackgroundRelabeler(object(), rules_lag=2)
    with pytest.raises(TypeError, match="submit"):
        BackgroundRelabeler(None, object())


def test_both_trainers_build_the_same_both(tmp_path):
    """The PQN and SB3 trainers' ``both``: one factory, the same two halves and queue policy."""
    from agents.sb3 import models as sb3_agents
    from agents.run.config import LLMConfig
    from agents.pqn.config import preset
    from agents.pqn.trainer import make_relabeler as pqn_relabeler

    backend = "llm_child_backends:SegmentsBackend"
    pqn = pqn_relabeler(preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "both",
                                                    "llm.backend": backend}))
    sb3 = sb3_agents.make_relabeler("both", llm=LLMConfig(backend=backend))
    try:
        for bg in (pqn, sb3):
            assert isinstance(bg, BackgroundRelabeler)
            assert isinstance(bg.rules, HindsightRelabeler) and bg.rules.backend.llm is None
            lc = bg.llm.config.llm
            assert (bg.llm.use_rules, lc.fallback, lc.queue_size, lc.on_full) == (False, "none", 1, "replace")
        assert isinstance(sb3_agents.make_relabeler("rules").rules, HindsightRelabeler)
        assert sb3_agents.make_relabeler("none") is None
        (r,) = sb3.relabel([traj()])
        assert r.candidates and {c.source for c in r.candidates} == {"rules"}
        late = sb3.collect(block=True, timeout=120)
        assert len(late) == 1 and late[0].error is None
        assert all(c.source == "llm" for c in late[0].candidates)
    finally:
        pqn.close()
        sb3.close()
