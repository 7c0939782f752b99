"""The few Craftax-Classic internals oir-gym relies on, imported in one place.

Craftax is pinned (``craftax==1.6.1``); if its layout changes, this is the only module to fix.
"""

from __future__ import annotations

import jax.numpy as jnp
from craftax.craftax_classic.constants import DIRECTIONS, OBS_DIM, Achievement, Action, BlockType
from craftax.craftax_classic.envs.craftax_state import EnvParams as CraftaxParams
from craftax.craftax_classic.envs.craftax_state import EnvState as CraftaxState
from craftax.craftax_classic.envs.craftax_state import StaticEnvParams as CraftaxStaticParams
from craftax.craftax_classic.game_logic import craftax_step, is_near_block
from craftax.craftax_classic.renderer import render_craftax_symbolic
from craftax.craftax_classic.world_gen import generate_world

NUM_ACTIONS = len(Action)  # 17
NUM_BLOCKS = len(BlockType)  # 17
MOB_NAMES = ("zombie", "cow", "skeleton", "arrow")
BLOCK_NAMES = tuple(b.name.lower().replace("_", " ") for b in BlockType)
ACTION_NAMES = tuple(a.name.lower() for a in Action)
INVENTORY_ITEMS = (
    "wood", "stone", "coal", "iron", "diamond", "sapling",
    "wood_pickaxe", "stone_pickaxe", "iron_pickaxe", "wood_sword", "stone_sword", "iron_sword",
)
#: Blocks that are ground, not worth naming in the text observation's "Nearby" list.
TRIVIAL_BLOCKS = (BlockType.INVALID.value, BlockType.OUT_OF_BOUNDS.value, BlockType.GRASS.value,
                  BlockType.SAND.value, BlockType.PATH.value)
#: Blocks that need a pickaxe (hitting them without one yields nothing).
HARD_BLOCKS = jnp.array([BlockType.STONE.value, BlockType.COAL.value, BlockType.IRON.value,
                         BlockType.DIAMOND.value], dtype=jnp.int32)

__all__ = [
    "DIRECTIONS", "OBS_DIM", "Achievement", "Action", "BlockType", "CraftaxParams", "CraftaxState",
    "CraftaxStaticParams", "craftax_step", "is_near_block", "render_craftax_symbolic", "generate_world",
    "NUM_ACTIONS", "NUM_BLOCKS", "MOB_NAMES", "BLOCK_NAMES", "ACTION_NAMES", "INVENTORY_ITEMS",
    "TRIVIAL_BLOCKS", "HARD_BLOCKS",
]
