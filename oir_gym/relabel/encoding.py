"""The relabeler's sentence encoder, shared between threads: candidate texts and the caption vocabulary."""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import numpy as np

from oir_gym.captions import VOCAB


class SharedEncoder:
    """A sentence encoder (``None``: :func:`oir_gym.encoder.get_encoder`'s shared one, loaded on first
    use) behind one lock: its string cache is not thread-safe."""

    def __init__(self, encoder: Any = None) -> None:
        self._encoder = encoder
        self._phrase_emb: Optional[np.ndarray] = None
        self._lock = threading.Lock()

    @property
    def encoder(self) -> Any:
        """The encoder object (loaded here on first use)."""
        if self._encoder is None:
            from oir_gym.encoder import get_encoder

            self._encoder = get_encoder()
        return self._encoder

    def phrases(self) -> np.ndarray:
        """``[P, D]`` embeddings of the caption vocabulary (encoded once)."""
        with self._lock:
            if self._phrase_emb is None:
                self._phrase_emb = np.asarray(self.encoder.encode(list(VOCAB.phrases)), dtype=np.float32)
            return self._phrase_emb

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[n, D]`` float32 embeddings of ``texts`` (``[0, D]`` for none)."""
        phrases = self.phrases()
        with self._lock:
            if not texts:
                return np.zeros((0, phrases.shape[1]), np.float32)
            return np.asarray(self.encoder.encode(list(texts)), dtype=np.float32)


class TableEncoder:
    """An encoder answering from a table (``texts``, ``embeddings [len(texts), D]``) that loads the
    real encoder ``model`` only for a text outside it. Rule relabeling workers get one so that they
    need not each load the sentence model. It pickles as its table alone."""

    def __init__(self, texts: Sequence[str], embeddings: np.ndarray, model: str = "default") -> None:
        emb = np.asarray(embeddings, dtype=np.float32)
        if emb.ndim != 2 or emb.shape[0] != len(texts):
            raise ValueError(f"TableEncoder: {len(texts)} texts need embeddings of shape [{len(texts)}, D], "
                             f"got {emb.shape}")
        self._rows = {t: i for i, t in enumerate(texts)}
        self._emb = emb
        self.model = model
        self.dim = int(emb.shape[1])
        #: texts answered by the loaded model (outside the table)
        self.misses = 0
        self._fallback: Any = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, encoder: Any, texts: Sequence[str], model: str = "default") -> "TableEncoder":
        """The table of ``texts`` (repeats dropped) embedded by ``encoder``."""
        texts = list(dict.fromkeys(texts))
        return cls(texts, encoder.encode(texts), model)

    def __contains__(self, text: str) -> bool:
        return text in self._rows

    def __getstate__(self) -> dict:
        return {"texts": list(self._rows), "embeddings": self._emb, "model": self.model}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["texts"], state["embeddings"], state["model"])

    @property
    def loaded(self) -> bool:
        """Whether a text outside the table made it load the model."""
        return self._fallback is not None

    def encode(self, texts: str | Sequence[str]) -> np.ndarray:
        """``[n, D]`` float32 unit-norm embeddings (``[D]`` for one string), as the model gives them."""
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        out = np.zeros((len(items), self.dim), np.float32)
        hits = [i for i, t in enumerate(items) if t in self._rows]
        missing = [i for i, t in enumerate(items) if t not in self._rows]
        out[hits] = self._emb[[self._rows[items[i]] for i in hits]]
        if missing:
            with self._lock:
                if self._fallback is None:
                    from oir_gym.encoder import get_encoder

                    self._fallback = get_encoder(self.model)
                self.misses += len(missing)
            out[missing] = np.asarray(self._fallback.encode([items[i] for i in missing]), np.float32)
        return out[0] if single else out
