"""The prerequisite table of Craftax-Classic's achievements (``oir_gym/data/prerequisites.json``).

An achievement's prerequisites must have happened earlier in the episode (a table needs wood...); the
evaluation's control pairing, the compound evaluation sets and the compound oracle use only unrelated pairs.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from oir_gym.captions import ACHIEVEMENT_NAMES


def _load() -> dict[str, tuple[str, ...]]:
    raw = json.loads(resources.files("oir_gym.data").joinpath("prerequisites.json").read_text())
    table = raw.get("prerequisites") if isinstance(raw, dict) else None
    if not isinstance(table, dict):
        raise ValueError("prerequisites.json: expected {\"prerequisites\": {achievement: [achievements]}}")
    out: dict[str, tuple[str, ...]] = {}
    for name, needs in table.items():
        for n in (name, *needs):
            if n not in ACHIEVEMENT_NAMES:
                raise ValueError(f"prerequisites.json: unknown achievement {n!r} (entry {name!r}); known achievements: "
                                 f"{', '.join(ACHIEVEMENT_NAMES)}")
        out[name] = tuple(needs)
    return out


#: Direct prerequisites of each achievement (name -> names); achievements without any are absent.
PREREQUISITES: dict[str, tuple[str, ...]] = _load()


@lru_cache(maxsize=None)
def ancestors(a: int) -> frozenset[int]:
    """Every achievement (index) that must happen before achievement ``a`` (transitively)."""
    out: set[int] = set()
    for p in PREREQUISITES.get(ACHIEVEMENT_NAMES[a], ()):
        i = ACHIEVEMENT_NAMES.index(p)
        out |= {i} | ancestors(i)
    return frozenset(out)


def related_achievements(a: int, b: int) -> bool:
    """Whether achievements ``a`` and ``b`` (indices) are the same, or one is a prerequisite of the
    other (directly or through others): "collect wood" and "make wood pickaxe" are related."""
    return a == b or a in ancestors(b) or b in ancestors(a)
