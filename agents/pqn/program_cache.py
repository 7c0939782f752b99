"""Compiled programs kept across processes, so that a run's second start skips tracing them.

JAX's persistent compilation cache skips XLA's compile, but its key is the lowered program: every start
still traces and lowers the rollout, update and evaluation (seconds each, one Python thread at a time).
:class:`ProgramCache` stores each compiled executable under a key made of what the program is built
from (its name, the caller's context such as the program config, the arguments' structure, shapes and
static values, the versions of JAX, Craftax and the other array libraries, the device, ``XLA_FLAGS`` and
JAX's numeric settings, and the contents of the ``oir_gym`` and ``agents`` source folders) and loads it on
the next start without tracing.

It lives in ``programs/`` of JAX's cache folder (``oir_gym.enable_compilation_cache``), on GPUs and
TPUs, and is off with it (``OIR_GYM_JAX_CACHE=0``) or alone (``OIR_GYM_PROGRAM_CACHE=0``). Entries are
pickled executables, trusted as JAX's own cache is: keep the folder private. A file that does not load
is compiled again and replaced (the error is logged).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import re
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np

from oir_gym.validation import atomic_file

#: Distributions whose code ends up inside the compiled programs.
_DISTRIBUTIONS = ("jax", "jaxlib", "craftax", "flax", "optax", "chex", "numpy")
#: The folder's size, beyond which the least recently used entries are removed.
MAX_BYTES = 4 << 30
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
#: JAX settings that change what a traced program computes (with ``XLA_FLAGS``, part of every key).
_JAX_FLAGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl", "jax_numpy_dtype_promotion")


@functools.lru_cache(maxsize=None)
def source_digest() -> str:
    """sha256 over the versions of :data:`_DISTRIBUTIONS` and every file of ``oir_gym/`` and ``agents/``."""
    h = hashlib.sha256()
    for name in _DISTRIBUTIONS:
        try:
            h.update(f"{name}={importlib.metadata.version(name)};".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{name}=none;".encode())
    root = Path(__file__).resolve().parents[2]
    for package in ("oir_gym", "agents"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _leaf_signature(x: Any) -> tuple:
    if isinstance(x, (bool, int, float, complex)):
        return (type(x).__name__,)  # a weakly typed scalar
    return (tuple(np.shape(x)), str(x.dtype), bool(getattr(x, "weak_type", False)))


def _statics(tree: Any) -> list[Any]:
    """The functions in ``tree``'s static node data (an optimiser's, say), in traversal order: pickled by
    reference to the arguments, which hold the same objects."""
    found: list[Any] = []

    def walk(treedef: Any) -> None:
        data = treedef.node_data()
        if data is not None:
            for obj in (data[1], *(data[1] if isinstance(data[1], tuple) else ())):
                parts = obj if isinstance(obj, tuple) else (obj,)
                if any(callable(o) and not isinstance(o, type) for o in parts):
                    found.append(obj)
        for child in treedef.children():
            walk(child)

    walk(jax.tree_util.tree_structure(tree))
    return found


class _Pickler(pickle.Pickler):
    """Pickles a program's pytree structures with the arguments' static objects by position."""

    def __init__(self, file: Any, statics: list[Any]) -> None:
        super().__init__(file)
        self.ids = {id(obj): i for i, obj in reversed(list(enumerate(statics)))}

    def persistent_id(self, obj: Any) -> Any:
        return self.ids.get(id(obj))


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: Any, statics: list[Any]) -> None:
        super().__init__(file)
        self.persistent_load = statics.__getitem__


def signature(dynamic: Sequence[Any], static: Sequence[Any] = ()) -> str:
    """The arguments' pytree structure, leaf shapes and dtypes, and the static values, as a string."""
    leaves, treedef = jax.tree_util.tree_flatten(tuple(dynamic))
    # static pytree fields (an optimiser's functions) print their address, which differs per process
    return _ADDRESS.sub("0x", repr((str(treedef), [_leaf_signature(x) for x in leaves], [repr(s) for s in static])))


