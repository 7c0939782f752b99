"""Textual observations of the paper's appendix, computed on the host.

``"Facing: tree; Nearby: [1] tree, water [2] cow, stone; Inventory: wood 2, sapling 1; Status: health 9, food 8, drink 7, energy 9, sleeping no"``

Nearby lists the non-ground blocks and mobs of the 7x7 window by Chebyshev distance, alphabetised
within a group; action text replaces ``DO`` by the faced object (``"interact with tree"``). A jitted
function extracts small arrays (:func:`text_features`), formatted in Python only where text is needed;
:func:`describe` gives the same content as an :class:`Observation`, :func:`parse_observation` reads it back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
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

_R = np.abs(np.arange(-VIEW_RADIUS, VIEW_RADIUS + 1))
_DIST = np.maximum(_R[:, None], _R[None, :])


def _nearby_groups(f: Mapping[str, np.ndarray]) -> list[set[str]]:
    """Names of the non-ground blocks and live mobs at each Chebyshev distance 1..VIEW_RADIUS."""
    groups: list[set[str]] = [set() for _ in range(VIEW_RADIUS + 1)]
    window = np.asarray(f["window"])
    for (i, j), b in np.ndenumerate(window):
        if int(b) not in _TRIVIAL and _DIST[i, j] > 0:
            groups[_DIST[i, j]].add(BLOCK_NAMES[int(b)])
    for rel, alive, kind in zip(np.asarray(f["mob_rel"]), np.asarray(f["mob_alive"]), np.asarray(f["mob_kind"])):
        d = int(np.max(np.abs(rel)))
        if alive and 1 <= d <= VIEW_RADIUS:
            groups[d].add(MOB_NAMES[int(kind)])
    return groups


def format_text(f: Mapping[str, np.ndarray]) -> str:
    """Format one state's features (numpy, unbatched) as the paper's text observation."""
    return _format(f, _nearby_groups(f))


def _format(f: Mapping[str, np.ndarray], groups: list[set[str]]) -> str:
    facing = FACING_NAMES[int(f["facing"])]
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


@dataclass
class Observation:
    """A textual observation in named form: ``facing`` (``"tree"``...), ``nearby`` (name -> smallest
    distance 1..3), ``inventory`` (non-zero counts), ``status`` (health, food, drink, energy), ``sleeping``
    and the ``text`` itself (empty when built by hand)."""

    facing: str = ""
    nearby: dict[str, int] = field(default_factory=dict)
    inventory: dict[str, int] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)
    sleeping: bool = False
    text: str = ""

    def has(self, item: str, n: int = 1) -> bool:
        return self.inventory.get(item, 0) >= n


def describe(f: Mapping[str, np.ndarray]) -> Observation:
    """One state's features (numpy, unbatched; :func:`text_features`) as an :class:`Observation`,
    read from the arrays (its ``text`` is :func:`format_text` of the same features)."""
    groups = _nearby_groups(f)
    nearby: dict[str, int] = {}
    for d, names in enumerate(groups):
        for name in names:
            nearby.setdefault(name, d)
    h, fo, dr, en = (int(v) for v in np.asarray(f["vitals"]))
    return Observation(
        facing=FACING_NAMES[int(f["facing"])], nearby=nearby,
        inventory={name: int(c) for name, c in zip(_ITEM_TEXT, np.asarray(f["inventory"])) if c > 0},
        status={"health": h, "food": fo, "drink": dr, "energy": en}, sleeping=bool(f["sleeping"]),
        text=_format(f, groups))


def _state_features(craftax_states) -> list[dict[str, np.ndarray]]:
    """:func:`text_features` of a batch of Craftax states (one jitted call), one dict per state."""
    feats = jax.device_get(batch_text_features(craftax_states))
    return [{k: v[i] for k, v in feats.items()} for i in range(feats["facing"].shape[0])]


def batch_observations(craftax_states) -> list[Observation]:
    """:func:`describe` for a batch of Craftax states (one jitted feature extraction)."""
    return [describe(f) for f in _state_features(craftax_states)]


_NAMES = r"(?:Facing|Nearby|Inventory|Status)"
_FIELD = re.compile(rf"({_NAMES[3:-1]})\s*:\s*(.*?)\s*(?=(?:;\s*{_NAMES}\s*:)|$)", re.S)
_GROUP = re.compile(r"\[(\d+)\]\s*([^\[]*)")
_COUNT = re.compile(r"^(.*?)\s+(\d+)$")


def parse_observation(text: str) -> Observation:
    """Read a text observation back (the inverse of :func:`format_text`, for text from elsewhere);
    tolerant: missing or odd fields are left empty, never raises."""
    obs = Observation(text=text if isinstance(text, str) else "")
    if not isinstance(text, str):
        return obs
    fields = {m.group(1).lower(): m.group(2).strip().rstrip(";").strip() for m in _FIELD.finditer(text)}
    obs.facing = fields.get("facing", "").lower()
    for m in _GROUP.finditer(fields.get("nearby", "")):
        d = int(m.group(1))
        for name in m.group(2).split(","):
            name = name.strip().lower()
            if name and (name not in obs.nearby or d < obs.nearby[name]):
                obs.nearby[name] = d
    inv = fields.get("inventory", "")
    if inv.lower() not in ("", "empty"):
        for part in inv.split(","):
            m = _COUNT.match(part.strip())
            if m:
                obs.inventory[m.group(1).lower()] = int(m.group(2))
    for part in fields.get("status", "").split(","):
        bits = part.strip().split()
        if len(bits) == 2:
            key, val = bits[0].lower(), bits[1].lower()
            if key == "sleeping":
                obs.sleeping = val in ("yes", "true", "1")
            elif val.lstrip("-").isdigit():
                obs.status[key] = int(val)
    return obs


def batch_text(craftax_states) -> tuple[list[str], np.ndarray]:
    """Text observations of a batch of Craftax states, and the faced ids (for action text)."""
    feats = _state_features(craftax_states)
    return [format_text(f) for f in feats], np.asarray([f["facing"] for f in feats])
