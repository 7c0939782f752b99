"""One LLM call at a time on a background thread, the caller waiting at most a timeout."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Optional

from oir_gym.relabel.backends.base import BackendTimeout
from oir_gym.relabel.llm.spec import LLMBusy


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
            with contextlib.suppress(Exception):  # the call's own error or the timeout
                fut.result(timeout=wait)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return not self.busy
