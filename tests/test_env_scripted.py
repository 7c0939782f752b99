"""Scripted agents in hand-built Craftax states: the reward, the terminations and the events.

Every scene is built by editing the worlds of the shared 4-env vector env (see
``conftest.Scene``), so these tests reuse one compiled step program.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EV, A, B, Scene, run_actions

from oir_gym import functional as F
from oir_gym.captions import EVENT_NAMES
from oir_gym.craftax_compat import Achievement


def event_sets(info) -> list[set[str]]:
    """Names of the events of each env of one step's ``infos``."""
    return [{EVENT_NAMES[j] for j in np.flatnonzero(row)} for row in info["events"]]


# --------------------------------------------------------------------------- the reward


def test_reward_fires_exactly_when_scripted_agent_collects_wood_and_places_table(venv):
    """Two trees to the right; the agent mines one, steps forward, mines the other, places a table.

    Same world and script in every env; only the instruction differs.
    """
    instructions = ["collect wood", "place table", "defeat skeleton", "make wood pickaxe"]
    venv.reset(seed=0, options={"instruction": instructions})
    assert venv.current_instructions() == instructions
    sc = Scene(venv)
    for i in range(4):
        sc.block(i, (0, 1), B.TREE).block(i, (0, 2), B.TREE)
    sc.apply()
    stats_before = {t: venv.buffer.stats(t).count for t in instructions}

    script = [A.DO, A.RIGHT, A.DO, A.PLACE_TABLE]
    rewards, terms, truncs, infos = [], [], [], []
    ach_flag_before_second_wood = None
    for t, a in enumerate(script):
        if t == 2:
            ach_flag_before_second_wood = np.asarray(venv._state.env.craftax.achievements)[:, Achievement.COLLECT_WOOD.value]
        acts = np.full(4, a.value)
        if t > 0:
            acts[0] = A.NOOP.value  # env 0 is in a new (random) world by then: keep it idle
        _, r, te, tr, inf = venv.step(acts)
        rewards.append(r), terms.append(te), truncs.append(tr), infos.append(inf)
    rewards, terms, truncs = np.stack(rewards), np.stack(terms), np.stack(truncs)

    # "collect wood": rewarded and terminated at the first step, where the wood is collected.
    assert rewards[0, 0] == 1.0 and terms[0, 0] and infos[0]["success"][0]
    assert infos[0]["episode"]["r"][0] == 1.0 and infos[0]["episode"]["l"][0] == 1
    # "place table": nothing while collecting wood, 1 exactly at the PLACE_TABLE step.
    np.testing.assert_array_equal(rewards[:, 1], [0, 0, 0, 1])
    np.testing.assert_array_equal(terms[:, 1], [False, False, False, True])
    assert [inf["success"][1] for inf in infos] == [False, False, False, True]
    assert infos[3]["episode"]["r"][1] == 1.0 and infos[3]["episode"]["l"][1] == 4
    assert infos[3]["_final_obs"][1] and infos[3]["final_obs"][1] is not None
    # Unrelated instructions never fire, although the same events happen.
    np.testing.assert_array_equal(rewards[:, 2:], 0)
    assert not terms[:, 2:].any() and not truncs.any()

    # Every occurrence of collect_wood is an event (t=0 and t=2), though Craftax's own
    # achievement flag was already set before the second one (Craftax would not count it).
    for i in (1, 2, 3):
        assert [EV["collect_wood"] in np.flatnonzero(inf["events"][i]) for inf in infos] == [True, False, True, False]
        assert [bool(inf["achievements"][i, Achievement.COLLECT_WOOD.value]) for inf in infos] == [True, False, True, False]
        assert event_sets(infos[0])[i] == {"collect_wood"}
        assert event_sets(infos[1])[i] == {"move"}
        assert event_sets(infos[2])[i] == {"collect_wood"}
        assert event_sets(infos[3])[i] == {"place_table"}
    np.testing.assert_array_equal(ach_flag_before_second_wood[1:], True)

    # The similarity reported is the matched caption's (1.0 for the canonical wording).
    assert infos[0]["similarity"][0] == pytest.approx(1.0, abs=1e-5)
    assert infos[3]["similarity"][1] == pytest.approx(1.0, abs=1e-5)
    assert infos[3]["similarity"][2] < venv.params.delta

    # The finished episodes' returns went into the buffer's statistics.
    assert venv.buffer.stats("collect wood").count == stats_before["collect wood"] + 1
    assert venv.buffer.stats("place table").count == stats_before["place table"] + 1
    assert venv.buffer.stats("collect wood").mean_return > 0
    assert venv.buffer.stats("defeat skeleton").count == stats_before["defeat skeleton"]

    # Env 1's world after the script: a table where the second tree stood, all wood spent.
    cs = jax.device_get(venv._state.env.craftax)
    assert cs.map[2, 32, 34] == B.CRAFTING_TABLE.value
    assert cs.inventory.wood[2] == 0
    # Pinned env 0 started a new episode with the same instruction.
    assert venv.current_instructions()[0] == "collect wood"


