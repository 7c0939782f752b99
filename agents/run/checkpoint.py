"""Checkpoints that cannot run code, survive a kill at any moment, and say which file is damaged: a folder
``<run>/checkpoints/<update:06d>/`` of ``arrays.msgpack`` (flax msgpack), ``host.json`` and ``manifest.json``
(sizes and sha256 of the other two), renamed into place whole; reading verifies sizes, checksums and content.
Old runs' ``checkpoint.pkl`` is refused (convert it with ``python -m agents.tools.legacy_checkpoint RUN_DIR``).

Check a run's newest checkpoint without loading it: ``python -m agents.run.checkpoint RUN_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping

from agents.run.run_dir import CHECKPOINTS, CorruptFileError, json_default, member, read_json, sha256_bytes
from oir_gym.validation import fsync_dir

FORMAT = "oir-gym-checkpoint/1"
ARRAYS = "arrays.msgpack"
HOST = "host.json"
MANIFEST = "manifest.json"
LEGACY_PICKLE = "checkpoint.pkl"
_STEP_DIR = re.compile(r"\d{6,}")


class CheckpointError(CorruptFileError):
    """A checkpoint file is damaged, foreign, legacy, or does not fit this run; the message names the file."""


def _checkpoint_root(run_or_ckpt_dir: str | os.PathLike) -> Path:
    p = Path(run_or_ckpt_dir)
    return p if p.name == CHECKPOINTS else p / CHECKPOINTS


def _step_dirs(run_dir: str | os.PathLike, complete: bool) -> list[Path]:
    root = _checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if _STEP_DIR.fullmatch(p.name) and (p / MANIFEST).exists() == complete),
                  key=lambda p: int(p.name))


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoint folders of a run (those with a manifest), oldest first."""
    return _step_dirs(run_dir, True)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def incomplete_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint folders of a run without a manifest (copies that stopped part way, never loaded), oldest first."""
    return _step_dirs(run_dir, False)


def remove_checkpoints_after(run_dir: str | os.PathLike, update: int) -> list[Path]:
    """Delete the complete checkpoints of a run newer than ``update`` (a resume replays them); returns them."""
    newer = [p for p in list_checkpoints(run_dir) if int(p.name) > update]
    for p in newer:
        shutil.rmtree(p)
    if newer:
        fsync_dir(_checkpoint_root(run_dir))
    return newer


def _write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and flush it to the disk (one place a test can stop a save midway)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(run_dir: str | os.PathLike, update: int, arrays: Any, host: Mapping[str, Any],
                    keep: int = 2) -> Path:
    """Write checkpoint ``update`` (``arrays``: a pytree; ``host``: JSON-able) of a run atomically, keep the newest
    ``keep``; returns its folder (a complete checkpoint of the same update already there is kept)."""
    import jax
    from flax import serialization

    if keep < 1:
        raise ValueError(f"keep={keep} must be >= 1")
    root = _checkpoint_root(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{int(update):06d}"
    if (final / MANIFEST).exists():
        _prune(root, keep)
        return final
    if final.exists():  # no manifest: a copy that stopped part way, never loaded; kept aside, not in the way
        aside = root / f"{final.name}.incomplete"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
    state = serialization.to_state_dict(jax.device_get(arrays))
    blob = serialization.msgpack_serialize(state)
    host_bytes = json.dumps(dict(host), indent=1, default=json_default, allow_nan=False).encode("utf-8")
    manifest = {
        "format": FORMAT, "update": int(update),
        "files": {ARRAYS: {"bytes": len(blob), "sha256": sha256_bytes(blob)},
                  HOST: {"bytes": len(host_bytes), "sha256": sha256_bytes(host_bytes)}},
    }
    tmp = root / f".tmp-{int(update):06d}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for name, data in ((ARRAYS, blob), (HOST, host_bytes), (MANIFEST, json.dumps(manifest, indent=1).encode())):
            _write_synced(tmp / name, data)
        fsync_dir(tmp)
        os.rename(tmp, final)  # atomic: the folder appears complete or not at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    _prune(root, keep)
    return final


def _prune(root: Path, keep: int) -> None:
    done = list_checkpoints(root)
    for old in done[:-keep]:
        # renamed first: a kill while deleting leaves a temporary folder, not a checkpoint without its manifest
        doomed = root / f".tmp-{old.name}-{os.getpid()}"
        if doomed.exists():
            shutil.rmtree(doomed, ignore_errors=True)
        try:
            os.rename(old, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
    for p in root.iterdir():  # temporary folders of writers that were killed
        if p.name.startswith(".tmp-") and not _owned_by_live_process(p):
            shutil.rmtree(p, ignore_errors=True)


def _owned_by_live_process(p: Path) -> bool:
    pid = p.name.rsplit("-", 1)[-1]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _checked(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` (:func:`agents.run.run_dir.member`, ``read_json``), its CorruptFileError a CheckpointError."""
    try:
        return fn(*args)
    except CorruptFileError as e:
        raise CheckpointError(e.path, str(e).split(": ", 1)[1]) from None


