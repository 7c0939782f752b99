"""Running an LLM backend off the training thread: crash isolation, deadlines, health.

One module shared by the :class:`~oir_gym.relabel.HindsightRelabeler` and the ELLM
:class:`~agents.ellm_proposer.GoalProposer`:

* :class:`BackendSpec`: a picklable recipe for a backend (a :func:`~oir_gym.relabel.make_backend`
  name, or ``"package.module:ClassName"`` for any class with the backend protocol, plus kwargs).
* :class:`ChildProcessBackend`: builds the backend from its spec in a child process (``spawn``)
  and forwards ``generate`` / ``count_tokens`` over a pipe. A native fault of the LLM library
  (illegal instruction, segfault, out-of-memory kill) or a hang (a call past its deadline) ends
  only the child: the call raises :class:`~oir_gym.relabel.BackendError` (the relabeler then
  answers with rules), the cause is named with its remedy, and the child is started again with
  bounded exponential backoff (calls before the backoff has elapsed fail at once).
* :func:`build_llm`: what the relabeler and the proposer call: every in-process native backend
  (``llama_cpp``, ``transformers``, ``vllm``, custom classes) runs in such a child unless
  ``isolate=False``; the ``openai`` backend (HTTP, no native code) runs in the caller's process.
* :class:`OffThreadCaller`: one call at a time on a background thread, the caller waiting at most
  a timeout (the proposer's late answers still fill its cache).
* :class:`LLMHealth`: counts consecutive failed LLM calls and prints ONE console warning with
  the cause and the remedy when they pass a threshold (again only after a recovery).
* :func:`probe`: one tiny real call, for a clear error before training starts.

Nothing here runs at import time; the first child started registers an exit hook that stops
every live child within its grace period.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as _wait_any
from typing import Any, Callable, Optional

from oir_gym.relabel.backends.base import BackendError, BackendTimeout, LLMBackend

#: Backends that do no native work in the caller's process (HTTP clients): no child needed.
IN_PROCESS_BACKENDS = ("openai",)

#: The portable llama-cpp-python rebuild (no AVX-512/AMX code paths), for the SIGILL/SIGSEGV remedy.
PORTABLE_LLAMA_CPP = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    "pip install --no-cache-dir --force-reinstall llama-cpp-python"
)

#: Errors of a backend's constructor that another attempt cannot fix (a wrong name, argument or
#: path, a missing package): the child is not restarted after them.
PERMANENT_INIT_ERRORS = (
    "ImportError", "ModuleNotFoundError", "FileNotFoundError", "NotADirectoryError", "IsADirectoryError",
    "PermissionError", "ValueError", "TypeError", "AttributeError",
)


class LLMUnavailable(BackendError):
    """The LLM child is down (crashed, hung or could not start) and not restarted yet."""


class LLMProcessDied(BackendError):
    """The LLM child process ended during a call (signal or exit code in the message)."""


class LLMBusy(BackendTimeout):
    """An earlier call that exceeded its timeout is still running; this one was not started."""


class LLMCheckError(RuntimeError):
    """The LLM failed its start-up check (:func:`probe`); the message says what to fix."""


# --------------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class BackendSpec:
    """A picklable recipe for an LLM backend, built where it is used (e.g. in a child process).

    Attributes:
        name: a :func:`~oir_gym.relabel.make_backend` name (``"llama_cpp"``, ``"openai"``...) or
            ``"package.module:ClassName"`` for any importable class with the backend protocol.
        kwargs: constructor arguments.
    """

    name: str
    kwargs: dict = field(default_factory=dict)

    def build(self) -> Optional[LLMBackend]:
        """Construct the backend here (``None`` for ``"rules"``)."""
        if ":" in self.name:
            module, _, qualname = self.name.partition(":")
            try:
                obj: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    obj = getattr(obj, part)
            except (ImportError, AttributeError) as e:
                raise ValueError(f"backend spec {self.name!r}: cannot import {qualname!r} from {module!r} "
                                 f"({type(e).__name__}: {e})") from e
            return obj(**self.kwargs)
        from oir_gym.relabel.backends import make_backend

        return make_backend(self.name, **self.kwargs)

    @property
    def label(self) -> str:
        """Short name for messages and cache keys: the backend name and its model file or id."""
        model = self.kwargs.get("model_path") or self.kwargs.get("model") or ""
        return f"{self.name}:{os.path.basename(str(model))}" if model else self.name


def backend_identity(llm: Any) -> str:
    """A stable id of an LLM backend for cache keys (``"none"`` without one)."""
    if llm is None:
        return "none"
    ident = getattr(llm, "identity", None)
    if isinstance(ident, str) and ident:
        return ident
    from oir_gym.relabel.backends.llama_cpp import LlamaCppBackend

    if isinstance(llm, LlamaCppBackend):
        return "llama_cpp:" + os.path.basename(llm.model_path)
    return f"{type(llm).__name__}:{getattr(llm, 'model', '')}"


# --------------------------------------------------------------------------------------------- causes
_SIGNAL_CAUSES = {
    "SIGILL": ("illegal instruction: the native LLM library was built for another CPU (e.g. with AVX-512/AMX "
               "code this CPU lacks)",
               f"rebuild llama-cpp-python portably: {PORTABLE_LLAMA_CPP}; or use the transformers backend"),
    "SIGSEGV": ("segmentation fault in the native LLM library (a natively built llama-cpp-python does this on "
                "some AVX-512/AMX CPUs)",
                f"rebuild llama-cpp-python portably: {PORTABLE_LLAMA_CPP}; or use the transformers backend"),
    "SIGBUS": ("bus error in the native LLM library (a truncated or changed model file?)",
               "check the model file, or use another backend"),
    "SIGABRT": ("aborted by the native LLM library (a failed internal check; see its message above)",
                "see the library's message above; try another model or backend"),
    "SIGFPE": ("arithmetic fault in the native LLM library", "use another build or backend"),
    "SIGKILL": ("killed from outside, most often by the kernel's out-of-memory killer",
                "free memory, use a smaller model or fewer threads, or run the LLM as a server (backend openai)"),
    "SIGTERM": ("terminated from outside", "see what stopped it (a job scheduler, an admin)"),
}


def describe_exit(exitcode: Optional[int]) -> tuple[str, str]:
    """``(cause key, one-line message with the remedy)`` for a child's exit code.

    Negative codes are signals (``-4``: SIGILL, ``-9``: SIGKILL, ``-11``: SIGSEGV...).
    """
    if exitcode is None:
        return "unknown", "the LLM process ended for an unknown reason"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        what, fix = _SIGNAL_CAUSES.get(name, ("killed by a signal", "see the system log"))
        return name, f"LLM process died: {name} ({what}). Fix: {fix}"
    return f"exit {exitcode}", (f"LLM process exited with code {exitcode} (see its message above). "
                                "Fix: see the error printed above by the LLM process")


def remedy_for(error: str) -> str:
    """A short remedy for an LLM error message (``""`` when the message already carries one)."""
    e = error.lower()
    if "fix:" in e:
        return ""
    if "unusableanswer" in e or "nothing usable" in e:
        return ("the model's answers held no usable instruction: use a larger or instruction-tuned model, "
                "a backend with constrained JSON output, or check the prompt template")
    if "cannot connect" in e or "connection refused" in e or "name or service not known" in e:
        return "start the LLM server, or fix the URL (--llm.base-url, e.g. http://127.0.0.1:8000/v1)"
    if "http 401" in e or "http 403" in e:
        return "set the server's API key in OPENAI_API_KEY"
    if "http 404" in e:
        return ("the server does not know this path or model: the base URL must end in /v1 and --llm.model "
                "must be a model the server lists at /v1/models")
    if "http 5" in e or "unexpected answer" in e or "http 400" in e or "http 405" in e:
        return ("the URL does not answer like an OpenAI-compatible LLM server (POST <base_url>/chat/completions): "
                "check --llm.base-url and the server's log")
    if "timeout" in e or "timed out" in e or "deadline" in e:
        return ("the LLM is too slow for its deadline: raise the timeout, send fewer prompts per update "
                "(--llm-per-update) or use a faster backend or a smaller model")
    if "unknown backend" in e or "cannot import" in e:
        return "use one of the backend names listed above, or 'package.module:ClassName'"
    if "failed to load" in e or "not a gguf" in e or "invalid model" in e:
        return ("the model file is broken or in a format the backend cannot read: point --llm.model at a good "
                "model file, or leave it empty for the packaged default model")
    if "not found" in e or "no such file" in e:
        return "fix the model path (--llm.model), or leave it empty for the packaged default model"
    if "pip install" in e:
        return ""  # install hints of the backends
    return "see the error above; --relabeler rules trains without an LLM"


def _with_remedy(error: str) -> str:
    """``error`` on one line (server answers may hold HTML), with its remedy."""
    error = " ".join(error.split())
    if len(error) > 600:
        error = error[:600] + "..."
    fix = remedy_for(error)
    return f"{error}. Fix: {fix}" if fix else error


# --------------------------------------------------------------------------------------------- child side
def _portable_exc(e: BaseException) -> BaseException:
    """The exception itself when the parent can unpickle it without importing the backend's
    library (builtins and our own errors), else a :class:`BackendError` with its type and text."""
    mod = type(e).__module__
    if mod == "builtins" or mod.startswith("oir_gym."):
        try:
            import pickle

            pickle.loads(pickle.dumps(e))
            return e
        except Exception:  # noqa: BLE001 - fall through to a plain error
            pass
    return BackendError(f"{type(e).__name__}: {e}")


def _child_entry(fd: int) -> None:
    """Entry point of the LLM child (``python -c``): read the spec, build the backend, then answer
    requests until told to stop or the parent is gone."""
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
        try:
            conn.send(("init_error", type(e).__name__, str(e)))
        except OSError:  # the parent is gone
            pass
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


# The child's first lines. The packages ``oir_gym`` and ``oir_gym.relabel`` are registered without
# running their __init__ (which imports JAX and the env: ~2 s and ~220 MB per start); their
# submodules import as usual, and the first access to a package attribute runs the real __init__.
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
from oir_gym.relabel.worker import _child_entry
_child_entry({fd})
"""


