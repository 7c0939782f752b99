"""Event-bound grounding through the PQN trainer: the batch pays a bound copy exactly at its bound
step, the buffer's bound instructions get their indicator rows in the env's table, a smoke run
with ``oir.grounding=bound`` writes its diversity, and a checkpoint keeps the bindings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from test_oir_grounding import SAPLING_FIRST, _trainer as _cosine_trainer
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from agents.pqn.config import TrainConfig  # noqa: E402
from agents.pqn.trainer import Trainer, build_batch  # noqa: E402
from oir_gym.captions import NUM_EVENTS, VOCAB  # noqa: E402
from oir_gym.grounding import BOUND, Binding, indicator_row  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WOOD, TABLE = VOCAB.event_id("collect_wood"), VOCAB.event_id("place_table")


def _rollouts(T=8, E=2, D=3, emb_dim=4):
    """One rollout of 2 envs: env 0 places a table at 1 (before any wood), wood at 3, table at 5;
    env 1: wood at 2, a new episode from 4, table at 6 (its wood was in the previous episode)."""
    events = np.zeros((1, T, E, NUM_EVENTS), bool)
    events[0, 1, 0, TABLE] = events[0, 3, 0, WOOD] = events[0, 5, 0, TABLE] = True
    events[0, 2, 1, WOOD] = events[0, 6, 1, TABLE] = True
    done = np.zeros((1, T, E), bool)
    done[0, 3, 1] = True
    reset = np.zeros((1, T, E), bool)
    reset[0, 0] = True
    reset[0, 4, 1] = True
    z = lambda *s: jnp.zeros(s)  # noqa: E731
    return dict(obs=z(1, T, E, D), instr=jnp.zeros((1, T, E), jnp.int32), action=jnp.ones((1, T, E), jnp.int32),
                reward=z(1, T, E), done=jnp.asarray(done), reset=jnp.asarray(reset), events=jnp.asarray(events),
                last_obs=z(1, E, D), last_instr=z(1, E, emb_dim), carry0=(z(1, E, 5), z(1, E, 5)))


def test_a_bound_copy_pays_exactly_at_its_bound_step_and_an_ordered_pair_after_its_first_event():
    cfg = TrainConfig().replace(**{"pqn.num_envs": 2, "pqn.num_steps": 8, "oir.k": 2, "pqn.num_minibatches": 2,
                                   "env.delta": 0.9, "oir.grounding": "bound"})
    wood_then_table = Binding(final=TABLE, pre=WOOD)
    table = Binding(final=TABLE)
    rows = [(0, wood_then_table), (1, wood_then_table), (0, table), (1, table)]
    slots = dict(src=jnp.zeros(4, jnp.int32), env=jnp.array([e for e, _ in rows]), emb=jnp.ones((4, 4)),
                 final=jnp.asarray(np.stack([b.rows(NUM_EVENTS)[0] for _, b in rows])),
                 pre=jnp.asarray(np.stack([b.rows(NUM_EVENTS)[1] for _, b in rows])),
                 valid=jnp.ones(4, bool))
    r = np.asarray(build_batch(cfg, _rollouts(), jnp.zeros((1, 4)), slots)["rewards"])[:, 2:]
    # "wood then table" on env 0: not the table at 1 (no wood yet), the one at 5 after the wood at 3
    np.testing.assert_array_equal(r[:, 0], [0, 0, 0, 0, 0, 1, 0, 0])
    # on env 1 the wood was in the episode before: the table at 6 does not pay
    np.testing.assert_array_equal(r[:, 1], 0)
    # a single bound event pays at its first occurrence per episode, whatever the wording
    np.testing.assert_array_equal(r[:, 2], [0, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(r[:, 3], [0, 0, 0, 0, 0, 0, 1, 0])


def _trainer(tmp_path, **kw) -> tuple[Trainer, dict]:
    """test_oir_grounding's tiny trainer and hand-built rollout (a sapling, then wood, table, pickaxe),
    in bound mode, with the compound oracle's ordered pairs ("collect sapling then collect wood") in its K = 8."""
    return _cosine_trainer(tmp_path, SAPLING_FIRST, **{"oir.grounding": "bound", "oir.oracle": "compound",
                                                       "oir.k": 8, **kw})


