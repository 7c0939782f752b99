"""Thread-safe LRU cache of (parsed, filtered) LLM candidate texts keyed by normalised behaviour,
optionally in a JSON file written atomically."""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from oir_gym.validation import atomic_file

CACHE_FORMAT_VERSION = 1


class LRUCache:
    """``key -> list[str]`` with least-recently-used eviction: ``capacity`` entries (0: disabled),
    loaded from ``path`` at construction and :meth:`save` to it (``None``: memory only)."""

    def __init__(self, capacity: int = 4096, path: Optional[str | os.PathLike] = None) -> None:
        self.capacity = int(capacity)
        self.path = Path(path) if path else None
        self._data: OrderedDict[str, list[str]] = OrderedDict()
        self._lock = threading.Lock()
        self.dirty = 0  # entries added since the last save
        self.load_error: Optional[str] = None
        if self.path is not None and self.path.is_file():
            self.load()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str) -> Optional[list[str]]:
        with self._lock:
            val = self._data.get(key)
            if val is not None:
                self._data.move_to_end(key)
                return list(val)
            return None

    def put(self, key: str, value: list[str]) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._data[key] = list(value)
            self._data.move_to_end(key)
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)
            self.dirty += 1

    def load(self) -> None:
        """Load entries from :attr:`path`; a corrupt or foreign file is ignored (and noted)."""
        try:
            raw = json.loads(self.path.read_text())
            if raw.get("version") != CACHE_FORMAT_VERSION:
                raise ValueError(f"cache version {raw.get('version')!r}")
            with self._lock:
                for k, v in raw["entries"]:
                    if isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v):
                        self._data[k] = v
                while len(self._data) > self.capacity:
                    self._data.popitem(last=False)
        except Exception as e:  # noqa: BLE001 - a bad cache file must not stop training
            self.load_error = f"{type(e).__name__}: {e}"

    def save(self) -> None:
        """Write all entries (LRU order) to :attr:`path` atomically; no-op without a path."""
        if self.path is None:
            return
        with self._lock:
            payload = {"version": CACHE_FORMAT_VERSION, "entries": [[k, v] for k, v in self._data.items()]}
            taken, self.dirty = self.dirty, 0
        try:
            with atomic_file(self.path) as f:
                json.dump(payload, f)
        except BaseException:
            with self._lock:  # not written: those entries are still unsaved, so the next save is due at once
                self.dirty += taken
            raise
