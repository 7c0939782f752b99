"""Running an LLM backend off the training thread: crash isolation, deadlines, health.

One module shared by the :class:`~oir_gym.relabel.HindsightRelabeler` and the ELLM
:class:`~agents.pqn.ellm_proposer.GoalProposer`:

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

The implementation lives in :mod:`oir_gym.relabel.llm`, one module per concern: ``spec`` (the
backend recipe, the runtime's errors, failure causes and remedies), ``child`` (the child process),
``caller`` (the off-thread caller), ``health`` (outage warnings) and ``build`` (``build_llm`` and
the start-up ``probe``). This module gathers their public names in one place.
"""

from __future__ import annotations

from oir_gym.relabel.llm.spec import (  # noqa: F401
    IN_PROCESS_BACKENDS, PORTABLE_LLAMA_CPP, PERMANENT_INIT_ERRORS, LLMUnavailable, LLMProcessDied, LLMBusy,
    LLMCheckError, BackendSpec, backend_identity, describe_exit, remedy_for, with_remedy, close_llm,
)
from oir_gym.relabel.llm.child import (  # noqa: F401
    ChildConfig, ChildProcessBackend, llm_process_stats,
)
from oir_gym.relabel.llm.build import (  # noqa: F401
    needs_isolation, check_spec, build_llm, UnavailableBackend, CHECK_TIMEOUT, CHILD_CHECK_TIMEOUT,
    PROBE_PROMPT, probe,
)
from oir_gym.relabel.llm.caller import (  # noqa: F401
    OffThreadCaller,
)
from oir_gym.relabel.llm.health import (  # noqa: F401
    LLMHealth,
)

__all__ = [
    "BackendSpec",
    "CHECK_TIMEOUT",
    "CHILD_CHECK_TIMEOUT",
    "ChildConfig",
    "ChildProcessBackend",
    "IN_PROCESS_BACKENDS",
    "LLMBusy",
    "LLMCheckError",
    "LLMHealth",
    "LLMProcessDied",
    "LLMUnavailable",
    "OffThreadCaller",
    "PERMANENT_INIT_ERRORS",
    "PORTABLE_LLAMA_CPP",
    "PROBE_PROMPT",
    "UnavailableBackend",
    "backend_identity",
    "build_llm",
    "check_spec",
    "close_llm",
    "describe_exit",
    "llm_process_stats",
    "needs_isolation",
    "probe",
    "remedy_for",
    "with_remedy",
]
