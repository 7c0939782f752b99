"""Per-transition event detection (JAX), the source of transition captions.

Every occurrence of each of the 22 achievement kinds is detected, not only the first unlock of
an episode: the step function clears Craftax's achievement flags before stepping, so the flags
set after the step are exactly this step's achievements (Craftax reads the flags only to
compute its own reward). Other events are read off the state before and after the step.
"""

from __future__ import annotations

import jax.numpy as jnp

from oir_gym.captions import NUM_ACHIEVEMENTS, NUM_EVENTS, VOCAB
from oir_gym.craftax_compat import DIRECTIONS, HARD_BLOCKS, Action, BlockType

_E = {name: i for i, name in enumerate(VOCAB.event_names)}
# event id of achievement a (the 22 achievement events come first in captions.json, but do not
# rely on it: map explicitly).
_ACH_EVENT = jnp.array(
    [VOCAB.achievement_of_event.index(a) for a in range(NUM_ACHIEVEMENTS)], dtype=jnp.int32
)


def facing_position(state):
    """Map position of the tile in front of the player."""
    return state.player_position + DIRECTIONS[state.player_direction]


def _mob_at(mobs, pos):
    return jnp.any(jnp.logical_and(mobs.mask, jnp.all(mobs.position == pos[None, :], axis=-1)))


def detect_events(prev, action, nxt, step_achievements):
    """Events of one transition.

    Args:
        prev: Craftax state before the step.
        action: the action taken (int).
        nxt: Craftax state after the step.
        step_achievements: ``[22]`` bool achievements that happened in this step.

    Returns:
        ``[NUM_EVENTS]`` bool.
    """
    ev = jnp.zeros((NUM_EVENTS,), dtype=bool)
    ev = ev.at[_ACH_EVENT].set(step_achievements)

    awake = jnp.logical_not(prev.is_sleeping)
    act = jnp.where(awake, action, Action.NOOP.value)
    is_do = act == Action.DO.value
    target = facing_position(prev)
    in_bounds = jnp.all((target >= 0) & (target < jnp.array(prev.map.shape)))
    tpos = jnp.clip(target, 0, jnp.array(prev.map.shape) - 1)
    block = jnp.where(in_bounds, prev.map[tpos[0], tpos[1]], BlockType.OUT_OF_BOUNDS.value)
    mob_there = jnp.logical_and(in_bounds, prev.mob_map[tpos[0], tpos[1]])

    def ach(name):
        return ev[_E[name]]

    zombie = _mob_at(prev.zombies, target)
    cow = _mob_at(prev.cows, target)
    skeleton = _mob_at(prev.skeletons, target)
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
    return ev