def test_place_table_without_wood_does_nothing(venv):
    venv.reset(seed=0, options={"instruction": "place table"})
    sc = Scene(venv)
    sc.inventory(1, wood=1).inventory(2, wood=2).inventory(3, wood=2)
    sc.block(3, (0, 1), B.STONE)  # a table cannot be placed into a solid block
    sc.apply()
    rewards, terms, _, infos = run_actions(venv, [[A.PLACE_TABLE.value] * 4])
    np.testing.assert_array_equal(rewards[0], [0, 0, 1, 0])
    np.testing.assert_array_equal(terms[0], [False, False, True, False])
    assert [EV["place_table"] in np.flatnonzero(e) for e in infos[0]["events"]] == [False, False, True, False]


def test_gt_reward_mode_pays_the_achievement_of_the_row(venv, encoder):
    """``reward="gt"`` pays Craftax's ground truth for the instruction's achievement."""
    from oir_gym.vector_env import InstructionCraftax

    env = InstructionCraftax(num_envs=4, seed=0, encoder=encoder, reward="gt")
    env._reset_fn, env._step_fn = venv._reset_fn, venv._step_fn  # same program: skip re-tracing
    env.reset(seed=0, options={"instruction": ["collect wood", "chop a tree", "place table", "collect wood"]})
    sc = Scene(env)
    for i in range(4):
        sc.block(i, (0, 1), B.TREE)
    sc.apply()
    rewards, terms, _, _ = run_actions(env, [[A.DO.value, A.DO.value, A.DO.value, A.NOOP.value]])
    # Row 0 maps to achievement collect_wood; "chop a tree" has no achievement (never paid in gt
    # mode); "place table" is another achievement; env 3 did not act.
    np.testing.assert_array_equal(rewards[0], [1, 0, 0, 0])
    np.testing.assert_array_equal(terms[0], [True, False, False, False])


# --------------------------------------------------------------------------- events


def test_events_drink_craft_sleep(venv):
    venv.reset(seed=0, options={"instruction": ["drink water", "make wood pickaxe", "make wood pickaxe", "fall asleep"]})
    sc = Scene(venv)
    sc.block(0, (0, 1), B.WATER).set(0, player_drink=5)
    sc.block(1, (1, 1), B.CRAFTING_TABLE).inventory(1, wood=1)  # diagonal neighbour counts as nearby
    sc.inventory(2, wood=1)  # no table nearby: crafting fails
    sc.set(3, player_energy=5)
    sc.apply()
    rewards, terms, _, infos = run_actions(venv, [[A.DO.value, A.MAKE_WOOD_PICKAXE.value, A.MAKE_WOOD_PICKAXE.value, A.SLEEP.value]])
    assert event_sets(infos[0]) == [{"collect_drink"}, {"make_wood_pickaxe"}, set(), {"fall_asleep"}]
    np.testing.assert_array_equal(rewards[0], [1, 1, 0, 1])
    np.testing.assert_array_equal(terms[0], [True, True, False, True])
    # Check the states through final_obs-independent quantities: the reset env states are new,
    # so read the effects of env 2 (not reset) and the step achievements.
    cs = jax.device_get(venv._state.env.craftax)
    assert cs.inventory.wood[2] == 1 and cs.inventory.wood_pickaxe[2] == 0
    assert infos[0]["achievements"][0, Achievement.COLLECT_DRINK.value]
    assert infos[0]["achievements"][1, Achievement.MAKE_WOOD_PICKAXE.value]


