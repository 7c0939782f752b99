"""Evaluation instruction sets (paper Sec. 5 and Appendix A, "Testing Protocol Details").

Sets scored by the env's ground-truth achievement flags: the paper's :data:`SET_NAMES` and
:data:`EXTRA_SET_NAMES`, from ``oir_gym/data/instructions.json``, and user files of named sets. Both file
schemas: ``docs/evaluation.md``.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from oir_gym.captions import ACHIEVEMENT_NAMES
from oir_gym.validation import read_json_file, show
from oir_gym.prerequisites import related_achievements

#: The paper's instruction sets, in the order the paper reports them (evaluated by default).
SET_NAMES: tuple[str, ...] = ("original", "simple", "complex")

#: The other packaged sets (a training run's final evaluation adds them, ``eval.final_sets``).
EXTRA_SET_NAMES: tuple[str, ...] = ("heldout", "ordered", "ordered_reverse")

#: Every packaged set, in order.
PACKAGED_SET_NAMES: tuple[str, ...] = (*SET_NAMES, *EXTRA_SET_NAMES)

#: Paraphrase sets of the per-achievement schema that an entry may leave out.
OPTIONAL_PARAPHRASE_SETS: tuple[str, ...] = ("heldout",)

#: Names a user set may not take (``control``: the control's metrics are ``eval/control/<set>/...``).
RESERVED_SET_NAMES: tuple[str, ...] = (*PACKAGED_SET_NAMES, "control")

#: A user set name: it becomes part of metric keys (``eval/<name>/...``) and table rows.
SET_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class UnknownInstructionSetError(KeyError, ValueError):
    """An instruction-set name that is not one of :data:`SET_NAMES` (catchable as KeyError or ValueError)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class EvalInstruction:
    """One evaluation instruction."""

    text: str
    achievement_index: int  # the achievement whose flag marks success, or -1 for several (all_of)
    set_name: str
    all_of: tuple[int, ...] = ()  # the achievements that must all happen (Craftax order; asked order when ordered)
    ordered: bool = False  # all_of's two achievements must happen in this order ("X then Y")
    horizon: int | None = None  # success counts only within this many steps (None: the evaluation's horizon)

    @property
    def targets(self) -> tuple[int, ...]:
        """The achievement indices that score this instruction (one, or ``all_of``)."""
        return self.all_of or (self.achievement_index,)

    @property
    def achievement(self) -> str:
        """Achievement name, e.g. ``"collect_wood"``; ``"a+b"`` for several, ``"a>b"`` for an ordered pair."""
        return (">" if self.ordered else "+").join(ACHIEVEMENT_NAMES[i] for i in self.targets)


def _parse(raw: Any, source: str) -> dict[str, list[EvalInstruction]]:
    ordered = _parse_ordered(raw.get("ordered"), source) if isinstance(raw, dict) and "ordered" in raw else None
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
        unknown = [k for k in entry if k not in ("achievement", *SET_NAMES, *OPTIONAL_PARAPHRASE_SETS)
                   and not k.startswith("_")]
        if unknown:
            raise ValueError(f"{where} ({name}): unknown key {unknown[0]!r}; an entry has achievement, "
                             f"{', '.join(SET_NAMES)} and optionally {', '.join(OPTIONAL_PARAPHRASE_SETS)}")
        for key in ("simple", "complex", *(k for k in OPTIONAL_PARAPHRASE_SETS if k in entry)):
            texts = entry[key]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise ValueError(f"{where} ({name}): {key!r} must be a non-empty list of non-empty strings")
        for key, texts in (("original", [entry["original"]]), ("simple", entry["simple"]),
                           ("complex", entry["complex"])):
            for t in texts:  # the rule every instruction follows (length, control characters)
                validate_instruction(t, f"{where} ({name}): {key!r}")
        parsed.append((idx, entry))
    parsed.sort(key=lambda p: p[0])  # Craftax order, so per-instruction results line up across files
    optional = [k for k in OPTIONAL_PARAPHRASE_SETS if any(k in e for _, e in parsed)]
    sets: dict[str, list[EvalInstruction]] = {s: [] for s in (*SET_NAMES, *optional)}
    for idx, entry in parsed:
        sets["original"].append(EvalInstruction(entry["original"], idx, "original"))
        for key in ("simple", "complex", *optional):
            sets[key].extend(EvalInstruction(t, idx, key) for t in entry.get(key, ()))
    if ordered is not None:
        sets.update(ordered)
    return sets


