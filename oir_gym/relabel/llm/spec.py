"""What an LLM backend is to the runtime: its picklable recipe (:class:`BackendSpec`), the
runtime's errors, and the causes of a failure with their remedies."""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
from dataclasses import dataclass, field
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, BackendTimeout, LLMBackend


#: Backends that do no native work in the caller's process (HTTP clients): no child needed.
IN_PROCESS_BACKENDS = ("openai",)

#: The portable llama-cpp-python rebuild (no AVX-512/AMX code paths), for the SIGILL/SIGSEGV remedy.
PORTABLE_LLAMA_CPP = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    "pip install --no-cache-dir --force-reinstall llama-cpp-python"
)

#: Errors of a backend's constructor that another attempt cannot fix: the child is not restarted.
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


@dataclass(frozen=True)
class BackendSpec:
    """A picklable recipe for an LLM backend, built where it is used (e.g. in a child process):
    ``name`` (a :func:`~oir_gym.relabel.make_backend` name or ``"package.module:ClassName"``) and the
    constructor's ``kwargs``."""

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
    """``(cause key, one-line message with the remedy)`` for a child's exit code (negative: a signal)."""
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
        return ("the LLM is too slow for its deadline: raise the timeout (--llm.call-timeout), send fewer prompts "
                "per update (--llm.per-update) or use a faster backend or a smaller model")
    if "unknown backend" in e or "cannot import" in e:
        return "use one of the backend names listed above, or 'package.module:ClassName'"
    if "failed to load" in e or "not a gguf" in e or "invalid model" in e:
        return ("the model file is broken or in a format the backend cannot read: point --llm.model at a good "
                "model file, or leave it empty for the packaged default model")
    if "not found" in e or "no such file" in e:
        return "fix the model path (--llm.model), or leave it empty for the packaged default model"
    if "pip install" in e:
        return ""  # install hints of the backends
    return "see the error above; --oir.relabeler rules trains without an LLM"


def with_remedy(error: str) -> str:
    """``error`` on one line (server answers may hold HTML), with its remedy."""
    error = " ".join(error.split())
    error = error[:600] + "..." if len(error) > 600 else error
    fix = remedy_for(error)
    return f"{error}. Fix: {fix}" if fix else error


def close_llm(llm: Any) -> None:
    """Free a backend (its ``close`` if it has one; errors ignored: this runs at shutdown)."""
    close = getattr(llm, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()

