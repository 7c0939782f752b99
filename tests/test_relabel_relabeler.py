"""HindsightRelabeler: grounding, selection, cache, async mode and failure policies.

The LLM is replaced here by small scripted backend objects: a backend that returns a fixed
answer, one that raises and one that sleeps are *fault injection* for failures a real model
cannot produce on demand (the real models are exercised in ``test_relabel_llm.py``).
"""

from __future__ import annotations

import json
import threading
import time
import warnings

import numpy as np
import pytest

from oir_gym.encoder import get_encoder
from oir_gym.relabel import HindsightRelabeler, RelabelResult
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from relabel_config import relabel_config

ANSWER = json.dumps({"Mid-Level": ["collect wood from the tree", "make iron sword", "walk to the tree"],
                     "High-Level": ["collect wood then place a table"]})


class Scripted:
    """Returns a fixed answer and counts calls/prompts."""

    def __init__(self, answer: str = ANSWER, delay: float = 0.0) -> None:
        self.answer, self.delay = answer, delay
        self.calls = 0
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def generate(self, prompts, n=1, *, schema=None):
        with self.lock:
            self.calls += 1
            self.prompts += prompts
        if self.delay:
            time.sleep(self.delay)
        return [[self.answer] * n for _ in prompts]


class Raising:
    """Fault injection: a backend whose every call fails."""

    calls = 0

    def generate(self, prompts, n=1, *, schema=None):
        self.calls += 1
        raise ConnectionError("LLM server exploded")


@pytest.fixture(scope="module")
def encoder():
    return get_encoder()


def wtp(shift: int = 0, seed: int = 0, length: int = 128):
    return make_trajectory([(t + shift, e) for t, e in WOOD_TABLE_PICKAXE], length, seed=seed)


def by_text(res: RelabelResult) -> dict:
    return {c.text: c for c in res.candidates}


def test_grounding_rules_only(encoder):
    rl = HindsightRelabeler(relabel_config("rules", k=8), encoder=encoder)
    (res,) = rl.relabel([wtp()])
    c = by_text(res)
    assert c["collect wood"].grounded and c["collect wood"].first_step == 5
    assert c["place table"].first_step == 12 and c["make wood pickaxe"].first_step == 14
    assert all(x.source == "rules" for x in res.candidates)
    assert c["collect wood"].similarity > 0.99
    assert rl.stats()["calls"] == 0


def test_grounding_llm_candidates_and_selection(encoder):
    llm = Scripted()
    rl = HindsightRelabeler(relabel_config(k=10), llm=llm, encoder=encoder)
    (res,) = rl.relabel([wtp()])
    c = by_text(res)
    assert c["collect wood from the tree"].source == "llm" and c["collect wood from the tree"].first_step == 5
    iron = c["make iron sword"]
    assert not iron.grounded and iron.first_step == -1 and iron.similarity < 0.9
    assert "walk to the tree" not in c and res.dropped["forbidden_word"] == 1
    # grounded first (LLM before rules), ungrounded after
    flags = [x.grounded for x in res.candidates]
    assert flags == sorted(flags, reverse=True)
    assert res.candidates[0].text == "collect wood from the tree"
    assert res.num_scored == len(res.candidates) and res.num_grounded == sum(flags)
    assert 0 < rl.stats()["grounded_fraction"] < 1
    # k limits, ungrounded can be excluded
    assert len(HindsightRelabeler(relabel_config(k=2), llm=llm, encoder=encoder)([wtp()])[0].candidates) == 2
    strict = HindsightRelabeler(relabel_config(k=10, keep_ungrounded=False), llm=llm, encoder=encoder)
    assert all(x.grounded for x in strict([wtp()])[0].candidates)


def test_cache_hits_on_identical_behaviour(encoder):
    llm = Scripted()
    rl = HindsightRelabeler(relabel_config(), llm=llm, encoder=encoder)
    first = rl.relabel([wtp()])[0]
    again = rl.relabel([wtp()])[0]
    shifted = rl.relabel([wtp(shift=9, seed=4)])[0]  # same events, other timing -> same key
    assert llm.calls == 1
    assert not first.cache_hit and again.cache_hit and shifted.cache_hit
    assert shifted.candidates[0].first_step == 5 + 9  # grounding is per trajectory, not cached
    # one prompt for identical behaviour within a batch
    rl2 = HindsightRelabeler(relabel_config(), llm=llm, encoder=encoder)
    rl2.relabel([wtp(), wtp(seed=1), wtp(seed=2)])
    assert len(llm.prompts) == 2
    s = rl.stats()
    assert s["cache_hits"] == 2 and s["cache_misses"] == 1 and s["cache_hit_rate"] == pytest.approx(2 / 3)


