"""Prompt-token counting: one counter for templates, the relabeler and the benchmarks.

Exact where a model tokenizer is at hand (the backend's own ``count_tokens``, or the packaged GGUF's
vocabulary through llama-cpp-python), otherwise an approximation (words and punctuation marks).
"""

from __future__ import annotations

import atexit
import contextlib
import re
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Optional


class TokenCount(NamedTuple):
    """A prompt length and how it was measured (``"llama"``: exact model tokenizer;
    ``"approx-regex"``: words and punctuation marks, an approximation of a BPE count)."""

    n: int
    method: str


_APPROX_RE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def approx_token_count(text: str) -> int:
    """Approximate token count: words and punctuation marks (BPE tokenizers land within ~30%)."""
    return len(_APPROX_RE.findall(text))


@lru_cache(maxsize=4)
def llama_tokenizer(model_path: Optional[str] = None) -> Optional[Callable[[str], int]]:
    """A token counter using the GGUF model's own tokenizer (vocabulary only), or ``None`` when
    ``llama_cpp`` or the model is not available."""
    try:
        from llama_cpp import Llama

        from oir_gym.relabel.models import default_gguf_path

        path = model_path or default_gguf_path()
        vocab = Llama(model_path=path, vocab_only=True, verbose=False)
    except Exception:  # noqa: BLE001 - optional dependency, fall back to the approximation
        return None
    # free it before interpreter teardown, when llama_cpp's __del__ would hit None globals
    atexit.register(vocab.close)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    return count


def count_tokens(text: str, tokenizer: Callable[[str], int] | str | None = "auto") -> TokenCount:
    """Count prompt tokens with ``tokenizer`` (a callable ``str -> int``: method ``"custom"``;
    ``"auto"``: the default GGUF model's tokenizer when llama-cpp-python is installed, method
    ``"llama"``), else approximately (method ``"approx-regex"``)."""
    tok = llama_tokenizer() if tokenizer == "auto" else None
    if tok is not None:
        return TokenCount(tok(text), "llama")
    if callable(tokenizer):
        return TokenCount(int(tokenizer(text)), "custom")
    return TokenCount(approx_token_count(text), "approx-regex")


def backend_token_count(llm: Any, text: str) -> TokenCount:
    """Prompt length in ``llm``'s own tokens when it can count them (``count_tokens``), else
    :func:`approx_token_count`. ``method`` is the backend's ``token_method`` (default ``"model"``)."""
    counter = getattr(llm, "count_tokens", None)
    if callable(counter):
        with contextlib.suppress(Exception):  # a tokenizer failure must not stop relabeling
            return TokenCount(int(counter(text)), getattr(llm, "token_method", "model"))
    return TokenCount(approx_token_count(text), "approx-regex")