def test_events_wake_move_noop_hit_stone(venv):
    # Unrelated instructions: no env terminates, so the post-step states can be inspected.
    venv.reset(seed=0, options={"instruction": "defeat skeleton"})
    sc = Scene(venv)
    sc.set(0, is_sleeping=True, player_energy=9)  # wakes up during the step
    sc.block(3, (0, 1), B.STONE)
    sc.apply()
    _, terms, _, infos = run_actions(venv, [[A.NOOP.value, A.RIGHT.value, A.NOOP.value, A.DO.value]])
    assert event_sets(infos[0]) == [{"wake_up"}, {"move"}, {"noop"}, {"hit_hard_block"}]
    assert not terms.any()
    cs = jax.device_get(venv._state.env.craftax)
    assert not cs.is_sleeping[0]
    np.testing.assert_array_equal(cs.player_position[1], [32, 33])
    np.testing.assert_array_equal(cs.player_position[2], [32, 32])
    assert cs.map[3, 32, 33] == B.STONE.value and cs.inventory.stone[3] == 0

    # Blocked move: turning towards a stone does not move (no "move" event), and a sleeping
    # player's actions are ignored (no noop/move event).
    sc = Scene(venv)
    sc.block(0, (0, 1), B.STONE)
    sc.set(1, is_sleeping=True, player_energy=3)
    sc.apply()
    _, _, _, infos = run_actions(venv, [[A.RIGHT.value, A.RIGHT.value, A.UP.value, A.LEFT.value]])
    assert event_sets(infos[0]) == [set(), set(), {"move"}, {"move"}]


def test_events_attack_defeat_search(venv):
    venv.reset(seed=0, options={"instruction": "place stone"})
    sc = Scene(venv)
    sc.mob(0, "zombies", 0, (0, 1), health=5)  # survives one hit
    sc.mob(1, "cows", 0, (0, 1), health=3)  # survives one hit
    sc.block(2, (0, 1), B.GRASS)
    sc.mob(3, "zombies", 0, (0, 1), health=1)  # dies
    sc.apply()
    _, _, _, infos = run_actions(venv, [[A.DO.value] * 4])
    ev = event_sets(infos[0])
    assert ev[0] == {"attack_zombie"}
    assert ev[1] == {"attack_cow"}
    # Searching grass yields a sapling with probability 0.1: exactly one of the two events.
    assert ev[2] in ({"search_grass"}, {"collect_sapling"})
    assert ev[3] == {"defeat_zombie"}


def test_events_every_occurrence_over_repeated_drinks(venv):
    """Drinking five times gives five collect_drink events; Craftax's flag is set once."""
    venv.reset(seed=0, options={"instruction": "defeat zombie"})
    sc = Scene(venv)
    for i in range(4):
        sc.block(i, (0, 1), B.WATER).set(i, player_drink=1)
    sc.apply()
    _, _, _, infos = run_actions(venv, [[A.DO.value, A.DO.value, A.NOOP.value, A.DO.value]] * 5)
    counts = np.sum([inf["events"][:, EV["collect_drink"]] for inf in infos], axis=0)
    np.testing.assert_array_equal(counts, [5, 5, 0, 5])
    cs = jax.device_get(venv._state.env.craftax)
    np.testing.assert_array_equal(cs.player_drink, [6, 6, 1, 6])
    # the episode-level flag is a flag, set once, and the env's ground-truth record agrees
    np.testing.assert_array_equal(cs.achievements[:, Achievement.COLLECT_DRINK.value], [True, True, False, True])
    np.testing.assert_array_equal(
        np.asarray(venv._state.env.achieved)[:, Achievement.COLLECT_DRINK.value], [True, True, False, True]
    )


