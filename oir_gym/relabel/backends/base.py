"""The LLM backend protocol, its errors and the shared generation limits.

Protocol (:class:`LLMBackend`): ``generate(prompts, n=1, *, schema=None) -> list[list[str]]``:
a batch of prompts in, ``n`` raw completions per prompt out (parsing is the caller's job, see
:mod:`oir_gym.relabel.parse`). ``schema`` is the JSON schema of the expected answer; backends
use it for constrained decoding where they can.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

from oir_gym.validation import ArgumentTypeError, show

class BackendError(RuntimeError):
    """An LLM backend could not produce completions (server down, bad answer, model missing)."""


class BackendTimeout(BackendError):
    """The backend did not answer within its timeout."""


@runtime_checkable
class LLMBackend(Protocol):
    """What the relabeler needs from an LLM: batched prompts in, raw completions out."""

    def generate(
        self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None
    ) -> list[list[str]]:
        """``n`` raw completions for each prompt (``len(result) == len(prompts)``).

        Implementations check ``prompts`` with :func:`check_prompts` first."""
        ...


def check_prompts(prompts: Any) -> list[str]:
    """``prompts`` as a list of strings, for :meth:`LLMBackend.generate`.

    Raises:
        ArgumentTypeError: (a ``TypeError``) a single string (iterating it would send one prompt per
            character), not an iterable, or an item that is not a string.
    """
    if isinstance(prompts, (str, bytes)):
        raise ArgumentTypeError(f"prompts={show(prompts)} must be a list of prompt strings, got one "
                                f"{type(prompts).__name__}: pass [prompt]")
    try:
        items = list(prompts)
    except TypeError:
        raise ArgumentTypeError(f"prompts={show(prompts)} must be a list of prompt strings, "
                                f"got {type(prompts).__name__}") from None
    for i, p in enumerate(items):
        if not isinstance(p, str):
            raise ArgumentTypeError(f"prompts[{i}]={show(p)} must be a string, got {type(p).__name__}")
    return items


def default_max_tokens(k: int, analysis: bool) -> int:
    """Enough tokens for two lists of ``k`` short instructions (plus the paper's analysis)."""
    return 48 + 2 * k * 24 + (64 if analysis else 0)


def schema_shape(schema: Optional[dict]) -> tuple[int, bool]:
    """``(k, analysis)`` of an answer schema made by :func:`~oir_gym.relabel.prompts.output_schema`."""
    if not schema:
        return 4, False
    props = schema.get("properties", {})
    analysis = "Analysis" in props
    lists = props.get("Completed Instructions", {}) if analysis else schema
    k = lists.get("properties", {}).get("Mid-Level", {}).get("maxItems", 4)
    return int(k), analysis


def set_sampling(backend: Any, temperature: float, top_p: float, seed: int, max_tokens: Optional[int],
                 grammar: Optional[str]) -> None:
    """Set the sampling attributes the native backends share."""
    backend.temperature, backend.top_p, backend.seed = float(temperature), float(top_p), int(seed)
    backend.max_tokens, backend.grammar_mode = max_tokens, grammar
