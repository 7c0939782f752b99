"""Textual observations of the paper's appendix, computed on the host.

``"Facing: tree; Nearby: [1] tree, water [2] cow, stone; Inventory: wood 2, sapling 1; Status: health 9, food 8, drink 7, energy 9, sleeping no"``

* **Facing** names the block or mob on the tile ahead.
* **Nearby** lists the non-ground blocks (not grass, sand, path) and the mobs of the 7x7 window,
  grouped by Chebyshev distance ``[1]``, ``[2]``, ``[3]`` and alphabetised within a group
  (``nothing`` when the window holds only ground).
* **Inventory** lists items with a non-zero count (``empty`` otherwise).
* **Status** gives health, food, drink, energy and whether the player sleeps.

Action text names the action, with ``DO`` replaced by the faced object (``"interact with tree"``).

A jitted JAX function extracts the few small arrays needed (:func:`text_features`); the strings
are then formatted in Python, only for the steps that need text (LLM prompts, ``info``).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from oir_gym.craftax_compat import ACTION_NAMES, BLOCK_NAMES, INVENTORY_ITEMS, MOB_NAMES, TRIVIAL_BLOCKS, Action
from oir_gym.observation import VIEW_RADIUS, facing_id, local_window

FACING_NAMES = BLOCK_NAMES + MOB_NAMES
_TRIVIAL = set(TRIVIAL_BLOCKS)
_ITEM_TEXT = tuple(i.replace("_", " ") for i in INVENTORY_ITEMS)


def text_features(state) -> dict:
    """Small arrays describing one Craftax state (vmap for a batch)."""
    mobs = (state.zombies, state.cows, state.skeletons, state.arrows)
    rel = jnp.concatenate([m.position - state.player_position[None, :] for m in mobs])
    alive = jnp.concatenate([m.mask for m in mobs])
    kind = jnp.concatenate([jnp.full(m.mask.shape, i) for i, m in enumerate(mobs)])
    return {
        "window": local_window(state),
        "facing": facing_id(state),
        "mob_rel": rel,
        "mob_alive": alive,
        "mob_kind": kind,
        "inventory": jnp.stack(jax.tree_util.tree_leaves(state.inventory)),
        "vitals": jnp.stack([state.player_health, state.player_food, state.player_drink, state.player_energy]),
        "sleeping": state.is_sleeping,
    }


batch_text_features = jax.jit(jax.vmap(text_features))

_DIST = None


def _distances() -> np.ndarray:
    global _DIST
    if _DIST is None:
        r = np.arange(-VIEW_RADIUS, VIEW_RADIUS + 1)
        _DIST = np.maximum(np.abs(r)[:, None], np.abs(r)[None, :])
    return _DIST


def format_text(f: Mapping[str, np.ndarray]) -> str:
    """Format one state's features (numpy, unbatched) as the paper's text observation."""
    facing = FACING_NAMES[int(f["facing"])]
    groups: list[set[str]] = [set() for _ in range(VIEW_RADIUS + 1)]
    window = np.asarray(f["window"])
    dist = _distances()
    for (i, j), b in np.ndenumerate(window):
        if int(b) not in _TRIVIAL and dist[i, j] > 0:
            groups[dist[i, j]].add(BLOCK_NAMES[int(b)])
    for rel, alive, kind in zip(np.asarray(f["mob_rel"]), np.asarray(f["mob_alive"]), np.asarray(f["mob_kind"])):
        d = int(np.max(np.abs(rel)))
        if alive and 1 <= d <= VIEW_RADIUS:
            groups[d].add(MOB_NAMES[int(kind)])
    nearby = " ".join(f"[{d}] " + ", ".join(sorted(groups[d])) for d in range(1, VIEW_RADIUS + 1) if groups[d])
    inv = ", ".join(f"{name} {int(c)}" for name, c in zip(_ITEM_TEXT, np.asarray(f["inventory"])) if c > 0)
    h, fo, dr, en = (int(v) for v in np.asarray(f["vitals"]))
    status = f"health {h}, food {fo}, drink {dr}, energy {en}, sleeping {'yes' if bool(f['sleeping']) else 'no'}"
    return f"Facing: {facing}; Nearby: {nearby or 'nothing'}; Inventory: {inv or 'empty'}; Status: {status}"


def action_text(action: int, facing: int | None = None) -> str:
    """Text of an action; ``DO`` becomes ``"interact with <faced object>"`` when ``facing`` is given."""
    action = int(action)
    if not 0 <= action < len(ACTION_NAMES):
        raise ValueError(f"action {action} outside [0, {len(ACTION_NAMES) - 1}]")
    if action == Action.DO.value and facing is not None:
        return f"interact with {FACING_NAMES[int(facing)]}"
    name = ACTION_NAMES[action]
    if action in (Action.LEFT.value, Action.RIGHT.value, Action.UP.value, Action.DOWN.value):
        return f"move {name}"
    return name.replace("_", " ")


def batch_text(craftax_states) -> tuple[list[str], np.ndarray]:
    """Text observations of a batch of Craftax states, and the faced ids (for action text)."""
    feats = jax.device_get(batch_text_features(craftax_states))
    n = feats["facing"].shape[0]
    texts = [format_text({k: v[i] for k, v in feats.items()}) for i in range(n)]
    return texts, np.asarray(feats["facing"])