def _read_verified(folder: Path, name: str, spec: Mapping[str, Any]) -> bytes:
    path = _checked(member, folder, name)
    if not path.exists():
        raise CheckpointError(path, "is missing from the checkpoint")
    data = path.read_bytes()
    if len(data) != spec.get("bytes"):
        raise CheckpointError(path, f"holds {len(data)} bytes, the manifest says {spec.get('bytes')}: the file was cut "
                                    "short or changed")
    if sha256_bytes(data) != spec.get("sha256"):
        raise CheckpointError(path, "does not match the sha256 its manifest recorded: the file is damaged or was changed")
    return data


def load_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(arrays, host)`` of the verified checkpoint at ``path`` (a checkpoint folder, or a run directory: its
    newest); the arrays as the saved state dict (:func:`restore_tree`). FileNotFoundError: none there;
    :class:`CheckpointError`: a damaged, foreign or legacy file, named."""
    from flax import serialization

    folder = Path(path)
    if not (folder / MANIFEST).exists():
        refuse_legacy(folder)
        latest = latest_checkpoint(folder)
        if latest is None:
            raise FileNotFoundError(f"no checkpoint in {folder} (expected {folder / CHECKPOINTS}/<update>/{MANIFEST})")
        folder = _checked(member, latest.parent, latest.name)  # a checkpoint found in a run is read from inside it
    manifest = _checked(read_json, _checked(member, folder, MANIFEST))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(folder / MANIFEST, f"is not an oir-gym checkpoint manifest (format "
                                                 f"{manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                                                 f"expected {FORMAT!r})")
    files = manifest.get("files", {})
    if not isinstance(files, dict):
        raise CheckpointError(folder / MANIFEST, f"'files' is a {type(files).__name__}, not an object of file names")
    for name in files:  # a manifest names its folder's two files, nothing elsewhere
        _checked(member, folder, name, folder / MANIFEST)
        if name not in (ARRAYS, HOST):
            raise CheckpointError(folder / MANIFEST, f"names {name!r}; a checkpoint manifest lists only {ARRAYS} and "
                                                     f"{HOST} of its own folder")
    blob = _read_verified(folder, ARRAYS, files.get(ARRAYS, {}))
    host_bytes = _read_verified(folder, HOST, files.get(HOST, {}))
    try:
        arrays = serialization.msgpack_restore(blob)
    except Exception as e:  # checksum matched, so the writer itself wrote something unreadable
        raise CheckpointError(folder / ARRAYS, f"cannot be decoded ({type(e).__name__}: {e})") from None
    try:
        host = json.loads(host_bytes)
    except json.JSONDecodeError as e:
        raise CheckpointError(folder / HOST, f"is not valid JSON ({e})") from None
    _check_content(folder, manifest, arrays, host)
    return arrays, host


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _check_content(folder: Path, manifest: Mapping[str, Any], arrays: Any, host: Any) -> None:
    """What checksums cannot vouch for (bad state, a rewritten file and manifest): the content itself."""
    import numpy as np

    update = manifest.get("update")
    if not _is_count(update):
        raise CheckpointError(folder / MANIFEST, f"update={update!r} is not a count of updates (an integer >= 0)")
    if _STEP_DIR.fullmatch(folder.name) and int(folder.name) != update:
        raise CheckpointError(folder / MANIFEST, f"says update {update} but lies in the folder of update "
                                                 f"{int(folder.name)}")
    if not isinstance(host, dict):
        raise CheckpointError(folder / HOST, f"holds a JSON {type(host).__name__}, not an object of host state")
    for key in ("update", "env_steps"):
        if key in host and not _is_count(host[key]):
            raise CheckpointError(folder / HOST, f"{key}={host[key]!r} is not a count (an integer >= 0)")
    if "update" in host and host["update"] != update:
        raise CheckpointError(folder / HOST, f"update={host['update']} but its manifest says {update}")
    if not isinstance(arrays, dict):
        raise CheckpointError(folder / ARRAYS, f"holds a {type(arrays).__name__}, not a group of named arrays")
    for path, a, _ in _leaves(arrays, arrays, folder / ARRAYS):
        a = np.asarray(a)
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            raise CheckpointError(folder / ARRAYS, f"field {path} holds NaN or infinite values: the state diverged "
                                                   "or the file was changed (move this checkpoint folder away to resume "
                                                   "from the one before it)")


def _leaves(t: Any, s: Any, file: str | os.PathLike, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """``(path, leaf of t, leaf of s)`` of two trees of nested dicts; CheckpointError where their groups differ."""
    if not isinstance(t, dict):
        yield path, t, s
        return
    if not isinstance(s, dict):
        raise CheckpointError(file, f"field {path or '/'} is missing or not a group in the checkpoint")
    missing, extra = sorted(set(map(str, t)) - set(map(str, s))), sorted(set(map(str, s)) - set(map(str, t)))
    if missing or extra:
        raise CheckpointError(file, f"field {path or '/'}: the checkpoint lacks {missing} and has extra "
                                    f"{extra}: it was written by another method, network or code version")
    for k in t:
        yield from _leaves(t[k], s[str(k)] if str(k) in s else s[k], file, f"{path}/{k}" if path else str(k))


def restore_tree(template: Any, state: Any, file: str | os.PathLike, prefix: str = "") -> Any:
    """``template`` with its leaves replaced by those of ``state`` (from :func:`load_checkpoint`); a
    :class:`CheckpointError` naming ``file`` and the field where a leaf is missing or of another shape or kind."""
    import jax
    import numpy as np
    from flax import serialization

    for path, t, s in _leaves(serialization.to_state_dict(template), state, file, prefix):
        ta, sa = np.asarray(t), np.asarray(s)
        if ta.shape != sa.shape:
            raise CheckpointError(file, f"field {path} has shape {sa.shape} in the checkpoint and {ta.shape} in this "
                                        "run: it was written for another network size or batch shape")
        if ta.dtype.kind != sa.dtype.kind:
            raise CheckpointError(file, f"field {path} has dtype {sa.dtype} in the checkpoint and {ta.dtype} in this run")
    restored = serialization.from_state_dict(template, state)
    return jax.tree_util.tree_map(lambda t, s: np.asarray(s, dtype=np.asarray(t).dtype), template, restored)


def refuse_legacy(run_dir: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` when ``run_dir`` holds only a legacy pickle checkpoint."""
    run_dir = Path(run_dir)
    legacy = run_dir / LEGACY_PICKLE
    if legacy.exists() and latest_checkpoint(run_dir) is None:
        raise CheckpointError(legacy, "is a legacy pickle checkpoint, which is not loaded because unpickling runs any "
                                      "code the file names. If you trust the file (you wrote it), convert it once "
                                      f"with: python -m agents.tools.legacy_checkpoint {run_dir}")


