"""One run directory for both trainers (:class:`RunDir`): files written atomically, never through a symbolic link,
``metrics.jsonl``'s prefix verified on resume, ``complete.json`` written last. Imports only the standard library."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import itertools
import json
import os
import re
import secrets
import shutil
import string
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from oir_gym.validation import atomic_file


CONFIG = "config.json"
METRICS = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
TENSORBOARD = "tb"
WANDB = "wandb"
CHECKPOINTS = "checkpoints"
COMPLETE = "complete.json"

#: Glob patterns of everything a run writes (``overwrite`` removes these); any of the first six "holds a run".
OUTPUT_PATTERNS: tuple[str, ...] = (
    CONFIG, METRICS, CHECKPOINTS, COMPLETE, "checkpoint.pkl", "model.zip",
    METRICS_CSV, TENSORBOARD, WANDB, "eval_*.json", "eval_*.md", "*.png", "instructions.json", "goals.json",
    "instruction_buffer.json", "state.json", "checkpoint.tmp", ".*.tmp",
)
_RUN_MARKERS = OUTPUT_PATTERNS[:6]

#: Packages whose versions :func:`provenance` records (those installed).
PROVENANCE_PACKAGES: tuple[str, ...] = (
    "oir-gym", "jax", "jaxlib", "flax", "optax", "craftax", "numpy", "gymnasium", "torch", "sentence-transformers",
    "transformers", "llama_cpp_python", "openai", "vllm", "stable-baselines3", "sb3-contrib",
)

_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_TAG_LENGTH = 64
#: Tags of the run's own evaluations that ``--eval-only TAG`` may not take (all-digit tags neither).
RESERVED_TAGS: tuple[str, ...] = ("final",)
#: Paths (glob patterns) a run also writes besides :data:`OUTPUT_PATTERNS`: checked for links too.
_ALSO_WRITTEN: tuple[str, ...] = ("diversity.json", "process[0-9]*")


class RunDirError(RuntimeError):
    """A run directory cannot be used as asked; raised before anything is deleted or written."""


class CorruptFileError(ValueError):
    """A file of a run directory (``path``, named in the message) is damaged."""

    def __init__(self, path: str | os.PathLike, problem: str) -> None:
        self.path = Path(path)
        super().__init__(f"{self.path}: {problem}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`oir_gym.validation.atomic_file`; mode 0666 less the umask)."""
    with atomic_file(path, "wb", private=False) as f:
        f.write(data)
    return Path(path)


def json_default(o: Any) -> Any:
    """``json.dumps``'s ``default``: numpy scalars and arrays as numbers and lists, paths as text."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1) -> Path:
    """:func:`atomic_write_bytes` of ``obj`` as JSON (numpy scalars/arrays become numbers/lists)."""
    return atomic_write_bytes(path, json.dumps(obj, indent=indent, default=json_default).encode("utf-8"))


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; a missing file raises ``FileNotFoundError``, a damaged one :class:`CorruptFileError`."""
    path = Path(path)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(path, f"not valid JSON ({e}); the file is damaged or was cut short") from None


def check_tag(tag: str) -> str:
    """``tag`` if it is a valid evaluation tag (letters, digits, '.', '_', '-'; at most 64), else ValueError."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise ValueError(f"evaluation tag {tag!r} may hold only letters, digits, '.', '_' and '-' "
                         "(and must start with a letter or digit)")
    if len(tag) > MAX_TAG_LENGTH:
        raise ValueError(f"evaluation tag {tag[:20]!r}... has {len(tag)} characters; at most {MAX_TAG_LENGTH}")
    return tag


def check_user_tag(tag: str) -> str:
    """:func:`check_tag`, refusing the tags of the run's own evaluations (for ``--eval-only TAG``)."""
    check_tag(tag)
    if tag in RESERVED_TAGS or tag.isdigit():
        raise ValueError(f"evaluation tag {tag!r} is the name of the run's own "
                         f"{'final' if tag in RESERVED_TAGS else 'periodic'} evaluation (eval_{tag}.json), which "
                         f"it would replace; choose another name, e.g. {tag}_again")
    return tag


