"""Evaluation instruction sets (paper Sec. 5 and Appendix A, "Testing Protocol Details").

Three sets, each tied to Craftax achievements so the environment's ground-truth achievement
flags can score them (used only at evaluation):

* ``"original"``: the 22 Craftax instructions in the paper's wording (``"make wooden pickaxe"``);
* ``"simple"``:   three paraphrases per achievement (robustness to surface wording);
* ``"complex"``:  three semantically enriched / compositional variants per achievement.

The texts live in ``oir_gym/data/instructions.json``; a user file with the same schema can be
loaded instead::

    {"instructions": [
        {"achievement": "collect_wood", "original": "collect wood",
         "simple": ["..."], "complex": ["..."]},
        ...]}

(a bare list of entries is accepted too). Entries are returned in Craftax achievement order, and
within an achievement in file order, whatever the order in the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from oir_gym.captions import ACHIEVEMENT_NAMES

#: Valid instruction-set names, in the order the paper reports them.
SET_NAMES: tuple[str, ...] = ("original", "simple", "complex")


class UnknownInstructionSetError(KeyError, ValueError):
    """An instruction-set name that is not one of :data:`SET_NAMES` (catchable as KeyError or ValueError)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class EvalInstruction:
    """One evaluation instruction.

    Attributes:
        text: the instruction given to the agent.
        achievement_index: Craftax achievement index whose ground-truth flag marks success.
        set_name: ``"original"``, ``"simple"`` or ``"complex"``.
    """

    text: str
    achievement_index: int
    set_name: str

    @property
    def achievement(self) -> str:
        """Achievement name, e.g. ``"collect_wood"``."""
        return ACHIEVEMENT_NAMES[self.achievement_index]


def _parse(raw: Any, source: str) -> dict[str, list[EvalInstruction]]:
    entries = raw.get("instructions") if isinstance(raw, dict) else raw
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: expected a non-empty list of entries (or {{\"instructions\": [...]}})")
    seen: set[int] = set()
    parsed: list[tuple[int, dict[str, Any]]] = []
    for n, entry in enumerate(entries):
        where = f"{source}: entry {n}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        missing = [k for k in ("achievement", *SET_NAMES) if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing key(s) {missing}; required: achievement, {', '.join(SET_NAMES)}")
        name = entry["achievement"]
        if name not in ACHIEVEMENT_NAMES:
            raise ValueError(f"{where}: unknown achievement {name!r}; known achievements: {', '.join(ACHIEVEMENT_NAMES)}")
        idx = ACHIEVEMENT_NAMES.index(name)
        if idx in seen:
            raise ValueError(f"{where}: achievement {name!r} appears more than once")
        seen.add(idx)
        if not isinstance(entry["original"], str) or not entry["original"].strip():
            raise ValueError(f"{where} ({name}): 'original' must be a non-empty string")
        for key in ("simple", "complex"):
            texts = entry[key]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise ValueError(f"{where} ({name}): {key!r} must be a non-empty list of non-empty strings")
        parsed.append((idx, entry))
    parsed.sort(key=lambda p: p[0])  # Craftax order, so per-instruction results line up across files
    sets: dict[str, list[EvalInstruction]] = {s: [] for s in SET_NAMES}
    for idx, entry in parsed:
        sets["original"].append(EvalInstruction(entry["original"], idx, "original"))
        for key in ("simple", "complex"):
            sets[key].extend(EvalInstruction(t, idx, key) for t in entry[key])
    return sets


@lru_cache(maxsize=1)
def _packaged() -> dict[str, tuple[EvalInstruction, ...]]:
    raw = json.loads(resources.files("oir_gym.data").joinpath("instructions.json").read_text())
    return {k: tuple(v) for k, v in _parse(raw, "instructions.json").items()}


def load_instruction_sets(path: str | os.PathLike | None = None) -> dict[str, list[EvalInstruction]]:
    """Load the evaluation sets.

    Args:
        path: a JSON file with the schema in the module docstring; default the packaged sets.

    Returns:
        ``{"original": [...], "simple": [...], "complex": [...]}`` (fresh lists).

    Raises:
        ValueError: malformed file (unknown achievement, missing key, empty text, ...).
    """
    if path is None:
        return {k: list(v) for k, v in _packaged().items()}
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    return _parse(raw, str(path))


def get_instruction_set(name: str, path: str | os.PathLike | None = None) -> list[EvalInstruction]:
    """One evaluation set by name (``"original"``, ``"simple"`` or ``"complex"``).

    Raises:
        UnknownInstructionSetError: (a KeyError and a ValueError) for any other name.
    """
    if name not in SET_NAMES:
        raise UnknownInstructionSetError(f"unknown instruction set {name!r}; valid names: {', '.join(SET_NAMES)}")
    return load_instruction_sets(path)[name]


#: The 22 original instructions in Craftax achievement order (paper's wording).
ORIGINAL_INSTRUCTIONS: tuple[str, ...] = tuple(e.text for e in _packaged()["original"])
