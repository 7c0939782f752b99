"""Per-transition event detection (JAX), the source of transition captions.

Every occurrence of each achievement is detected, not only an episode's first unlock: the step clears
Craftax's achievement flags before stepping. Other events are read off the states before and after the
step; a progress event (``"progress": true`` in captions.json) fires where its state condition turns true.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from oir_gym.captions import NUM_ACHIEVEMENTS, NUM_EVENTS, VOCAB
from oir_gym.craftax_compat import DIRECTIONS, HARD_BLOCKS, OBS_DIM, Action, BlockType, is_near_block

_E = {name: i for i, name in enumerate(VOCAB.event_names)}
# event id of achievement a (mapped explicitly, whatever the order in captions.json)
_ACH_EVENT = jnp.array(
    [VOCAB.achievement_of_event.index(a) for a in range(NUM_ACHIEVEMENTS)], dtype=jnp.int32
)


def facing_position(state):
    """Map position of the tile in front of the player."""
    return state.player_position + DIRECTIONS[state.player_direction]


def mob_at(mobs, pos):
    """Whether a live mob of ``mobs`` stands at ``pos``."""
    return jnp.any(jnp.logical_and(mobs.mask, jnp.all(mobs.position == pos[None, :], axis=-1)))


def detect_events(prev, action, nxt, step_achievements):
    """``[NUM_EVENTS]`` bool events of the transition ``prev`` -(``action``)-> ``nxt`` whose ``[22]`` bool
    achievements are ``step_achievements``."""
    ev = jnp.zeros((NUM_EVENTS,), dtype=bool)
    ev = ev.at[_ACH_EVENT].set(step_achievements)

    awake = jnp.logical_not(prev.is_sleeping)
    act = jnp.where(awake, action, Action.NOOP.value)
    is_do = act == Action.DO.value
    target = facing_position(prev)
    block, in_bounds, tpos = faced_tile(prev)
    mob_there = jnp.logical_and(in_bounds, prev.mob_map[tpos[0], tpos[1]])

    def ach(name):
        return ev[_E[name]]

    zombie = mob_at(prev.zombies, target)
    cow = mob_at(prev.cows, target)
    skeleton = mob_at(prev.skeletons, target)
    ev = ev.at[_E["attack_zombie"]].set(is_do & zombie & ~ach("defeat_zombie"))
    ev = ev.at[_E["attack_cow"]].set(is_do & cow & ~ach("eat_cow"))
    ev = ev.at[_E["attack_skeleton"]].set(is_do & skeleton & ~ach("defeat_skeleton"))

    hard = jnp.any(block == HARD_BLOCKS)
    collected_hard = ach("collect_stone") | ach("collect_coal") | ach("collect_iron") | ach("collect_diamond")
    ev = ev.at[_E["hit_hard_block"]].set(is_do & ~mob_there & hard & ~collected_hard)
    ev = ev.at[_E["search_grass"]].set(
        is_do & ~mob_there & (block == BlockType.GRASS.value) & ~ach("collect_sapling")
    )

    ev = ev.at[_E["fall_asleep"]].set(jnp.logical_and(awake, nxt.is_sleeping))
    ev = ev.at[_E["take_damage"]].set(nxt.player_health < prev.player_health)
    ev = ev.at[_E["die"]].set(nxt.player_health <= 0)
    ev = ev.at[_E["move"]].set(jnp.any(nxt.player_position != prev.player_position))
    ev = ev.at[_E["noop"]].set(awake & (action == Action.NOOP.value))
    before, after = progress_conditions(prev), progress_conditions(nxt)
    for name in before:
        ev = ev.at[_E[name]].set(after[name] & ~before[name])
    return ev


def faced_tile(state):
    """The block in front of the player (``OUT_OF_BOUNDS`` past the map's edge), whether that tile is
    on the map, and its position clipped to the map."""
    target = facing_position(state)
    in_bounds = jnp.all((target >= 0) & (target < jnp.array(state.map.shape)))
    tpos = jnp.clip(target, 0, jnp.array(state.map.shape) - 1)
    return jnp.where(in_bounds, state.map[tpos[0], tpos[1]], BlockType.OUT_OF_BOUNDS.value), in_bounds, tpos


def block_in_view(state, block: int):
    """Whether ``block`` lies in the player's view (the ``OBS_DIM`` window of the observation)."""
    dims = jnp.array(OBS_DIM, dtype=jnp.int32)
    shape = jnp.array(state.map.shape, dtype=jnp.int32)
    start = jnp.clip(state.player_position - dims // 2, 0, shape - dims)
    window = jax.lax.dynamic_slice(state.map, (start[0], start[1]), OBS_DIM)
    # a window clipped at the map's edge holds cells outside the view: mask them
    rows = start[0] + jnp.arange(OBS_DIM[0])
    cols = start[1] + jnp.arange(OBS_DIM[1])
    seen = ((jnp.abs(rows - state.player_position[0]) <= OBS_DIM[0] // 2)[:, None]
            & (jnp.abs(cols - state.player_position[1]) <= OBS_DIM[1] // 2)[None, :])
    return jnp.any(seen & (window == block))


def progress_conditions(state) -> dict:
    """The state conditions behind the progress events, by event name (scalar bools)."""
    inv = state.inventory
    faced = faced_tile(state)[0]
    near_table = is_near_block(state, BlockType.CRAFTING_TABLE.value)
    face_stone = faced == BlockType.STONE.value
    return {
        "see_stone": block_in_view(state, BlockType.STONE.value),
        "face_stone": face_stone,
        "face_stone_with_pickaxe": face_stone & (inv.wood_pickaxe >= 1),
        # the materials of the next pickaxe, while it is still missing
        "near_table_with_wood": near_table & (inv.wood >= 1) & (inv.wood_pickaxe == 0),
        "near_table_with_wood_and_stone": near_table & (inv.wood >= 1) & (inv.stone >= 1) & (inv.stone_pickaxe == 0),
        "face_coal_with_pickaxe": (faced == BlockType.COAL.value) & (inv.wood_pickaxe >= 1),
        "face_iron_with_stone_pickaxe": (faced == BlockType.IRON.value) & (inv.stone_pickaxe >= 1),
    }
