"""The shipped embeddings of the packaged texts: complete, equal to what the model computes, used only
under the model that made them, and they spare a fresh encoder the model on the evaluation sets."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from oir_gym import embedding_table, packaged_embeddings
from oir_gym.encoder import InstructionEncoder, default_model_path


@pytest.fixture(scope="module")
def table() -> embedding_table.EmbeddingTable:
    return embedding_table.read()


def test_shipped_table_holds_every_packaged_text_under_the_packaged_model(table):
    """A packaged text added (or a model changed) without regenerating fails here, naming the command."""
    checked = packaged_embeddings.check()  # raises naming `python -m oir_gym.packaged_embeddings` when stale
    assert checked.fingerprint == table.fingerprint == embedding_table.model_fingerprint(default_model_path())
    from oir_gym.captions import VOCAB
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS, load_instruction_sets
    from oir_gym.relabel.oracle import load_pool

    must = ([i.text for s in load_instruction_sets().values() for i in s] + load_pool().texts()
            + list(VOCAB.phrases) + list(ORIGINAL_INSTRUCTIONS))
    assert set(must) <= set(packaged_embeddings.packaged_texts()) <= set(table.texts)
    assert table.embeddings.dtype == np.float32 and table.embeddings.shape == (len(table), 384)
    with pytest.raises(ValueError, match="regenerate it with `python -m oir_gym.packaged_embeddings`"):
        packaged_embeddings.check(packaged_embeddings.packaged_texts() + ["a packaged text added without regenerating"])
    with pytest.raises(ValueError, match="write it with `python -m oir_gym.packaged_embeddings`"):
        packaged_embeddings.check(path="/nonexistent/table.npz")


def test_table_vectors_equal_a_fresh_uncached_encoding(table):
    fresh = InstructionEncoder(cache_size=0)
    assert fresh.backend == "numpy" and fresh.table is None  # cache_size=0 computes every text
    computed = fresh.encode(list(table.texts))
    assert np.abs(computed - table.embeddings).max() <= 1e-6
    np.testing.assert_allclose(np.linalg.norm(table.embeddings, axis=1), 1.0, atol=1e-6)


def test_write_and_load_round_trip(tmp_path, table):
    path = packaged_embeddings.write(tmp_path / "t.npz", texts=["collect wood", "a text no file holds"])
    got = embedding_table.load(table.fingerprint, path)
    assert got is not None and got.texts == ("collect wood", "a text no file holds")
    np.testing.assert_allclose(got.get("collect wood"), table.get("collect wood"), atol=1e-6)
    assert got.get("place table") is None and not got.embeddings.flags.writeable
    assert embedding_table.load("0" * 64, path) is None  # another model's fingerprint
    assert embedding_table.load(table.fingerprint, tmp_path / "missing.npz") is None


def _linked_copy(src: str, dst) -> None:
    shutil.copytree(src, dst, copy_function=os.symlink)  # links: no 90 MB copy


def test_a_copy_of_the_packaged_model_uses_the_table_and_another_model_ignores_it(tmp_path, table):
    from safetensors.numpy import load_file, save_file

    # the same weights in another folder, with a newer sentence-transformers' modules.json: same fingerprint
    newer = tmp_path / "newer"
    _linked_copy(default_model_path(), newer)
    (newer / "modules.json").unlink()
    (newer / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"}]))
    same = InstructionEncoder(str(newer)).table
    assert same is not None and same.fingerprint == table.fingerprint and same.texts == table.texts

    # one weight changed: another model, which computes every text
    other = tmp_path / "other"
    _linked_copy(default_model_path(), other)
    weights = load_file(str(other / "model.safetensors"))
    name = next(k for k in weights if k.endswith("encoder.layer.5.intermediate.dense.weight"))
    weights[name] = weights[name] * np.float32(1.2)
    (other / "model.safetensors").unlink()
    save_file(weights, str(other / "model.safetensors"))
    assert embedding_table.model_fingerprint(other) != table.fingerprint
    enc = InstructionEncoder(str(other))
    assert enc.backend == "numpy" and enc.table is None
    v = enc.encode("collect wood")
    np.testing.assert_allclose(v, InstructionEncoder(str(other), cache_size=0).encode("collect wood"), atol=1e-6)
    assert np.abs(v - table.get("collect wood")).max() > 1e-4


def test_a_fresh_encoder_encodes_the_evaluation_sets_without_running_the_model(monkeypatch):
    """Counts the calls that reach the model through a wrapper around the numpy backend's ``encode``
    (a counter that passes every call on, not a mock: the real model still answers them)."""
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.instructions import load_instruction_sets

    enc = InstructionEncoder()
    assert enc.table is not None
    calls: list[list[str]] = []
    real = enc._model.encode

    def counting(sentences, **kw):
        calls.append(list(sentences))
        return real(sentences, **kw)

    monkeypatch.setattr(enc._model, "encode", counting)
    texts = [i.text for s in load_instruction_sets().values() for i in s]
    registry = InstructionRegistry(enc, 1024)  # encodes the caption phrasings
    rows = registry.rows(texts)
    assert calls == [] and len(set(rows.tolist())) == len(set(texts))
    v = enc.encode(texts[0])
    v[:] = 0  # a returned vector is a copy: the table stays as it was
    assert np.linalg.norm(enc.encode(texts[0])) == pytest.approx(1.0, abs=1e-6)
    enc.encode(["a sentence no packaged file holds", texts[1]])
    assert calls == [["a sentence no packaged file holds"]]  # the counter sees what the model runs


# ----------------------------------------------------------------------------- a table that cannot be trusted
# Each file below is a real fault written where the reader reads it (a truncated copy, random bytes,
# a NaN row, two rows swapped): no mock.
def _rewrite(path, table, texts=None, emb=None):
    with open(path, "wb") as f:
        np.savez(f, texts=np.array(list(texts if texts is not None else table.texts), dtype=str),
                 embeddings=np.asarray(emb if emb is not None else table.embeddings, np.float32),
                 fingerprint=np.array(table.fingerprint))
    return path


def test_an_unreadable_table_names_its_file_and_the_command_that_rewrites_it(tmp_path):
    packaged = embedding_table.table_path()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(packaged.read_bytes()[: packaged.stat().st_size // 2])
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    for bad in (truncated, noise, empty):
        with pytest.raises(embedding_table.CorruptTableError) as e:
            embedding_table.read(bad)
        msg = str(e.value)
        assert str(bad) in msg and "python -m oir_gym.packaged_embeddings" in msg
        assert "allow_pickle" not in msg and "BadZipFile" not in type(e.value).__name__
    partial = tmp_path / "partial.npz"
    np.savez(partial, texts=np.array(["a"]))
    with pytest.raises(embedding_table.CorruptTableError, match="no embeddings, fingerprint array"):
        embedding_table.read(partial)


def test_rows_that_are_not_finite_unit_vectors_are_refused(tmp_path, table):
    for value in (np.nan, np.inf, 0.0):
        emb = np.array(table.embeddings)
        emb[3] = value
        path = _rewrite(tmp_path / f"bad_{value}.npz", table, emb=emb)
        with pytest.raises(embedding_table.CorruptTableError, match=f"not finite unit vectors.*{table.texts[3]!r}"):
            embedding_table.read(path)


def test_swapped_rows_keep_the_fingerprint_but_fail_the_spot_check(tmp_path, table):
    """The fingerprint names the model; the spot check compares rows with what that model computes."""
    from oir_gym.numpy_bert import NumpyBertEncoder

    model = NumpyBertEncoder(default_model_path())
    emb = np.array(table.embeddings)
    emb[[0, 1]] = emb[[1, 0]]
    path = _rewrite(tmp_path / "swapped.npz", table, emb=emb)
    assert embedding_table.read(path).fingerprint == table.fingerprint  # readable, and the same model's
    with pytest.raises(embedding_table.CorruptTableError, match=f"{table.texts[0]!r} is not the model's embedding"):
        embedding_table.spot_check(embedding_table.read(path), model, path, rows=[0, 1])
    embedding_table.spot_check(table, model, "packaged", rows=[0, 1, len(table) - 1])  # the shipped rows pass
    # every row swapped with its neighbour: whichever rows load() draws, it refuses the file
    emb = np.array(table.embeddings)
    emb[: len(emb) // 2 * 2] = emb[: len(emb) // 2 * 2].reshape(-1, 2, emb.shape[1])[:, ::-1].reshape(-1, emb.shape[1])
    path = _rewrite(tmp_path / "all_swapped.npz", table, emb=emb)
    with pytest.raises(embedding_table.CorruptTableError, match="is not the model's embedding"):
        embedding_table.load(table.fingerprint, path, model=model)
    assert embedding_table.load(table.fingerprint, model=model) is embedding_table.load(table.fingerprint, model=model)