# --------------------------------------------------------------------------------------------- parent side
@dataclass
class ChildConfig:
    """Deadlines and restart policy of a :class:`ChildProcessBackend`.

    Attributes:
        timeout: seconds a call may take before the child counts as hung and is killed
            (``generate`` gets ``timeout + per_prompt_timeout * prompts * n``).
        per_prompt_timeout: extra seconds per completion asked for.
        start_timeout: seconds the child may take to import its library and load the model.
        backoff: seconds before the first restart after a failure; doubled after each failure in
            a row, up to ``max_backoff``; reset by a successful call.
        max_backoff: longest wait between restarts.
        grace: seconds shutdown waits for the child after asking it to stop (then terminate,
            then kill, each with the same grace).
    """

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
    """An LLM backend that lives in a child process (implements the ``LLMBackend`` protocol).

    Args:
        spec: what to build in the child (a :class:`BackendSpec`, or a name / ``"module:Class"``).
        kwargs: constructor arguments when ``spec`` is a string.
        config: deadlines and restart policy (:class:`ChildConfig`).
        start: start the child now (the model loads while the caller does other work); else on
            the first call.

    Calls are serialised (one in flight). Every failure raises a :class:`BackendError`:
    :class:`LLMProcessDied` (the child died; the message names the signal and the remedy),
    :class:`~oir_gym.relabel.BackendTimeout` (past the deadline; the child was killed),
    :class:`LLMUnavailable` (down, restarting later), or the backend's own error (the child lives on).
    :meth:`stats` counts ``restarts``, ``child_deaths`` by cause and ``seconds_without_llm``.
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
            try:
                with self._lock:
                    self._ensure_started()
            except BackendError:
                pass
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
        # A fresh interpreter, as multiprocessing's "spawn" start method gives, but started directly:
        # "spawn" would import the caller's __main__ again in the child, which re-runs a script
        # without an ``if __name__ == "__main__"`` guard. The child gets this process's sys.path.
        parent_sock, child_sock = socket.socketpair()
        fd = child_sock.fileno()
        code = _CHILD_BOOT.format(path=list(sys.path), fd=fd)
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(fd,), stdin=subprocess.DEVNULL)
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
            self._fail(f"init:{etype}", _with_remedy(error), kill=True)
            if etype in PERMANENT_INIT_ERRORS:  # another start would fail the same way
                self._fatal = self._last_error
            raise BackendError(self._last_error)
        self._fail("protocol", f"LLM process sent {msg[0]!r} while starting", kill=True)
        raise BackendError(self._last_error)

    def _receive(self, limit: float, what: str) -> tuple:
        """The child's next message within ``limit`` seconds; on death or a passed deadline:
        record the failure, stop the child and raise."""
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
                self._fail(cause, _with_remedy(msg), kill=True)
                raise BackendTimeout(self._last_error)
            # the socket reports EOF when the child dies; the poll also catches a child whose own
            # children (vLLM workers) still hold the socket open
            if _wait_any([conn], timeout=min(left, 0.5)):
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    pass  # the child closed its end: it is dying; its exit code tells why
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
        try:
            proc.wait(self.config.grace)
        except subprocess.TimeoutExpired:
            pass
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
            try:
                stop()
            except (OSError, ValueError):
                pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            conn.close()
        except OSError:
            pass

    def close(self) -> None:
        """Stop the child: never waits longer than about three times ``config.grace`` (an idle child
        is asked to stop, then terminated, then killed; one inside a call is terminated at once,
        then killed). Idempotent."""
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
        """``restarts`` (starts after the first), ``child_deaths`` (by cause: a signal name, ``hang``,
        ``exit N``, ``init:<error>``...), ``seconds_without_llm`` (from a failure to the next
        answer, summed), ``down`` (no working child right now), ``calls``, ``failures``, ``last_error``."""
        now = time.monotonic()
        down = self._down_total + (now - self._down_since if self._down_since is not None else 0.0)
        return {
            "restarts": max(0, self._starts - 1), "child_deaths": dict(self._deaths),
            "seconds_without_llm": down, "down": self._down_since is not None or bool(self._fatal),
            "calls": self._calls, "failures": self._failures, "last_error": self._last_error,
        }


# --------------------------------------------------------------------------------------------- factory
def needs_isolation(name: str) -> bool:
    """Whether backend ``name`` does native work in process (everything but HTTP clients)."""
    return name not in IN_PROCESS_BACKENDS and name != "rules"


def check_spec(spec: BackendSpec) -> None:
    """Reject a wrong backend name or an unimportable ``module:Class`` module in this process, at
    once (the class itself, its arguments and its model are checked where it is built).

    Raises:
        ValueError: naming the known backends.
    """
    from oir_gym.relabel import backends

    # the factory's own list; the names below only until it exports one
    names = tuple(getattr(backends, "BACKEND_NAMES", ("llama_cpp", "openai", "vllm", "transformers", "rules")))
    if ":" in spec.name:
        module = spec.name.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ValueError(f"backend spec {spec.name!r}: no module {module!r} on sys.path")
    elif spec.name not in names:
        raise ValueError(f"unknown backend {spec.name!r}: use one of {', '.join(map(repr, names))} "
                         "or 'package.module:ClassName'")


def build_llm(backend: Any, backend_kwargs: Optional[dict] = None, *, isolate: Optional[bool] = None,
              config: Optional[ChildConfig] = None) -> Optional[LLMBackend]:
    """The LLM object the relabeler / proposer talks to.

    Args:
        backend: ``"rules"`` (no LLM: ``None``), a backend name or ``"module:Class"`` spec, a
            :class:`BackendSpec`, or a backend object (returned as is).
        backend_kwargs: constructor arguments of a named backend.
        isolate: run the backend in a child process (default: yes for every backend but
            ``openai``; ``False`` builds it in this process, for debugging).
        config: the child's deadlines and restart policy.
    """
    if isinstance(backend, str):
        if backend == "rules":
            return None
        spec = BackendSpec(backend, dict(backend_kwargs or {}))
    elif isinstance(backend, BackendSpec):
        spec = backend
    else:
        return backend
    check_spec(spec)
    if isolate is None:
        isolate = needs_isolation(spec.name)
    if isolate:  # started on first use (or by a check): constructing a relabeler starts no process
        return ChildProcessBackend(spec, config=config, start=False)
    try:
        return spec.build()
    except BackendError as e:  # e.g. a server that cannot be asked for its model: reported by the
        return UnavailableBackend(spec.name, str(e))  # start-up check and at every call, never a crash


class UnavailableBackend:
    """Stands for a backend whose construction failed with a :class:`BackendError` (an unreachable
    server, say): every call raises that error, so the check before training reports it and a
    ``both`` run falls back to rules, as for any failing LLM."""

    def __init__(self, name: str, error: str) -> None:
        self.name, self.error = name, error

    def __repr__(self) -> str:
        return f"UnavailableBackend({self.name!r}: {self.error})"

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        raise BackendError(self.error)


def close_llm(llm: Any) -> None:
    """Free a backend (its ``close`` if it has one; errors ignored: this runs at shutdown)."""
    close = getattr(llm, "close", None)
    if callable(close):
        try:
            close()
        except Exception:  # noqa: BLE001 - best effort
            pass


#: Longest wait (seconds) of the start-up check (:func:`probe`) on a backend in this process (an
#: HTTP server): one tiny call. :meth:`~oir_gym.relabel.HindsightRelabeler.check_llm` waits the
#: relabeler's ``llm_timeout`` instead when one is set.
CHECK_TIMEOUT = 60.0
#: Longest wait (seconds) of the start-up check on a backend in a child process: starting the
#: child, loading its model (``ChildConfig.start_timeout``) and one call.
CHILD_CHECK_TIMEOUT = 900.0

#: The start-up check's prompt: short, with the one-instruction answer schema.
PROBE_PROMPT = ('A player in a Minecraft-like game chopped a tree. Answer in JSON with one short instruction '
                'that describes what it did, e.g. {"Mid-Level": ["collect wood"], "High-Level": []}.')


def probe(llm: Any, timeout: Optional[float] = None) -> str:
    """One tiny real call through ``llm`` (a child starts and loads its model first).

    Returns the completion within ``timeout`` seconds (default :data:`CHILD_CHECK_TIMEOUT` for a
    :class:`ChildProcessBackend`, else :data:`CHECK_TIMEOUT`); raises :class:`LLMCheckError` with
    the cause and the remedy when the backend cannot be built, dies, hangs, passes ``timeout``,
    cannot be reached or answers in a wrong shape. A call past ``timeout`` is abandoned on its
    thread (a backend's own deadline or its ``close`` ends it).
    """
    from oir_gym.relabel.prompts import output_schema

    if timeout is None:
        timeout = CHILD_CHECK_TIMEOUT if isinstance(llm, ChildProcessBackend) else CHECK_TIMEOUT

    name = llm.spec.label if isinstance(llm, ChildProcessBackend) else type(llm).__name__
    caller = OffThreadCaller("oir-llm-probe")
    try:
        out = caller.call(llm.generate, [PROBE_PROMPT], 1, schema=output_schema(1), timeout=timeout)
        if not (isinstance(out, list) and len(out) == 1 and isinstance(out[0], list) and out[0]
                and all(isinstance(s, str) for s in out[0])):
            raise BackendError(f"unexpected answer shape {out!r:.200}")
        return out[0][0]
    except Exception as e:  # noqa: BLE001 - any failure becomes one clear line
        text = str(e) if isinstance(e, BackendError) else f"{type(e).__name__}: {e}"
        raise LLMCheckError(f"the LLM backend {name} failed its start-up check: {_with_remedy(text)}") from None
    finally:
        caller.close(0)


# --------------------------------------------------------------------------------------------- threads
class OffThreadCaller:
    """Runs one call at a time on a daemon thread; the caller waits at most a timeout.

    A call that outlives its timeout keeps running (its side effects, such as filling a cache,
    still happen); until it ends, new calls fail at once with :class:`LLMBusy`.
    """

    def __init__(self, name: str = "oir-llm") -> None:
        self.name = name
        self._pool: Optional[ThreadPoolExecutor] = None
        self._inflight: Optional[Future] = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """Whether a call is still running."""
        f = self._inflight
        return f is not None and not f.done()

    @property
    def inflight(self) -> Optional[Future]:
        """The future of the last call started (``None`` before any)."""
        return self._inflight

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Start ``fn`` on the thread; raises :class:`LLMBusy` while the previous call runs."""
        with self._lock:
            if self.busy:
                raise LLMBusy("the previous LLM call is still running (it exceeded its timeout)")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
            self._inflight = self._pool.submit(fn, *args, **kwargs)
            return self._inflight

    def call(self, fn: Callable[..., Any], *args: Any, timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``'s result, or :class:`BackendTimeout` after ``timeout`` seconds."""
        fut = self.submit(fn, *args, **kwargs)
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            raise BackendTimeout(f"LLM call exceeded its timeout of {timeout}s") from None

    def close(self, wait: float = 0.0) -> bool:
        """Wait up to ``wait`` s for a running call, then let the thread go; True if none runs."""
        fut = self._inflight
        if fut is not None and not fut.done() and wait > 0:
            try:
                fut.result(timeout=wait)
            except Exception:  # noqa: BLE001 - the call's own error or the timeout
                pass
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return not self.busy


# --------------------------------------------------------------------------------------------- health
def _stderr_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class LLMHealth:
    """Consecutive LLM failures, and ONE console warning per outage.

    Args:
        who: what uses the LLM (``"relabeler"``, ``"ELLM proposer"``), for the message.
        warn_after: consecutive failed calls before the warning (a permanent failure warns at once).
        fallback: what happens meanwhile, for the message.
        report: where the warning goes (default: one line on stderr).
    """

    def __init__(self, who: str, warn_after: int = 3, fallback: str = "continuing with rules",
                 report: Optional[Callable[[str], None]] = None) -> None:
        self.who, self.warn_after, self.fallback = who, max(1, int(warn_after)), fallback
        self._report = report or _stderr_line
        self._lock = threading.Lock()
        self.failures = 0
        self.consecutive = 0
        self.outages = 0
        self.warnings = 0
        self._warned = False
        self._down_since: Optional[float] = None
        self._down_total = 0.0
        self.last_cause: Optional[str] = None
        self._recent: deque = deque(maxlen=64)
        self._quality: deque = deque(maxlen=self.warn_after)  # (asked, unusable) of the last calls
        self._quality_warned = False
        self._quality_cause: Optional[str] = None

    def ok(self) -> None:
        """A call gave a usable answer."""
        with self._lock:
            if self._warned:
                down = time.monotonic() - (self._down_since or time.monotonic())
                self._report(f"oir-gym: {self.who}: the LLM answers again (after {self.consecutive} failed calls, "
                             f"{down:.0f}s without it)")
            self._close_outage()
            self.consecutive = 0
            self._warned = False
            self._recent.append(True)

    def failed(self, cause: str, *, permanent: bool = False) -> None:
        """A call failed (error, deadline, or nothing usable); warns once per outage."""
        with self._lock:
            self.failures += 1
            self.consecutive += 1
            self.last_cause = cause
            self._recent.append(False)
            if self._down_since is None:
                self._down_since = time.monotonic()
                self.outages += 1
            if not self._warned and (permanent or self.consecutive >= self.warn_after):
                self._warned = True
                self.warnings += 1
                self._report(f"oir-gym: WARNING: {self.who}: the LLM failed {self.consecutive} call(s) in a row; "
                             f"{self.fallback}. Cause: {_with_remedy(cause)}")

    def answers(self, asked: int, unusable: int, cause: Optional[str] = None) -> None:
        """One call's answer quality: ``unusable`` of its ``asked`` prompts gave nothing usable.

        A call with some good answers counts as :meth:`ok`, so a model that fails most prompts would
        never trip the outage warning: when more than half the prompts of the last ``warn_after``
        calls were unusable (and some call did answer), ONE console line says so with a typical
        ``cause`` (again only after the share has recovered).
        """
        if asked <= 0:
            return
        with self._lock:
            self._quality.append((int(asked), int(unusable)))
            if cause:
                self._quality_cause = cause
            if len(self._quality) < self._quality.maxlen:
                return
            n_asked = sum(a for a, _ in self._quality)
            n_bad = sum(u for _, u in self._quality)
            if 2 * n_bad <= n_asked:
                self._quality_warned = False
            elif all(u >= a for a, u in self._quality):
                return  # no call answered at all: an outage, which failed() reports
            elif not self._quality_warned:
                self._quality_warned = True
                self.warnings += 1
                self._report(f"oir-gym: WARNING: {self.who}: {n_bad} of {n_asked} LLM answers in the last "
                             f"{len(self._quality)} calls were unusable; {self.fallback} for those. A typical "
                             f"cause: {self._quality_cause}")

    def _close_outage(self) -> None:
        if self._down_since is not None:
            self._down_total += time.monotonic() - self._down_since
            self._down_since = None

    @property
    def down(self) -> bool:
        """Whether the last call failed."""
        return self._down_since is not None

    def down_seconds(self) -> float:
        """Seconds from a failed call to the next good one, summed (the current outage included)."""
        with self._lock:
            cur = time.monotonic() - self._down_since if self._down_since is not None else 0.0
            return self._down_total + cur

    def stats(self) -> dict[str, Any]:
        """``failures``, ``consecutive_failures``, ``outages``, ``warnings``, ``down``, ``down_seconds``."""
        return {"failures": self.failures, "consecutive_failures": self.consecutive, "outages": self.outages,
                "warnings": self.warnings, "down": self.down, "down_seconds": self.down_seconds(),
                "last_cause": self.last_cause}


def llm_process_stats(llm: Any) -> dict[str, Any]:
    """The child's counters when ``llm`` is a :class:`ChildProcessBackend`, else zeros."""
    if isinstance(llm, ChildProcessBackend):
        return llm.stats()
    return {"restarts": 0, "child_deaths": {}, "seconds_without_llm": 0.0}
