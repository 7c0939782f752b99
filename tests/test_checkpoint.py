"""Checkpoints: no code execution, atomic under a kill, checksums naming the damaged file, last N kept."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
from flax import struct  # noqa: E402

from agents.run.checkpoint import (  # noqa: E402
    ARRAYS, HOST, MANIFEST, CheckpointError, incomplete_checkpoints, latest_checkpoint, list_checkpoints,
    load_checkpoint, refuse_legacy, restore_tree, save_checkpoint,
)

ROOT = Path(__file__).resolve().parents[1]
Pair = namedtuple("Pair", "mu nu")


@struct.dataclass
class Box:
    weights: np.ndarray
    flags: np.ndarray


def _tree(scale: float = 1.0, hidden: int = 8):
    return {"box": Box(np.full((3, hidden), scale, np.float32), np.array([True, False])),
            "opt": Pair(np.zeros(hidden, np.float32), np.ones(2, np.int32)),
            "key": jax.random.PRNGKey(3), "carry": (np.zeros(2), np.ones(2))}


def test_round_trip_restores_every_leaf_and_the_host_state(tmp_path):
    tree = _tree(2.0)
    folder = save_checkpoint(tmp_path, 7, tree, {"update": 7, "buffer": ["collect wood"], "rng": 2**100})
    assert folder == tmp_path / "checkpoints" / "000007"
    arrays, host = load_checkpoint(tmp_path)
    assert host == {"update": 7, "buffer": ["collect wood"], "rng": 2**100}
    out = restore_tree(_tree(0.0), arrays, folder / ARRAYS)
    assert isinstance(out["box"], Box) and isinstance(out["opt"], Pair)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(tree)):
        np.testing.assert_array_equal(a, np.asarray(b))
        assert np.asarray(a).dtype == np.asarray(b).dtype


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    for u in (2, 4, 6, 8):
        save_checkpoint(tmp_path, u, _tree(u), {"update": u}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["000006", "000008"]
    assert load_checkpoint(tmp_path)[1]["update"] == 8


@pytest.mark.parametrize("target, damage", [(ARRAYS, "flip"), (ARRAYS, "truncate"), (HOST, "flip"),
                                            (MANIFEST, "truncate")])
def test_a_damaged_file_is_an_error_naming_it(tmp_path, target, damage):
    folder = save_checkpoint(tmp_path, 1, _tree(), {"update": 1, "note": "x" * 100})
    path = folder / target
    data = bytearray(path.read_bytes())
    if damage == "flip":
        for i in range(len(data) // 2, len(data) // 2 + 64):  # 64 flipped bytes (resumed silently before)
            data[i] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(path)):
        load_checkpoint(tmp_path)


def test_another_network_size_is_an_error_naming_the_field(tmp_path):
    folder = save_checkpoint(tmp_path, 1, _tree(hidden=8), {})
    arrays, _ = load_checkpoint(folder)
    with pytest.raises(CheckpointError, match=r"field box/weights has shape \(3, 8\) in the checkpoint and \(3, 16\)"):
        restore_tree(_tree(hidden=16), arrays, folder / ARRAYS)
    other = {"params": np.zeros(3)}
    with pytest.raises(CheckpointError, match=r"field /: the checkpoint lacks \['params'\]"):
        restore_tree(other, arrays, folder / ARRAYS)


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_readable(tmp_path):
    """SIGKILL a process that keeps writing large checkpoints; what is on disk must load and verify."""
    code = (
        "import sys, numpy as np; sys.path.insert(0, %r)\n"
        "from agents.run.checkpoint import save_checkpoint\n"
        "big = {'w': np.random.default_rng(0).random(8_000_000).astype(np.float32)}\n"
        "save_checkpoint(%r, 0, big, {'update': 0})\n"
        "print('first', flush=True)\n"
        "u = 1\n"
        "while True:\n"
        "    save_checkpoint(%r, u, {'w': big['w'] + u}, {'update': u}, keep=1)\n"
        "    u += 1\n"
    ) % (str(ROOT), str(tmp_path), str(tmp_path))
    for delay in (0.05, 0.4, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "first"
        time.sleep(delay)
        proc.kill()
        proc.wait()
        arrays, host = load_checkpoint(tmp_path)  # verifies sizes and checksums
        base = np.random.default_rng(0).random(8_000_000).astype(np.float32)[:5]
        np.testing.assert_array_equal(arrays["w"][:5], base + np.float32(host["update"]))
        assert latest_checkpoint(tmp_path).name == f"{host['update']:06d}"
    # a later save cleans up the temporary folders of killed writers
    save_checkpoint(tmp_path, 10_000, {"w": np.zeros(2)}, {"update": 10_000}, keep=1)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["010000"]


def test_a_writer_killed_while_deleting_an_old_checkpoint_leaves_no_checkpoint_without_its_manifest(tmp_path,
                                                                                                    monkeypatch):
    """Pruning renames an old checkpoint before deleting it: a kill part way through the deletion
    (injected: ``shutil.rmtree`` removes one file and raises, as a SIGKILL there cannot be timed)
    leaves a temporary folder that the next save removes, never a numbered folder without its
    manifest (which a later save of that update would keep aside as ``.incomplete``)."""
    import shutil as real_shutil

    from agents.run import checkpoint

    save_checkpoint(tmp_path, 1, {"w": np.zeros(3)}, {"update": 1}, keep=1)
    real_rmtree = real_shutil.rmtree

    def killed_part_way(path, ignore_errors=False):
        first = sorted(Path(path).iterdir())[0]
        first.unlink()
        raise KeyboardInterrupt("killed while deleting")

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_part_way)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, {"w": np.ones(3)}, {"update": 2}, keep=1)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    root = tmp_path / "checkpoints"
    assert incomplete_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path).name == "000002"
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]  # the half-deleted one
    save_checkpoint(tmp_path, 3, {"w": np.ones(3)}, {"update": 3}, keep=1)
    assert sorted(p.name for p in root.iterdir()) == ["000003"]


class _Payload:
    """A pickle that runs code when loaded (what a malicious checkpoint.pkl would hold)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_cannot_run_code(tmp_path):
    marker = tmp_path / "code_ran"
    payload = pickle.dumps(_Payload(marker))
    # (a) the pickle in place of the arrays, with a manifest whose checksums match it
    folder = save_checkpoint(tmp_path / "run", 1, {"w": np.zeros(2)}, {"update": 1})
    (folder / ARRAYS).write_bytes(payload)
    manifest = json.loads((folder / MANIFEST).read_text())
    import hashlib

    manifest["files"][ARRAYS] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot be decoded"):
        load_checkpoint(tmp_path / "run")
    # (b) a legacy checkpoint.pkl: refused, never unpickled
    legacy = tmp_path / "old"
    legacy.mkdir()
    (legacy / "checkpoint.pkl").write_bytes(payload)
    with pytest.raises(CheckpointError, match="legacy pickle checkpoint.*python -m agents.tools.legacy_checkpoint"):
        load_checkpoint(legacy)
    with pytest.raises(CheckpointError, match="checkpoint.pkl"):
        refuse_legacy(legacy)
    assert not marker.exists()
    pickle.loads(payload)  # the payload is live: loading it as a pickle would have run it
    assert marker.exists()


