"""The packaged encoder's embeddings of every packaged text, shipped with the package.

A run's start encodes the evaluation sets, the caption phrasings and (for the rule relabeler) the
pair and pool wordings: some 800 texts, seconds of the numpy BERT on a few CPU cores. They never
change between runs, so ``oir_gym/data/embeddings_all-MiniLM-L6-v2.npz`` holds them as the encoder
computes them (float32, unit norm), with the :func:`fingerprint` of the model that made them.
:class:`oir_gym.encoder.InstructionEncoder` answers these texts from the table when its model's
fingerprint is the table's (see its docstring); any other model never sees the table.

This module fingerprints a model (:func:`fingerprint`, :func:`model_fingerprint`) and reads the
table (:func:`read`, :func:`load`). Which texts are packaged, and the command that rewrites the
table after one of them or the model changes, are :mod:`oir_gym.packaged_embeddings`'s.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from oir_gym.numpy_bert import NumpyBertEncoder

#: the table's file in ``oir_gym/data``
TABLE_FILE = "embeddings_all-MiniLM-L6-v2.npz"
# bumped when what the fingerprint covers changes (old tables then stop matching)
_FINGERPRINT_VERSION = b"oir-gym embedding table fingerprint v1\n"


def fingerprint(model: "NumpyBertEncoder") -> str:
    """A sha256 of what a numpy-backend model's embeddings depend on: its settings (sizes, layer norm
    epsilon, truncation length, lower-casing), its tokenizer (``tokenizer.json`` as JSON, less the
    truncation and padding the encoder sets itself) and every weight its forward pass reads (names,
    dtypes, shapes, bytes: ~0.1 s for all-MiniLM-L6-v2).

    Files that only say the same thing another way (a copy in another folder, ``modules.json`` of a
    newer sentence-transformers, key order or metadata of ``model.safetensors``, the pooler and
    ``position_ids`` tensors the forward pass does not read) leave it unchanged; any weight changed
    changes it.
    """
    h = hashlib.sha256(_FINGERPRINT_VERSION)
    h.update(json.dumps(model.settings, sort_keys=True).encode())
    tok = json.loads((Path(model.path) / "tokenizer.json").read_text(encoding="utf-8"))
    for key in ("truncation", "padding"):
        tok.pop(key, None)
    h.update(json.dumps(tok, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for name, w in sorted(model.forward_weights().items()):
        h.update(f"\n{name} {w.dtype.str} {w.shape}\n".encode())
        h.update(np.ascontiguousarray(w).data)
    return h.hexdigest()


def model_fingerprint(path: str | Path) -> Optional[str]:
    """The :func:`fingerprint` of the model folder ``path`` (loads it), or ``None`` when the numpy
    backend cannot run it (:func:`oir_gym.numpy_bert.is_supported`)."""
    from oir_gym.numpy_bert import NumpyBertEncoder, is_supported

    return fingerprint(NumpyBertEncoder(path)) if is_supported(path) else None


@dataclass(frozen=True, eq=False)
class EmbeddingTable:
    """Texts and their embeddings (``[len(texts), dim]`` float32, read-only) under the model of ``fingerprint``."""

    texts: tuple[str, ...]
    embeddings: np.ndarray
    fingerprint: str

    def __post_init__(self) -> None:
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != len(self.texts):
            raise ValueError(f"embedding table: {len(self.texts)} texts need embeddings of shape "
                             f"[{len(self.texts)}, dim], got {self.embeddings.shape}")
        self.embeddings.setflags(write=False)
        object.__setattr__(self, "_rows", {t: i for i, t in enumerate(self.texts)})

    def get(self, text: str) -> Optional[np.ndarray]:
        """The (read-only) embedding of ``text``, or ``None`` when the table does not hold it."""
        i = self._rows.get(text)  # type: ignore[attr-defined]
        return None if i is None else self.embeddings[i]

    def __contains__(self, text: object) -> bool:
        return text in self._rows  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.texts)


def table_path() -> Path:
    """Where the packaged table is (``oir_gym/data/``, found through the package's resources)."""
    return Path(str(resources.files("oir_gym.data").joinpath(TABLE_FILE)))


def read(path: str | Path | None = None) -> Optional[EmbeddingTable]:
    """The table at ``path`` (default: the packaged one), or ``None`` when there is no such file."""
    path = Path(path) if path is not None else table_path()
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as z:
        return EmbeddingTable(tuple(str(t) for t in z["texts"]), np.asarray(z["embeddings"], np.float32),
                              str(z["fingerprint"]))


def load(fingerprint: str, path: str | Path | None = None) -> Optional[EmbeddingTable]:
    """The table at ``path`` (default: the packaged one) if it was made by the model of ``fingerprint``,
    else ``None`` (also when there is no file): a caller then computes every text."""
    table = read(path)
    return table if table is not None and table.fingerprint == fingerprint else None