def _link_error(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (f"{path} is a symbolic link (to {target}): a run writes its files in its own folder, never through a "
            "link; remove the link (or put a copy of the file in its place) and run again")


def refuse_links(folder: str | os.PathLike, patterns: Iterable[str] = ()) -> None:
    """:class:`RunDirError` naming the first symbolic link among ``patterns``' matches in ``folder`` and under them."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for pattern in patterns:
        for p in sorted(folder.glob(pattern)):
            if p.is_symlink():
                raise RunDirError(_link_error(p))
            if not p.is_dir() or p.name == WANDB:
                continue
            for root, dirs, files in os.walk(p):  # does not descend into linked folders, lists them in dirs
                for name in dirs + files:
                    if os.path.islink(os.path.join(root, name)):
                        raise RunDirError(_link_error(Path(root) / name))


def member(folder: str | os.PathLike, name: str, source: str | os.PathLike | None = None) -> Path:
    """``folder / name`` (``name`` read from ``source``) if inside ``folder``, else :class:`CorruptFileError`."""
    folder = Path(folder)
    where = Path(source) if source is not None else folder / str(name)
    parts = Path(name).parts if isinstance(name, str) and name else ()
    if not parts or Path(name).is_absolute() or any(part in ("..", ".", "") for part in parts) or "\\" in name:
        raise CorruptFileError(where, f"names {name!r}, which is not a file inside {folder}: the file was changed "
                                      "(its names stay inside its own folder)")
    p = folder
    for part in parts:
        p = p / part
        if p.is_symlink():
            raise CorruptFileError(where, f"names {name!r}, and {p} is a symbolic link (to {os.readlink(p)}): "
                                          "files are read from inside their folder only; remove the link")
    return p


def _open_no_follow(path: Path, flags: int) -> int:
    """``os.open`` of ``path`` that refuses a symbolic link (a :class:`RunDirError` naming it)."""
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as e:
        if path.is_symlink():
            raise RunDirError(_link_error(path)) from None
        raise e


def require_wandb() -> None:
    """Raise ``ValueError`` with the install command when the wandb package is missing."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ValueError("--wandb needs the wandb package (pip install 'oir-gym[wandb]')") from None


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def provenance(source_root: str | os.PathLike | None = None) -> dict[str, Any]:
    """Which code produced a run: git commit and state of ``source_root``'s checkout (``OIR_GYM_SOURCE_COMMIT``
    wins), Python, package versions, time."""
    from importlib import metadata

    root = Path(source_root) if source_root is not None else Path(__file__).resolve().parents[1]
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    versions: dict[str, str] = {}
    for name in PROVENANCE_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    declared = os.environ.get("OIR_GYM_SOURCE_COMMIT", "").strip()
    commit = commit.strip() if commit else None
    return {
        "git_commit": declared or commit,
        **({"git_commit_from": "environment"} if declared else {}),
        **({"checkout_commit": commit} if declared and commit and not commit.startswith(declared) else {}),
        "git_dirty": (bool(status.strip()) if status is not None else None),
        "source": str(root),
        "python": sys.version.split()[0],
        "packages": versions,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@dataclass(frozen=True)
class MetricsPosition:
    """Where ``metrics.jsonl`` stood at a checkpoint: rows, bytes, their sha256, the last row's update and steps."""

    rows: int
    bytes: int
    sha256: str
    update: int
    env_steps: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "MetricsPosition":
        try:
            return cls(rows=int(d["rows"]), bytes=int(d["bytes"]), sha256=str(d["sha256"]), update=int(d["update"]),
                       env_steps=int(d["env_steps"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a metrics position: {d!r} ({e})") from None


def _parse_rows(path: Path, data: bytes) -> list[tuple[int, dict]]:
    """``(end offset, row)`` per line of a metrics file; a damaged line is a CorruptFileError."""
    # imported here: oir_gym imports JAX, which a script configures first (XLA's log level, jax.distributed)
    from oir_gym.analysis.runs import JsonlError, parse_jsonl

    try:
        rows = list(parse_jsonl(data, path, torn_tail=False))
    except JsonlError as e:
        raise CorruptFileError(path, e.detail) from None
    for lineno, (_, row) in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("update"), int) or "env_steps" not in row:
            raise CorruptFileError(path, f"line {lineno} is not a metrics row (an object with 'update' and 'env_steps')")
    return rows


class _EventWriter:
    """TensorBoard scalars through tensorboard's own event file writer (no torch import: 2-3 s of a
    start). ``purge_step``: a resumed run's first step; TensorBoard hides the older files' events from it on."""

    def __init__(self, folder: Path, *, purge_step: int | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self._writer = EventFileWriter(str(folder))
        self.flush, self.close = self._writer.flush, self._writer.close
        if purge_step is not None:
            self._writer.add_event(Event(step=purge_step, wall_time=time.time(),
                                         session_log=SessionLog(status=SessionLog.START)))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        self._writer.add_event(self._event(step=step, wall_time=time.time(), summary=self._summary(value=values)))


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``, TensorBoard and W&B; made by :meth:`RunDir.open_metrics`."""

    def __init__(self, path: Path, *, start: MetricsPosition, tb_dir: Path | None = None,
                 tb_purge_step: int | None = None, wandb_run: Any = None) -> None:
        self.path = path
        self._hash = hashlib.sha256()
        fd = _open_no_follow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        offset = 0
        while chunk := os.pread(fd, 1 << 20, offset):  # the kept prefix (verified by the caller)
            self._hash.update(chunk)
            offset += len(chunk)
        self._file = os.fdopen(fd, "ab")
        self._rows, self._bytes = start.rows, start.bytes
        self._last = (start.update, start.env_steps)
        self.tb = _EventWriter(tb_dir, purge_step=tb_purge_step) if tb_dir is not None else None
        self.wandb_run = wandb_run

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row (a flat dict of JSON values with int ``update`` and ``env_steps``)."""
        if not isinstance(row.get("update"), int) or not isinstance(row.get("env_steps"), int):
            raise ValueError(f"a metrics row needs int 'update' and 'env_steps', got {row.get('update')!r}, "
                             f"{row.get('env_steps')!r}")
        line = (json.dumps(dict(row), default=json_default) + "\n").encode("utf-8")
        self._file.write(line)
        self._file.flush()
        self._hash.update(line)
        self._rows += 1
        self._bytes += len(line)
        self._last = (int(row["update"]), int(row["env_steps"]))
        scalars = {k: float(v) for k, v in row.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("update", "env_steps")}
        if self.tb is not None:
            self.tb.scalars(scalars, row["env_steps"])
        if self.wandb_run is not None:
            self.wandb_run.log({**scalars, "update": row["update"]}, step=int(row["env_steps"]))

    def position(self) -> MetricsPosition:
        """The file's state after the rows written so far (call :meth:`sync` before relying on it on disk)."""
        return MetricsPosition(self._rows, self._bytes, self._hash.hexdigest(), *self._last)

    def sync(self) -> MetricsPosition:
        """fsync the rows written so far (and flush TensorBoard); returns :meth:`position`."""
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.tb is not None:
            self.tb.flush()
        return self.position()

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RunDir:
    """A run directory at ``path``."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @classmethod
    def prepare(cls, path: str | os.PathLike, *, resume: bool = False, overwrite: bool = False) -> "RunDir":
        """The :class:`RunDir`, its folder created, once the flags fit the folder (else :class:`RunDirError`,
        nothing changed; ``overwrite`` removes the old outputs first)."""
        run = cls(path)
        if resume and overwrite:
            raise RunDirError("--resume continues the run in the folder and --overwrite deletes it: pass one of them")
        if resume:
            if not (run.path / CONFIG).is_file():
                raise RunDirError(f"--resume given but {run.path / CONFIG} does not exist: there is no run to continue "
                                  "(leave out --resume to start one)")
        elif run.holds_run() and not overwrite:
            raise RunDirError(f"{run.path} already holds a run; pass --resume to continue it, --overwrite to replace "
                              "it, or choose another run directory")
        if overwrite:
            run.remove_outputs()
        refuse_links(run.path, OUTPUT_PATTERNS + _ALSO_WRITTEN)
        run.path.mkdir(parents=True, exist_ok=True)
        return run

    def check_before_first_checkpoint(self, first_checkpoint: int, last_update: int, place: str | os.PathLike) -> None:
        """A resume found no checkpoint in ``place``: :class:`RunDirError` naming what the files hold unless no
        metrics row or evaluation file is past update ``first_checkpoint`` (``final`` counts as ``last_update``),
        so that starting again from update 0 loses nothing."""
        found = []
        rows = self.read_metrics()
        if rows and max(r["update"] for r in rows) > first_checkpoint:
            found.append(f"{self.metrics_path.name} rows up to update {max(r['update'] for r in rows)}")
        for p in sorted(self.path.glob("eval_*.json")):
            tag = p.name[len("eval_"):-len(".json")]
            update = int(tag) if tag.isdigit() else last_update if tag == "final" else None
            if update is None or update > first_checkpoint:
                found.append(p.name)
        if found:
            raise RunDirError(
                f"--resume given but {place} holds no checkpoint, while {self.path} holds {', '.join(found[:4])}"
                f"{' and more' if len(found) > 4 else ''}: the run went past its first checkpoint (update "
                f"{first_checkpoint}), so its checkpoints were moved or deleted. Nothing was changed: put the "
                "checkpoints back to continue the run, or pass --overwrite instead to start it again (its outputs "
                "are deleted)")

    def holds_run(self) -> bool:
        """Whether the folder holds (part of) a run: a config, metrics, a checkpoint or a completion marker."""
        return any(any(self.path.glob(p)) for p in _RUN_MARKERS) if self.path.is_dir() else False

    def remove_outputs(self) -> None:
        """Delete the run's outputs (the completion marker first, so a half-removed run is never "complete")."""
        found = [p for pattern in OUTPUT_PATTERNS for p in sorted(self.path.glob(pattern))]
        for p in dict.fromkeys([self.path / COMPLETE, *found]):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()

    def write_config(self, config: Mapping[str, Any]) -> Path:
        """Write ``config.json`` with ``"provenance"``; a resumed run appends its own to ``"resumed"``."""
        prov = provenance()
        data = {k: v for k, v in config.items() if k not in ("provenance", "resumed")}
        path = self.path / CONFIG
        if path.exists():
            old = read_json(path)
            if isinstance(old, dict) and "provenance" in old:
                data["provenance"] = old["provenance"]
                data["resumed"] = list(old.get("resumed", [])) + [prov]
        data.setdefault("provenance", prov)
        return atomic_write_json(path, data, indent=2)

    def read_config(self) -> dict[str, Any]:
        """``config.json`` without its provenance keys (``provenance``, ``resumed``)."""
        data = read_json(self.path / CONFIG)
        if not isinstance(data, dict):
            raise CorruptFileError(self.path / CONFIG, "is not a JSON object")
        return {k: v for k, v in data.items() if k not in ("provenance", "resumed")}

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    def read_metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` ([] when absent); a damaged line is a :class:`CorruptFileError`."""
        if not self.metrics_path.exists():
            return []
        return [r for _, r in _parse_rows(self.metrics_path, self.metrics_path.read_bytes())]

    def check_metrics(self, *, position: MetricsPosition | Mapping[str, Any] | None = None,
                      after_update: int | None = None) -> MetricsPosition:
        """The position :meth:`open_metrics` will cut ``metrics.jsonl`` back to (unchanged); CorruptFileError."""
        if position is not None and after_update is not None:
            raise ValueError("give the checkpoint's metrics position or after_update, not both")
        path = self.metrics_path
        if path.is_symlink():  # read from inside the folder only (and appended to in place)
            raise RunDirError(_link_error(path))
        data = path.read_bytes() if path.exists() else b""
        if position is not None:
            pos = position if isinstance(position, MetricsPosition) else MetricsPosition.from_dict(position)
            if len(data) < pos.bytes:
                raise CorruptFileError(path, f"holds {len(data)} bytes but the checkpoint recorded {pos.bytes} "
                                             f"({pos.rows} rows up to update {pos.update}): it was cut short")
            if sha256_bytes(data[: pos.bytes]) != pos.sha256:
                raise CorruptFileError(path, f"its first {pos.bytes} bytes ({pos.rows} rows up to update {pos.update}) "
                                             "do not match the checksum the checkpoint recorded: the file was changed "
                                             "or damaged")
            return pos
        rows = _parse_rows(path, data) if data else []
        # the rows up to the first one the checkpoint does not cover
        kept = list(itertools.takewhile(lambda er: after_update is None or er[1]["update"] <= after_update, rows))
        keep = kept[-1][0] if kept else 0
        last = kept[-1][1] if kept else {"update": 0, "env_steps": 0}
        return MetricsPosition(len(kept), keep, sha256_bytes(data[:keep]), int(last["update"]), int(last["env_steps"]))

    def open_metrics(self, *, position: MetricsPosition | Mapping[str, Any] | None = None,
                     after_update: int | None = None, tensorboard: bool | None = None,
                     wandb: bool | Mapping[str, Any] = False) -> MetricsWriter:
        """Open ``metrics.jsonl`` for appending, after cutting the rows the checkpoint's ``position`` (its prefix
        must match, else :class:`CorruptFileError`) or, without one, ``after_update`` does not cover.
        ``tensorboard``: write ``tb/`` (None: when installed); ``wandb``: True (or ``wandb.init`` arguments): also
        log to W&B, resuming the run id in ``wandb/run_id``."""
        start = self.check_metrics(position=position, after_update=after_update)
        path = self.metrics_path
        if not path.exists() or path.stat().st_size > start.bytes:
            fd = _open_no_follow(path, os.O_WRONLY | os.O_CREAT)  # create / cut in place (the kept prefix is unchanged)
            try:
                os.ftruncate(fd, start.bytes)
                os.fsync(fd)
            finally:
                os.close(fd)
        if tensorboard is None:
            tensorboard = importlib.util.find_spec("tensorboard") is not None
        wandb_run = None
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError:
                raise RunDirError("wandb=True needs the wandb package (pip install 'oir-gym[wandb]')") from None
            id_file = self.path / WANDB / "run_id"
            if not id_file.exists():  # W&B's id format (its helper moved between versions)
                atomic_write_bytes(id_file, "".join(secrets.choice(string.ascii_lowercase + string.digits)
                                                    for _ in range(8)).encode())
            wandb_run = wandb_module.init(**{
                "config": self.read_config() if (self.path / CONFIG).exists() else {}, "dir": str(self.path),
                "name": self.path.name, "id": id_file.read_text().strip(), "resume": "allow",
                **(wandb if isinstance(wandb, Mapping) else {})})
        return MetricsWriter(path, start=start, tb_dir=self.path / TENSORBOARD if tensorboard else None,
                             tb_purge_step=start.env_steps + 1 if start.rows > 0 else None, wandb_run=wandb_run)

    def write_csv(self, path: str | os.PathLike | None = None) -> Path:
        """Write ``metrics.csv`` (atomically) from ``metrics.jsonl``: one column per key of any row."""
        rows = self.read_metrics()
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("update", "env_steps"), k))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
        return atomic_write_bytes(path or self.path / METRICS_CSV, buf.getvalue().encode("utf-8"))

    def eval_path(self, tag: str, ext: str = "json") -> Path:
        """``eval_<tag>.<ext>``."""
        return self.path / f"eval_{check_tag(tag)}.{ext}"

    def write_eval(self, tag: str, results: Any, markdown: str | None = None) -> Path:
        """Write ``eval_<tag>.json`` (``results``, JSON-able) and, when given, ``eval_<tag>.md`` (atomically)."""
        path = atomic_write_json(self.eval_path(tag), results)
        if markdown is not None:
            atomic_write_bytes(self.eval_path(tag, "md"), markdown.encode("utf-8"))
        return path

    def read_eval(self, tag: str) -> Any:
        """The results of ``eval_<tag>.json``."""
        return read_json(self.eval_path(tag))

    def mark_complete(self, **info: Any) -> Path:
        """Write ``complete.json`` (``info`` plus the time). Call it only after every final output is written."""
        return atomic_write_json(self.path / COMPLETE, {**info, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                        time.gmtime())})

    def completion(self) -> dict[str, Any] | None:
        """The contents of ``complete.json`` (None while the run is not complete; a damaged one: CorruptFileError)."""
        path = self.path / COMPLETE
        return read_json(path) if path.exists() else None

    def clear_complete(self) -> None:
        """Remove the completion marker (before a run continues past it)."""
        (self.path / COMPLETE).unlink(missing_ok=True)