def test_a_foreign_manifest_is_refused(tmp_path):
    folder = save_checkpoint(tmp_path, 1, {"w": np.zeros(2)}, {})
    (folder / MANIFEST).write_text(json.dumps({"format": "something-else/9"}))
    with pytest.raises(CheckpointError, match="is not an oir-gym checkpoint manifest"):
        load_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty")


def test_a_checkpoint_folder_without_its_manifest_is_skipped_and_saves_go_on(tmp_path):
    """Issue 30.7: a partial copy (no manifest.json) of the newest checkpoint: readers fall back to
    the one before, and saving its update again moves the partial folder aside (it used to fail
    with 'Directory not empty' at every later save)."""
    from agents.run.checkpoint import incomplete_checkpoints

    for u in (2, 4):
        save_checkpoint(tmp_path, u, _tree(u), {"update": u})
    partial = tmp_path / "checkpoints" / "000004"
    (partial / MANIFEST).unlink()
    assert latest_checkpoint(tmp_path).name == "000002" and incomplete_checkpoints(tmp_path) == [partial]
    assert load_checkpoint(tmp_path)[1]["update"] == 2
    save_checkpoint(tmp_path, 4, _tree(4.5), {"update": 4})
    assert load_checkpoint(tmp_path)[1]["update"] == 4
    np.testing.assert_array_equal(load_checkpoint(tmp_path)[0]["box"]["weights"], np.full((3, 8), 4.5, np.float32))
    aside = tmp_path / "checkpoints" / "000004.incomplete"
    assert (aside / ARRAYS).exists() and not incomplete_checkpoints(tmp_path)  # kept, out of the way
    save_checkpoint(tmp_path, 6, _tree(6), {"update": 6}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["000004", "000006"]


def _rewrite(folder: Path, arrays=None, host=None, manifest_update=None) -> None:
    """Replace a checkpoint's content and write a manifest consistent with it (what a writer with
    bad state, or someone editing the folder, leaves: the checksums match)."""
    import hashlib

    from flax import serialization

    manifest = json.loads((folder / MANIFEST).read_text())
    if arrays is not None:
        blob = serialization.msgpack_serialize(arrays)
        (folder / ARRAYS).write_bytes(blob)
        manifest["files"][ARRAYS] = {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    if host is not None:
        data = json.dumps(host).encode()
        (folder / HOST).write_bytes(data)
        manifest["files"][HOST] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if manifest_update is not None:
        manifest["update"] = manifest_update
    (folder / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("case, file, match", [
    ("nan weights", ARRAYS, r"field w/kernel holds NaN or infinite values"),
    ("host is a list", HOST, r"holds a JSON list, not an object"),
    ("negative update", MANIFEST, r"update=-3 is not a count"),
    ("negative env steps", HOST, r"env_steps=-64 is not a count"),
    ("host update differs", HOST, r"update=5 but its manifest says 2"),
    ("manifest of another folder", MANIFEST, r"says update 7 but lies in the folder of update 2"),
])
def test_checkpoint_content_is_checked_with_an_error_naming_the_file(tmp_path, case, file, match):
    """Issue 30.8: files whose manifest matches them but whose content is bad are refused on load."""
    folder = save_checkpoint(tmp_path, 2, {"w": {"kernel": np.ones((2, 2), np.float32)}},
                             {"update": 2, "env_steps": 128})
    if case == "nan weights":
        _rewrite(folder, arrays={"w": {"kernel": np.array([[1.0, np.nan], [0.0, 1.0]], np.float32)}})
    elif case == "host is a list":
        _rewrite(folder, host=[1, 2, 3])
    elif case == "negative update":
        _rewrite(folder, host={"update": -3}, manifest_update=-3)
    elif case == "negative env steps":
        _rewrite(folder, host={"update": 2, "env_steps": -64})
    elif case == "host update differs":
        _rewrite(folder, host={"update": 5})
    else:
        _rewrite(folder, host={"update": 7}, manifest_update=7)
    with pytest.raises(CheckpointError, match=match) as err:
        load_checkpoint(tmp_path)
    assert str(folder / file) in str(err.value)


def test_a_manifest_cannot_name_a_file_outside_its_folder(tmp_path):
    """Issue 37.12: a manifest naming ``../../outside.bin`` (its checksum rewritten to match) is
    refused naming the manifest; nothing outside the checkpoint folder is read."""
    run = tmp_path / "run"
    folder = save_checkpoint(run, 1, {"w": np.zeros(2)}, {"update": 1})
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    manifest = json.loads((folder / MANIFEST).read_text())
    for name in ("../../outside.bin", str(outside), "sub/../../x"):
        crafted = {**manifest, "files": {**manifest["files"], name: {"bytes": 6, "sha256": "0" * 64}}}
        (folder / MANIFEST).write_text(json.dumps(crafted))
        with pytest.raises(CheckpointError, match=rf"{MANIFEST}: names '.*', which is not a file inside"):
            load_checkpoint(run)
    crafted = {**manifest, "files": {**manifest["files"], "extra.bin": {"bytes": 6, "sha256": "0" * 64}}}
    (folder / MANIFEST).write_text(json.dumps(crafted))
    with pytest.raises(CheckpointError, match=rf"names 'extra.bin'; a checkpoint manifest lists only {ARRAYS} and"):
        load_checkpoint(run)


def test_checkpoint_files_that_are_links_are_not_read_through(tmp_path):
    """A checkpoint's file (or a checkpoint folder of a run) that is a symbolic link is refused,
    even when the bytes it points to match the manifest."""
    run = tmp_path / "run"
    folder = save_checkpoint(run, 1, {"w": np.zeros(2)}, {"update": 1})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (folder / HOST).rename(outside / HOST)
    (folder / HOST).symlink_to(outside / HOST)
    with pytest.raises(CheckpointError, match=rf"{MANIFEST}: names '{HOST}', and .* is a symbolic link"):
        load_checkpoint(run)
    (folder / HOST).unlink()
    (outside / HOST).rename(folder / HOST)
    load_checkpoint(run)  # back in place: reads
    folder.rename(outside / "000001")
    folder.symlink_to(outside / "000001")
    with pytest.raises(CheckpointError, match="000001: names '000001', and .* is a symbolic link"):
        load_checkpoint(run)
