"""LLM health: consecutive failed calls, and ONE console warning with the cause and the remedy."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter, deque
from typing import Any, Callable, Optional

from oir_gym.relabel.llm.spec import with_remedy


def _stderr_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class LLMHealth:
    """Consecutive LLM failures, and ONE warning (to ``report``, default stderr) per outage, after
    ``warn_after`` failed calls in a row (a permanent failure warns at once). ``who`` (what uses the
    LLM) and ``fallback`` (what happens meanwhile) go into the message."""

    def __init__(self, who: str, warn_after: int = 3, fallback: str = "continuing with rules",
                 report: Optional[Callable[[str], None]] = None) -> None:
        self.who, self.warn_after, self.fallback = who, max(1, int(warn_after)), fallback
        self._report = report or _stderr_line
        self._lock = threading.Lock()
        self.failures = self.consecutive = self.outages = self.warnings = 0
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
            if self._down_since is not None:
                self._down_total += time.monotonic() - self._down_since
                self._down_since = None
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
                             f"{self.fallback}. Cause: {with_remedy(cause)}")

    def answers(self, asked: int, unusable: int, cause: Optional[str] = None) -> None:
        """One call's answer quality: ``unusable`` of its ``asked`` prompts gave nothing usable. When
        more than half the prompts of the last ``warn_after`` calls were unusable (and some call
        answered), ONE warning says so with a typical ``cause`` (again only after a recovery)."""
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

    def call(self, errors: list[Optional[str]], *, permanent: bool = False) -> None:
        """One LLM call's outcome, ``errors`` holding one entry per prompt asked (``None``: usable):
        :meth:`ok` when any prompt got a usable answer, else :meth:`failed` with the first error;
        then :meth:`answers` with the most common error."""
        if not errors:
            return
        bad = [e for e in errors if e is not None]
        if len(bad) < len(errors):
            self.ok()
        else:
            self.failed(bad[0], permanent=permanent)
        self.answers(len(errors), len(bad), Counter(bad).most_common(1)[0][0] if bad else None)

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
