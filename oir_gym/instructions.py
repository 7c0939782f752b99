"""Evaluation instruction sets (paper Sec. 5 and Appendix A, "Testing Protocol Details").

Three sets, each tied to Craftax achievements so the environment's ground-truth achievement
flags can score them (used only at evaluation):

* ``"original"``: the 22 Craftax instructions in the paper's wording (``"make wooden pickaxe"``);
* ``"simple"``:   three paraphrases per achievement (robustness to surface wording);
* ``"complex"``:  three semantically enriched / compositional variants per achievement.

The texts live in ``oir_gym/data/instructions.json`` (the *per-achievement* schema below);
:func:`load_instruction_sets` can load a user file of that schema instead of the packaged one::

    {"instructions": [
        {"achievement": "collect_wood", "original": "collect wood",
         "simple": ["..."], "complex": ["..."]},
        ...]}

(a bare list of entries is accepted too). Entries are returned in Craftax achievement order, and
within an achievement in file order, whatever the order in the file.

User files of *named sets*, evaluated beside the built-in sets (see ``docs/evaluation.md``), are
read by :func:`load_instruction_file` / :func:`load_instruction_files`::

    {"sets": {"tools": [{"text": "make a pickaxe out of wood", "achievement": "make_wood_pickaxe"},
                        {"text": "build a table and a wooden sword",
                         "achievements": ["place_table", "make_wood_sword"]}]}}

An entry scored by a list of achievements succeeds when all of them happen in the episode (in
any order).
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
from pathlib import Path
from typing import Any

from oir_gym.captions import ACHIEVEMENT_NAMES
from oir_gym.validation import show

#: Valid instruction-set names, in the order the paper reports them.
SET_NAMES: tuple[str, ...] = ("original", "simple", "complex")

#: Names a user set may not take: the built-in sets, and ``control`` (the control metrics are
#: logged as ``eval/control/<set>/...``, beside ``eval/<set>/...``).
RESERVED_SET_NAMES: tuple[str, ...] = (*SET_NAMES, "control")

#: A user set name: it becomes part of metric keys (``eval/<name>/...``) and table rows.
SET_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class UnknownInstructionSetError(KeyError, ValueError):
    """An instruction-set name that is not one of :data:`SET_NAMES` (catchable as KeyError or ValueError)."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class EvalInstruction:
    """One evaluation instruction.

    Attributes:
        text: the instruction given to the agent.
        achievement_index: Craftax achievement index whose ground-truth flag marks success, or
            -1 for an instruction scored by several achievements (``all_of``).
        set_name: ``"original"``, ``"simple"``, ``"complex"`` or a user set's name.
        all_of: for an instruction scored by several achievements, their indices (in Craftax
            order); success needs all of them in the episode. Empty otherwise.
    """

    text: str
    achievement_index: int
    set_name: str
    all_of: tuple[int, ...] = ()

    @property
    def targets(self) -> tuple[int, ...]:
        """The achievement indices that score this instruction (one, or ``all_of``)."""
        return self.all_of or (self.achievement_index,)

    @property
    def achievement(self) -> str:
        """Achievement name, e.g. ``"collect_wood"``; ``"a+b"`` for several."""
        return "+".join(ACHIEVEMENT_NAMES[i] for i in self.targets)


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
        for key, texts in (("original", [entry["original"]]), ("simple", entry["simple"]),
                           ("complex", entry["complex"])):
            for t in texts:  # the rule every instruction follows (length, control characters)
                validate_instruction(t, f"{where} ({name}): {key!r}")
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
    return _parse(_read_json(path), str(path))


def get_instruction_set(name: str, path: str | os.PathLike | None = None) -> list[EvalInstruction]:
    """One evaluation set by name (``"original"``, ``"simple"`` or ``"complex"``).

    Raises:
        UnknownInstructionSetError: (a KeyError and a ValueError) for any other name.
    """
    if name not in SET_NAMES:
        raise UnknownInstructionSetError(f"unknown instruction set {name!r}; valid names: {', '.join(SET_NAMES)}")
    return load_instruction_sets(path)[name]


