"""The sentence encoder: offline loading, output contract, caching, errors."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from oir_gym.encoder import EMBED_DIM, InstructionEncoder, default_model_path, get_encoder


def test_default_model_is_packaged_locally():
    path = default_model_path()
    assert os.path.isdir(path)


def _run_clean(code: str, drop: tuple[str, ...], **extra: str) -> str:
    """Run ``code`` in a fresh interpreter without the variables ``drop`` (plus ``extra``); its stdout."""
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_encoder_loads_offline_without_network(tmp_path):
    """A fresh process with no sockets, an empty HF cache and no HF_*_OFFLINE variables can encode,
    and building the encoder leaves the process environment as it was (no process-wide switch)."""
    code = textwrap.dedent(
        """
        import os, socket
        def _no_network(*a, **k):
            raise OSError("network access attempted")
        socket.socket.connect = _no_network
        socket.create_connection = _no_network
        import oir_gym
        from oir_gym.encoder import InstructionEncoder
        import jax
        assert not jax.config.jax_compilation_cache_dir, "import oir_gym switched on the JAX cache"
        before = dict(os.environ)
        enc = InstructionEncoder()
        v = enc.encode(["collect wood"])
        assert v.shape == (1, 384), v.shape
        changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
        assert not changed, f"building the encoder changed the environment: {sorted(changed)}"
        print("OK", float(abs(v).sum()) > 0)
        """
    )
    out = _run_clean(code, ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "JAX_COMPILATION_CACHE_DIR"),
                     HF_HOME=str(tmp_path / "hf"))
    assert "OK True" in out


def test_enable_compilation_cache_is_explicit(tmp_path):
    """``import oir_gym`` leaves JAX's cache alone; ``enable_compilation_cache`` sets it, honours
    OIR_GYM_JAX_CACHE=0 and OIR_GYM_JAX_CACHE_DIR, and caches programs of 1 s and more unless
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS or the argument says otherwise."""
    code = textwrap.dedent(
        """
        import os, jax, oir_gym
        assert not jax.config.jax_compilation_cache_dir
        os.environ["OIR_GYM_JAX_CACHE"] = "0"
        assert oir_gym.enable_compilation_cache() is None and not jax.config.jax_compilation_cache_dir
        del os.environ["OIR_GYM_JAX_CACHE"]
        path = oir_gym.enable_compilation_cache()
        assert path == jax.config.jax_compilation_cache_dir == os.environ["OIR_GYM_JAX_CACHE_DIR"], path
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 1.0
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
        oir_gym.enable_compilation_cache(path)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
        oir_gym.enable_compilation_cache(path, min_compile_time_secs=2.5)
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
        print("OK")
        """
    )
    drop = ("OIR_GYM_JAX_CACHE", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")
    out = _run_clean(code, drop, OIR_GYM_JAX_CACHE_DIR=str(tmp_path / "jaxcache"))
    assert "OK" in out


def test_output_contract(encoder):
    v = encoder.encode(["collect wood", "place table", "eat cow"])
    assert v.shape == (3, EMBED_DIM) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    one = encoder.encode("collect wood")
    assert one.shape == (EMBED_DIM,)
    np.testing.assert_allclose(one, v[0], atol=1e-6)
    empty = encoder.encode([])
    assert empty.shape == (0, EMBED_DIM) and empty.dtype == np.float32
    assert encoder.dim == EMBED_DIM


def test_paraphrase_similarity(encoder):
    sim = encoder.similarity(["collect wood"], ["collect wood from the tree", "collect wood", "defeat skeleton"])
    assert sim.shape == (1, 3)
    assert sim[0, 0] == pytest.approx(0.889, abs=0.005)  # just below the default delta 0.9
    assert sim[0, 1] == pytest.approx(1.0, abs=1e-5)
    assert sim[0, 2] < 0.6


def test_encodes_each_string_once(encoder, monkeypatch):
    calls = []
    real = encoder._model.encode

    def counting(sentences, **kw):
        calls.append(list(sentences))
        return real(sentences, **kw)

    monkeypatch.setattr(encoder._model, "encode", counting)
    a = encoder.encode(["a cache test sentence", "another cache test sentence", "a cache test sentence"])
    b = encoder.encode(["another cache test sentence"])
    assert calls == [["a cache test sentence", "another cache test sentence"]]  # batched, de-duplicated
    np.testing.assert_array_equal(a[1], b[0])
    np.testing.assert_array_equal(a[0], a[2])
    # returned arrays are copies: mutating them does not poison the cache
    a[0][:] = 0
    assert np.linalg.norm(encoder.encode("a cache test sentence")) == pytest.approx(1.0, abs=1e-5)


def test_cache_is_bounded(encoder):
    small = InstructionEncoder.__new__(InstructionEncoder)
    small.__dict__.update(encoder.__dict__)
    from collections import OrderedDict

    small._cache, small._cache_size = OrderedDict(), 2
    small.encode(["cache one", "cache two", "cache three"])
    assert len(small._cache) == 2 and "cache one" not in small._cache


@pytest.mark.parametrize("bad", [3, None, b"bytes", ["ok", 4]])
def test_rejects_non_strings(encoder, bad):
    with pytest.raises(TypeError, match="strings"):
        encoder.encode(bad if isinstance(bad, list) else [bad])


def test_missing_model_path():
    with pytest.raises(FileNotFoundError, match="/nonexistent/model"):
        InstructionEncoder("/nonexistent/model")


def test_env_with_missing_encoder_path():
    from oir_gym.vector_env import InstructionCraftax

    with pytest.raises(FileNotFoundError, match="/nonexistent"):
        InstructionCraftax(num_envs=4, encoder="/nonexistent")


def test_get_encoder_is_shared(encoder):
    assert get_encoder() is encoder
    # env specs holding an encoder are deep-copied by Gymnasium: the copy is the same encoder
    assert copy.deepcopy({"encoder": encoder})["encoder"] is encoder


# --------------------------------------------------------------------------- numpy backend vs sentence-transformers


def _package_texts() -> tuple[list[str], list[str]]:
    """Every packaged instruction (all sets, oracle pool wordings) and every caption phrasing."""
    from oir_gym.captions import VOCAB
    from oir_gym.instructions import load_instruction_sets
    from oir_gym.relabel.oracle import load_pool

    instr = [i.text for s in load_instruction_sets().values() for i in s]
    instr += [w for ws in load_pool().wordings.values() for w in ws]
    return list(dict.fromkeys(instr)), list(dict.fromkeys(VOCAB.phrases))


@pytest.fixture(scope="module")
def st_encoder():
    """The packaged model through sentence-transformers (the reference the numpy backend must match)."""
    return InstructionEncoder(backend="sentence-transformers", cache_size=0)


def test_packaged_model_runs_on_the_numpy_backend_without_torch():
    """The default encoder imports neither torch, transformers nor sentence-transformers."""
    code = textwrap.dedent(
        """
        import sys
        from oir_gym.encoder import InstructionEncoder
        enc = InstructionEncoder()
        v = enc.encode(["collect wood"])
        heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers", "sklearn") if m in sys.modules)
        print("BACKEND", enc.backend, v.shape, heavy)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "OIR_GYM_ENCODER_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BACKEND numpy (1, 384) []" in out.stdout, out.stdout