# --------------------------------------------------------------------------- functional core


def test_functional_batch_step_rewards_and_pool_resets(venv):
    """``F.batch_step`` directly: reward, termination, and a reset that takes the pool's next world."""
    venv.reset(seed=0, options={"instruction": ["collect wood", "collect wood", "eat cow", "eat cow"]})
    sc = Scene(venv)
    sc.block(0, (0, 1), B.TREE)
    sc.apply()
    bstate = venv._state
    params = venv.params
    step = jax.jit(F.batch_step, static_argnames=("obs_mode", "pool_refresh", "autoreset"))
    actions = jnp.array([A.DO.value, A.NOOP.value, A.NOOP.value, A.NOOP.value], jnp.int32)
    obs, new, reward, term, trunc, info, final_obs = step(
        jax.random.PRNGKey(3), bstate, actions, params, obs_mode="paper", pool_refresh=venv.pool_refresh, autoreset=True
    )
    np.testing.assert_array_equal(reward, [1, 0, 0, 0])
    np.testing.assert_array_equal(term, [True, False, False, False])
    assert not np.asarray(trunc).any()
    assert bool(info.events[0, EV["collect_wood"]]) and bool(info.success[0])
    assert int(info.ep_length[0]) == 1 and float(info.ep_return[0]) == 1.0

    # Env 0 restarted on the pool's world at the cursor; the others continue.
    cursor = int(bstate.cursor)
    pool_map = np.asarray(bstate.pool.map[cursor])
    np.testing.assert_array_equal(np.asarray(new.env.craftax.map[0]), pool_map)
    np.testing.assert_array_equal(np.asarray(new.env.steps), [0, 1, 1, 1])
    assert int(new.env.instr[0]) == int(bstate.env.pinned[0])
    assert not bool(new.env.success[0]) and float(new.env.ep_return[0]) == 0.0
    # The cursor advanced by pool_refresh; exactly those slots were regenerated.
    k = venv.pool_refresh
    pool_size = venv.pool_size
    assert int(new.cursor) == (cursor + k) % pool_size
    old_maps, new_maps = np.asarray(bstate.pool.map), np.asarray(new.pool.map)
    changed = [j for j in range(pool_size) if not np.array_equal(old_maps[j], new_maps[j])]
    assert set(changed) <= {(cursor + j) % pool_size for j in range(k)} and changed
    # obs is the new episode's for env 0 and the same as final_obs elsewhere.
    assert not np.array_equal(np.asarray(obs["obs"][0]), np.asarray(final_obs["obs"][0]))
    np.testing.assert_array_equal(np.asarray(obs["obs"][1:]), np.asarray(final_obs["obs"][1:]))


def test_functional_single_env_api_shapes(venv):
    """``reset``/``step`` of one env are vmappable gymnax-style functions (checked by tracing only)."""
    params = venv.params
    key = jax.random.PRNGKey(0)
    obs, state = jax.eval_shape(lambda k: F.reset(k, params, 0), key)
    assert obs["obs"].shape == (888,) and obs["instruction"].shape == (384,)
    out = jax.eval_shape(lambda k, s: F.step(k, s, 5, params), key, state)
    obs2, state2, reward, term, trunc, info = out
    assert obs2["obs"].shape == (888,) and reward.shape == () and term.dtype == jnp.bool_
    assert info.events.shape == (len(EVENT_NAMES),)
    batched = jax.eval_shape(
        lambda ks, ss, a: jax.vmap(F.step, in_axes=(0, 0, 0, None))(ks, ss, a, params),
        jax.random.split(key, 3), jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct((3,) + x.shape, x.dtype), state),
        jnp.zeros((3,), jnp.int32),
    )
    assert batched[2].shape == (3,) and batched[5].events.shape == (3, len(EVENT_NAMES))