def test_bound_relabeling_uses_each_candidates_rows_and_binds_buffer_instructions(tmp_path):
    tr, host = _trainer(tmp_path)
    assert tr.method.relabeler.rules.grounding == "bound"
    slots, stats = tr.method.relabel(host)
    cands = tr.method.last_candidates[0]
    valid = np.asarray(slots["valid"][0])
    assert valid.sum() == len(cands) > 0
    for j, c in enumerate(cands):  # the slot rows are the candidate's own rows
        assert c.binding is not None
        np.testing.assert_array_equal(np.asarray(slots["final"][0, j]), c.final_row)
        np.testing.assert_array_equal(np.asarray(slots["pre"][0, j]), c.pre_row)
        np.testing.assert_allclose(np.asarray(slots["emb"][0, j]), c.emb)
    # an ordered compound ("collect sapling then collect wood") binds and becomes a row under bound grounding
    assert any(c.binding.pre >= 0 for c in cands)
    rollout = jax.tree_util.tree_map(jnp.asarray, {
        "obs": np.zeros((1, 16, 2, 3), np.float32), "instr": host["instr"], "action": host["action"],
        "reward": np.zeros((1, 16, 2), np.float32), "done": host["done"],
        "reset": np.concatenate([np.ones((1, 1, 2), bool), host["done"][:, :-1]], axis=1), "events": host["events"],
        "last_obs": np.zeros((1, 2, 3), np.float32), "last_instr": np.zeros((1, 2, tr.encoder.dim), np.float32),
    })
    rollout["carry0"] = jax.tree_util.tree_map(lambda x: jnp.zeros((1,) + x.shape), tr.net.initial_carry(2))
    batch = tr.build_batch([rollout], slots)
    rew = np.asarray(batch["rewards"])[0, :, 2:]
    for j, c in enumerate(cands):  # each relabeled copy pays exactly at its bound step
        np.testing.assert_array_equal(np.flatnonzero(rew[:, j]), [c.binding.step])
    # the buffer's new instructions carry their binding into the env's table (originals keep theirs)
    offered = {c.text: c for c in cands}
    added = [t for t in tr.buffers[0].contents() if t in offered and t not in tr.method.curriculum.config.fixed_texts]
    assert added
    for t in added:
        row = tr.registry.find([t])[t]
        assert tr.registry.bindings[t] == offered[t].binding
        np.testing.assert_array_equal(tr.registry.event_sim[row], indicator_row(offered[t].binding.final, NUM_EVENTS))
    assert stats["relabel/llm_offer_share"] == 0.0  # rules only
    div = tr.method.diversity()
    assert div["diversity/instructions"] == len(tr.method.offered) > 0
    assert 0.0 <= div["diversity/novelty_share"] <= 1.0 and div["diversity/wordings_per_event"] >= 1.0
    # novelty per update (the relabeling plot): the first offers are all new; the same rollout again adds none
    assert stats["relabel/new_instructions"] == len(tr.method.offered)
    assert tr.method.relabel(host)[1]["relabel/new_instructions"] == 0
    tr.close()


def test_a_checkpoint_round_trip_keeps_bindings_and_offer_counts(tmp_path):
    tr, host = _trainer(tmp_path / "a")
    tr.init_state()
    tr.method.relabel(host)
    bindings = dict(tr.registry.bindings)
    assert bindings and any(b.pre >= 0 for b in bindings.values())
    pre_sim, event_sim = tr.registry.pre_sim.copy(), tr.registry.event_sim.copy()
    div = tr.method.diversity()
    folder = tr.save()
    tr.close()
    tr2, _ = _trainer(tmp_path / "b")
    tr2.load(folder)
    assert tr2.registry.bindings == bindings
    np.testing.assert_array_equal(tr2.registry.pre_sim, pre_sim)
    np.testing.assert_array_equal(tr2.registry.event_sim, event_sim)
    assert tr2.method.diversity() == div
    assert BOUND in np.asarray(tr2.registry.device_table().pre_sim)  # the env pays ordered pairs after resume
    tr2.close()


def test_registry_state_dict_round_trip_keeps_bindings(tmp_path):
    from oir_gym.encoder import get_encoder
    from oir_gym.instruction_registry import InstructionRegistry

    reg = InstructionRegistry(get_encoder(), capacity=8)
    b = Binding(final=TABLE, pre=WOOD, step=5)
    reg.rows(["get wood and then build a table", "place table"], bindings=[b, None])
    reg2 = InstructionRegistry(get_encoder(), capacity=8)
    reg2.load_state_dict(reg.state_dict())
    assert reg2.bindings == {"get wood and then build a table": b}
    np.testing.assert_array_equal(reg2.pre_sim, reg.pre_sim)
    # a state without bindings (older checkpoints) loads as unbound, with no preconditions
    old = {k: v for k, v in reg.state_dict().items() if k not in ("bindings", "pre_sim")}
    reg2.load_state_dict(old)
    assert reg2.bindings == {} and (reg2.pre_sim == -1).all()
    # a binding of a text the state does not hold is an inconsistent state
    bad = reg.state_dict()
    bad["bindings"] = [["no such text", b.to_list()]]
    with pytest.raises(ValueError, match="no such text"):
        reg2.load_state_dict(bad)


@pytest.mark.slow  # a whole smoke run in a fresh process (compiles: about a minute on 2 cores)
def test_smoke_run_with_bound_grounding_writes_diversity(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "train_pqn.py"), "smoke", "--run.method", "oir",
                        "--oir.relabeler", "rules", "--oir.grounding", "bound", "--run-dir", str(run)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    d = json.loads((run / "diversity.json").read_text())
    assert d["grounding"] == "bound"
    assert d["diversity/instructions"] > 0 and 0 <= d["diversity/novelty_share"] <= 1
    assert d["relabel/llm_offer_share_total"] == 0.0
    assert "novelty share" in p.stdout and "wordings per event" in p.stdout