def test_numpy_backend_matches_sentence_transformers_on_every_package_text(encoder, st_encoder):
    """Per component within 1e-5 (measured: < 1e-6), cosines within 1e-5, and no instruction/caption
    pair changes side of the reward delta 0.9 or the bind threshold 0.5."""
    assert encoder.backend == "numpy" and st_encoder.backend == "sentence-transformers"
    instr, caps = _package_texts()
    assert len(instr) + len(caps) >= 300
    fresh = InstructionEncoder(cache_size=0)  # uncached: the shared encoder's cache may hold other runs' vectors
    a_i, a_c = fresh.encode(instr), fresh.encode(caps)
    b_i, b_c = st_encoder.encode(instr), st_encoder.encode(caps)
    assert np.abs(a_i - b_i).max() <= 1e-5 and np.abs(a_c - b_c).max() <= 1e-5
    sim_a, sim_b = a_i @ a_c.T, b_i @ b_c.T
    assert np.abs(sim_a - sim_b).max() <= 1e-5
    for threshold in (0.9, 0.5):
        assert np.array_equal(sim_a > threshold, sim_b > threshold), threshold


def test_numpy_backend_truncates_long_texts_and_strips_as_sentence_transformers(encoder, st_encoder):
    long = "collect wood and then place a table near the water " * 60  # far past 256 tokens
    texts = [long, long + " and finally defeat a zombie", "  eat cow  ", "eat cow", "Collect WOOD"]
    a, b = InstructionEncoder(cache_size=0).encode(texts), st_encoder.encode(texts)
    np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(a[0], a[1], atol=1e-6)  # the tail past max_seq_length is cut off
    np.testing.assert_allclose(a[2], a[3], atol=1e-6)
    empty_a, empty_b = encoder.encode([]), st_encoder.encode([])
    assert empty_a.shape == empty_b.shape == (0, EMBED_DIM) and empty_a.dtype == empty_b.dtype == np.float32