def test_also_pays_rows_pay_the_reward_beside_the_instruction(venv):
    """``EnvState.also_pays`` (ELLM's proposed goals): a caption matching any of those rows pays and
    ends the episode like the instruction itself; -1 slots and non-matching rows pay nothing."""
    venv.reset(seed=0, options={"instruction": ["eat cow"] * 4})
    sc = Scene(venv)
    for i in range(4):
        sc.block(i, (0, 1), B.TREE)
    sc.apply()
    wood, zombie = (int(r) for r in venv.registry.rows(["collect wood", "defeat zombie"]))
    params = venv.params
    bstate = F.set_also_pays(venv._state.replace(env=venv._state.env.replace(
        also_pays=jnp.full((4, 2), -1, jnp.int32))), jnp.array([[wood, -1], [-1, -1], [zombie, -1], [-1, wood]]))
    step = jax.jit(F.batch_step, static_argnames=("obs_mode", "pool_refresh", "autoreset"))
    actions = jnp.full((4,), A.DO.value, jnp.int32)
    _, new, reward, term, _, info, _ = step(jax.random.PRNGKey(0), bstate, actions, params, obs_mode="paper",
                                             pool_refresh=venv.pool_refresh, autoreset=True)
    assert bool(np.asarray(info.events[:, EV["collect_wood"]]).all())  # every env collected wood
    np.testing.assert_array_equal(reward, [1, 0, 0, 1])
    np.testing.assert_array_equal(term, [True, False, False, True])
    # the rows stay with the env across its reset, like a pinned row
    np.testing.assert_array_equal(np.asarray(new.env.also_pays[0]), [wood, -1])
    with pytest.raises(ValueError, match="num_also_pays"):
        F.set_also_pays(bstate, jnp.zeros((4, 3), jnp.int32))


def test_bound_rows_pay_exactly_at_their_events_on_device(venv):
    """Event-bound grounding in the env: a row bound to an event pays exactly at that event whatever
    its wording, and an ordered pair pays at its second event only after its first one."""
    from oir_gym.grounding import Binding

    venv.reset(seed=0, options={"instruction": ["eat cow"] * 4})
    sc = Scene(venv)
    for i in range(4):
        sc.block(i, (0, 1), B.TREE).block(i, (0, 2), B.TREE)
    sc.apply()
    wood, table = EV["collect_wood"], EV["place_table"]
    bindings = [Binding(final=wood), Binding(final=table, pre=wood), Binding(final=wood, pre=table),
                Binding(final=table)]
    t = venv.params.table
    final = np.array(t.event_sim)
    pre = np.array(t.pre_sim)
    for r, b in enumerate(bindings):
        final[r], pre[r] = b.rows(len(EVENT_NAMES))
    params = venv.params.replace(table=t.replace(event_sim=jnp.asarray(final), pre_sim=jnp.asarray(pre)))
    rows = jnp.arange(4, dtype=jnp.int32)
    bstate = venv._state.replace(env=venv._state.env.replace(instr=rows, pinned=rows))
    step = jax.jit(F.batch_step, static_argnames=("obs_mode", "pool_refresh", "autoreset"))
    rewards = []
    for k, a in enumerate([A.DO, A.RIGHT, A.DO, A.PLACE_TABLE]):
        acts = jnp.full((4,), a.value, jnp.int32).at[0].set(A.DO.value if k == 0 else A.NOOP.value)
        _, bstate, reward, term, _, _, _ = step(jax.random.PRNGKey(k), bstate, acts, params, obs_mode="paper",
                                                 pool_refresh=venv.pool_refresh, autoreset=True)
        rewards.append(np.asarray(reward))
    rewards = np.stack(rewards)
    np.testing.assert_array_equal(rewards[:, 0], [1, 0, 0, 0])  # bound to wood: the first wood
    np.testing.assert_array_equal(rewards[:, 1], [0, 0, 0, 1])  # wood then table: at the table
    np.testing.assert_array_equal(rewards[:, 2], [0, 0, 0, 0])  # table then wood: never in this order
    np.testing.assert_array_equal(rewards[:, 3], [0, 0, 0, 1])  # bound to the table