def test_cache_persisted(tmp_path, encoder):
    path = tmp_path / "relabel_cache.json"
    llm = Scripted()
    with HindsightRelabeler(relabel_config(cache_path=path), llm=llm, encoder=encoder) as rl:
        rl.relabel([wtp()])
    assert path.is_file()
    rl2 = HindsightRelabeler(relabel_config(cache_path=path), llm=llm, encoder=encoder)
    assert rl2.relabel([wtp()])[0].cache_hit and llm.calls == 1
    path.write_text("{ corrupt")
    rl3 = HindsightRelabeler(relabel_config(cache_path=path), llm=llm, encoder=encoder)
    assert rl3.cache.load_error and len(rl3.cache) == 0


def test_a_cache_that_cannot_be_saved_is_counted_and_warned_once_not_an_llm_error(tmp_path, encoder):
    """A real filesystem fault: the cache's folder is a file. Relabeling goes on from memory."""
    (tmp_path / "not_a_folder").write_text("")
    llm = Scripted()
    rl = HindsightRelabeler(relabel_config(cache_path=tmp_path / "not_a_folder" / "cache.json", cache_save_every=1),
                            llm=llm, encoder=encoder)
    with pytest.warns(RuntimeWarning, match="could not save the relabel cache"):
        rl.relabel([wtp()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second failure is counted, not warned again
        rl.save_cache()
    s = rl.stats()
    assert s["cache_save_failures"] >= 2 and s["errors"] == 0 and s["errors_by_type"] == {}
    assert rl.relabel([wtp()])[0].cache_hit  # the cache still works in memory
    assert rl.cache.dirty >= 1  # the unsaved entries stay due: once the folder exists, the next save writes them
    (tmp_path / "not_a_folder").unlink()
    (tmp_path / "not_a_folder").mkdir()
    rl.save_cache()
    assert (tmp_path / "not_a_folder" / "cache.json").is_file() and rl.cache.dirty == 0
    assert HindsightRelabeler(relabel_config(cache_path=tmp_path / "not_a_folder" / "cache.json"), llm=llm,
                              encoder=encoder).relabel(
        [wtp()])[0].cache_hit


def test_idle_trajectories_skip_the_llm(encoder):
    llm = Scripted()
    rl = HindsightRelabeler(relabel_config(), llm=llm, encoder=encoder)
    (res,) = rl.relabel([make_trajectory([], 64)])
    assert llm.calls == 0 and res.candidates == [] and rl.stats()["skipped_idle"] == 1


def test_fallback_to_rules_when_backend_raises(encoder):
    """Fault injection: the backend raises on every call."""
    rl = HindsightRelabeler(relabel_config(use_rules=False), llm=Raising(), encoder=encoder)
    (res,) = rl.relabel([wtp()])
    assert res.fallback == "rules" and "LLM server exploded" in res.error
    assert res.instructions[:3] == ["collect wood", "place table", "make wood pickaxe"]
    s = rl.stats()
    assert s["errors"] == 1 and s["fallbacks"] == 1 and s["errors_by_type"] == {"ConnectionError": 1}
    none = HindsightRelabeler(relabel_config(use_rules=False, fallback="none"), llm=Raising(), encoder=encoder)
    assert none.relabel([wtp()])[0].candidates == []
    assert len(none.cache) == 0  # failures are not cached


def test_llm_timeout_falls_back(encoder):
    """Fault injection: a backend that takes longer than ``llm_timeout``."""
    rl = HindsightRelabeler(relabel_config(llm_timeout=0.3), llm=Scripted(delay=3.0), encoder=encoder)
    t0 = time.perf_counter()
    (res,) = rl.relabel([wtp()])
    assert time.perf_counter() - t0 < 2.0
    assert res.fallback == "rules" and "llm_timeout" in res.error
    assert rl.stats()["errors_by_type"] == {"BackendTimeout": 1}
    # the stuck call still occupies the LLM thread: a batch without prompts must not wait for it
    t0 = time.perf_counter()
    assert rl.relabel([make_trajectory([], 16)])[0].error is None
    assert time.perf_counter() - t0 < 1.0
    rl.close()


def test_internal_error_does_not_raise():
    """Fault injection: an encoder that fails; the training loop gets empty results and a warning."""

    class BrokenEncoder:
        def encode(self, texts):
            raise MemoryError("no memory for embeddings")

    rl = HindsightRelabeler(relabel_config("rules"), encoder=BrokenEncoder())
    with pytest.warns(RuntimeWarning, match="relabeling failed"):
        (res,) = rl.relabel([wtp()])
    assert res.candidates == [] and "MemoryError" in res.error
    assert rl.stats()["errors_by_type"] == {"MemoryError": 1}


def test_async_submit_collect(encoder):
    gate = threading.Event()

    class Gated(Scripted):
        """Answers only once the test opens the gate, so 'still working' is a state, not a race."""

        def generate(self, prompts, n=1, *, schema=None):
            assert gate.wait(20)
            return super().generate(prompts, n, schema=schema)

    llm = Gated()
    rl = HindsightRelabeler(relabel_config(), llm=llm, encoder=encoder)
    ids1 = rl.submit([wtp(), make_trajectory([(3, "collect_drink")], 64)])
    ids2 = rl.submit([wtp(seed=5)])
    assert rl.collect() == [] and rl.pending == 3  # returns at once while the LLM is busy
    assert rl.collect(block=True, timeout=0.05) == [] and rl.pending == 3  # a timed-out wait returns nothing
    gate.set()
    out = rl.collect(block=True, timeout=20)
    assert sorted(r.request_id for r in out) == ids1 + ids2
    assert all(r.candidates for r in out)
    s = rl.stats()
    assert s["submitted"] == 3 and s["completed"] == 3 and s["pending"] == 0
    rl.close()
    with pytest.raises(RuntimeError):
        rl.submit([wtp()])


def test_async_fault_injection_keeps_worker_alive(encoder):
    """Fault injection: the backend raises inside the background worker."""
    rl = HindsightRelabeler(relabel_config(), llm=Raising(), encoder=encoder)
    rl.submit([wtp()])
    rl.submit([wtp(seed=2)])
    out = rl.collect(block=True, timeout=20)
    assert len(out) == 2 and all(r.fallback == "rules" and r.candidates for r in out)
    assert rl.stats()["errors"] == 2
    rl.close()


@pytest.mark.parametrize("policy", ["rules", "skip", "replace"])
def test_async_overflow_policy(policy, encoder):
    llm = Scripted(delay=0.5)
    rl = HindsightRelabeler(relabel_config(queue_size=1, on_full=policy, cache_size=0), llm=llm, encoder=encoder)
    ids = [rl.submit([wtp(seed=i)])[0] for i in range(5)]
    out = rl.collect(block=True, timeout=30)
    s = rl.stats()
    overflow = {"rules": s["overflow_rules"], "skip": s["overflow_skipped"], "replace": s["overflow_replaced"]}[policy]
    assert overflow >= 1
    got = sorted(r.request_id for r in out)
    if policy == "rules":
        assert len(out) == 5
        assert sum(r.fallback == "overflow" for r in out) == overflow
        assert all(r.candidates for r in out)
    else:
        assert len(out) == 5 - overflow
    if policy == "skip":
        assert ids[0] in got  # the first batch went straight to the worker; later ones were dropped
    if policy == "replace":
        assert ids[-1] in got  # the newest batch always survives
    rl.close()


def test_callable_and_stats_keys(encoder):
    rl = HindsightRelabeler(relabel_config(), llm=Scripted(), encoder=encoder)
    assert rl.instructions([wtp()])[0][0] == "collect wood from the tree"
    res = rl([wtp()])
    assert isinstance(res[0], RelabelResult)
    s = rl.stats()
    for key in ("calls", "cache_hits", "errors", "latency_mean_s", "prompt_tokens", "candidates",
                "dropped", "grounded_fraction", "prompt_token_method"):
        assert key in s
    assert s["prompt_tokens"] > 0 and s["dropped"]["forbidden_word"] >= 1
    with pytest.raises(ValueError):
        HindsightRelabeler(relabel_config("nope"), encoder=encoder)


def test_rule_compounds_that_pay_on_their_first_event_are_dropped_as_premature(encoder):
    """ "make stone pickaxe then place stone" scores above 0.9 against "make a stone pickaxe": the
    reward would pay it before the stone is placed. "place stone then make stone pickaxe" pays on
    its final event and is kept; the single-event instructions are untouched."""
    from oir_gym.relabel.rules import rule_final_event

    assert rule_final_event("make stone pickaxe then place stone") == rule_final_event("collect wood then place stone")
    assert rule_final_event("collect wood") is None and rule_final_event("sleep and wake up") is not None
    from oir_gym.relabel import RuleBackend

    # the consecutive "A then B" compounds (RuleBackend(compounds=True); prerequisite pairs included)
    rl = HindsightRelabeler(relabel_config("rules", k=16, keep_ungrounded=False), encoder=encoder,
                            rules=RuleBackend(compounds=True))
    script = [(5, "collect_stone"), (9, "make_stone_pickaxe"), (14, "place_stone"), (20, "make_stone_pickaxe")]
    (res,) = rl.relabel([make_trajectory(script, 64)])
    texts = {c.text for c in res.candidates}
    assert "collect stone" in texts and "make stone pickaxe" in texts and "place stone" in texts
    assert "place stone then make stone pickaxe" in texts
    # the reward compares single captions, so a compound pays at its final event's first occurrence,
    # here before its first half happened (ordered sub-goal rewards are not built)
    assert by_text(res)["place stone then make stone pickaxe"].first_step == 9
    assert "make stone pickaxe then place stone" not in texts  # premature
    assert "collect stone then make stone pickaxe" not in texts  # ungrounded: matches no caption above 0.9
    assert res.dropped["premature"] >= 1 and rl.stats()["dropped"]["premature"] >= 1


OWN_WORDS = json.dumps({"Mid-Level": ["chop down a tree for logs", "put down a crafting bench",
                                      "slay a dragon with a wand"],
                        "High-Level": ["chop down a tree for logs then put down a crafting bench",
                                       "put down a crafting bench then chop down a tree for logs"]})


def test_bound_grounding_binds_free_wording_to_its_events(encoder):
    """grounding="bound": the LLM's own wording binds to the event of the trajectory it names and
    pays exactly there; what names no event of the trajectory is dropped and counted; an "A then B"
    binds to an ordered pair, only in the order that happened."""
    from oir_gym.captions import EVENT_NAMES
    from oir_gym.grounding import Binding, paid_steps

    wood, table = EVENT_NAMES.index("collect_wood"), EVENT_NAMES.index("place_table")
    cosine = HindsightRelabeler(relabel_config(k=10, use_rules=False), llm=Scripted(OWN_WORDS), encoder=encoder)
    (res_cos,) = cosine.relabel([wtp()])
    assert res_cos.grounded == []  # own wordings never reach delta 0.9 against the captions

    rl = HindsightRelabeler(relabel_config(k=10, use_rules=False, grounding="bound"), llm=Scripted(OWN_WORDS),
                            encoder=encoder)
    traj = wtp()
    (res,) = rl.relabel([traj])
    c = by_text(res)
    assert c["chop down a tree for logs"].binding == Binding(final=wood, step=5)
    assert c["put down a crafting bench"].binding == Binding(final=table, step=12)
    pair = c["chop down a tree for logs then put down a crafting bench"]
    assert pair.binding == Binding(final=table, pre=wood, step=12)
    assert "slay a dragon with a wand" not in c  # nothing of the kind happened
    assert "put down a crafting bench then chop down a tree for logs" not in c  # wood came first only
    assert res.dropped["unbound"] == 2 and rl.stats()["dropped"]["unbound"] == 2
    # the carried rows pay exactly at the bound step on the trajectory
    starts = np.concatenate([[True], traj.dones[:-1]])
    for cand in res.candidates:
        paid = paid_steps(traj.events, cand.final_row, cand.pre_row, starts, rl.delta)
        assert np.flatnonzero(paid)[0] == cand.first_step == cand.binding.step
        assert cand.emb.shape == (encoder.dim,)


def test_bound_grounding_binds_rule_instructions_exactly(encoder):
    from oir_gym.captions import EVENT_NAMES

    from oir_gym.relabel import RuleBackend

    rl = HindsightRelabeler(relabel_config("rules", k=20, grounding="bound"), encoder=encoder,
                            rules=RuleBackend(compounds=True))
    (res,) = rl.relabel([wtp()])
    c = by_text(res)
    assert c["collect wood"].binding.final == EVENT_NAMES.index("collect_wood")
    compound = c["collect wood then place table"].binding
    assert (compound.pre, compound.final, compound.step) == (
        EVENT_NAMES.index("collect_wood"), EVENT_NAMES.index("place_table"), 12)
    with pytest.raises(ValueError, match="grounding"):
        HindsightRelabeler(relabel_config("rules", grounding="semantic"))