def test_numpy_backend_is_independent_of_batching(st_encoder):
    texts = ["collect wood", "place a crafting table right next to you please", "eat", "x " * 300]
    one = InstructionEncoder(cache_size=0, batch_size=1).encode(texts)
    many = InstructionEncoder(cache_size=0, batch_size=256).encode(texts)
    np.testing.assert_allclose(one, many, atol=1e-6)


def test_backend_choice_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv("OIR_GYM_ENCODER_BACKEND", "sentence-transformers")
    assert InstructionEncoder(cache_size=0).backend == "sentence-transformers"
    monkeypatch.setenv("OIR_GYM_ENCODER_BACKEND", "onnx")
    with pytest.raises(ValueError, match="OIR_GYM_ENCODER_BACKEND"):
        InstructionEncoder()
    monkeypatch.delenv("OIR_GYM_ENCODER_BACKEND")
    with pytest.raises(ValueError, match="backend must be one of"):
        InstructionEncoder(backend="torch")
    with pytest.raises(ValueError, match="device 'cpu'"):
        InstructionEncoder(backend="numpy", device="cuda")
    # a folder that is not BERT + mean pooling + Normalize (here: CLS pooling) is refused by the
    # numpy backend and left to sentence-transformers by "auto"
    import shutil

    from oir_gym.numpy_bert import is_supported

    other = tmp_path / "cls_model"
    shutil.copytree(default_model_path(), other, copy_function=os.symlink)  # links: no 90 MB copy
    (other / "1_Pooling" / "config.json").unlink()
    (other / "1_Pooling" / "config.json").write_text(
        (Path(default_model_path()) / "1_Pooling" / "config.json").read_text())
    cfg = json.loads((other / "1_Pooling" / "config.json").read_text())
    cfg.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (other / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    assert is_supported(default_model_path()) and not is_supported(other)
    with pytest.raises(ValueError, match="backend='sentence-transformers'"):
        InstructionEncoder(str(other), backend="numpy")
    assert InstructionEncoder(str(other), cache_size=0).backend == "sentence-transformers"


def test_a_folder_saved_by_a_newer_sentence_transformers_runs_on_the_numpy_backend(tmp_path, encoder):
    """Newer sentence-transformers versions save the same model with other module class paths in
    ``modules.json`` and one ``pooling_mode`` field: the numpy backend takes it, with the same
    embeddings; a ``pooling_mode`` other than mean is left to sentence-transformers."""
    import shutil

    from oir_gym.numpy_bert import is_supported

    newer = tmp_path / "newer"
    shutil.copytree(default_model_path(), newer, copy_function=os.symlink)
    for name, text in (("modules.json", json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"}])),
            ("1_Pooling/config.json", json.dumps({"embedding_dimension": 384, "pooling_mode": "mean",
                                                  "include_prompt": True}))):
        (newer / name).unlink()
        (newer / name).write_text(text)
    assert is_supported(newer)
    enc = InstructionEncoder(str(newer), cache_size=0)
    texts = ["collect wood", "place a crafting table", "the player drank water"]
    assert enc.backend == "numpy"
    np.testing.assert_allclose(enc.encode(texts), encoder.encode(texts), atol=1e-6)
    (newer / "1_Pooling" / "config.json").unlink()
    (newer / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "cls"}))
    assert not is_supported(newer)