class ProgramCache:
    """A folder of compiled programs (``None``: nothing is kept) and what it did: ``loaded``/``compiled`` names."""

    def __init__(self, folder: str | os.PathLike | None, context: str = "",
                 log: Callable[[str], None] | None = None) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.context = context
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.loaded: list[str] = []
        self.compiled: list[str] = []

    @classmethod
    def from_jax_config(cls, context: str = "", log: Callable[[str], None] | None = None,
                        devices: int = 1) -> "ProgramCache":
        """The cache in ``programs/`` of JAX's persistent cache folder for programs of one device; inactive where
        that is unset, with ``OIR_GYM_PROGRAM_CACHE=0``, for programs over several ``devices`` or processes, and
        on the CPU (jaxlib 0.10's CPU executables, loaded in a process that compiled others or from JAX's cache,
        can fail: "Function ... not found")."""
        folder = jax.config.jax_compilation_cache_dir
        active = (folder and os.environ.get("OIR_GYM_PROGRAM_CACHE", "1") != "0" and jax.default_backend() != "cpu"
                  and jax.process_count() == 1 and devices == 1)
        return cls(Path(folder) / "programs" if active else None, context, log)

    def key(self, name: str, sig: str) -> str:
        """The entry name of program ``name`` for arguments of signature ``sig`` (see the module docstring)."""
        device = jax.devices()[0]
        flags = [os.environ.get("XLA_FLAGS", ""), *(str(getattr(jax.config, f)) for f in _JAX_FLAGS)]
        parts = [name, self.context, sig, source_digest(), device.platform, device.device_kind,
                 str(len(jax.devices())), device.client.platform_version, *flags]
        return f"{name}-{hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]}"

    def wrap(self, jitted: Any, name: str, static_argnums: Sequence[int] = ()) -> Any:
        """``jitted`` (a ``jax.jit`` function) with its executables kept in this cache under ``name``; ``jitted``
        itself where the cache is inactive."""
        return CachedProgram(jitted, name, self, tuple(static_argnums)) if self.folder is not None else jitted

    def summary(self) -> str:
        """``"N programs loaded from the program cache, M compiled"``, or ``""`` where the cache is inactive."""
        n, m = len(self.loaded), len(self.compiled)
        return f"{n} programs loaded from the program cache, {m} compiled" if self.folder is not None else ""

    def has(self, key: str) -> bool:
        """Whether an entry is stored under ``key``."""
        return self.folder is not None and (self.folder / f"{key}.bin").exists()

    def load(self, key: str, args: Any = ()) -> Any | None:
        """The executable stored under ``key`` for arguments like ``args``, or None (missing, inactive, or not
        loadable: logged)."""
        if not self.has(key):
            return None
        from jax.experimental import serialize_executable

        path = self.folder / f"{key}.bin"
        try:
            payload, in_tree, out_tree = _Unpickler(io.BytesIO(path.read_bytes()), _statics(args)).load()
            compiled = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception as e:  # noqa: BLE001 - a bad entry is compiled again and replaced
            self.log(f"program cache: {path.name} did not load ({e!r}); compiling it again")
            return None
        os.utime(path)  # least recently used goes first
        return compiled

    def store(self, key: str, compiled: Any, args: Any = ()) -> None:
        """Keep ``compiled``, compiled for ``args``, under ``key`` (one that cannot be serialized is not kept)."""
        if self.folder is None:
            return
        from jax.experimental import serialize_executable

        try:
            file = io.BytesIO()
            _Pickler(file, _statics(args)).dump(serialize_executable.serialize(compiled))
            with atomic_file(self.folder / f"{key}.bin", "wb") as f:
                f.write(file.getvalue())
        except Exception as e:  # noqa: BLE001 - the program runs; only its next start is slower
            self.log(f"program cache: {key} was not stored ({e!r})")
            return
        self.prune()

    def prune(self, max_bytes: int = MAX_BYTES) -> None:
        """Remove the least recently used entries until the folder holds at most ``max_bytes``."""
        entries = []
        for path in self.folder.glob("*.bin") if self.folder is not None else ():
            try:  # another process may remove an entry meanwhile
                entries.append((path.stat().st_mtime, path.stat().st_size, path))
            except OSError:
                continue
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size


