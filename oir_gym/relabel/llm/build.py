"""What the relabeler and the goal proposer call: :func:`build_llm` (an LLM object from a name,
spec or object; native backends in a child process) and :func:`probe` (the start-up check)."""

from __future__ import annotations

import importlib.util
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, LLMBackend
from oir_gym.relabel.llm.caller import OffThreadCaller
from oir_gym.relabel.llm.child import ChildConfig, ChildProcessBackend
from oir_gym.relabel.llm.spec import IN_PROCESS_BACKENDS, BackendSpec, LLMCheckError, with_remedy


def check_spec(spec: BackendSpec) -> None:
    """Reject a wrong backend name or an unimportable ``module:Class`` module here, at once
    (:class:`ValueError` naming the known backends)."""
    from oir_gym.relabel.backends import BACKEND_NAMES as names

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
        backend: ``"rules"`` (``None``), a backend name, ``"module:Class"``, a :class:`BackendSpec`,
            or a backend object (returned as is).
        backend_kwargs: constructor arguments of a named backend.
        isolate: run the backend in a child process (default: every backend but ``openai``).
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
        isolate = spec.name not in (*IN_PROCESS_BACKENDS, "rules")
    if isolate:  # started on first use (or by a check): constructing a relabeler starts no process
        return ChildProcessBackend(spec, config=config, start=False)
    try:
        return spec.build()
    except BackendError as e:  # e.g. a server that cannot be asked for its model: reported by the
        return UnavailableBackend(spec.name, str(e))  # start-up check and at every call, never a crash


class UnavailableBackend:
    """Stands for a backend whose construction failed with a :class:`BackendError`: every call raises it."""

    def __init__(self, name: str, error: str) -> None:
        self.name, self.error = name, error

    def __repr__(self) -> str:
        return f"UnavailableBackend({self.name!r}: {self.error})"

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        raise BackendError(self.error)


#: Longest wait (seconds) of the start-up check (:func:`probe`) on a backend in this process (the
#: relabeler's ``llm_timeout`` instead when one is set), and on one in a child process (its start,
#: model load and one call).
CHECK_TIMEOUT = 60.0
CHILD_CHECK_TIMEOUT = 900.0

#: The start-up check's prompt: short, with the one-instruction answer schema.
PROBE_PROMPT = ('A player in a Minecraft-like game chopped a tree. Answer in JSON with one short instruction '
                'that describes what it did, e.g. {"Mid-Level": ["collect wood"], "High-Level": []}.')


def probe(llm: Any, timeout: Optional[float] = None) -> str:
    """One tiny real call through ``llm``: its completion within ``timeout`` seconds (default
    :data:`CHILD_CHECK_TIMEOUT` for a :class:`ChildProcessBackend`, else :data:`CHECK_TIMEOUT`), or
    :class:`LLMCheckError` with the cause and the remedy (a call past ``timeout`` is abandoned)."""
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
        raise LLMCheckError(f"the LLM backend {name} failed its start-up check: {with_remedy(text)}") from None
    finally:
        caller.close(0)
