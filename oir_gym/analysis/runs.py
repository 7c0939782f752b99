"""Reading run files: ``metrics.jsonl`` (the one reader of it), instruction lists, CSV export."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator


class JsonlError(ValueError):
    """A damaged line of a JSONL file; the message names the file and the line (``detail`` without the file)."""

    def __init__(self, path: str | Path, detail: str) -> None:
        self.path, self.detail = Path(path), detail
        super().__init__(f"{self.path}: {detail}")


def parse_jsonl(data: bytes, path: str | Path = "<bytes>", torn_tail: bool = True) -> Iterator[tuple[int, dict]]:
    """``(end offset, row)`` per non-blank line of JSONL ``data``.

    A last line without its newline (a run killed while writing it) is skipped when ``torn_tail`` and it
    does not parse, and is a :class:`JsonlError` when not ``torn_tail``; any other unparsable line is one.
    """
    pos = 0
    lines = data.splitlines(keepends=True)
    for lineno, line in enumerate(lines, 1):
        pos += len(line)
        if not line.strip():
            continue
        cut = not line.endswith(b"\n")
        if cut and not torn_tail:
            raise JsonlError(path, f"line {lineno} is cut short (no newline at the end of the file)")
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            if cut:
                return
            raise JsonlError(path, f"line {lineno} is not valid JSON ({e})") from None
        yield pos, row


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file (``.gz``: gzip); for repeated ``update`` values (a resumed run) the last row wins.

    A torn last line is skipped (:func:`parse_jsonl`); another damaged line is a :class:`JsonlError`.
    """
    p = Path(path)
    data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    rows: dict[int, dict] = {}
    extra: list[dict] = []
    for _, r in parse_jsonl(data, p):
        if isinstance(r, dict) and "update" in r:
            rows[int(r["update"])] = r
        else:
            extra.append(r)
    return [rows[k] for k in sorted(rows)] + extra


def write_csv(rows: list[dict], path: str | Path) -> Path:
    """Rows (dicts with possibly different keys) as a CSV file with the union of keys."""
    import csv

    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    return Path(path)

def metrics_path(run: str | Path) -> Path:
    """``run/metrics.jsonl`` (or ``metrics.jsonl.gz`` when only that exists) for a run directory; a file
    is taken as it is."""
    p = Path(run)
    if not p.is_dir():
        return p
    return p / "metrics.jsonl" if (p / "metrics.jsonl").exists() or not (p / "metrics.jsonl.gz").exists() \
        else p / "metrics.jsonl.gz"


def read_instruction_list(path: str | Path) -> list[str]:
    """Instruction texts of a run's ``instructions.json`` / ``goals.json`` (or a plain JSON list)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = data.get("items", [])
    return [d["text"] if isinstance(d, dict) else str(d) for d in data]