def _parse_ordered(raw: Any, source: str) -> dict[str, list[EvalInstruction]]:
    where = f"{source}: 'ordered'"
    if not isinstance(raw, dict) or not isinstance(raw.get("pairs"), list) or not raw["pairs"]:
        raise ValueError(f"{where}: expected {{\"horizon\": steps, \"pairs\": [{{\"first\", \"then\", \"text\", "
                         "\"reverse\"}}, ...]}}")
    horizon = _horizon(raw.get("horizon"), where)
    out: dict[str, list[EvalInstruction]] = {"ordered": [], "ordered_reverse": []}
    seen: set[frozenset[int]] = set()
    for n, pair in enumerate(raw["pairs"]):
        at = f"{where}, pair {n}"
        if not isinstance(pair, dict) or sorted(k for k in pair if not k.startswith("_")) != ["first", "reverse",
                                                                                             "text", "then"]:
            raise ValueError(f"{at}: expected an object with the fields first, then, text and reverse")
        a = _achievement_index(pair["first"], at, "first")
        b = _achievement_index(pair["then"], at, "then")
        if related_achievements(a, b):
            raise ValueError(f"{at}: {pair['first']!r} and {pair['then']!r} are the same achievement or one is a "
                             "prerequisite of the other (oir_gym/data/prerequisites.json): their order says nothing "
                             "about the agent; choose an unrelated pair")
        if frozenset((a, b)) in seen:
            raise ValueError(f"{at}: the pair {pair['first']!r}, {pair['then']!r} is listed twice")
        seen.add(frozenset((a, b)))
        try:
            text = validate_instruction(pair["text"], f"{at}: field 'text'")
            reverse = validate_instruction(pair["reverse"], f"{at}: field 'reverse'")
        except TypeError as e:
            raise ValueError(str(e)) from None
        out["ordered"].append(EvalInstruction(text, -1, "ordered", (a, b), True, horizon))
        out["ordered_reverse"].append(EvalInstruction(reverse, -1, "ordered_reverse", (b, a), True, horizon))
    return out


