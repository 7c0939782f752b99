"""The prerequisite table of Craftax-Classic's achievements (``oir_gym/data/prerequisites.json``).

An achievement's prerequisites are what must have happened earlier in the episode for it to be
possible (the game's recipes: a table needs wood, a wooden pickaxe a table...). The table is read
in three places, all through this module: the evaluation's control pairing never pairs an
achievement with a prerequisite or a consequence (:mod:`oir_gym.evaluation`), the ordered-compound
evaluation sets use only unrelated pairs (:mod:`oir_gym.instructions`), and the ``compound`` oracle
relabeler names only unrelated pairs (:mod:`oir_gym.relabel.oracle`).
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


#: Direct prerequisites of each achievement (achievement name -> names); achievements without any
#: are absent.
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
