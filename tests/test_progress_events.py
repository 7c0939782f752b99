"""The stone tier's progress events (labels only), the ``progress`` and ``mixed`` oracles, and the
training rates of events.

The events are checked on hand-built scenes stepped by the real env (``conftest.Scene``: the
shared 4-env vector env, one compiled step program).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import A, B, Scene, run_actions
from hypothesis import given, settings
from hypothesis import strategies as st

from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, PROGRESS_EVENTS, VOCAB
from oir_gym.event_rates import EpisodeEvents, per_1k_steps, rate_metrics
from oir_gym.grounding import episode_starts_from_dones, indicator_row, paid_steps
from oir_gym.relabel import HindsightRelabeler
from oir_gym.relabel.oracle import (
    MAX_EVAL_COSINE, MIXED_POOL_SHARE, evaluation_texts, load_pool, mixed_labels, oracle_labels,
)
from oir_gym.relabel.segments import segments_text
from oir_gym.trajectory import Trajectory

PROGRESS = {EVENT_NAMES[e] for e in PROGRESS_EVENTS}


def progress_sets(info) -> list[set[str]]:
    return [{EVENT_NAMES[j] for j in np.flatnonzero(row)} & PROGRESS for row in info["events"]]


def test_progress_events_fire_where_their_condition_starts(venv):
    """Env 0 walks until stone enters the view, then until it faces it (no pickaxe); env 1 steps
    in front of stone holding a wooden pickaxe; env 2 reaches a table holding wood and stone, then
    crafts both pickaxes; env 3 faces coal with a wooden pickaxe, then iron with a stone one."""
    venv.reset(seed=0, options={"instruction": "defeat skeleton"})
    sc = Scene(venv)
    sc.block(0, (0, 5), B.STONE)                      # one column outside the 9-wide view
    sc.block(1, (0, 2), B.STONE).inventory(1, wood_pickaxe=1)
    sc.block(2, (0, 3), B.CRAFTING_TABLE).inventory(2, wood=2, stone=1)
    sc.block(3, (0, 2), B.COAL).block(3, (2, 1), B.IRON).inventory(3, wood_pickaxe=1, stone_pickaxe=1)
    sc.apply()
    R, D, N = A.RIGHT.value, A.DOWN.value, A.NOOP.value
    script = [[R, R, R, R], [R, N, R, D], [R, N, A.MAKE_WOOD_PICKAXE.value, N],
              [R, N, A.MAKE_STONE_PICKAXE.value, N]]
    _, terms, _, infos = run_actions(venv, script)
    assert not terms.any()
    got = [progress_sets(info) for info in infos]  # [step][env]
    assert [g[0] for g in got] == [{"see_stone"}, set(), set(), {"face_stone"}]
    assert [g[1] for g in got] == [{"face_stone", "face_stone_with_pickaxe"}, set(), set(), set()]
    assert [g[2] for g in got] == [set(), {"near_table_with_wood", "near_table_with_wood_and_stone"}, set(), set()]
    assert [g[3] for g in got] == [{"face_coal_with_pickaxe"}, {"face_iron_with_stone_pickaxe"}, set(), set()]


def test_progress_events_are_labels_only():
    """Never among the 22 achievements, never in the text an LLM reads, and their captions stay
    below the pool's distance to every evaluation string (they cannot pay an evaluation wording)."""
    assert PROGRESS and not PROGRESS & set(ACHIEVEMENT_NAMES)
    assert all(VOCAB.achievement_of_event[e] < 0 for e in PROGRESS_EVENTS)
    from oir_gym.encoder import get_encoder

    enc = get_encoder()
    phrases = [p for e in PROGRESS_EVENTS for p in VOCAB.phrases_of(e)]
    sims = enc.encode(phrases) @ enc.encode(evaluation_texts()).T
    assert sims.max() < MAX_EVAL_COSINE
    ev = np.zeros((3, len(EVENT_NAMES)), bool)
    ev[0, EVENT_NAMES.index("see_stone")] = ev[1, EVENT_NAMES.index("collect_wood")] = True
    text = segments_text(Trajectory("x", ev, np.zeros(3, np.int64), np.zeros(3, bool)))
    assert "stone" not in text and "collect wood" in text


def _traj(names_per_step: list[list[str]], dones=None, env_id: int = 0) -> Trajectory:
    ev = np.zeros((len(names_per_step), len(EVENT_NAMES)), bool)
    for t, names in enumerate(names_per_step):
        for n in names:
            ev[t, EVENT_NAMES.index(n)] = True
    d = np.zeros(len(ev), bool) if dones is None else np.asarray(dones, bool)
    return Trajectory("x", ev, np.zeros(len(ev), np.int64), d, env_id=env_id)


def test_progress_oracle_puts_canonical_first_and_each_label_pays_at_its_event(encoder):
    traj = _traj([["see_stone"], ["collect_wood"], [], ["face_stone_with_pickaxe", "face_stone"], ["place_table"]])
    labels = oracle_labels(traj, "progress")
    assert [lab.text for lab in labels] == [
        "collect wood", "place table", "find stone", "face stone", "face stone holding a wooden pickaxe"]
    rl = HindsightRelabeler.rules(8, encoder=encoder, oracle="progress", grounding="bound")
    (res,) = rl.relabel([traj])
    rl.close()
    steps = {c.text: c.first_step for c in res.candidates if c.grounded}
    assert steps == {"collect wood": 1, "place table": 4, "find stone": 0, "face stone": 3,
                     "face stone holding a wooden pickaxe": 3}


def _pays_only_at_its_event(traj: Trajectory, lab) -> None:
    n = len(EVENT_NAMES)
    final, pre = indicator_row(lab.final, n), indicator_row(lab.pre, n)
    paid = paid_steps(traj.events, final, pre, episode_starts_from_dones(traj.dones), 0.9)
    assert paid.any() and traj.events[paid, lab.final].all(), lab


