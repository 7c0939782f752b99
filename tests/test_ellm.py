"""ELLM baseline: the goal proposer (rules, cache, LLM parsing and fallbacks) and method ``ellm`` in the Trainer.

Fault injection: the LLM failures are simulated with small backend objects that raise, answer
garbage or sleep past the timeout (stand-ins for a crashed, confused or slow server); the real
offline Gemma is exercised by the ``llm``-marked test at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from agents.pqn.config import METHODS, TrainConfig
from agents.pqn.ellm_proposer import FALLBACK_GOALS, GOALS, GoalProposer, load_prompt, rule_goals, signature
from oir_gym.text import Observation, parse_observation

ROOT = Path(__file__).resolve().parents[1]
ST = "Status: health 9, food 8, drink 7, energy 9, sleeping no"


def obs(facing: str, nearby: str = "nothing", inventory: str = "empty", status: str = ST) -> str:
    return f"Facing: {facing}; Nearby: {nearby}; Inventory: {inventory}; {status}"


# ------------------------------------------------------------------------------------- rules
RULE_CASES = [
    (obs("tree", "[1] tree, water [2] cow, stone"), ["collect wood", "drink water", "eat cow"]),
    (obs("water"), ["drink water"]),
    (obs("grass", "[2] tree"), ["collect sapling", "collect wood"]),
    (obs("cow", "[1] cow"), ["eat cow"]),
    (obs("grass", "[1] zombie [3] skeleton"), ["collect sapling", "defeat zombie", "defeat skeleton"]),
    (obs("zombie", "[1] zombie"), ["defeat zombie"]),
    # wood in the inventory, no table nearby -> place table
    (obs("sand", inventory="wood 2"), ["place table"]),
    # a table nearby and wood -> the wood tools (crafting before placing/resources)
    (obs("grass", "[2] crafting table [3] zombie", "wood 3, sapling 1"),
     ["collect sapling", "defeat zombie", "make wood pickaxe", "make wood sword"]),
    (obs("crafting table", "[1] crafting table", "wood 1, wood pickaxe 1"), ["make wood sword"]),
    # stone is collectable only with a wood pickaxe
    (obs("stone", "[1] stone [2] coal, tree"), ["collect wood"]),
    (obs("stone", "[1] stone [2] coal, tree", "wood 1, wood pickaxe 1"),
     ["collect stone", "place table", "collect coal", "collect wood"]),
    (obs("grass", "[1] crafting table", "wood 1, stone 2, wood pickaxe 1, wood sword 1"),
     ["collect sapling", "make stone pickaxe", "make stone sword", "place furnace"]),
    (obs("iron", "[1] crafting table, furnace, iron", "wood 1, stone 1, coal 1, iron 1, stone pickaxe 1"),
     ["collect iron", "make wood pickaxe", "make wood sword", "make stone sword"]),
    # diamond only with an iron pickaxe
    (obs("diamond", "[1] diamond", "stone pickaxe 1"), list(FALLBACK_GOALS)),
    (obs("diamond", "[1] diamond", "iron pickaxe 1"), ["collect diamond"]),
    (obs("sand", inventory="sapling 1"), ["place plant"]),
    (obs("sand", "[2] ripe plant"), ["eat plant"]),
    (obs("sand", status="Status: health 9, food 8, drink 7, energy 2, sleeping no"), ["wake up"]),
    (obs("tree", "[1] tree", status="Status: health 9, food 8, drink 7, energy 5, sleeping yes"), ["wake up"]),
    (obs("sand"), list(FALLBACK_GOALS)),
    ("not an observation at all", list(FALLBACK_GOALS)),
]


@pytest.mark.parametrize("text,expected", RULE_CASES)
def test_rule_goals_exact(text, expected):
    assert rule_goals(text, k=4) == expected


def test_rule_goals_k_and_vocabulary():
    text = obs("grass", "[1] crafting table, furnace [2] cow, tree, water, zombie",
               "wood 1, stone 1, coal 1, iron 1, sapling 1")
    full = rule_goals(text)
    assert len(full) > 4 and len(set(full)) == len(full)
    assert rule_goals(text, k=2) == full[:2]
    assert set(full) <= set(GOALS.values())
    assert len(GOALS) == 22  # one wording per Craftax achievement


def test_parse_observation_of_the_text_format():
    o = parse_observation("Facing: crafting table; Nearby: [1] crafting table, tree [2] cow, tree; "
                          "Inventory: wood 2, wood pickaxe 1; Status: health 9, food 8, drink 7, energy 6, sleeping no")
    assert o.facing == "crafting table"
    assert o.nearby == {"crafting table": 1, "tree": 1, "cow": 2}
    assert o.inventory == {"wood": 2, "wood pickaxe": 1}
    assert o.status == {"health": 9, "food": 8, "drink": 7, "energy": 6} and o.sleeping is False


def test_coarse_signature_keeps_what_the_rules_read():
    a = obs("tree", "[1] tree", "wood 3", "Status: health 9, food 8, drink 7, energy 9, sleeping no")
    b = obs("tree", "[1] tree", "wood 5", "Status: health 8, food 6, drink 9, energy 7, sleeping no")
    tired = obs("tree", "[1] tree", "wood 5", "Status: health 8, food 6, drink 9, energy 3, sleeping no")
    assert signature(a) == signature(b) != signature(tired)
    assert signature(obs("tree", inventory="wood 1")) != signature(obs("tree", inventory="wood 2"))
    assert signature(a, "text") == a != b


def test_prompt_template_is_data():
    tpl = load_prompt()
    assert "{{observation}}" in tpl and "#|" not in tpl
    p = GoalProposer(FakeLLM([]), k=3).render_prompt(obs("tree"))
    assert p.rstrip().endswith("Answer:") and "Facing: tree; Nearby: nothing" in p and "at most 3" in p


# ------------------------------------------------------------------------------------- cache
def test_rule_proposer_batches_and_caches():
    prop = GoalProposer("rules", k=4)
    hurt = obs("tree", status="Status: health 5, food 8, drink 7, energy 9, sleeping no")
    texts = [obs("tree"), obs("tree"), obs("water"), hurt]
    out = prop.propose(texts)
    assert out == [["collect wood"], ["collect wood"], ["drink water"], ["collect wood"]]
    s = prop.stats()
    assert (s["requests"], s["unique"], s["cache_misses"], s["cache_hits"]) == (4, 2, 2, 0)  # health 9/5 share a key
    assert prop.propose([obs("water"), obs("cow")]) == [["drink water"], ["eat cow"]]
    s = prop.stats()
    assert (s["cache_hits"], s["cache_misses"], s["cache_size"]) == (1, 3, 3)
    out[0].append("mutated")  # results are copies: the cache is not affected
    assert prop.propose([obs("tree")]) == [["collect wood"]]
    assert GoalProposer("rules", cache_size=2).propose([obs("a"), obs("b"), obs("c")]) == [list(FALLBACK_GOALS)] * 3


class FakeLLM:
    """A stand-in LLM backend: fixed answers per call, or raise/sleep (fault injection)."""

    def __init__(self, answer, raise_exc=None, sleep=0.0):
        self.answer, self.raise_exc, self.sleep = answer, raise_exc, sleep
        self.calls: list[list[str]] = []
        self.closed = False

    def generate(self, prompts, n=1, *, schema=None):
        self.calls.append(list(prompts))
        assert schema["properties"]["Mid-Level"]["maxItems"] >= 1
        if self.sleep:
            time.sleep(self.sleep)
        if self.raise_exc is not None:
            raise self.raise_exc
        return [[self.answer(p) if callable(self.answer) else self.answer] for p in prompts]

    def close(self):
        self.closed = True


def test_llm_answers_are_parsed_filtered_batched_and_cached():
    answer = ('```json\n{"Mid-Level": ["Collect wood.", "move to the water", "collect wood", "drink water", '
              '"eat cow", "place table"], "High-Level": []}\n```')
    llm = FakeLLM(answer)
    prop = GoalProposer(llm, k=3)
    texts = [obs("tree"), obs("water"), obs("tree")]
    out = prop.propose(texts)
    # normalised, de-duplicated, the movement goal dropped, at most k
    assert out == [["collect wood", "drink water", "eat cow"]] * 3
    assert len(llm.calls) == 1 and len(llm.calls[0]) == 2  # one batched call, one prompt per signature
    assert prop.propose(texts) == out and len(llm.calls) == 1  # cached
    s = prop.stats()
    assert s["llm_calls"] == 1 and s["cache_hits"] == 2 and s["fallbacks"] == 0 and s["llm_fraction"] == 1.0
    assert s["dropped"].get("forbidden_word") == 2  # once per prompt (two signatures)
    prop.close()
    assert llm.closed


def test_llm_failure_falls_back_to_rules():
    # fault injection: a backend that raises (as a crashed server would)
    llm = FakeLLM(None, raise_exc=ConnectionError("server down"))
    prop = GoalProposer(llm, k=4)
    texts = [obs("tree", "[2] water"), obs("cow")]
    assert prop.propose(texts) == [rule_goals(t, 4) for t in texts]
    s = prop.stats()
    assert s["llm_errors"] == 1 and s["fallbacks"] == 2 and s["errors_by_type"] == {"ConnectionError": 1}
    assert s["cache_size"] == 0  # failures are not cached: the next call asks again
    prop.propose(texts)
    assert len(llm.calls) == 2

    # an answer with nothing usable (garbage, or only forbidden goals) -> rules as well
    for bad in ("I cannot help with that", '{"Mid-Level": ["explore the map", "walk around"], "High-Level": []}'):
        prop = GoalProposer(FakeLLM(bad), k=4)
        assert prop.propose(texts) == [rule_goals(t, 4) for t in texts]
        assert prop.stats()["llm_empty"] == 2 and prop.stats()["fallbacks"] == 2

    # a backend that returns the wrong number of results
    prop = GoalProposer(FakeLLM("x"), k=4)
    prop.llm.generate = lambda prompts, n=1, schema=None: []
    assert prop.propose(texts) == [rule_goals(t, 4) for t in texts]
    assert prop.stats()["llm_errors"] == 1


def test_slow_llm_answers_by_rules_then_fills_the_cache():
    release = threading.Event()
    llm = FakeLLM('{"Mid-Level": ["chop the tree"], "High-Level": []}')
    inner = llm.generate

    def slow(prompts, n=1, *, schema=None):
        release.wait(10)
        return inner(prompts, n, schema=schema)

    llm.generate = slow
    prop = GoalProposer(llm, k=2, timeout=0.05)
    t0 = time.time()
    assert prop.propose([obs("tree")]) == [["collect wood"]]  # timed out: rules, at once
    assert time.time() - t0 < 5
    assert prop.propose([obs("water")]) == [["drink water"]]  # still running: rules, not asked
    s = prop.stats()
    assert (s["llm_timeouts"], s["llm_busy"], s["fallbacks"], s["llm_calls"]) == (1, 1, 2, 1)
    release.set()
    prop._caller.inflight.result(10)
    assert prop.propose([obs("tree")]) == [["chop the tree"]]  # the late answer is in the cache
    prop.close()


def test_max_prompts_asks_the_most_frequent_signatures():
    llm = FakeLLM('{"Mid-Level": ["llm goal"], "High-Level": []}')
    prop = GoalProposer(llm, k=2, max_prompts=1)
    texts = [obs("water"), obs("tree"), obs("tree")]
    assert prop.propose(texts) == [["drink water"], ["llm goal"], ["llm goal"]]
    assert len(llm.calls[0]) == 1 and "Facing: tree" in llm.calls[0][0].splitlines()[-2]
    assert prop.stats()["not_asked"] == 1


def test_config_knows_ellm():
    assert "ellm" in METHODS
    TrainConfig().replace(**{"run.method": "ellm", "ellm.proposer": "llm"}).validate()
    with pytest.raises(ValueError, match="ellm.proposer"):
        TrainConfig().replace(**{"run.method": "ellm", "ellm.proposer": "gpt"}).validate()
    with pytest.raises(ValueError, match="unknown proposer backend"):
        GoalProposer("gpt")


# ------------------------------------------------------------------------------------- trainer
class Recording:
    """Wraps a proposer and keeps what it proposed."""

    def __init__(self, inner):
        self.inner = inner
        self.observations: list[list] = []
        self.goals: list[list[list[str]]] = []

    def propose(self, observations):
        out = self.inner.propose(observations)
        self.observations.append(list(observations))
        self.goals.append(out)
        return out

    def stats(self):
        return self.inner.stats()

    def close(self):
        self.inner.close()


def _params(tr):
    from test_train_pqn import _params as leaves  # one definition of "the trainer's parameters"

    return leaves(tr)


def _counts(goals_json) -> Counter:
    return Counter({it["text"]: it["count"] for it in goals_json["items"]})


def test_ellm_trainer_pins_envs_to_proposed_goals_and_resumes(tmp_path):
    pytest.importorskip("jax")
    from agents.pqn.trainer import Trainer
    from test_train_pqn import tiny

    # episodes of 8 steps: every env resets twice per 16-step rollout, so the pins set after a
    # rollout are the instructions of the envs at the end of the next one
    cfg = tiny(**{"run.method": "ellm", "env.max_episode_steps": 8})
    rec = Recording(GoalProposer("rules", k=cfg.ellm.k))
    tr = Trainer(cfg, tmp_path, log=lambda s: None, proposer=rec)
    tr.init_state()
    env = lambda: tr.runner[0].env  # noqa: E731

    log = tr.iteration()
    seen = rec.observations[-1]
    # the trainer hands the proposer values read from the state arrays (not text to parse back);
    # they say what the text says
    assert len(seen) == cfg.pqn.num_envs and all(isinstance(o, Observation) for o in seen)
    assert seen[0].text.startswith("Facing: ")
    for o in seen:
        assert parse_observation(o.text) == o
    p1 = np.asarray(env().pinned)
    assert (p1 >= 0).all()
    for i, row in enumerate(p1):
        assert tr.registry.text(row) in rec.goals[-1][i]  # each env pinned to one of ITS goals
    assert rec.goals[-1][0] == rule_goals(seen[0], cfg.ellm.k) == rule_goals(seen[0].text, cfg.ellm.k)
    m = log.metrics
    assert m["ellm/pinned_frac"] == 1.0 and m["ellm/groundable_frac"] == 1.0 and m["ellm/distinct_goals"] >= 1
    assert m["ellm/requests"] == cfg.pqn.num_envs and "relabel/rows" not in m and np.isfinite(m["loss"])
    assert set(p1.tolist()) <= set(tr.protected_rows())
    # ellm.reward="any" (default): every goal proposed for an env also pays that env's reward
    also = np.asarray(env().also_pays)
    assert also.shape == (cfg.pqn.num_envs, cfg.ellm.k)
    for i, g in enumerate(rec.goals[-1]):
        assert [tr.registry.text(r) for r in also[i] if r >= 0] == g
    assert set(also[also >= 0].tolist()) <= set(tr.protected_rows())

    tr.iteration()
    np.testing.assert_array_equal(np.asarray(env().instr), p1)  # resets used the pinned goals
    p2 = np.asarray(env().pinned)
    assert all(tr.registry.text(r) in g for r, g in zip(p2, rec.goals[-1]))
    tr.save()
    goals = json.loads((tmp_path / "goals.json").read_text())
    assert goals["method"] == "ellm" and goals["update"] == 2 and goals["source"] == "proposer rules"
    assert goals["total"] == sum(len(g) for it in rec.goals for g in it)
    assert sum(it["pinned"] for it in goals["items"]) == 2 * cfg.pqn.num_envs
    assert {it["text"] for it in goals["items"]} == {t for it in rec.goals for g in it for t in g}

    # resume: the checkpoint holds everything the next iteration depends on (pins in the runner,
    # the table, the goal sampler's state). Loaded into the same Trainer (no second compile); the
    # rng has moved on meanwhile, so a state missing from the checkpoint would show.
    straight = tr.iteration()
    after = [np.array(x) for x in _params(tr)], np.asarray(env().pinned).copy(), Counter(tr.generated)
    tr.load()
    assert (tr.update_idx, tr.generated) == (2, _counts(goals))
    np.testing.assert_array_equal(np.asarray(env().pinned), p2)
    assert np.asarray(env().also_pays).shape == (cfg.pqn.num_envs, cfg.ellm.k)
    again = tr.iteration()
    for a, b in zip(after[0], _params(tr)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(env().pinned), after[1])
    assert tr.generated == after[2] and straight.metrics["loss"] == pytest.approx(again.metrics["loss"], rel=1e-5)
    tr.close()


def test_ellm_pinned_reward_pays_only_the_pinned_goal(tmp_path):
    pytest.importorskip("jax")
    from agents.pqn.trainer import Trainer
    from test_train_pqn import tiny

    cfg = tiny(**{"run.method": "ellm", "ellm.reward": "pinned"})
    tr = Trainer(cfg, tmp_path, log=lambda s: None)
    tr.init_state()
    tr.iteration()
    assert np.asarray(tr.runner[0].env.also_pays).shape == (cfg.pqn.num_envs, 0)
    assert (np.asarray(tr.runner[0].env.pinned) >= 0).all()
    tr.close()
    with pytest.raises(ValueError, match="ellm.reward"):
        tiny(**{"run.method": "ellm", "ellm.reward": "all"}).validate()


@pytest.mark.slow
def test_ellm_fresh_process_resume_and_script(tmp_path):
    """A fresh Trainer continues identically, and the main script runs ``--method ellm`` end to end."""
    pytest.importorskip("jax")
    from agents.pqn.trainer import Trainer
    from test_train_pqn import tiny

    cfg = tiny(**{"run.method": "ellm"})
    a = Trainer(cfg, tmp_path / "a", log=lambda s: None)
    a.init_state()
    for _ in range(2):
        a.iteration()
    a.save()
    a.iteration()
    b = Trainer(cfg, tmp_path / "a", log=lambda s: None)
    b.load()
    b.iteration()
    for x, y in zip(_params(a), _params(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(a.runner[0].env.pinned), np.asarray(b.runner[0].env.pinned))
    a.close()
    b.close()

    run = tmp_path / "run"
    script = [sys.executable, str(ROOT / "examples" / "train_pqn.py")]
    cmd = script + ["smoke", "--run.method", "ellm", "--ellm.proposer", "rules", "--run-dir", str(run), "--no-progress"]
    first = subprocess.run(cmd + ["--max-updates", "2"], capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "proposer=rules" in first.stdout and "goals" in first.stdout
    second = subprocess.run(script + ["--run-dir", str(run), "--resume"], capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3, 4] and all("ellm/distinct_goals" in r for r in rows)
    goals = json.loads((run / "goals.json").read_text())
    assert goals["update"] == 4 and sum(it["pinned"] for it in goals["items"]) == 4 * 4


def test_oir_run_records_the_inserted_instructions(smoke_trainer):
    """(The session's shared OIR trainer, saved at update 3: conftest.py.)"""
    data = json.loads(smoke_trainer.instructions_3)
    assert data["method"] == "oir" and data["total"] == sum(it["count"] for it in data["items"])
    assert data["distinct"] == len(data["items"]) == len(smoke_trainer.generated_3)
    assert not (smoke_trainer.trainer.run_dir / "goals.json").exists()


# ------------------------------------------------------------------------------------- real LLM
@pytest.mark.llm
@pytest.mark.slow  # loads the offline Gemma (~15 s); the relabeler's real-LLM route stays in test_relabel_transformers
def test_offline_gemma_proposes_goals():
    from conftest_llm import _transformers_or_skip

    path = _transformers_or_skip()  # the offline default route (transformers): runs on any CPU
    prop = GoalProposer("transformers", k=3, backend_kwargs={"model": path, "seed": 0})
    texts = [obs("tree", "[1] tree [2] water [3] cow"), obs("grass", "[1] crafting table", "wood 2")]
    out = prop.propose(texts)
    s = prop.stats()
    prop.close()
    assert s["llm_calls"] == 1 and s["llm_errors"] == 0 and s["llm_ok"] == 1, s
    assert len(out) == 2 and all(1 <= len(g) <= 3 for g in out)
    assert all(isinstance(t, str) and t == t.strip().lower() for g in out for t in g)
    assert s["llm_fraction"] > 0, s  # the model's own (parsed, filtered) goals were used