def main(argv: list[str] | None = None, prog: str = "python -m agents.run.checkpoint") -> int:
    """``python -m agents.run.checkpoint [verify] RUN_DIR``: verify a PQN run's newest checkpoint; returns the exit
    status (0 sound, 2 missing or damaged)."""
    from agents.run.config import plain_help

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:
        argv = argv[1:]
    p = argparse.ArgumentParser(
        prog=prog,
        description="Verify the newest checkpoint of a PQN run directory (examples/train_pqn.py): the sizes and "
                    "sha256 of its files against its manifest, then its content (the update, finite arrays). "
                    "Nothing is loaded into a trainer or changed. Exit status 0: sound; 2: missing or damaged.",
        epilog=plain_help(__doc__ or ""), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a run directory (its newest checkpoint) or one checkpoint folder "
                                   "(<run>/checkpoints/<update>)")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"error: {run_dir} is not a folder (give a run directory written by examples/train_pqn.py)",
              file=sys.stderr)
        return 2
    if (run_dir / "model.zip").exists() and latest_checkpoint(run_dir) is None:
        print(f"error: {run_dir} holds an SB3 checkpoint (model.zip); this command checks PQN checkpoints. An SB3 "
              "run's model.zip is checked against the sha256 its run recorded whenever it is loaded (--resume, "
              "--eval-only, agents.sb3.models.load_sb3_policy)", file=sys.stderr)
        return 2
    try:
        _, host = load_checkpoint(run_dir)
        where = run_dir if (run_dir / MANIFEST).exists() else latest_checkpoint(run_dir)
        print(f"{where}: ok (update {host.get('update')})")
    except (CheckpointError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
