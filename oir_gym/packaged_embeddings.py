"""Which texts of the package a run may encode, and the command that writes their embedding table.

After changing a packaged text (``oir_gym/data/*.json``, the rule pair wordings) or the packaged model,
regenerate it (tests/test_embedding_table.py fails until then)::

    python -m oir_gym.packaged_embeddings          # rewrite oir_gym/data/embeddings_all-MiniLM-L6-v2.npz
    python -m oir_gym.packaged_embeddings --check  # is it up to date?
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import numpy as np

from oir_gym.embedding_table import REGENERATE, TABLE_FILE, EmbeddingTable, model_fingerprint, read, table_path


def packaged_texts() -> list[str]:
    """Every text of the package a run may encode, once each, in a fixed order."""
    from oir_gym.captions import EVENT_NAMES, VOCAB
    from oir_gym.relabel.oracle import RULE_PAIRS, evaluation_texts, load_pool, load_settings

    canonical = [VOCAB.canonical(e) for e in range(len(EVENT_NAMES))]
    return list(dict.fromkeys([*evaluation_texts(), *VOCAB.phrases, *canonical, *RULE_PAIRS.values(),
                               *load_pool().texts(), *load_settings().noise.echo_examples.values()]))


def check(texts: Optional[list[str]] = None, path: str | Path | None = None, model: str | Path | None = None) -> EmbeddingTable:
    """The table at ``path`` (default: the packaged one), checked to be ``model``'s (default: the
    packaged model) and to hold every one of ``texts`` (default: :func:`packaged_texts`).

    Raises:
        ValueError: naming what is missing or stale and the command that rewrites the table.
    """
    from oir_gym.encoder import default_model_path

    table = read(path)
    where = path if path is not None else f"oir_gym/data/{TABLE_FILE}"
    if table is None:
        raise ValueError(f"no embedding table at {where}; write it with `{REGENERATE}`")
    model = str(model) if model is not None else default_model_path()
    if table.fingerprint != model_fingerprint(model):
        raise ValueError(f"the embedding table {where} was made by another model than {model}; "
                         f"regenerate it with `{REGENERATE}`")
    missing = [t for t in (texts if texts is not None else packaged_texts()) if t not in table]
    if missing:
        raise ValueError(f"the embedding table {where} lacks {len(missing)} packaged text(s), e.g. "
                         f"{missing[:3]}; regenerate it with `{REGENERATE}`")
    return table


def write(path: str | Path | None = None, model: str | Path | None = None,
          texts: Optional[list[str]] = None) -> Path:
    """Encode ``texts`` (default: :func:`packaged_texts`) with ``model`` (default: the packaged
    all-MiniLM-L6-v2, :func:`oir_gym.encoder.default_model_path`) on the numpy backend, uncached, and
    write the table to ``path`` (default: the packaged file). Returns the path."""
    from oir_gym.encoder import InstructionEncoder, default_model_path

    model = str(model) if model is not None else default_model_path()
    path = Path(path) if path is not None else table_path()
    texts = list(dict.fromkeys(texts if texts is not None else packaged_texts()))
    enc = InstructionEncoder(model, backend="numpy", cache_size=0)  # cache_size=0: no table, every text computed
    emb = enc.encode(texts)
    fp = model_fingerprint(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:  # uncompressed: float32 embeddings hardly compress, and it loads faster
        np.savez(f, texts=np.array(texts, dtype=str), embeddings=emb.astype(np.float32), fingerprint=np.array(fp))
    return path


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m oir_gym.packaged_embeddings [PATH]``: rewrite the packaged table (or write it to PATH);
    ``--check``: say whether it is up to date (exit status 1 and why when it is not)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--check":
        try:
            table = check()
        except ValueError as e:
            print(e, file=sys.stderr)
            return 1
        print(f"the packaged embedding table holds all {len(packaged_texts())} packaged texts "
              f"({len(table)} rows) under the packaged model")
        return 0
    path = write(argv[0] if argv else None)
    table = read(path)
    assert table is not None
    print(f"wrote {len(table)} embeddings ({table.embeddings.shape[1]} dims, model {table.fingerprint[:12]}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
