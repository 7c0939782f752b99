"""The few Craftax-Classic internals oir-gym relies on, imported in one place.

Craftax is pinned (``craftax==1.6.1``); if its layout changes, this is the only module to fix.

Pixel rendering reads the block textures from a per-user cache written atomically
(:func:`texture_cache_path`), not from Craftax's in-package file that an interrupted write leaves
truncated for every later render; an unreadable cache is named (:class:`TextureCacheError`) and rebuilt.
"""

from __future__ import annotations

import bz2
import functools
import os
import pickle
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import jax.numpy as jnp
from craftax.craftax_classic import constants as _constants
from craftax.craftax_classic import renderer as _renderer
from craftax.craftax_classic.constants import DIRECTIONS, OBS_DIM, Achievement, Action, BlockType
from craftax.craftax_classic.envs.craftax_state import EnvParams as CraftaxParams
from craftax.craftax_classic.envs.craftax_state import EnvState as CraftaxState
from craftax.craftax_classic.envs.craftax_state import StaticEnvParams as CraftaxStaticParams
from craftax.craftax_classic.game_logic import craftax_step, is_near_block
from craftax.craftax_classic.renderer import render_craftax_symbolic
from craftax.craftax_classic.world_gen import generate_world

from oir_gym.validation import atomic_file

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
    "TRIVIAL_BLOCKS", "HARD_BLOCKS", "TextureCacheError", "TEXTURE_CACHE_ENV", "texture_cache_path",
    "read_texture_cache", "load_textures", "make_pixel_renderer",
]

# ----------------------------------------------------------------------------- the texture cache
#: Environment variable naming the folder of the texture cache (default ``~/.cache/oir_gym/craftax``).
TEXTURE_CACHE_ENV = "OIR_GYM_CRAFTAX_CACHE_DIR"
#: The block sizes Craftax-Classic's texture cache holds (agent observation, image, human view).
TEXTURE_SIZES = (_constants.BLOCK_PIXEL_SIZE_AGENT, _constants.BLOCK_PIXEL_SIZE_IMG,
                 _constants.BLOCK_PIXEL_SIZE_HUMAN)


class TextureCacheError(RuntimeError):
    """A Craftax texture cache file that cannot be used; the message names the file."""


def _craftax_version() -> str:
    try:
        return version("craftax")
    except PackageNotFoundError:  # pragma: no cover - a source checkout of craftax
        return "unknown"


def texture_cache_path() -> Path:
    """The per-user texture cache: ``$OIR_GYM_CRAFTAX_CACHE_DIR`` (default ``~/.cache/oir_gym/craftax``)
    / ``texture_cache_classic-<craftax version>.pbz2``."""
    folder = os.environ.get(TEXTURE_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "oir_gym", "craftax")
    return Path(folder) / f"texture_cache_classic-{_craftax_version()}.pbz2"


def read_texture_cache(path: str | os.PathLike) -> dict:
    """The textures in the cache file ``path``, checked as Craftax checks them (the shapes of every size).

    Raises:
        TextureCacheError: naming ``path``: unreadable, truncated, not a bz2 pickle, or wrong shapes.
    """
    try:
        with bz2.BZ2File(path, "rb") as f:
            data = pickle.load(f)
    except Exception as e:  # noqa: BLE001 - EOFError, OSError, UnpicklingError...: all mean "cannot use it"
        raise TextureCacheError(f"Craftax texture cache {path} cannot be read ({type(e).__name__}: {e}); "
                                "it is rebuilt on the next render (or delete the file)") from None
    for ts in TEXTURE_SIZES:
        try:
            shape = tuple(data[ts]["full_map_block_textures"].shape)
        except Exception:  # noqa: BLE001 - a dict of another layout
            shape = None
        want = (len(BlockType), _constants.OBS_DIM[0] * ts, _constants.OBS_DIM[1] * ts, 3)
        if shape != want:
            raise TextureCacheError(f"Craftax texture cache {path} holds textures of another layout (size {ts}: "
                                    f"{shape}, expected {want}); it is rebuilt on the next render")
    return data


def _write_texture_cache(path: Path, textures: dict) -> None:
    """Write ``textures`` to a temporary file and rename it over ``path`` (a reader never sees a part)."""
    with atomic_file(path, "wb") as raw, bz2.BZ2File(raw, "wb") as f:
        pickle.dump(textures, f)


@functools.lru_cache(maxsize=None)
def load_textures() -> dict:
    """Craftax-Classic's block textures of every size, once per process: from the per-user cache, else
    Craftax's own when it reads whole, else built (a minute) and cached; ``CRAFTAX_RELOAD_TEXTURES`` rebuilds."""
    path = texture_cache_path()
    reload = bool(os.environ.get("CRAFTAX_RELOAD_TEXTURES"))
    if not reload:
        for source in (path, Path(_constants.TEXTURE_CACHE_FILE)):
            if not source.is_file():
                continue
            try:
                textures = read_texture_cache(source)
            except TextureCacheError as e:
                print(f"oir-gym: WARNING: {e}", file=sys.stderr, flush=True)
                continue
            if source != path:
                _write_cache_quietly(path, textures)
            return textures
    print(f"oir-gym: building the Craftax-Classic textures (about a minute, once; cached in {path})",
          file=sys.stderr, flush=True)
    textures = {ts: _constants.load_all_textures_given_size(ts) for ts in TEXTURE_SIZES}
    _write_cache_quietly(path, textures)
    return textures


def _write_cache_quietly(path: Path, textures: dict) -> None:
    try:
        _write_texture_cache(path, textures)
    except OSError as e:  # a read-only home still renders, building the textures each process
        print(f"oir-gym: WARNING: cannot write the Craftax texture cache {path} ({e}); set "
              f"{TEXTURE_CACHE_ENV} to a writable folder", file=sys.stderr, flush=True)


def make_pixel_renderer(block_pixel_size: int) -> Callable[[Any], Any]:
    """Craftax-Classic's pixel renderer of ``block_pixel_size``-pixel blocks (one state -> ``[H, W, 3]``
    floats), its textures from :func:`load_textures` instead of Craftax's in-package cache."""
    _renderer.load_all_textures = load_textures  # the renderer reads the name from its own module
    return _renderer.make_craftax_pixel_renderer(block_pixel_size)
