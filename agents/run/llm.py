"""What an :class:`~agents.run.config.LLMConfig` becomes, for both trainers: :func:`backend_kwargs` and the
start-up check :func:`check_llm` (one tiny real call before training).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Any, Iterator, Optional

from agents.run.config import LLMConfig
from oir_gym.relabel.llm.spec import LLMCheckError

# (wall-clock deadline, the option that set it) of the start-up checks made inside check_deadline()
_DEADLINE: contextvars.ContextVar[Optional[tuple[float, str]]] = contextvars.ContextVar("oir_llm_check_deadline",
                                                                                         default=None)


@contextlib.contextmanager
def check_deadline(deadline: Optional[float], why: str = "") -> Iterator[None]:
    """Bound every :func:`check_llm` inside the block by ``deadline`` (a ``time.time()``; None: no bound); ``why``
    names the option in the message of a check it cut short."""
    token = _DEADLINE.set(None if deadline is None else (float(deadline), why))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def backend_kwargs(llm: LLMConfig) -> dict[str, Any]:
    """Constructor arguments of ``llm.backend`` from ``llm.model`` and ``llm.base_url``."""
    from oir_gym.relabel.backends import backend_kwargs as of_backend

    return of_backend(llm.backend, llm.model, llm.base_url)


def check_llm(component: Any, required: bool, flag: str) -> None:
    """One tiny real LLM call of ``component`` (has ``check_llm()`` and ``close()``). On failure: ``required``
    (``FLAG llm``) closes it and raises :class:`LLMCheckError` naming ``flag``; otherwise (``both``) a warning."""
    bound = _DEADLINE.get()
    try:
        if bound is None:
            component.check_llm()
        else:
            from oir_gym.relabel.llm.build import CHILD_CHECK_TIMEOUT

            component.check_llm(round(min(max(bound[0] - time.time(), 1.0), CHILD_CHECK_TIMEOUT), 1))
    except LLMCheckError as e:
        if bound is not None and time.time() >= bound[0] - 0.5:
            e = LLMCheckError(f"{e} (the check was cut short by {bound[1]})")
        if required:
            component.close()
            raise LLMCheckError(f"{flag} llm: {e} (or train without the LLM: {flag} rules)") from None
        print(f"oir-gym: WARNING: {flag} both: {e}; relabeling with rules, the LLM is retried with backoff",
              file=sys.stderr, flush=True)
