"""An LLM backend in a child process (:class:`ChildProcessBackend`): a native fault or a hang of the
LLM library ends only the child, which is restarted with bounded backoff."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_any
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, BackendTimeout
from oir_gym.relabel.llm.spec import (
    PERMANENT_INIT_ERRORS, BackendSpec, LLMProcessDied, LLMUnavailable, backend_identity, close_llm, describe_exit,
    with_remedy,
)
from oir_gym.relabel.parallel import WORKER_ENV


# --------------------------------------------------------------------------------------------- child side
def _portable_exc(e: BaseException) -> BaseException:
    """``e`` when the parent can unpickle it without the backend's library, else a :class:`BackendError`."""
    mod = type(e).__module__
    if mod == "builtins" or mod.startswith("oir_gym."):
        with contextlib.suppress(Exception):  # not picklable: a plain error
            pickle.loads(pickle.dumps(e))
            return e
    return BackendError(f"{type(e).__name__}: {e}")


def _child_entry(fd: int) -> None:
    """Entry point of the LLM child (``python -c``): read the spec, then serve until closed or orphaned."""
    # Ctrl+C in a terminal reaches the whole process group; the parent decides when this child ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        spec = conn.recv()
    except (EOFError, OSError):
        return
    _serve(conn, spec)


def _serve(conn: Connection, spec: BackendSpec) -> None:
    try:
        backend = spec.build()
        if backend is None:
            raise ValueError(f"backend {spec.name!r} is not an LLM")
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        with contextlib.suppress(OSError):  # the parent is gone
            conn.send(("init_error", type(e).__name__, str(e)))
        return
    info = {
        "identity": backend_identity(backend),
        "token_method": getattr(backend, "token_method", "model"),
        "count_tokens": callable(getattr(backend, "count_tokens", None)),
        "repr": repr(backend)[:300],
        "pid": os.getpid(),
    }
    try:
        conn.send(("ready", info))
    except OSError:
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if msg[0] == "close":
            break
        op, call_id, args, kwargs = msg
        try:
            if op == "generate":
                out: Any = backend.generate(*args, **kwargs)
                out = [list(r) if isinstance(r, (list, tuple)) else [r] for r in out]
            elif op == "count_tokens":
                out = int(backend.count_tokens(*args))
            else:
                raise ValueError(f"unknown request {op!r}")
            reply: tuple = ("ok", call_id, out)
        except Exception as e:  # noqa: BLE001 - the call fails, the child lives on
            reply = ("err", call_id, _portable_exc(e))
        try:
            conn.send(reply)
        except OSError:  # the parent is gone
            break
    close_llm(backend)


# The child's first lines: ``oir_gym`` and ``oir_gym.relabel`` registered without running their __init__
# (JAX and the env: ~2 s and ~220 MB per start) until a package attribute is first read.
_CHILD_BOOT = """
import importlib.util, sys
sys.path[:] = {path!r}
def _bare(name):
    spec = importlib.util.find_spec(name)
    mod = importlib.util.module_from_spec(spec)
    def __getattr__(attr):
        if mod.__dict__.pop("__getattr__", None) is None:
            raise AttributeError(attr)
        spec.loader.exec_module(mod)
        return getattr(mod, attr)
    mod.__getattr__ = __getattr__
    sys.modules[name] = mod
_bare("oir_gym"); _bare("oir_gym.relabel")
from oir_gym.relabel.llm.child import _child_entry
_child_entry({fd})
"""


# --------------------------------------------------------------------------------------------- parent side
@dataclass
class ChildConfig:
    """Deadlines and restart policy of a :class:`ChildProcessBackend`: a call may take ``timeout`` plus
    ``per_prompt_timeout`` per completion before the child is killed as hung; ``start_timeout`` covers import and
    model load; restarts wait ``backoff``, doubled per failure up to ``max_backoff``; ``grace``: each shutdown step."""

    timeout: float = 120.0
    per_prompt_timeout: float = 30.0
    start_timeout: float = 600.0
    backoff: float = 0.5
    max_backoff: float = 60.0
    grace: float = 5.0


_LIVE: "weakref.WeakSet[ChildProcessBackend]" = weakref.WeakSet()
_EXIT_HOOK = False


def _close_all_at_exit() -> None:
    for b in list(_LIVE):
        b.close()