def _horizon(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{where}: field 'horizon': expected a number of steps >= 1, got {v!r}")
    return v


@lru_cache(maxsize=1)
def _packaged() -> dict[str, tuple[EvalInstruction, ...]]:
    raw = json.loads(resources.files("oir_gym.data").joinpath("instructions.json").read_text())
    return {k: tuple(v) for k, v in _parse(raw, "instructions.json").items()}


def load_instruction_sets(path: str | os.PathLike | None = None) -> dict[str, list[EvalInstruction]]:
    """``{set name: [EvalInstruction, ...]}`` (fresh lists) of the packaged sets or of a per-achievement file."""
    if path is None:
        return {k: list(v) for k, v in _packaged().items()}
    return _parse(_read_json(path), str(path))


def get_instruction_set(name: str, path: str | os.PathLike | None = None) -> list[EvalInstruction]:
    """One of the :data:`PACKAGED_SET_NAMES` sets; UnknownInstructionSetError for another name or one ``path`` lacks."""
    if name not in PACKAGED_SET_NAMES:
        raise UnknownInstructionSetError(f"unknown instruction set {name!r}; valid names: {', '.join(PACKAGED_SET_NAMES)}")
    sets = load_instruction_sets(path)
    if name not in sets:
        raise UnknownInstructionSetError(f"{path}: has no set {name!r}; it has {', '.join(sets)}")
    return sets[name]


#: Longest instruction text (characters, after whitespace is collapsed).
MAX_INSTRUCTION_CHARS = 500
MAX_TEXT_CHARS = MAX_INSTRUCTION_CHARS


def validate_instruction(text: object, where: str = "instruction") -> str:
    """The instruction with its whitespace collapsed; TypeError for a non-string, ValueError for one empty,
    longer than :data:`MAX_INSTRUCTION_CHARS` or holding a control character."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: expected a non-empty string, got {_type_name(text)} {show(text)}")
    s = " ".join(text.split())
    if not s:
        raise ValueError(f"{where}: empty text (an instruction must be a non-empty string), got {text!r}")
    bad = next((c for c in s if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"{where}: holds the control character {bad!r} at position {s.index(bad)}; "
                         f"an instruction is plain text: {s[:60]!r}")
    if len(s) > MAX_INSTRUCTION_CHARS:
        raise ValueError(f"{where}: {len(s)} characters, more than the {MAX_INSTRUCTION_CHARS} allowed: {s[:60]!r}...")
    return s


_ENTRY_FIELDS = ("text", "achievement", "achievements", "sequence", "horizon")


class _Obj(dict):
    """A JSON object that remembers keys given twice (``json`` keeps only the last silently)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        seen: set[str] = set()
        self.repeated = [k for k, _ in pairs if k in seen or seen.add(k)]


def _read_json(path: str | os.PathLike) -> Any:
    return read_json_file(path, "instruction file", "docs/evaluation.md", object_pairs_hook=_Obj)


def _type_name(x: Any) -> str:
    names = {dict: "object", _Obj: "object", list: "list", str: "string", type(None): "null"}
    return names.get(type(x), type(x).__name__)


def _achievement_index(name: Any, where: str, field: str) -> int:
    if not isinstance(name, str):
        raise ValueError(f"{where}: field {field!r}: expected an achievement name (a string), "
                         f"got {_type_name(name)} {name!r}")
    if name not in ACHIEVEMENT_NAMES:
        raise ValueError(f"{where}: field {field!r}: unknown achievement {name!r}; known achievements: "
                         f"{', '.join(ACHIEVEMENT_NAMES)}")
    return ACHIEVEMENT_NAMES.index(name)


def _parse_entry(entry: Any, set_name: str, where: str) -> EvalInstruction:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected an object {{\"text\": ..., \"achievement\": ...}}, got {_type_name(entry)}")
    if isinstance(entry, _Obj) and entry.repeated:
        raise ValueError(f"{where}: field {entry.repeated[0]!r} is given twice")
    unknown = [k for k in entry if k not in _ENTRY_FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; an entry has 'text', one of 'achievement', "
                         "'achievements' or 'sequence', and optionally 'horizon'")
    if "text" not in entry:
        raise ValueError(f"{where}: field 'text' is missing")
    try:
        text = validate_instruction(entry["text"], f"{where}: field 'text'")
    except TypeError as e:
        raise ValueError(str(e)) from None
    where = f"{where} ({text!r})"
    given = [k for k in ("achievement", "achievements", "sequence") if k in entry]
    if len(given) != 1:
        raise ValueError(f"{where}: give exactly one of the fields 'achievement' (a name), 'achievements' "
                         "(a list of names, all to be achieved) or 'sequence' (two names, to be achieved in this order)")
    horizon = _horizon(entry.get("horizon"), where)
    if "achievement" in entry:
        return EvalInstruction(text, _achievement_index(entry["achievement"], where, "achievement"), set_name,
                               horizon=horizon)
    field = given[0]
    names = entry[field]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{where}: field {field!r}: expected a non-empty list of achievement names, "
                         f"got {_type_name(names)} {names!r}")
    idx = [_achievement_index(n, where, field) for n in names]
    if len(set(idx)) != len(idx):
        raise ValueError(f"{where}: field {field!r}: an achievement is listed twice ({names!r})")
    if field == "sequence":
        if len(idx) != 2:
            raise ValueError(f"{where}: field 'sequence': expected two achievement names (first, then), got {names!r}")
        return EvalInstruction(text, -1, set_name, tuple(idx), True, horizon)
    if len(idx) == 1:
        return EvalInstruction(text, idx[0], set_name, horizon=horizon)
    return EvalInstruction(text, -1, set_name, tuple(sorted(idx)), horizon=horizon)


def _parse_named_sets(raw: dict, source: str) -> dict[str, list[EvalInstruction]]:
    extra = [k for k in raw if k != "sets" and not k.startswith("_") and k != "description"]
    if extra:
        raise ValueError(f"{source}: unknown top-level field {extra[0]!r}; expected 'sets' (and optionally "
                         "'description' or fields starting with '_')")
    sets_raw = raw["sets"]
    if not isinstance(sets_raw, dict) or not sets_raw:
        raise ValueError(f"{source}: field 'sets': expected a non-empty object {{set name: [entries]}}, "
                         f"got {_type_name(sets_raw)}")
    if isinstance(sets_raw, _Obj) and sets_raw.repeated:
        raise ValueError(f"{source}: set {sets_raw.repeated[0]!r}: duplicate set name (given twice in this file)")
    out: dict[str, list[EvalInstruction]] = {}
    for name, entries in sets_raw.items():
        if not SET_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"{source}: set {name!r}: a set name is 1-64 letters, digits, '_', '.' or '-', "
                             "starting with a letter or digit (it becomes part of metric keys)")
        if name in RESERVED_SET_NAMES:
            raise ValueError(f"{source}: set {name!r}: duplicate set name (reserved: the built-in sets "
                             f"{', '.join(SET_NAMES)} and 'control'); rename it")
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"{source}: set {name!r}: expected a non-empty list of entries, got {_type_name(entries)}")
        items = [_parse_entry(e, name, f"{source}: set {name!r}, entry {i}") for i, e in enumerate(entries)]
        texts = [e.text for e in items]
        for i, t in enumerate(texts):
            if t in texts[:i]:
                raise ValueError(f"{source}: set {name!r}, entry {i} ({t!r}): field 'text': the same text as entry "
                                 f"{texts.index(t)} of this set")
        out[name] = items
    return out


