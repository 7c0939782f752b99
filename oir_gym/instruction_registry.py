"""Host-side registry mapping instruction strings to rows of the device instruction table.

Each new string is encoded once into a fixed-size table (the jitted env never recompiles); one
registered with a :class:`~oir_gym.grounding.Binding` gets its indicator rows instead of its cosines.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from oir_gym.captions import NUM_EVENTS, VOCAB
from oir_gym.encoder import InstructionEncoder
from oir_gym.functional import InstructionTable, make_table
from oir_gym.grounding import Binding
from oir_gym.instructions import MAX_INSTRUCTION_CHARS, validate_instruction  # noqa: F401 - re-exported
from oir_gym.reward import event_similarity, without_events


class InstructionRegistry:
    """Fixed-capacity table of instructions with their embeddings and event similarities.

    Args:
        encoder: the sentence encoder.
        capacity: number of rows of the device table. When full, the least recently used row
            that is neither in ``protected`` rows nor in the buffer is reused.
    """

    def __init__(self, encoder: InstructionEncoder, capacity: int = 256) -> None:
        if capacity < 1:
            raise ValueError(f"table capacity must be >= 1, got {capacity}")
        self.encoder = encoder
        self.capacity = capacity
        self.dim = encoder.dim
        self.phrase_emb = encoder.encode(list(VOCAB.phrases))
        self.emb = np.zeros((capacity, self.dim), np.float32)
        self.event_sim = np.full((capacity, NUM_EVENTS), -1.0, np.float32)
        self.pre_sim = np.full((capacity, NUM_EVENTS), -1.0, np.float32)
        self.bindings: dict[str, Binding] = {}
        self.achievement = np.full((capacity,), -1, np.int32)
        self.sample_mask = np.zeros((capacity,), bool)
        self.texts: list[str | None] = [None] * capacity
        self._rows: OrderedDict[str, int] = OrderedDict()  # LRU order
        self._device: InstructionTable | None = None

    def similarity_to_events(self, emb: np.ndarray) -> np.ndarray:
        """``[n, E]`` max cosine of embeddings to each event's phrasings, the progress events at -1
        (the cosine reward never pays them: :func:`oir_gym.reward.without_events`)."""
        sims = event_similarity(np.asarray(emb, np.float32), self.phrase_emb, VOCAB.phrase_event, NUM_EVENTS)
        return without_events(sims, VOCAB.progress_events)

    def rows(self, texts: Sequence[str], achievements: Sequence[int] | None = None,
             protected: Iterable[int] | Callable[[], Iterable[int]] = (),
             bindings: Sequence[Binding | None] | None = None) -> np.ndarray:
        """Rows of ``texts``, adding the new ones (encoded in one batch).

        ``protected``: rows a new text must not take, or a callable returning them, called only when
        some text is new (finding them can cost device reads). ``bindings`` (one per text, ``None``
        for cosine grounding) binds texts not bound yet.
        """
        clean = [validate_instruction(t) for t in texts]
        new = [t for t in dict.fromkeys(clean) if t not in self._rows]
        if new:
            # a new text must not take the row of a text of this same call (nor of another new one)
            keep = (set(protected() if callable(protected) else protected) | set(np.flatnonzero(self.sample_mask).tolist())
                    | {self._rows[t] for t in clean if t in self._rows})
            free = self.capacity - len(keep & set(self._rows.values()))
            if len(new) > free:
                raise ValueError(f"{len(new)} new instructions do not fit a table of {self.capacity} rows "
                                 f"({self.capacity - free} are in use by this call, the buffer and protected rows); "
                                 "raise table_capacity (--env.table-capacity)")
            emb = self.encoder.encode(new)
            sims = self.similarity_to_events(emb)
            for t, e, s in zip(new, emb, sims):
                r = self._free_row(keep)
                keep.add(r)
                self.texts[r] = t
                self.emb[r], self.event_sim[r], self.achievement[r], self.pre_sim[r] = e, s, -1, -1.0
                self._rows[t] = r
            self._device = None
        out = np.array([self._rows[t] for t in clean], np.int32)
        if bindings is not None:
            for t, r, b in zip(clean, out, bindings):
                if b is not None and t not in self.bindings:
                    self.bindings[t] = b
                    self.event_sim[r], self.pre_sim[r] = b.rows(NUM_EVENTS)
                    self._device = None
        for t in clean:
            self._rows.move_to_end(t)
        if achievements is not None:
            for r, a in zip(out, achievements):
                if self.achievement[r] != a:
                    self.achievement[r] = a
                    self._device = None
        return out

    def _free_row(self, keep: set[int]) -> int:
        free = set(range(self.capacity)) - set(self._rows.values())
        if free:
            return min(free)
        for t, r in self._rows.items():  # least recently used first
            if r not in keep:
                del self._rows[t]
                self.bindings.pop(t, None)
                return r
        raise RuntimeError(f"instruction table full ({self.capacity} rows all in use); raise table_capacity")

    def set_buffer(self, texts: Sequence[str]) -> None:
        """Mark exactly these instructions as the ones resets draw from."""
        if len(texts) == 0:
            raise ValueError("the instruction buffer is empty: resets need at least one instruction")
        rows = self.rows(texts)
        mask = np.zeros_like(self.sample_mask)
        mask[rows] = True
        if not np.array_equal(mask, self.sample_mask):
            self.sample_mask = mask
            self._device = None

    def find(self, texts: Iterable[str]) -> dict[str, int]:
        """Rows of those ``texts`` already in the table (no encoding, no change of the LRU order)."""
        return {t: self._rows[t] for t in texts if t in self._rows}

    def __contains__(self, text: object) -> bool:
        return text in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def state_dict(self) -> dict[str, Any]:
        """A snapshot: ``capacity``, ``texts`` (per row, None when free), ``rows`` (``[text, row]`` pairs in
        LRU order, least recent first), ``bindings`` (``[text, [final, pre, step]]`` pairs of the bound
        texts), and the arrays ``emb``, ``event_sim``, ``pre_sim``, ``achievement``, ``sample_mask``."""
        return {"capacity": self.capacity, "texts": list(self.texts), "rows": [[t, int(r)] for t, r in self._rows.items()],
                "bindings": [[t, b.to_list()] for t, b in self.bindings.items()],
                "emb": self.emb.copy(), "event_sim": self.event_sim.copy(), "pre_sim": self.pre_sim.copy(),
                "achievement": self.achievement.copy(), "sample_mask": self.sample_mask.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (``rows`` may be a ``{text: row}`` dict; a missing ``sample_mask`` is
        all False, a missing ``pre_sim`` is rebuilt from the bindings); capacity and dimension must match."""
        emb = np.array(state["emb"], np.float32)  # a copy: restored arrays may be read-only
        if emb.shape != self.emb.shape:
            raise ValueError(f"instruction table of shape {emb.shape} does not fit this registry's {self.emb.shape} "
                             "(table_capacity x encoder dimension)")
        texts = list(state["texts"])
        pairs = state["rows"].items() if isinstance(state["rows"], dict) else state["rows"]
        rows = OrderedDict((str(t), int(r)) for t, r in pairs)
        if len(texts) != self.capacity or any(not 0 <= r < self.capacity or texts[r] != t for t, r in rows.items()):
            raise ValueError("instruction registry state is inconsistent: its rows do not match its texts")
        bindings = {str(t): Binding.from_list(b) for t, b in state.get("bindings") or []}
        unknown = sorted(set(bindings) - set(rows))
        if unknown:
            raise ValueError(f"instruction registry state is inconsistent: bindings of texts it does not hold: {unknown[:3]}")
        if state.get("pre_sim") is not None:
            pre_sim = np.array(state["pre_sim"], np.float32).reshape(self.pre_sim.shape)
        else:
            pre_sim = np.full_like(self.pre_sim, -1.0)
            for t, b in bindings.items():
                pre_sim[rows[t]] = b.rows(NUM_EVENTS)[1]
        self.texts = texts
        self.emb = emb
        self.bindings = bindings
        self.pre_sim = pre_sim
        self.event_sim = np.array(state["event_sim"], np.float32).reshape(self.event_sim.shape)
        self.achievement = np.array(state["achievement"], np.int32).reshape(self.achievement.shape)
        mask = state.get("sample_mask")
        self.sample_mask = (np.zeros_like(self.sample_mask) if mask is None
                            else np.array(mask, bool).reshape(self.sample_mask.shape))
        self._rows = rows
        self._device = None

    def text(self, row: int) -> str:
        t = self.texts[int(row)]
        return "" if t is None else t

    def device_table(self) -> InstructionTable:
        """The table as device arrays (rebuilt only after a change)."""
        if self._device is None:
            self._device = make_table(self.emb, self.event_sim, self.achievement, self.sample_mask, self.pre_sim)
        return self._device
