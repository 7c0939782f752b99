"""LLM backends behind one small protocol (:class:`~oir_gym.relabel.backends.base.LLMBackend`).

* :class:`TransformersBackend`: in-process Hugging Face transformers, the offline default (the
  packaged Gemma 3 270M GGUF on any CPU, or any local model on CPU / GPU; ``oir-gym[llm]``).
* :class:`LlamaCppBackend`: in-process llama.cpp (optional, faster on CPU, ``oir-gym[llamacpp]``).
* :class:`OpenAIBackend`: any OpenAI-compatible server (``vllm serve``, ``llama_cpp.server``,
  hosted APIs), on the ``openai`` package's ``AsyncOpenAI`` (``oir-gym[llm]``).
* :class:`VLLMBackend`: in-process ``vllm.LLM`` (optional dependency, GPU).

Concrete backends import their heavy libraries only when constructed. The rule relabeler lives in
:mod:`oir_gym.relabel.rules`, the LLM+rules composite in :mod:`oir_gym.relabel.composite`.
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
    """Constructor arguments of backend ``name`` from the common model / server settings.

    ``openai`` takes the server's ``base_url`` and ``model``: an empty ``model`` asks the server
    which one it serves; an empty ``base_url``, or the built-in loopback default, yields to
    ``OPENAI_BASE_URL`` when that is set (the OpenAI client's variable). ``vllm`` takes a model
    name or path, ``transformers`` a local model folder, ``.gguf`` file or cached hub id,
    ``llama_cpp`` a GGUF ``model_path`` (both: the packaged Gemma when empty).
    """
    if name == "openai":
        kw: dict[str, Any] = {"model": model or None}
        # The trainers' configs carry the loopback default: treat it as "not given", so that the
        # backend reads OPENAI_BASE_URL (and falls back to that same default).
        if base_url and base_url.rstrip("/") != DEFAULT_BASE_URL:
            kw["base_url"] = base_url
        return kw
    if name in ("vllm", "transformers"):
        return {"model": model} if model else {}
    return {"model_path": model} if model else {}


def make_backend(name: str, **kwargs: Any) -> Optional[LLMBackend]:
    """Build an LLM backend by name (:data:`BACKEND_NAMES`): ``"transformers"``, ``"llama_cpp"``,
    ``"openai"``, ``"vllm"``; ``"rules"`` -> None.

    The arguments are plain picklable values, so ``(name, kwargs)`` can also build the backend in
    another process."""
    if name == "transformers":
        return TransformersBackend(**kwargs)
    if name == "llama_cpp":
        return LlamaCppBackend(**kwargs)
    if name == "openai":
        return OpenAIBackend(**kwargs)
    if name == "vllm":
        return VLLMBackend(**kwargs)
    if name == "rules":
        return None
    raise ValueError(f"unknown backend {name!r}: use one of {', '.join(map(repr, BACKEND_NAMES))} "
                     "or a backend object")


__all__ = [
    "BACKEND_NAMES", "BackendError", "BackendTimeout", "LLMBackend", "LlamaCppBackend", "OpenAIBackend",
    "TransformersBackend", "VLLMBackend", "VLLM_INSTALL_HINT", "backend_kwargs", "default_gguf_path",
    "default_max_tokens", "make_backend", "schema_shape",
]
