"""The relabeler's thread-safe counters; :meth:`RelabelStats.snapshot` is what
:meth:`~oir_gym.relabel.HindsightRelabeler.stats` returns (keys in :data:`STAT_KEYS`)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any, Iterable, Mapping, Optional

from oir_gym.relabel.parse import NOTE_REASONS

#: Every key of :meth:`RelabelStats.snapshot`, with its meaning.
STAT_KEYS: dict[str, str] = {
    "trajectories": "trajectories relabeled (synchronously, by the worker, or by the overflow rules)",
    "batches": "batches relabeled",
    "calls": "batched LLM calls",
    "prompts": "prompts sent to the LLM",
    "cache_hits": "trajectories answered from the cache",
    "cache_misses": "trajectories whose behaviour was not cached (each gets a prompt)",
    "cache_hit_rate": "(cache hits + batch duplicates) / lookups",
    "cache_entries": "entries in the cache now",
    "batch_dedup": "trajectories that shared a prompt with an earlier one of their batch",
    "skipped_idle": "trajectories not sent to the LLM because nothing but moving/waiting happened",
    "errors": "trajectories whose LLM answer failed (unusable answers included)",
    "errors_by_type": "failed LLM calls by exception type (a dict)",
    "error_examples": "the first message of each error type (a dict)",
    "fallbacks": "trajectories answered by rule instructions because the LLM failed",
    "latency_mean_s": "seconds per LLM call",
    "latency_per_prompt_s": "seconds per prompt",
    "prompt_tokens": "prompt tokens sent in all",
    "prompt_tokens_mean": "prompt tokens per prompt",
    "prompt_token_method": "how prompt tokens were counted: 'llama' (exact) or 'approx-regex'",
    "prompts_compacted": "prompts whose trajectory was compacted to fit the prompt budget",
    "closed_in_flight": "trajectories whose LLM call close() cut short, or still queued when it stopped "
                        "waiting (not errors)",
    "cache_save_failures": "failed writes of the cache file (warned once)",
    "candidates": "candidates scored (after filters, duplicates and the grounding checks)",
    "candidates_llm": "scored candidates from the LLM",
    "candidates_rules": "scored candidates from the rules",
    "candidates_kept": "candidates kept (at most k per trajectory)",
    "candidates_kept_llm": "kept candidates from the LLM: its instructions the relabeler handed on (0 while "
                           "the LLM contributes nothing)",
    "dropped": "candidates dropped, by reason (parser notes such as salvaged_json included; a dict)",
    "dropped_total": "candidates dropped (without the parser's notes)",
    "grounded_fraction": "grounded / scored candidates",
    "kept_grounded_fraction": "grounded / kept candidates",
    "submitted": "trajectories submitted to the background worker",
    "completed": "submitted trajectories with results",
    "pending": "submitted trajectories without results yet",
    "overflow_rules": "trajectories answered by rules because the queue was full",
    "overflow_skipped": "trajectories dropped because the queue was full (on_full='skip')",
    "overflow_replaced": "queued trajectories replaced by newer ones (on_full='replace')",
    "share": "of the last 64 trajectories the LLM was asked about (or answered from the cache), the fraction "
             "that got LLM candidates",
    "failed_calls": "LLM calls with no usable answer for any prompt",
    "consecutive_failures": "failed LLM calls in a row now",
    "llm_down": "1 while the last LLM call failed",
    "down_seconds": "seconds from a failed call to the next good one, summed",
    "llm_warnings": "console warnings of an LLM outage printed",
    "restarts": "restarts of the LLM's child process",
    "child_deaths": "deaths of the LLM's child process by cause (a dict: SIGILL, SIGKILL, hang, init:<error>...)",
}


class RelabelStats:
    """Counters shared by every thread of one relabeler (every method takes the lock)."""

    def __init__(self, share_window: int = 64) -> None:
        self._lock = threading.Lock()
        self._s: Counter = Counter()
        self._dropped: Counter = Counter()
        self._errors: Counter = Counter()
        self._examples: dict[str, str] = {}  # error type -> its first message
        self._latency = 0.0
        self._share: deque = deque(maxlen=share_window)
        self.token_method = "none"

    def add(self, counts: Optional[Mapping[str, int]] = None, **more: int) -> None:
        """Add ``counts`` and ``more`` to the plain counters."""
        with self._lock:
            self._s.update(counts or {})
            self._s.update(more)

    def increment(self, key: str, n: int = 1) -> int:
        """Add ``n`` to ``key`` and return its new value (for once-only warnings)."""
        with self._lock:
            self._s[key] += n
            return self._s[key]

    def count_error(self, err: str) -> None:
        """Count one failed call's error by type and keep the first message of each type."""
        with self._lock:
            self._count_error(err)

    def _count_error(self, err: str) -> None:
        kind = err.split(":", 1)[0]
        self._errors[kind] += 1
        self._examples.setdefault(kind, err[:300])

    def record_batch(self, counts: Counter, *, dropped: Iterable[Counter], errors: Iterable[str],
                     share: Optional[Iterable[bool]], prompts: int, tokens: int, latency: float) -> None:
        """One relabeled batch: its counters, drops, distinct errors, LLM share (``None``: not
        recorded, the relabeler was closing) and, when it sent ``prompts``, one LLM call."""
        with self._lock:
            self._s.update(counts)
            if share is not None:
                self._share.extend(share)
            self._s["batches"] += 1
            if prompts:
                self._s["llm_calls"] += 1
                self._s["prompts"] += prompts
                self._s["prompt_tokens"] += tokens
                self._latency += latency
            for d in dropped:
                self._dropped.update(d)
            for e in errors:
                self._count_error(e)

    def snapshot(self, *, cache_entries: int, pending: int, health: Mapping[str, Any],
                 child: Mapping[str, Any]) -> dict[str, Any]:
        """The flat dict of :data:`STAT_KEYS` (``health``: :meth:`LLMHealth.stats`; ``child``: the
        child process's restarts and deaths)."""
        with self._lock:
            s = dict(self._s)
            dropped = dict(self._dropped)
            errors = dict(self._errors)
            examples = dict(self._examples)
            lat = self._latency
            share = sum(self._share) / len(self._share) if self._share else 0.0
        g = s.get
        calls, scored, kept = g("llm_calls", 0), g("candidates_scored", 0), g("candidates_kept", 0)
        lookups = g("cache_hits", 0) + g("cache_misses", 0) + g("batch_dedup", 0)
        derived = {
            "calls": calls,
            "cache_hit_rate": (g("cache_hits", 0) + g("batch_dedup", 0)) / lookups if lookups else 0.0,
            "cache_entries": cache_entries,
            "errors_by_type": errors,
            "error_examples": examples,
            "latency_mean_s": lat / calls if calls else 0.0,
            "latency_per_prompt_s": lat / s["prompts"] if g("prompts") else 0.0,
            "prompt_tokens_mean": g("prompt_tokens", 0) / s["prompts"] if g("prompts") else 0.0,
            "prompt_token_method": self.token_method,
            "candidates": scored,
            "dropped": dropped,
            "dropped_total": sum(v for k, v in dropped.items() if k not in NOTE_REASONS),
            "grounded_fraction": g("candidates_grounded", 0) / scored if scored else 0.0,
            "kept_grounded_fraction": g("candidates_kept_grounded", 0) / kept if kept else 0.0,
            "pending": pending,
            "overflow_skipped": g("overflow_skip", 0),
            "overflow_replaced": g("overflow_replace", 0),
            "share": share,
            "failed_calls": health["failures"],
            "consecutive_failures": health["consecutive_failures"],
            "llm_down": int(health["down"]),
            "down_seconds": health["down_seconds"],
            "llm_warnings": health["warnings"],
            "restarts": child["restarts"],
            "child_deaths": child["child_deaths"],
        }
        # every other key is a plain counter of the same name
        return {k: derived[k] if k in derived else g(k, 0) for k in STAT_KEYS}
