"""Chat completions from any OpenAI-compatible server (standard library HTTP only)."""

from __future__ import annotations

import json
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, BackendTimeout, default_max_tokens, schema_shape

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
