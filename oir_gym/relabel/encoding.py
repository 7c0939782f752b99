"""The relabeler's sentence encoder, shared between threads: candidate texts and the caption vocabulary."""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import numpy as np

from oir_gym.captions import VOCAB


class SharedEncoder:
    """A sentence encoder (``encode(list[str]) -> [n, D]``) behind one lock, loaded on first use.

    The shared encoder's string cache is not thread-safe: the training loop (:meth:`encode`) and a
    relabeler's background worker use it one at a time.

    Args:
        encoder: the encoder, or ``None`` for :func:`oir_gym.encoder.get_encoder`'s shared one.
    """

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