@pytest.mark.slow  # 20-40 s on 2 cores (4 programs compile); the default suite's 2-device stored pair (test_sharding) runs blocks end to end
def test_blocks_step_independently_of_each_other(venv):
    """``F.block_step`` over 2 blocks gives, block by block, exactly what ``F.batch_step`` gives each
    block alone (its own key and world pool): the property that lets the trainer run blocks on
    different devices and still reproduce a one-device run. Short episodes force resets."""
    params = venv.params.replace(max_steps=3)
    n, pool = 3, 8
    keys = jax.random.split(jax.random.PRNGKey(7), 2)
    groups = jnp.zeros((2 * n,), jnp.int32)
    reset_b = jax.jit(F.block_reset, static_argnums=(2, 3, 5, 7))
    reset_1 = jax.jit(F.batch_reset, static_argnums=(2, 3, 5, 7))
    step_b = jax.jit(F.block_step, static_argnames=("obs_mode", "pool_refresh"))
    step_1 = jax.jit(F.batch_step, static_argnames=("obs_mode", "pool_refresh"))
    _, both = reset_b(keys, params, n, pool, None, "paper", groups, 0)
    alone = [reset_1(keys[b], params, n, pool, None, "paper", groups[:n], 0)[1] for b in range(2)]
    # block 0 one step ahead: it resets in steps where block 1 does not (block 1 keeps its pool and cursor)
    both = both.replace(env=both.env.replace(steps=both.env.steps.at[:n].set(1)))
    alone[0] = alone[0].replace(env=alone[0].env.replace(steps=alone[0].env.steps + 1))
    run_keys = jax.random.split(jax.random.PRNGKey(8), 2)
    resets, lone_resets = 0, 0
    for t in range(7):
        actions = jax.random.randint(jax.random.PRNGKey(100 + t), (2 * n,), 0, 17)
        step_keys = jax.vmap(lambda k: jax.random.fold_in(k, t))(run_keys)
        obs, both, reward, term, trunc, *_ = step_b(step_keys, both, actions, params, obs_mode="paper", pool_refresh=2)
        done = np.asarray(term | trunc).reshape(2, n)
        resets += int(done.sum())
        lone_resets += int(done[0].any() != done[1].any())
        for b in range(2):
            o, alone[b], r, *_ = step_1(step_keys[b], alone[b], actions[b * n:(b + 1) * n], params, obs_mode="paper",
                                        pool_refresh=2)
            sl = slice(b * n, (b + 1) * n)
            np.testing.assert_array_equal(np.asarray(obs["obs"])[sl], np.asarray(o["obs"]))
            np.testing.assert_array_equal(np.asarray(reward)[sl], np.asarray(r))
            jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x)[sl], np.asarray(y)),
                                   both.env, alone[b].env)
            jax.tree_util.tree_map(
                lambda x, y: np.testing.assert_array_equal(np.asarray(x)[b * pool:(b + 1) * pool], np.asarray(y)),
                both.pool, alone[b].pool)
            assert int(both.cursor[b]) == int(alone[b].cursor)
    assert resets >= 2 * n and lone_resets >= 2  # every env reset; some steps reset one block only


def test_a_reset_from_pregenerated_worlds_is_the_reset_that_generates_them(venv):
    """``F.block_worlds`` (what a trainer generates while its encoder loads) gives the worlds
    ``F.block_reset`` would generate from the same keys: the reset from them is the same reset."""
    n, pool = 3, 8
    keys = jax.random.split(jax.random.PRNGKey(11), 2)
    reset = jax.jit(F.block_reset, static_argnums=(2, 3, 5, 7))
    worlds = jax.jit(F.block_worlds, static_argnums=(2, 3))(keys, venv.params.craftax, n, pool)
    obs_a, a = reset(keys, venv.params, n, pool, None, "paper", None, 0)
    obs_b, b = reset(keys, venv.params, n, pool, None, "paper", None, 0, worlds)
    jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), (obs_a, a),
                           (obs_b, b))
    # the pool is not a copy of the envs' worlds
    assert not np.array_equal(np.asarray(b.pool.map[:n]), np.asarray(b.env.craftax.map))