class CachedProgram:
    """A ``jax.jit`` function whose executable, per argument signature, comes from a :class:`ProgramCache`.

    Called like the function; ``eval_shape`` answers from a known executable without tracing."""

    def __init__(self, jitted: Any, name: str, cache: ProgramCache, static_argnums: tuple[int, ...] = ()) -> None:
        self.jitted, self.name, self.cache, self.static_argnums = jitted, name, cache, static_argnums
        self._executables: dict[str, Any] = {}
        self._traces: dict[str, Future] = {}  # per signature until compiled: eval_shape and compile trace once
        self._lock, self._trace_lock = threading.Lock(), threading.Lock()

    def _split(self, args: tuple) -> tuple[list, list]:
        return [a for i, a in enumerate(args) if i not in self.static_argnums], [args[i] for i in self.static_argnums]

    def executable(self, *args: Any, compile_missing: bool = True, wait: Callable[[], Any] | None = None) -> Any | None:
        """The executable for ``args``: held, loaded or (``compile_missing``) compiled and stored; ``wait`` (a
        compile only) is called between lowering and XLA's compile, to keep that compile off a busier one."""
        dynamic, static = self._split(args)
        sig = signature(dynamic, static)
        if (hit := self._executables.get(sig)) is not None:
            return hit
        with self._lock:
            if (hit := self._executables.get(sig)) is not None:
                return hit
            key = self.cache.key(self.name, sig)
            if (compiled := self.cache.load(key, dynamic)) is not None:
                self.cache.loaded.append(self.name)
            elif not compile_missing:
                return None
            else:
                lowered = self._trace(sig, args).lower()
                if wait is not None:
                    wait()
                compiled = lowered.compile()
                self.cache.compiled.append(self.name)
                self.cache.store(key, compiled, dynamic)
            self._executables[sig] = compiled
            self._traces.pop(sig, None)
            return compiled

    def _trace(self, sig: str, args: tuple) -> Any:
        """``jitted.trace(*args)``, once per signature whichever thread asks first."""
        with self._trace_lock:
            owner = sig not in self._traces
            if owner:
                self._traces[sig] = Future()
        job = self._traces[sig]
        if owner:
            try:
                job.set_result(self.jitted.trace(*args))
            except BaseException as e:
                job.set_exception(e)
                self._traces.pop(sig, None)
        return job.result()

    def __call__(self, *args: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
            return self.jitted(*args)  # inside another trace (``jax.eval_shape``): the function itself
        return self.executable(*args)(*self._split(args)[0])

    def eval_shape(self, *args: Any) -> Any:
        """The outputs' shapes and dtypes, from the executable where one is held or stored, else from the trace
        that its compile uses too."""
        sig = signature(*self._split(args))
        compiled = None
        if sig in self._executables or self.cache.has(self.cache.key(self.name, sig)):
            compiled = self.executable(*args, compile_missing=False)  # waits for a load, never for a compile
        info = self._trace(sig, args).out_info if compiled is None else compiled.out_info
        return jax.tree_util.tree_map(lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype), info)

    def lower(self, *args: Any) -> Any:
        return self.jitted.lower(*args)


def prepare(program: Any, *args: Any, wait: Callable[[], Any] | None = None) -> None:
    """Have ``program`` ready for ``args``: a :class:`CachedProgram` compiles or loads it without running it; a
    plain ``jax.jit`` function runs once (its call is what fills its cache). ``wait``: called before a compile
    (:meth:`CachedProgram.executable`; before the run of a plain function)."""
    if isinstance(program, CachedProgram):
        program.executable(*args, wait=wait)
        return
    if wait is not None:
        wait()
    jax.block_until_ready(program(*args))
