"""OIR with the rules relabeler: only candidates the cosine reward can pay become training rows or
enter the instruction buffer (the rules' "A then B" compounds never exceed delta)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from agents.pqn.config import preset  # noqa: E402
from agents.pqn.trainer import Trainer  # noqa: E402
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory  # noqa: E402
from oir_gym.reward import first_success_step  # noqa: E402


#: WOOD_TABLE_PICKAXE after a sapling at step 2: the sapling is no prerequisite of the others, so the
#: compound oracle names "collect sapling then collect wood" (and the rest of its pairs)
SAPLING_FIRST = [(2, "collect_sapling"), *WOOD_TABLE_PICKAXE]


def _trainer(tmp_path, script=WOOD_TABLE_PICKAXE, **kw) -> tuple[Trainer, dict]:
    cfg = preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "rules", "run.total_timesteps": 2 * 16 * 2,
                                     "pqn.num_envs": 2, "pqn.num_epochs": 1, "oir.k": 4, "eval.every": 1000,
                                     "run.checkpoint_every": 1000, **kw})
    tr = Trainer(cfg, tmp_path, log=lambda s: None)
    trajs = [make_trajectory(script, cfg.pqn.num_steps, texts=False, seed=e, env_id=e) for e in range(2)]
    host = {
        "events": np.stack([t.events for t in trajs], axis=1)[None],  # [S, T, E, Ev]
        "action": np.stack([t.actions for t in trajs], axis=1)[None],
        "done": np.stack([t.dones for t in trajs], axis=1)[None],
        "instr": np.zeros((1, cfg.pqn.num_steps, 2), np.int32),
    }
    return tr, host


def test_rule_relabeling_trains_and_buffers_only_grounded_instructions(tmp_path):
    tr, host = _trainer(tmp_path)
    cfg = tr.cfg
    before = set(tr.buffers[0].contents())
    slots, _ = tr.method.relabel(host)
    valid = np.asarray(slots["valid"][0])
    assert valid.any()
    for j in np.flatnonzero(valid):  # every training copy pays a reward somewhere on its trajectory
        events = host["events"][0, :, int(slots["env"][0, j])]
        assert first_success_step(events, np.asarray(slots["final"][0, j]), cfg.env.delta) >= 0
    added = set(tr.buffers[0].contents()) - before
    assert "make wood pickaxe" in added
    assert not any(" then " in t for t in tr.buffers[0].contents())  # e.g. "collect wood then place table"
    sims = tr.registry.similarity_to_events(tr.encoder.encode(sorted(added)))
    assert (sims.max(axis=-1) > cfg.env.delta).all()
    tr.close()


@pytest.mark.parametrize("keep_ungrounded", [False, True])
def test_ungrounded_candidates_are_rows_and_buffer_entries_only_when_asked(tmp_path, keep_ungrounded):
    """keep_ungrounded=True is the paper's Alg. 1: every relabeled instruction becomes a training row
    and a buffer entry, including the compound oracle's "A then B" that the cosine reward never pays."""
    tr, host = _trainer(tmp_path, SAPLING_FIRST, **{"oir.keep_ungrounded": keep_ungrounded, "oir.oracle": "compound",
                                                    "oir.k": 8})
    assert tr.method.relabeler.rules.keep_ungrounded == keep_ungrounded
    slots, _ = tr.method.relabel(host)
    compounds = [t for t in tr.buffers[0].contents() if " then " in t]
    assert bool(compounds) == keep_ungrounded
    valid = np.asarray(slots["valid"][0])
    paid = [first_success_step(host["events"][0, :, int(slots["env"][0, j])], np.asarray(slots["final"][0, j]),
                               tr.cfg.env.delta) >= 0 for j in np.flatnonzero(valid)]
    assert all(paid) != keep_ungrounded  # with keep_ungrounded some rows never pay
    tr.close()


def test_training_logs_the_share_of_steps_under_instructions_that_can_never_pay(tmp_path):
    tr, _ = _trainer(tmp_path)
    tr.init_state()
    assert tr.iteration().metrics["curriculum/unpayable_step_frac"] == 0.0  # the 22 achievement wordings
    good, bad = tr.registry.rows(["place table", "collect wood then place table"])  # the second: below delta
    assert tr.unpayable_frac(np.array([[good, good], [good, bad]])) == 0.25
    tr.close()
    gt, _ = _trainer(tmp_path / "gt", **{"run.method": "gt"})  # gt pays on the achievement: free text never pays
    rows = gt.registry.rows(["place table", "place a table please"], achievements=[1, -1])
    assert gt.unpayable_frac(rows) == 0.5
    gt.close()


def test_balanced_slots_spread_two_identical_trajectories_over_more_instructions(tmp_path):
    """relabel_balance: the rule relabeler returns every grounded event, and the trainer keeps K per
    trajectory, preferring instructions with fewer rows (first K would repeat the same ones)."""
    distinct = {}
    for balance in (False, True):
        tr, host = _trainer(tmp_path / str(balance), **{"oir.k": 2, "oir.relabel_balance": balance})
        assert tr.method.relabeler.rules.k == (64 if balance else 2)
        slots, _ = tr.method.relabel(host)
        valid = np.asarray(slots["valid"][0])
        env = np.asarray(slots["env"][0])
        texts = [t for t, v in zip(tr.method.last_texts[0], valid) if v]
        assert all((env[valid] == e).sum() <= 2 for e in range(2))  # at most K rows per trajectory
        for j in np.flatnonzero(valid):  # and every row pays
            assert first_success_step(host["events"][0, :, env[j]], np.asarray(slots["final"][0, j]), tr.cfg.env.delta) >= 0
        distinct[balance] = set(texts)
        tr.close()
    # the trajectory pays for wood, table and pickaxe: first K keeps two of them, balance all three
    assert distinct[False] == {"collect wood", "place table"}
    assert distinct[True] == {"collect wood", "place table", "make wood pickaxe"}
