"""The prioritized instruction replay buffer of the paper (Sec. 4.3), in pure Python/numpy.

The buffer is a fixed-size circular array of instruction strings. Per-instruction statistics
(episode count and empirical mean return ``R(i)``) are kept for every instruction ever recorded;
they are used *only* to order a batch of new instructions before it is written into the buffer.
Episodes then draw their instruction uniformly from the filled slots.

Priority ordering (paper Eq. "Status"): each candidate gets

* status 0, *learning boundary*: ``tau_low < R(i) <= tau_high``
* status 1, *failing*:           ``R(i) <= tau_low``
* status 2, *mastered*:          ``R(i) > tau_high``

and candidates are sorted ascending by ``(status, R(i), count, position in the batch)``: the
paper's tuple ``(Status, R)``, then its "prefer instructions seen fewer times" tie-break, then
the candidate's position in the incoming batch so the order is fully deterministic (Python's
sort is stable, so equal keys keep their batch order). Unseen instructions have ``R = 0`` and
``count = 0``, so they are "failing" and come first among failing instructions.

Round-robin eviction: the sorted candidates are written one after another at the cursor, each
overwriting the oldest slot, and the cursor advances modulo the capacity.

Choices the paper leaves open (each documented where it is implemented):

* the buffer starts empty (Alg. 2 initialises ``B <- {}``); callers seed it, e.g. with the 22
  original Craftax instructions, through ``initial`` or :meth:`InstructionBuffer.insert`;
* a batch larger than the capacity keeps only the top ``capacity`` of its priority list;
* candidates already in the buffer (and repeats within a batch) are skipped by default;
* statistics are bounded: at most ``max_tracked`` instructions, least recently updated evicted.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oir_gym.validation import ArgumentTypeError, check_bool, check_int, check_real, show

#: Instruction statuses of the paper, in priority order.
LEARNING_BOUNDARY, FAILING, MASTERED = 0, 1, 2
STATUS_NAMES: tuple[str, ...] = ("learning_boundary", "failing", "mastered")

_STATE_VERSION = 1


class EmptyBufferError(RuntimeError):
    """Raised when sampling from a buffer that holds no instruction yet."""


@dataclass(frozen=True)
class InstructionStats:
    """Running statistics of one instruction: episodes recorded and their mean return."""

    count: int = 0
    mean_return: float = 0.0


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def _check_thresholds(tau_low: float, tau_high: float) -> tuple[float, float]:
    tl, th = check_real("tau_low", tau_low), check_real("tau_high", tau_high)
    if not 0.0 <= tl < th:
        raise ValueError(
            f"thresholds must satisfy 0 <= tau_low < tau_high, got tau_low={tau_low!r}, tau_high={tau_high!r}"
        )
    return tl, th


def instruction_status(mean_return: float, tau_low: float, tau_high: float) -> int:
    """Paper's Status(i): 0 learning boundary, 1 failing, 2 mastered.

    Args:
        mean_return: empirical mean return ``R(i)`` (0 for an unseen instruction).
        tau_low: lower threshold; ``R <= tau_low`` is failing.
        tau_high: upper threshold; ``R > tau_high`` is mastered.

    Returns:
        0 if ``tau_low < R <= tau_high``, 1 if ``R <= tau_low``, 2 if ``R > tau_high``.
    """
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
    """Order candidates by priority, highest first (the paper's lexicographic ascending sort).

    Args:
        candidates: ``(instruction, mean_return, count)`` triples.
        tau_low, tau_high: status thresholds, see :func:`instruction_status`.

    Returns:
        The instructions sorted ascending by ``(status, mean_return, count)``. Remaining ties keep
        the input order (stable sort), which makes the result deterministic.
    """
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


# --------------------------------------------------------------------------------------------
# The buffer
# --------------------------------------------------------------------------------------------


class InstructionBuffer:
    """Fixed-size circular buffer of instructions with PLR-style priority-ordered insertion.

    Args:
        capacity: number of slots (paper: 10). Must be >= 1.
        tau_low: failing threshold, ``0 <= tau_low < tau_high``.
        tau_high: mastered threshold.
        initial: instructions to insert at construction (through :meth:`insert`, so at most
            ``capacity`` of them, in priority order). Default: none. The paper initialises the
            buffer empty (Alg. 2) and is silent on the first episodes' instructions, so seeding
            (e.g. with :data:`oir_gym.instructions.ORIGINAL_INSTRUCTIONS`) is the caller's choice
            rather than a hidden default.
        seed: seed of the buffer's own numpy generator used by :meth:`sample`.
        allow_duplicates: if False (default), candidates already in the buffer and repeats within
            one batch are skipped, so the buffer holds distinct instructions and sampling stays
            uniform over instructions rather than being skewed towards ones the LLM repeats. If
            True, every candidate is written, repeats included.
        max_tracked: maximum number of instructions whose statistics are kept; beyond it the least
            recently updated entry is dropped (it then counts as unseen again).
    """

    def __init__(
        self,
        capacity: int = 10,
        tau_low: float = 0.1,
        tau_high: float = 0.9,
        initial: Iterable[str] | None = None,
        seed: int | None = None,
        allow_duplicates: bool = False,
        max_tracked: int = 100_000,
    ) -> None:
        self._capacity = check_int("capacity", capacity, minimum=1)
        self._max_tracked = check_int("max_tracked", max_tracked, minimum=1)
        self._tau_low, self._tau_high = _check_thresholds(tau_low, tau_high)
        self._allow_duplicates = check_bool("allow_duplicates", allow_duplicates)
        check_int("seed", seed, minimum=0, none_ok=True)  # numpy's generators take any non-negative int
        if initial is not None and (isinstance(initial, (str, bytes)) or not isinstance(initial, Iterable)):
            raise ArgumentTypeError(f"initial={show(initial)} must be a list of instructions or None"
                                    + (", not a single string" if isinstance(initial, (str, bytes)) else
                                       f", got {type(initial).__name__}"))
        self._slots: list[str | None] = [None] * self._capacity
        self._size = 0
        self._cursor = 0  # next slot to write; once full, also the oldest slot
        # instruction -> [count, mean]; order = least recently updated first (LRU eviction).
        self._stats: OrderedDict[str, list] = OrderedDict()
        self._rng = np.random.default_rng(seed)
        if initial is not None:
            initial = [_check_instruction(t, f"initial[{i}]") for i, t in enumerate(initial)]
            self.insert(initial)

    # ---- properties ------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def tau_low(self) -> float:
        return self._tau_low

    @property
    def tau_high(self) -> float:
        return self._tau_high

    @property
    def allow_duplicates(self) -> bool:
        return self._allow_duplicates

    @property
    def max_tracked(self) -> int:
        return self._max_tracked

    @property
    def cursor(self) -> int:
        """Index of the slot the next insertion writes (the oldest slot once the buffer is full)."""
        return self._cursor

    @property
    def rng(self) -> np.random.Generator:
        return self._rng

    def __len__(self) -> int:
        return self._size

    def __contains__(self, instruction: object) -> bool:
        return isinstance(instruction, str) and instruction in self._slots

    def is_full(self) -> bool:
        return self._size == self._capacity

    def contents(self) -> list[str]:
        """The filled slots in slot order (not insertion order once the cursor has wrapped)."""
        return [s for s in self._slots if s is not None]

    def num_tracked(self) -> int:
        """Number of instructions with recorded statistics."""
        return len(self._stats)

    # ---- statistics ------------------------------------------------------------------------

    def record(self, instruction: str, episode_return: float) -> None:
        """Add one finished episode's return to the instruction's running mean.

        The instruction need not be in the buffer (relabeled instructions get statistics too).
        """
        _check_instruction(instruction)
        r = float(episode_return)
        if not math.isfinite(r):
            raise ValueError(f"episode_return must be finite, got {episode_return!r} for {instruction!r}")
        entry = self._stats.pop(instruction, None)
        if entry is None:
            entry = [0, 0.0]
        entry[0] += 1
        entry[1] += (r - entry[1]) / entry[0]  # incremental mean: no sum that grows without bound
        self._stats[instruction] = entry  # re-insert at the end = most recently updated
        while len(self._stats) > self._max_tracked:
            self._stats.popitem(last=False)

    def record_many(self, instructions: Sequence[str], episode_returns: Sequence[float]) -> None:
        """:meth:`record` for paired sequences of equal length (in order)."""
        instructions = list(instructions)
        returns = np.asarray(episode_returns, dtype=np.float64).reshape(-1)
        if len(instructions) != len(returns):
            raise ValueError(
                f"instructions and episode_returns differ in length: {len(instructions)} vs {len(returns)}"
            )
        for instr, r in zip(instructions, returns):
            self.record(instr, float(r))

    def stats(self, instruction: str) -> InstructionStats:
        """Statistics of an instruction; ``InstructionStats(0, 0.0)`` if it was never recorded."""
        entry = self._stats.get(instruction)
        return InstructionStats() if entry is None else InstructionStats(int(entry[0]), float(entry[1]))

    def status(self, instruction: str) -> int:
        """The instruction's current status (see :func:`instruction_status`)."""
        return instruction_status(self.stats(instruction).mean_return, self._tau_low, self._tau_high)

    # ---- insertion / sampling --------------------------------------------------------------

    def insert(self, candidates: Sequence[str]) -> list[str]:
        """Write a batch of new instructions in priority order at the round-robin cursor.

        Candidates are ordered with :func:`priority_order` using their current statistics. If the
        batch (after skipping duplicates, see ``allow_duplicates``) is larger than the capacity,
        only the top ``capacity`` of the priority list are written: writing all of them would let
        the lowest-priority tail overwrite the head within the same call.

        Returns:
            The instructions written, in write order.
        """
        if isinstance(candidates, str):
            raise ValueError("candidates must be a list of instructions, not a single string")
        cands = [_check_instruction(c, f"candidate {i}") for i, c in enumerate(candidates)]
        if not self._allow_duplicates:
            present = set(self.contents())
            kept = []
            for c in cands:
                if c not in present:
                    kept.append(c)
                    present.add(c)
            cands = kept
        triples = [(c, *self._stat_pair(c)) for c in cands]
        ordered = priority_order(triples, self._tau_low, self._tau_high)[: self._capacity]
        for instr in ordered:
            self._slots[self._cursor] = instr
            self._cursor = (self._cursor + 1) % self._capacity
            self._size = min(self._size + 1, self._capacity)
        return ordered

    def _stat_pair(self, instruction: str) -> tuple[float, int]:
        s = self.stats(instruction)
        return s.mean_return, s.count

    def sample(self, n: int, rng: np.random.Generator | None = None) -> list[str]:
        """Draw ``n`` instructions uniformly (with replacement) from the filled slots.

        Args:
            n: number of draws, >= 0.
            rng: generator to use; default the buffer's own (whose state is saved by
                :meth:`state_dict`).

        Raises:
            EmptyBufferError: if the buffer holds no instruction.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        if self._size == 0:
            raise EmptyBufferError(
                "cannot sample from an empty InstructionBuffer; seed it first with insert() or initial=[...]"
            )
        gen = self._rng if rng is None else rng
        filled = self.contents()
        idx = gen.integers(0, len(filled), size=int(n))
        return [filled[i] for i in idx]

    # ---- persistence -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot: configuration, slots, cursor, statistics and rng state."""
        return {
            "version": _STATE_VERSION,
            "capacity": self._capacity,
            "tau_low": self._tau_low,
            "tau_high": self._tau_high,
            "allow_duplicates": self._allow_duplicates,
            "max_tracked": self._max_tracked,
            "slots": list(self._slots),
            "size": self._size,
            "cursor": self._cursor,
            # list (not dict) keeps the LRU order explicit.
            "stats": [[k, int(v[0]), float(v[1])] for k, v in self._stats.items()],
            "rng_state": _jsonable(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot made by :meth:`state_dict` (configuration included)."""
        try:
            version = state["version"]
            if version != _STATE_VERSION:
                raise ValueError(f"unsupported InstructionBuffer state version {version!r} (expected {_STATE_VERSION})")
            fresh = InstructionBuffer(
                capacity=state["capacity"],
                tau_low=state["tau_low"],
                tau_high=state["tau_high"],
                allow_duplicates=state["allow_duplicates"],
                max_tracked=state["max_tracked"],
            )
            slots = list(state["slots"])
            size, cursor = int(state["size"]), int(state["cursor"])
            stats = state["stats"]
            rng_state = state["rng_state"]
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
        """Write :meth:`state_dict` as JSON (atomically: temporary file, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.state_dict(), f)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> InstructionBuffer:
        """Build a buffer from a JSON file written by :meth:`save`."""
        buf = cls()
        buf.load_state_dict(json.loads(Path(path).read_text()))
        return buf

    def __repr__(self) -> str:
        return (
            f"InstructionBuffer(capacity={self._capacity}, size={self._size}, cursor={self._cursor}, "
            f"tau_low={self._tau_low}, tau_high={self._tau_high}, tracked={len(self._stats)})"
        )


def _jsonable(obj: Any) -> Any:
    """numpy bit-generator state -> plain JSON types (its ints may exceed 64 bits; JSON keeps them)."""
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    return obj