def test_mixed_oracle_draws_pool_wordings_at_the_stated_rate_and_pays_at_events():
    pool = load_pool()
    canon = {VOCAB.canonical(e) for e in range(len(EVENT_NAMES))}
    owner = pool.owner()
    kinds = []
    for env_id in range(300):
        traj = _traj([["collect_wood"], ["place_table"], ["collect_drink"], ["fall_asleep"], ["wake_up"]], env_id=env_id)
        labels = mixed_labels(traj, pool, seed=1)
        assert [lab.final for lab in labels[:4]] == [EVENT_NAMES.index(n) for n in
                                                     ("collect_wood", "place_table", "collect_drink", "wake_up")]
        assert labels[-1].text == "sleep and wake up"  # the pair wording stays canonical
        for lab in labels[:4]:
            assert lab.text in canon or owner[lab.text] == lab.final
            kinds.append(lab.text not in canon)
            _pays_only_at_its_event(traj, lab)
        assert mixed_labels(traj, pool, seed=1) == labels  # seeded: the same draws again
    share = np.mean(kinds)
    assert set(kinds) == {True, False}
    assert abs(share - MIXED_POOL_SHARE) < 0.06, share  # 1,200 draws: 4.5 standard errors


# --------------------------------------------------------------------------- training rates


def test_mixed_labels_pay_at_their_events_under_bound_grounding(encoder):
    traj = _traj([[], ["collect_wood"], [], ["place_table"], ["collect_drink"]])
    rl = HindsightRelabeler.rules(8, encoder=encoder, oracle="mixed", grounding="bound")
    (res,) = rl.relabel([traj])
    rl.close()
    first = {EVENT_NAMES[c.binding.final]: c.first_step for c in res.candidates if c.grounded}
    assert first == {"collect_wood": 1, "place_table": 3, "collect_drink": 4}


def test_rates_per_1k_steps_and_share_of_finished_episodes():
    ev = np.zeros((4, 2, 3), bool)  # [T, E, events]
    ev[0, 0, 0] = ev[2, 0, 0] = True  # env 0: event 0 twice in its first episode
    ev[1, 1, 1] = True  # env 1: event 1 in an episode that has not ended by the rollout's end
    dones = np.zeros((4, 2), bool)
    dones[2, 0] = dones[3, 0] = True  # env 0's episodes end at t=2 and t=3
    np.testing.assert_allclose(per_1k_steps(ev), [2 / 8 * 1000, 1 / 8 * 1000, 0])
    track = EpisodeEvents(num_envs=2, num_events=3)
    count, episodes = track.update(ev, dones)
    assert episodes == 2 and count.tolist() == [1, 0, 0]
    # env 1's episode ends in the next rollout: its event from the previous rollout counts
    dones2 = np.zeros((4, 2), bool)
    dones2[0, 1] = True
    count, episodes = track.update(np.zeros((4, 2, 3), bool), dones2)
    assert episodes == 1 and count.tolist() == [0, 1, 0]
    m = rate_metrics(["a", "b", "c"], per_1k_steps(ev), count, episodes, prefix="seed0/")
    assert m["seed0/episode_rate/b"] == 1.0 and m["seed0/rate/a"] == 250.0
    assert "episode_rate/a" not in rate_metrics(["a"], np.zeros(1), np.zeros(1), 0)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_episode_shares_are_fractions_that_sum_episodes(T, E, data):
    ev = np.array(data.draw(st.lists(st.booleans(), min_size=T * E * 2, max_size=T * E * 2))).reshape(T, E, 2)
    dn = np.array(data.draw(st.lists(st.booleans(), min_size=T * E, max_size=T * E))).reshape(T, E)
    count, episodes = EpisodeEvents(E, 2).update(ev, dn)
    assert episodes == dn.sum() and (count <= episodes).all()
    # an event seen at an episode's last step counts for that episode
    assert (count >= (ev & dn[..., None]).any(axis=(0, 1)) * (episodes > 0)).all()


def test_rate_tracking_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="do not match"):
        EpisodeEvents(2, 3).update(np.zeros((4, 3, 3), bool), np.zeros((4, 3), bool))


def test_the_cosine_reward_never_pays_a_progress_event(encoder):
    """Labels only: a progress caption as an instruction gets no cosine row for its event (it pays
    through event-bound grounding), so no instruction's cosine reward changes with them."""
    from oir_gym.instruction_registry import InstructionRegistry

    reg = InstructionRegistry(encoder, capacity=1)
    sims = reg.similarity_to_events(encoder.encode(["find stone", "collect stone"]))
    assert (sims[:, list(PROGRESS_EVENTS)] == -1).all()
    assert sims[1, EVENT_NAMES.index("collect_stone")] > 0.99


def test_a_rate_window_counts_steps_and_finished_episodes_until_reset():
    from oir_gym.event_rates import RATE_EVENTS, RATE_NAMES, RateWindow

    w = RateWindow(num_envs=2)
    assert w.metrics() == {}
    wood = EVENT_NAMES.index("collect_wood")
    ev = np.zeros((2, len(EVENT_NAMES)), bool)
    ev[0, wood] = True
    w.add(ev, np.array([False, False]))
    w.add(np.zeros_like(ev), np.array([True, False]))  # env 0's episode (with wood) ends
    m = w.metrics(reset=True)
    assert RATE_NAMES[RATE_EVENTS.index(wood)] == "collect_wood"
    assert m["rate/collect_wood"] == 250.0 and m["episode_rate/collect_wood"] == 1.0
    assert set(RATE_NAMES) >= PROGRESS and w.metrics() == {}
