"""Policy observations (JAX): the paper's appendix vector and Craftax's own symbolic vector.

``"paper"`` layout (all features in [0, 1]), in this order:

=================  =====  ==========================================================
block one-hot      833    7x7 window around the player (row-major), 17 block types
mob counts          12    zombie, cow, skeleton, arrow x Chebyshev distance 1..3,
                          each count divided by that mob type's maximum number
facing one-hot      21    the block (17) or mob (4) on the tile the player faces
inventory           12    counts / 9
vitals               4    health, food, drink, energy / 9
direction            4    one-hot (left, right, up, down)   [addition to the paper]
sleeping, light      2    is_sleeping, light level            [addition to the paper]
=================  =====  ==========================================================

Without the last two rows the policy cannot tell whether it sleeps or which way it faces on ground.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from oir_gym.craftax_compat import NUM_BLOCKS, BlockType, render_craftax_symbolic
from oir_gym.events import faced_tile, facing_position, mob_at
from oir_gym.validation import check_choice

OBS_MODES = ("paper", "symbolic")
VIEW_RADIUS = 3
_WIN = 2 * VIEW_RADIUS + 1
NUM_MOB_TYPES = 4
PAPER_OBS_DIM = _WIN * _WIN * NUM_BLOCKS + NUM_MOB_TYPES * VIEW_RADIUS + (NUM_BLOCKS + NUM_MOB_TYPES) + 12 + 4 + 4 + 2
SYMBOLIC_OBS_DIM = 1345


def obs_dim(mode: str) -> int:
    """Length of the observation vector for a mode."""
    check_obs_mode(mode)
    return PAPER_OBS_DIM if mode == "paper" else SYMBOLIC_OBS_DIM


def check_obs_mode(mode: str) -> None:
    """Raise ValueError naming ``obs_mode`` unless ``mode`` is one of :data:`OBS_MODES`."""
    check_choice("obs_mode", mode, OBS_MODES)


def _mobs(state):
    return (state.zombies, state.cows, state.skeletons, state.arrows)


def facing_id(state):
    """Id of what the player faces: a block id in [0, 17), or 17 + mob type (zombie, cow, skeleton, arrow)."""
    target = facing_position(state)
    block = faced_tile(state)[0]
    mob_hits = jnp.stack([mob_at(m, target) for m in _mobs(state)])
    return jnp.where(jnp.any(mob_hits), NUM_BLOCKS + jnp.argmax(mob_hits), block)


def local_window(state):
    """The 7x7 block ids around the player (out-of-map tiles are OUT_OF_BOUNDS)."""
    padded = jnp.pad(state.map, VIEW_RADIUS, constant_values=BlockType.OUT_OF_BOUNDS.value)
    # padded index of map position p is p + R; the window starts at p - R -> padded p.
    return jax.lax.dynamic_slice(padded, (state.player_position[0], state.player_position[1]), (_WIN, _WIN))


def paper_observation(state):
    """The paper's observation vector (see module docstring), float32 ``[PAPER_OBS_DIM]``."""
    window = local_window(state)
    blocks = jax.nn.one_hot(window.reshape(-1), NUM_BLOCKS, dtype=jnp.float32).reshape(-1)

    counts = []
    for m in _mobs(state):
        d = jnp.max(jnp.abs(m.position - state.player_position[None, :]), axis=-1)
        n_max = m.mask.shape[0]
        for r in range(1, VIEW_RADIUS + 1):
            counts.append(jnp.sum(m.mask & (d == r)) / n_max)
    mob_counts = jnp.stack(counts).astype(jnp.float32)

    facing = jax.nn.one_hot(facing_id(state), NUM_BLOCKS + NUM_MOB_TYPES, dtype=jnp.float32)
    inv = jnp.stack(jax.tree_util.tree_leaves(state.inventory)).astype(jnp.float32) / 9.0
    vitals = jnp.stack(
        [state.player_health, state.player_food, state.player_drink, state.player_energy]
    ).astype(jnp.float32) / 9.0
    direction = jax.nn.one_hot(state.player_direction - 1, 4, dtype=jnp.float32)
    extra = jnp.stack([state.is_sleeping.astype(jnp.float32), jnp.asarray(state.light_level, jnp.float32)])
    return jnp.concatenate([blocks, mob_counts, facing, jnp.clip(inv, 0, 1), jnp.clip(vitals, 0, 1), direction, extra])


def observe(state, mode: str):
    """Observation vector of a Craftax state in the given mode (mode is static)."""
    if mode == "paper":
        return paper_observation(state)
    if mode == "symbolic":
        return render_craftax_symbolic(state).astype(jnp.float32)
    check_obs_mode(mode)