# ----------------------------------------------------------------------------- user files of named sets

#: Longest instruction text (characters, after whitespace is collapsed).
MAX_INSTRUCTION_CHARS = 500
MAX_TEXT_CHARS = MAX_INSTRUCTION_CHARS  # the name the instruction-file loader used


def validate_instruction(text: object, where: str = "instruction") -> str:
    """Return the instruction with its whitespace collapsed, or raise an error that starts with
    ``where`` and says what is wrong (the one rule for instructions: env, registry, files).

    Raises:
        TypeError: not a string.
        ValueError: empty, longer than :data:`MAX_INSTRUCTION_CHARS`, or holding a control
            character other than whitespace (a NUL byte, an escape...: no instruction is typed
            with one, and they cut or garble text in terminals, files and prompts).
    """
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
_ENTRY_FIELDS = ("text", "achievement", "achievements")


class _Obj(dict):
    """A JSON object that remembers keys given twice (``json`` keeps only the last silently)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        seen: set[str] = set()
        self.repeated = [k for k, _ in pairs if k in seen or seen.add(k)]


def _read_json(path: str | os.PathLike) -> Any:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the instruction file ({e})") from None
    try:
        return json.loads(text, object_pairs_hook=_Obj)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # Python's JSON reader recurses once per nesting level
        raise ValueError(f"{path}: nested too deeply to be an instruction file (objects and lists inside each "
                         "other a thousand levels or more); see docs/evaluation.md for the schema") from None


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
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; an entry has 'text' and one of 'achievement' "
                         "or 'achievements'")
    if "text" not in entry:
        raise ValueError(f"{where}: field 'text' is missing")
    try:
        text = validate_instruction(entry["text"], f"{where}: field 'text'")
    except TypeError as e:
        raise ValueError(str(e)) from None
    where = f"{where} ({text!r})"
    if ("achievement" in entry) == ("achievements" in entry):
        raise ValueError(f"{where}: give exactly one of the fields 'achievement' (a name) or 'achievements' "
                         "(a list of names, all to be achieved)")
    if "achievement" in entry:
        return EvalInstruction(text, _achievement_index(entry["achievement"], where, "achievement"), set_name)
    names = entry["achievements"]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{where}: field 'achievements': expected a non-empty list of achievement names, "
                         f"got {_type_name(names)} {names!r}")
    idx = [_achievement_index(n, where, "achievements") for n in names]
    if len(set(idx)) != len(idx):
        raise ValueError(f"{where}: field 'achievements': an achievement is listed twice ({names!r})")
    if len(idx) == 1:
        return EvalInstruction(text, idx[0], set_name)
    return EvalInstruction(text, -1, set_name, tuple(sorted(idx)))


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
    """Named evaluation sets of one user file (schema in the module docstring and ``docs/evaluation.md``).

    A file of the packaged per-achievement schema (``{"instructions": [...]}``) is read too; its sets
    are then named ``original``, ``simple`` and ``complex``.

    Returns:
        ``{set name: [EvalInstruction, ...]}`` in file order.

    Raises:
        ValueError: naming the file, the set, the entry and the field: unreadable file, invalid JSON,
            unknown achievement, a set name given twice or reserved, empty text, wrong types, ...
    """
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
    """The named sets of several user files, checked together (what a trainer calls before it starts).

    Args:
        paths: user files (:func:`load_instruction_file`), in order.
        builtin: the built-in set names evaluated beside them; no user set may take one of them.

    Returns:
        ``{set name: [EvalInstruction, ...]}``, the files' sets in order.

    Raises:
        ValueError: a malformed file (see :func:`load_instruction_file`), or a set name that appears in
            two files or equals a built-in set's.
    """
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
