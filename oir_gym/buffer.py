"""The prioritized instruction replay buffer of the paper (Sec. 4.3), in pure Python/numpy.

A fixed-size circular array of instructions, sampled uniformly; a batch of new instructions is written
in priority order round-robin at the cursor over the oldest slots (unseen instructions have ``R = 0``).
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from oir_gym.validation import ArgumentTypeError, atomic_file, check_bool, check_int, check_real, show

#: Instruction statuses of the paper, in priority order.
LEARNING_BOUNDARY, FAILING, MASTERED = 0, 1, 2

_STATE_VERSION = 1


class EmptyBufferError(RuntimeError):
    """Raised when sampling from a buffer that holds no instruction yet."""


@dataclass(frozen=True)
class InstructionStats:
    """Running statistics of one instruction: episodes recorded and their mean return."""

    count: int = 0
    mean_return: float = 0.0


def _check_thresholds(tau_low: float, tau_high: float) -> tuple[float, float]:
    tl, th = check_real("tau_low", tau_low), check_real("tau_high", tau_high)
    if not 0.0 <= tl < th:
        raise ValueError(f"thresholds must satisfy 0 <= tau_low < tau_high, got tau_low={tau_low!r}, "
                         f"tau_high={tau_high!r}")
    return tl, th


def instruction_status(mean_return: float, tau_low: float, tau_high: float) -> int:
    """Paper's Status(i) of mean return ``R``: 0 if ``tau_low < R <= tau_high`` (learning boundary),
    1 if ``R <= tau_low`` (failing), 2 if ``R > tau_high`` (mastered)."""
    _check_thresholds(tau_low, tau_high)
    r = float(mean_return)
    if math.isnan(r):
        raise ValueError("mean_return must not be NaN")
    if r <= tau_low:
        return FAILING
    if r <= tau_high:
        return LEARNING_BOUNDARY
    return MASTERED


def priority_order(candidates: Sequence[tuple[str, float, int]], tau_low: float, tau_high: float) -> list[str]:
    """The instructions of ``(instruction, mean_return, count)`` triples, highest priority first: sorted
    ascending by ``(status, mean_return, count)``, ties in input order."""
    _check_thresholds(tau_low, tau_high)
    keyed = []
    for pos, cand in enumerate(candidates):
        try:
            text, mean, count = cand
        except (TypeError, ValueError):
            raise ValueError(f"candidate {pos} must be an (instruction, mean_return, count) triple, got {cand!r}") from None
        keyed.append(((instruction_status(mean, tau_low, tau_high), float(mean), int(count)), text))
    keyed.sort(key=lambda kv: kv[0])  # stable: equal keys stay in batch order
    return [text for _, text in keyed]


def _check_instruction(instruction: Any, what: str = "instruction") -> str:
    if not isinstance(instruction, str) or not instruction.strip():
        raise ValueError(f"{what} must be a non-empty string, got {show(instruction)}")
    return instruction


class InstructionBuffer:
    """Fixed-size circular buffer of instructions with PLR-style priority-ordered insertion: ``capacity``
    slots, failing / mastered thresholds ``0 <= tau_low < tau_high``, ``initial`` instructions to insert,
    ``seed`` of :meth:`sample`, ``allow_duplicates`` to write repeats, statistics of at most ``max_tracked``
    instructions (the least recently updated is dropped)."""

    def __init__(self, capacity: int = 10, tau_low: float = 0.1, tau_high: float = 0.9,
                 initial: Iterable[str] | None = None, seed: int | None = None, allow_duplicates: bool = False,
                 max_tracked: int = 100_000) -> None:
        self._capacity = check_int("capacity", capacity, minimum=1)
        self._max_tracked = check_int("max_tracked", max_tracked, minimum=1)
        self._tau_low, self._tau_high = _check_thresholds(tau_low, tau_high)
        self._allow_duplicates = check_bool("allow_duplicates", allow_duplicates)
        check_int("seed", seed, minimum=0, none_ok=True)
        if initial is not None and (isinstance(initial, (str, bytes)) or not isinstance(initial, Iterable)):
            raise ArgumentTypeError(f"initial={show(initial)} must be a list of instructions or None"
                                    + (", not a single string" if isinstance(initial, (str, bytes)) else
                                       f", got {type(initial).__name__}"))
        self._slots: list[str | None] = [None] * self._capacity
        self._size = 0
        self._cursor = 0  # next slot to write; once full, also the oldest slot
        # instruction -> [count, mean], least recently updated first
        self._stats: OrderedDict[str, list] = OrderedDict()
        self._rng = np.random.default_rng(seed)
        if initial is not None:
            initial = [_check_instruction(t, f"initial[{i}]") for i, t in enumerate(initial)]
            self.insert(initial)

    capacity = property(attrgetter("_capacity"))
    tau_low = property(attrgetter("_tau_low"))
    tau_high = property(attrgetter("_tau_high"))
    allow_duplicates = property(attrgetter("_allow_duplicates"))
    max_tracked = property(attrgetter("_max_tracked"))
    #: Index of the slot the next insertion writes (the oldest slot once the buffer is full).
    cursor = property(attrgetter("_cursor"))
    rng = property(attrgetter("_rng"))

    def __len__(self) -> int:
        return self._size

    def __contains__(self, instruction: object) -> bool:
        return isinstance(instruction, str) and instruction in self._slots

    def contents(self) -> list[str]:
        """The filled slots in slot order."""
        return [s for s in self._slots if s is not None]

    def num_tracked(self) -> int:
        """Number of instructions with recorded statistics."""
        return len(self._stats)

    def record(self, instruction: str, episode_return: float) -> None:
        """Add one finished episode's return to the instruction's running mean (in the buffer or not)."""
        _check_instruction(instruction)
        r = float(episode_return)
        if not math.isfinite(r):
            raise ValueError(f"episode_return must be finite, got {episode_return!r} for {instruction!r}")
        entry = self._stats.pop(instruction, None) or [0, 0.0]
        entry[0] += 1
        entry[1] += (r - entry[1]) / entry[0]
        self._stats[instruction] = entry  # at the end: most recently updated
        while len(self._stats) > self._max_tracked:
            self._stats.popitem(last=False)

    def record_many(self, instructions: Sequence[str], episode_returns: Sequence[float]) -> None:
        """:meth:`record` for paired sequences of equal length (in order)."""
        instructions = list(instructions)
        returns = np.asarray(episode_returns, dtype=np.float64).reshape(-1)
        if len(instructions) != len(returns):
            raise ValueError(f"instructions and episode_returns differ in length: {len(instructions)} vs "
                             f"{len(returns)}")
        for instr, r in zip(instructions, returns):
            self.record(instr, float(r))

    def stats(self, instruction: str) -> InstructionStats:
        """Statistics of an instruction; ``InstructionStats(0, 0.0)`` if it was never recorded."""
        entry = self._stats.get(instruction)
        return InstructionStats() if entry is None else InstructionStats(int(entry[0]), float(entry[1]))

    def status(self, instruction: str) -> int:
        """The instruction's current status (see :func:`instruction_status`)."""
        return instruction_status(self.stats(instruction).mean_return, self._tau_low, self._tau_high)

    def insert(self, candidates: Sequence[str]) -> list[str]:
        """Write at most ``capacity`` new instructions in :func:`priority_order` at the cursor; those written."""
        if isinstance(candidates, str):
            raise ValueError("candidates must be a list of instructions, not a single string")
        cands = [_check_instruction(c, f"candidate {i}") for i, c in enumerate(candidates)]
        if not self._allow_duplicates:
            present = set(self.contents())
            cands = [c for c in dict.fromkeys(cands) if c not in present]
        triples = [(c, self.stats(c).mean_return, self.stats(c).count) for c in cands]
        ordered = priority_order(triples, self._tau_low, self._tau_high)[: self._capacity]
        for instr in ordered:
            self._slots[self._cursor] = instr
            self._cursor = (self._cursor + 1) % self._capacity
            self._size = min(self._size + 1, self._capacity)
        return ordered

    def sample(self, n: int, rng: np.random.Generator | None = None) -> list[str]:
        """``n`` instructions drawn uniformly with replacement (EmptyBufferError if the buffer holds none)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        if self._size == 0:
            raise EmptyBufferError("cannot sample from an empty InstructionBuffer; seed it first with insert() "
                                   "or initial=[...]")
        filled = self.contents()
        return [filled[i] for i in (self._rng if rng is None else rng).integers(0, len(filled), size=int(n))]

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot (configuration included)."""
        return {"version": _STATE_VERSION, "capacity": self._capacity, "tau_low": self._tau_low,
                "tau_high": self._tau_high, "allow_duplicates": self._allow_duplicates,
                "max_tracked": self._max_tracked, "slots": list(self._slots), "size": self._size,
                "cursor": self._cursor, "stats": [[k, int(v[0]), float(v[1])] for k, v in self._stats.items()],
                "rng_state": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot made by :meth:`state_dict` (configuration included)."""
        try:
            version = state["version"]
            if version != _STATE_VERSION:
                raise ValueError(f"unsupported InstructionBuffer state version {version!r} (expected {_STATE_VERSION})")
            fresh = InstructionBuffer(capacity=state["capacity"], tau_low=state["tau_low"], tau_high=state["tau_high"],
                                      allow_duplicates=state["allow_duplicates"], max_tracked=state["max_tracked"])
            slots, stats, rng_state = list(state["slots"]), state["stats"], state["rng_state"]
            size, cursor = int(state["size"]), int(state["cursor"])
        except KeyError as e:
            raise ValueError(f"InstructionBuffer state is missing key {e.args[0]!r}") from None
        if len(slots) != fresh._capacity:
            raise ValueError(f"state has {len(slots)} slots but capacity {fresh._capacity}")
        if not 0 <= size <= fresh._capacity or not 0 <= cursor < fresh._capacity:
            raise ValueError(f"state size={size} / cursor={cursor} out of range for capacity {fresh._capacity}")
        filled = [s is not None for s in slots]
        if sum(filled) != size or (size < fresh._capacity and (any(filled[size:]) or cursor != size)):
            raise ValueError("state slots, size and cursor are inconsistent")
        for s in slots:
            if s is not None:
                _check_instruction(s, "slot")
        table: OrderedDict[str, list] = OrderedDict()
        for row in stats:
            if not isinstance(row, (list, tuple)) or len(row) != 3:
                raise ValueError(f"stats entries must be [instruction, count, mean_return], got {row!r}")
            text, count, mean = row
            table[_check_instruction(text, "stats entry")] = [int(count), float(mean)]
        if not isinstance(rng_state, dict) or rng_state.get("bit_generator") != "PCG64":
            raise ValueError("state rng_state must be a numpy PCG64 bit-generator state")
        rng = np.random.default_rng()
        rng.bit_generator.state = rng_state
        fresh._slots, fresh._size, fresh._cursor, fresh._stats, fresh._rng = slots, size, cursor, table, rng
        self.__dict__.update(fresh.__dict__)

    def save(self, path: str | os.PathLike) -> None:
        """Write :meth:`state_dict` as JSON, atomically."""
        with atomic_file(path) as f:
            json.dump(self.state_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstructionBuffer:
        """Build a buffer from a JSON file written by :meth:`save`."""
        buf = cls()
        buf.load_state_dict(json.loads(Path(path).read_text()))
        return buf

    def __repr__(self) -> str:
        return (f"InstructionBuffer(capacity={self._capacity}, size={self._size}, cursor={self._cursor}, "
                f"tau_low={self._tau_low}, tau_high={self._tau_high}, tracked={len(self._stats)})")

