"""The packaged encoder's embeddings of every packaged text (``oir_gym/data/``, float32, unit norm).

Some 800 texts (evaluation sets, caption phrasings, relabeler wordings) take seconds of the numpy BERT
at every run's start; :class:`oir_gym.encoder.InstructionEncoder` answers them from this table when its
model has the table's :func:`fingerprint`. :mod:`oir_gym.packaged_embeddings` lists and rewrites them.
"""

from __future__ import annotations

import hashlib
import json
import threading
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from oir_gym.numpy_bert import NumpyBertEncoder

#: the table's file in ``oir_gym/data``
TABLE_FILE = "embeddings_all-MiniLM-L6-v2.npz"
# bumped when what the fingerprint covers changes (old tables then stop matching)
_FINGERPRINT_VERSION = b"oir-gym embedding table fingerprint v1\n"


def fingerprint(model: "NumpyBertEncoder") -> str:
    """A sha256 of what a numpy-backend model's embeddings depend on: its settings, its tokenizer (less
    the truncation and padding the encoder sets) and every weight its forward pass reads. A copy in
    another folder or tensors the forward pass does not read leave it unchanged."""
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


#: the command that rewrites the packaged table (:mod:`oir_gym.packaged_embeddings`)
REGENERATE = "python -m oir_gym.packaged_embeddings"
#: rows of a table compared with the model's own embeddings when an encoder loads it
SPOT_CHECKS = 4
# a row equals the model's embedding of its text to float rounding (measured: 1e-7)
_SPOT_TOLERANCE = 1e-4


class CorruptTableError(ValueError):
    """An unreadable or malformed table file, or rows that are not the model's; names the fix."""


def _corrupt(path: Path, why: str) -> CorruptTableError:
    return CorruptTableError(f"embedding table {path}: {why}; rewrite it with `{REGENERATE}` "
                             "(or reinstall oir-gym for the packaged one)")


def read(path: str | Path | None = None) -> Optional[EmbeddingTable]:
    """The table at ``path`` (default: the packaged one), or ``None`` when there is no such file.

    Raises:
        CorruptTableError: not a readable table, a missing array, repeated texts, or a row that is not
            a finite unit vector.
    """
    path = Path(path) if path is not None else table_path()
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if not hasattr(z, "files"):
                raise _corrupt(path, "not an .npz archive (a single array)")
            missing = [k for k in ("texts", "embeddings", "fingerprint") if k not in z.files]
            if missing:
                raise _corrupt(path, f"no {', '.join(missing)} array")
            texts, emb, fp = z["texts"], z["embeddings"], z["fingerprint"]
    except CorruptTableError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
        # np.load's own message for bytes it cannot parse suggests allow_pickle=True: never for this file
        why = ("not an .npz archive" if "pickle" in str(e) else f"cannot be read ({type(e).__name__}: {e})")
        raise _corrupt(path, why) from None
    if texts.dtype.kind != "U" or texts.ndim != 1:
        raise _corrupt(path, f"texts must be a 1-D array of strings, got {texts.dtype} {texts.shape}")
    if emb.dtype.kind != "f" or emb.ndim != 2 or emb.shape[0] != texts.shape[0]:
        raise _corrupt(path, f"embeddings must be [{texts.shape[0]}, dim] floats, got {emb.dtype} {emb.shape}")
    if fp.dtype.kind != "U" or fp.shape != () or len(str(fp)) != 64:
        raise _corrupt(path, "fingerprint must be a sha256 hex string")
    emb = np.asarray(emb, np.float32)
    finite = np.isfinite(emb).all(axis=1)
    norms = np.linalg.norm(np.where(finite[:, None], emb, 0.0), axis=1)
    bad = np.flatnonzero(~finite | (np.abs(norms - 1.0) > 1e-3))
    if bad.size:
        i = int(bad[0])
        raise _corrupt(path, f"{bad.size} row(s) are not finite unit vectors, e.g. the row of {str(texts[i])!r}")
    text_tuple = tuple(str(t) for t in texts)
    if len(set(text_tuple)) != len(text_tuple):
        raise _corrupt(path, "a text is given twice")
    return EmbeddingTable(text_tuple, emb, str(fp))


def spot_check(table: EmbeddingTable, model: "NumpyBertEncoder", path: str | Path,
               rows: Optional[Sequence[int]] = None) -> None:
    """Compare ``rows`` of ``table`` (default: :data:`SPOT_CHECKS` at random) with ``model``'s embeddings
    (a swapped row keeps the fingerprint); raises :class:`CorruptTableError` naming the first that differs."""
    if rows is None:
        rows = np.random.default_rng().choice(len(table), size=min(SPOT_CHECKS, len(table)), replace=False)
    rows = [int(i) for i in rows]
    if not rows:
        return
    texts = [table.texts[i] for i in rows]
    vecs = np.asarray(model.encode(texts, batch_size=len(texts), convert_to_numpy=True, normalize_embeddings=False),
                      np.float32)
    vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    for t, i, v in zip(texts, rows, vecs):
        if not np.abs(v - table.embeddings[i]).max() <= _SPOT_TOLERANCE:
            raise _corrupt(Path(path), f"the row of {t!r} is not the model's embedding of that text")


_VERIFIED: dict[tuple, EmbeddingTable] = {}
_VERIFIED_LOCK = threading.Lock()


def load(fingerprint: str, path: str | Path | None = None, *,
         model: Optional["NumpyBertEncoder"] = None) -> Optional[EmbeddingTable]:
    """The table at ``path`` (default: the packaged one) if the model of ``fingerprint`` made it, else
    ``None``. With ``model``, :func:`spot_check` runs once per file version and process.
    Raises :class:`CorruptTableError` (see :func:`read`)."""
    path = Path(path) if path is not None else table_path()
    if model is None:
        table = read(path)
        return table if table is not None and table.fingerprint == fingerprint else None
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, st.st_ino, fingerprint)
    with _VERIFIED_LOCK:
        if key in _VERIFIED:
            return _VERIFIED[key]
        table = read(path)
        if table is None or table.fingerprint != fingerprint:
            return None
        spot_check(table, model, path)
        _VERIFIED[key] = table
        return table