def load_instruction_file(path: str | os.PathLike) -> dict[str, list[EvalInstruction]]:
    """``{set name: [EvalInstruction, ...]}`` of one user file (either schema); ValueError naming what is wrong."""
    raw = _read_json(path)
    if isinstance(raw, dict) and "sets" in raw:
        return _parse_named_sets(raw, str(path))
    if isinstance(raw, list) or (isinstance(raw, dict) and "instructions" in raw):
        return _parse(raw, str(path))
    raise ValueError(f"{path}: expected an object {{\"sets\": {{set name: [entries]}}}} (or the per-achievement "
                     f"schema {{\"instructions\": [...]}}), got {_type_name(raw)}"
                     + (f" with fields {sorted(raw)}" if isinstance(raw, dict) else ""))


def load_instruction_files(paths: Sequence[str | os.PathLike],
                           builtin: Sequence[str] = SET_NAMES) -> dict[str, list[EvalInstruction]]:
    """``{set name: [EvalInstruction, ...]}`` of several user files, in order; ValueError for a malformed
    file or a set name in two files or equal to one of ``builtin``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: dict[str, list[EvalInstruction]] = {}
    origin: dict[str, str] = {}
    for path in paths:
        for name, items in load_instruction_file(path).items():
            if name in builtin or name in RESERVED_SET_NAMES:
                raise ValueError(f"{path}: set {name!r}: duplicate set name (a built-in set); give the file's sets "
                                 "other names with the schema {\"sets\": {name: [entries]}}")
            if name in out:
                raise ValueError(f"{path}: set {name!r}: duplicate set name (already defined in {origin[name]})")
            out[name], origin[name] = items, str(path)
    return out


#: The 22 original instructions in Craftax achievement order (paper's wording).
ORIGINAL_INSTRUCTIONS: tuple[str, ...] = tuple(e.text for e in _packaged()["original"])