class ChildProcessBackend:
    """An LLM backend (the ``LLMBackend`` protocol) built in a child process from ``spec`` (a :class:`BackendSpec`,
    or a name / ``"module:Class"`` with constructor ``kwargs``), started now or (``start=False``) at the first call.

    Calls are serialised. Failures raise :class:`LLMProcessDied`, :class:`~oir_gym.relabel.BackendTimeout`,
    :class:`LLMUnavailable` or the backend's own :class:`BackendError`.
    """

    def __init__(self, spec: BackendSpec | str, kwargs: Optional[dict] = None, *,
                 config: Optional[ChildConfig] = None, start: bool = True) -> None:
        self.spec = spec if isinstance(spec, BackendSpec) else BackendSpec(spec, dict(kwargs or {}))
        self.config = config or ChildConfig()
        self._lock = threading.RLock()
        self._proc: Any = None
        self._conn: Any = None
        self._info: dict = {}
        self._identity: Optional[str] = None
        self._ids = itertools.count()
        self._starts = 0
        self._deaths: Counter = Counter()
        self._calls = 0
        self._failures = 0
        self._backoff = self.config.backoff
        self._next_start = 0.0
        self._down_since: Optional[float] = None
        self._down_total = 0.0
        self._last_error: Optional[str] = None
        self._fatal: Optional[str] = None
        self._closed = False
        if start:
            with self._lock:
                self._spawn()

    # ------------------------------------------------------------------ protocol
    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """``n`` completions per prompt, from the backend in the child (see the class doc for errors)."""
        if not prompts:
            return []
        deadline = self.config.timeout + self.config.per_prompt_timeout * len(prompts) * max(1, n)
        out = self._call("generate", (list(prompts), n), {"schema": schema}, deadline)
        if not isinstance(out, list) or len(out) != len(prompts):
            raise BackendError(f"backend returned {len(out) if isinstance(out, list) else out!r} results "
                               f"for {len(prompts)} prompts")
        return out

    def count_tokens(self, text: str) -> int:
        """Prompt length in the backend's own tokens (raises when the backend cannot count)."""
        if self._info and not self._info.get("count_tokens"):
            raise NotImplementedError(f"{self.spec.label} does not count tokens")
        return int(self._call("count_tokens", (text,), {}, self.config.timeout))

    @property
    def token_method(self) -> str:
        """How :meth:`count_tokens` counts (the backend's own ``token_method``)."""
        return str(self._info.get("token_method", "model"))

    @property
    def identity(self) -> str:
        """The backend's id for cache keys, as the child reported it (waits for a starting child;
        the spec's label while it was never up)."""
        if self._identity is None and not self._closed and not self._fatal:
            with contextlib.suppress(BackendError), self._lock:
                self._ensure_started()
        return self._identity or self.spec.label

    @property
    def pid(self) -> Optional[int]:
        """Process id of the live child (``None`` when none runs)."""
        p = self._proc
        return p.pid if p is not None and p.poll() is None else None

    @property
    def fatal(self) -> Optional[str]:
        """Why the child will not be started again (a permanent construction error), else ``None``."""
        return self._fatal

    @property
    def last_error(self) -> Optional[str]:
        """The message of the last failure (``None`` before any)."""
        return self._last_error

    def __repr__(self) -> str:
        return f"ChildProcessBackend({self.spec.name!r}, pid={self.pid})"

    # ------------------------------------------------------------------ lifecycle
    def _spawn(self) -> None:
        global _EXIT_HOOK
        if not _EXIT_HOOK:  # at exit, stop live children (one inside a call would outlive this process)
            atexit.register(_close_all_at_exit)
            _EXIT_HOOK = True
        # a fresh interpreter started directly: multiprocessing's "spawn" would re-run an unguarded __main__
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        code = _CHILD_BOOT.format(path=list(sys.path), fd=fd)
        try:
            # JAX on the CPU (parallel.WORKER_ENV): a CUDA context beside the model's would cost GPU memory
            proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(fd,), stdin=subprocess.DEVNULL,
                                    env={**os.environ, **WORKER_ENV})
        finally:
            child_sock.close()
        conn = Connection(parent_sock.detach())
        conn.send(self.spec)
        self._proc, self._conn, self._info = proc, conn, {}
        self._starts += 1
        _LIVE.add(self)

    def _ensure_started(self) -> None:
        if self._closed:
            raise LLMUnavailable("the LLM process was closed")
        if self._fatal:
            raise LLMUnavailable(self._fatal)
        if self._proc is None:
            wait = self._next_start - time.monotonic()
            if wait > 0:
                raise LLMUnavailable(f"LLM down ({self._last_error}); restarting in {wait:.1f}s")
            self._spawn()
        if self._info:
            return
        msg = self._receive(self.config.start_timeout, "start")
        if msg[0] == "ready":
            self._info = msg[1]
            self._identity = self._info.get("identity") or self._identity
            return
        if msg[0] == "init_error":
            _, etype, text = msg
            error = f"could not build the LLM backend {self.spec.label!r}: {etype}: {text}"
            self._fail(f"init:{etype}", with_remedy(error), kill=True)
            if etype in PERMANENT_INIT_ERRORS:  # another start would fail the same way
                self._fatal = self._last_error
            raise BackendError(self._last_error)
        self._fail("protocol", f"LLM process sent {msg[0]!r} while starting", kill=True)
        raise BackendError(self._last_error)

    def _receive(self, limit: float, what: str) -> tuple:
        """The child's next message within ``limit`` seconds; on death or a passed deadline: record, stop, raise."""
        proc, conn = self._proc, self._conn
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if what == "start":
                    cause, msg = "start_timeout", f"LLM process did not finish starting within its {limit:.0f}s timeout"
                else:
                    cause, msg = "hang", (f"LLM call ({what}) passed its {limit:.0f}s deadline (hung or too slow); "
                                          "the LLM process was killed")
                self._fail(cause, with_remedy(msg), kill=True)
                raise BackendTimeout(self._last_error)
            # EOF says the child died; the poll catches one whose children (vLLM workers) hold the socket open
            if _wait_any([conn], timeout=min(left, 0.5)):
                with contextlib.suppress(EOFError, OSError):  # the child closed its end: its exit code tells why
                    return conn.recv()
            elif proc.poll() is None:
                continue
            self._died(proc)

    def _call(self, op: str, args: tuple, kwargs: dict, timeout: float) -> Any:
        with self._lock:
            self._ensure_started()
            call_id = next(self._ids)
            try:
                self._conn.send((op, call_id, args, kwargs))
            except (OSError, ValueError):
                self._died(self._proc)
            self._calls += 1
            msg = self._receive(timeout, op)  # calls are serialised: the next message answers this one
            if msg[0] not in ("ok", "err") or msg[1] != call_id:
                self._fail("protocol", f"LLM process answered {msg[:2]!r} to call {call_id}", kill=True)
                raise BackendError(self._last_error)
            if msg[0] == "err":  # the backend's own error: the child is fine
                self._last_error = f"{type(msg[2]).__name__}: {msg[2]}"
                self._failures += 1
                raise msg[2]
            self._recovered()
            return msg[2]

    def _died(self, proc: subprocess.Popen) -> None:
        """Record the child's death (its exit code names the cause) and raise."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(self.config.grace)
        if self._closed:
            self._reap()
            raise LLMUnavailable("the LLM process was closed")
        cause, msg = describe_exit(proc.returncode)
        self._fail(cause, msg, kill=True)
        raise LLMProcessDied(msg)

    def _fail(self, cause: str, message: str, *, kill: bool) -> None:
        now = time.monotonic()
        self._deaths[cause] += 1
        self._failures += 1
        self._last_error = message
        if self._down_since is None:
            self._down_since = now
        self._next_start = now + self._backoff
        self._backoff = min(self.config.max_backoff, self._backoff * 2)
        if kill:
            self._reap()

    def _recovered(self) -> None:
        self._backoff = self.config.backoff
        if self._down_since is not None:
            self._down_total += time.monotonic() - self._down_since
            self._down_since = None

    def _reap(self, ask_first: bool = False) -> None:
        """Stop the child (asked to close, then terminate, then kill; each waits ``grace``)."""
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._info = None, None, {}
        if proc is None:
            return
        grace = self.config.grace
        steps = ([lambda: conn.send(("close",))] if ask_first else []) + [proc.terminate, proc.kill]
        for stop in steps:
            if proc.poll() is not None:
                break
            with contextlib.suppress(OSError, ValueError):
                stop()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(OSError):
            conn.close()

    def close(self) -> None:
        """Stop the child within about three times ``config.grace`` (ask, terminate, kill). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._reap(ask_first=True)
            finally:
                self._lock.release()
        else:  # a call is in flight and the child would not read "close" before it ends: stop it
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.terminate()  # the call then raises "closed"
                try:
                    proc.wait(self.config.grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
        _LIVE.discard(self)

    def __enter__(self) -> "ChildProcessBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ stats
    def stats(self) -> dict[str, Any]:
        """``restarts``, ``child_deaths`` by cause, ``seconds_without_llm``, ``down``, ``calls``, ``failures``,
        ``last_error``."""
        now = time.monotonic()
        down = self._down_total + (now - self._down_since if self._down_since is not None else 0.0)
        return {
            "restarts": max(0, self._starts - 1), "child_deaths": dict(self._deaths),
            "seconds_without_llm": down, "down": self._down_since is not None or bool(self._fatal),
            "calls": self._calls, "failures": self._failures, "last_error": self._last_error,
        }


def llm_process_stats(llm: Any) -> dict[str, Any]:
    """The child's counters when ``llm`` is a :class:`ChildProcessBackend`, else zeros."""
    if isinstance(llm, ChildProcessBackend):
        return llm.stats()
    return {"restarts": 0, "child_deaths": {}, "seconds_without_llm": 0.0}
