"""Craftax-Classic's texture cache (issue 37, items 9 and 15): a per-user cache written whole or not
at all, and a cache that cannot be read named and rebuilt instead of breaking every render.

The broken caches here are real faults written where the reader reads them (a truncated bz2
pickle, random bytes, a pickle of another layout): no mock. The tests point the cache at a
temporary folder (``OIR_GYM_CRAFTAX_CACHE_DIR``); none of them touches the installed Craftax package.
"""

from __future__ import annotations

import bz2
import pickle
from collections.abc import Sequence

import numpy as np
import pytest

from oir_gym import craftax_compat as cc


def _bz2_pickle(path, obj) -> bytes:
    with bz2.BZ2File(path, "wb") as f:
        pickle.dump(obj, f)
    return path.read_bytes()


def test_the_cache_is_per_user_and_outside_the_craftax_package(tmp_path, monkeypatch):
    import craftax

    monkeypatch.delenv(cc.TEXTURE_CACHE_ENV, raising=False)
    default = cc.texture_cache_path()
    assert ".cache" in default.parts and "oir_gym" in default.parts
    assert not str(default).startswith(str(__import__("pathlib").Path(craftax.__file__).parent))
    monkeypatch.setenv(cc.TEXTURE_CACHE_ENV, str(tmp_path))
    assert cc.texture_cache_path().parent == tmp_path


def test_a_truncated_or_foreign_cache_is_a_named_error(tmp_path):
    """What a process killed mid-write leaves: the first half of a bz2 pickle (a bare EOFError in Craftax)."""
    layout = {ts: {"full_map_block_textures": np.zeros((len(cc.BlockType), 7 * ts, 9 * ts, 3), np.float32)}
              for ts in cc.TEXTURE_SIZES}
    whole = _bz2_pickle(tmp_path / "whole.pbz2", layout)
    assert cc.read_texture_cache(tmp_path / "whole.pbz2")[16]["full_map_block_textures"].shape == (17, 112, 144, 3)
    truncated = tmp_path / "truncated.pbz2"
    truncated.write_bytes(whole[: len(whole) // 2])
    noise = tmp_path / "noise.pbz2"
    noise.write_bytes(np.random.default_rng(0).bytes(512))
    empty = tmp_path / "empty.pbz2"
    empty.write_bytes(b"")
    for bad in (truncated, noise, empty):
        with pytest.raises(cc.TextureCacheError, match="cannot be read") as e:
            cc.read_texture_cache(bad)
        assert str(bad) in str(e.value) and "rebuilt" in str(e.value)
    _bz2_pickle(tmp_path / "other.pbz2", {16: {"full_map_block_textures": np.zeros((3, 3))}})
    with pytest.raises(cc.TextureCacheError, match="another layout"):
        cc.read_texture_cache(tmp_path / "other.pbz2")


def test_the_cache_is_replaced_whole(tmp_path):
    """Written to a temporary file and renamed: no partial file under the cache's name, no leftovers."""
    path = tmp_path / "sub" / "cache.pbz2"
    cc._write_texture_cache(path, {"a": np.arange(3)})
    cc._write_texture_cache(path, {"a": np.arange(4)})
    with bz2.BZ2File(path) as f:
        assert pickle.load(f)["a"].tolist() == [0, 1, 2, 3]
    assert [p.name for p in path.parent.iterdir()] == ["cache.pbz2"]


@pytest.mark.slow
def test_a_render_after_a_truncated_cache_names_it_rebuilds_it_and_renders(tmp_path, monkeypatch, capfd, venv):
    """The whole path: a truncated cache where the renderer reads it, then a real render."""
    monkeypatch.setenv(cc.TEXTURE_CACHE_ENV, str(tmp_path))
    path = cc.texture_cache_path()
    path.write_bytes(b"BZh91AY&SY" + bytes(100))  # a bz2 header and then nothing: a write cut short
    cc.load_textures.cache_clear()
    venv._renderer = None  # the shared env renders again through the cache
    try:
        frames = venv.render()
    finally:
        cc.load_textures.cache_clear()
    assert isinstance(frames, Sequence) and max(f.max() for f in frames) > 0
    err = capfd.readouterr().err
    assert f"Craftax texture cache {path} cannot be read" in err
    assert cc.read_texture_cache(path)[16]["full_map_block_textures"].shape == (17, 112, 144, 3)  # rebuilt whole
