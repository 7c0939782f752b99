"""LLM backends behind one small protocol (:class:`~oir_gym.relabel.backends.base.LLMBackend`).

* :class:`TransformersBackend`: in-process Hugging Face transformers, the offline default (the
  packaged Gemma 3 270M GGUF on any CPU, or any local model on CPU / GPU; ``oir-gym[llm]``).
* :class:`LlamaCppBackend`: in-process llama.cpp (optional, faster on CPU, ``oir-gym[llamacpp]``).
* :class:`OpenAIBackend`: any OpenAI-compatible server (``vllm serve``, ``llama_cpp.server``,
  hosted APIs), on the ``openai`` package's ``AsyncOpenAI`` (``oir-gym[llm]``).
* :class:`VLLMBackend`: in-process ``vllm.LLM`` (optional dependency, GPU).

Concrete backends import their heavy libraries only when constructed.
"""

from __future__ import annotations

from typing import Any, Optional

from oir_gym.relabel.backends.base import (
    BackendError, BackendTimeout, LLMBackend, default_max_tokens, schema_shape,
)
from oir_gym.relabel.backends.llama_cpp import LlamaCppBackend
from oir_gym.relabel.models import default_gguf_path
from oir_gym.relabel.backends.openai import DEFAULT_BASE_URL, OpenAIBackend
from oir_gym.relabel.backends.transformers import TransformersBackend
from oir_gym.relabel.backends.vllm import VLLM_INSTALL_HINT, VLLMBackend

#: backend names :func:`make_backend` knows (``"transformers"`` is the offline default)
BACKEND_NAMES = ("transformers", "llama_cpp", "openai", "vllm", "rules")


def backend_kwargs(name: str, model: str = "", base_url: str = "") -> dict[str, Any]:
    """Constructor arguments of backend ``name`` from the common model / server settings (for
    ``openai``, an empty ``model`` asks the server, an empty or default ``base_url`` yields to
    ``OPENAI_BASE_URL``; ``llama_cpp`` and ``transformers`` use the packaged Gemma when empty)."""
    if name == "openai":
        kw: dict[str, Any] = {"model": model or None}
        if base_url and base_url.rstrip("/") != DEFAULT_BASE_URL:
            kw["base_url"] = base_url
        return kw
    if name in ("vllm", "transformers"):
        return {"model": model} if model else {}
    return {"model_path": model} if model else {}


def make_backend(name: str, **kwargs: Any) -> Optional[LLMBackend]:
    """Build an LLM backend by name (:data:`BACKEND_NAMES`; ``"rules"`` -> None)."""
    classes = {"transformers": TransformersBackend, "llama_cpp": LlamaCppBackend, "openai": OpenAIBackend,
               "vllm": VLLMBackend}
    if name in classes:
        return classes[name](**kwargs)
    if name == "rules":
        return None
    raise ValueError(f"unknown backend {name!r}: use one of {', '.join(map(repr, BACKEND_NAMES))} "
                     "or a backend object")


__all__ = [
    "BACKEND_NAMES", "BackendError", "BackendTimeout", "LLMBackend", "LlamaCppBackend", "OpenAIBackend",
    "TransformersBackend", "VLLMBackend", "VLLM_INSTALL_HINT", "backend_kwargs", "default_gguf_path",
    "default_max_tokens", "make_backend", "schema_shape",
]
