"""Chat completions from any OpenAI-compatible server, on the ``openai`` package's ``AsyncOpenAI``.

A hostile server cannot hurt the run: a total deadline per request, answers capped and uncompressed,
no redirects, malformed answers a counted :class:`BackendError`; the API key is never shown.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import logging
import math
import os
import random
import ssl
import threading
import time
import urllib.parse
import urllib.request
import weakref
from datetime import datetime, timezone
from typing import Any, Coroutine, Optional, Sequence

from oir_gym.relabel.backends.base import (
    BackendError, BackendTimeout, check_prompts, default_max_tokens, schema_shape,
)
from oir_gym.validation import check_bool, check_choice, check_instance, check_int, check_real, check_str

log = logging.getLogger(__name__)

#: Where the backend connects when neither ``base_url`` nor ``OPENAI_BASE_URL`` is given.
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
#: Largest answer read from the server (bytes).
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Installing the client library.
OPENAI_INSTALL_HINT = "OpenAIBackend needs the 'openai' package: pip install 'oir-gym[llm]' (or pip install openai)"

_RF_MODES = ("json_schema", "json_object", "none")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_FAILURE_KINDS = ("timeouts", "connection_errors", "http_errors", "redirects", "unusable")
_CLOSED = "closed (backend.close() was called)"


def _rejects_format(status: int, payload: bytes) -> bool:
    """True when an error answer says the response format is what the server cannot do (only then step down)."""
    if status < 400:
        return False
    text = payload[:4000].decode("utf-8", errors="replace").lower()
    if any(w in text for w in ("response_format", "response format", "json_schema", "json_object")):
        return True
    return ("not supported" in text or "unsupported" in text) and ("format" in text or "schema" in text)


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date)."""
    value = (value or "").strip()
    try:
        secs = float(value) if value else math.nan
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        secs = (when.replace(tzinfo=when.tzinfo or timezone.utc) - datetime.now(timezone.utc)).total_seconds()
    return max(0.0, secs) if math.isfinite(secs) else None


class _Secret:
    """An explicitly given API key; shows as ``<hidden>``."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"

    __str__ = __repr__


class _Failure(Exception):
    """One attempt's failure: ``kind`` is a key of :meth:`OpenAIBackend.stats`."""

    def __init__(self, kind: str, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.kind, self.message, self.retry = kind, message, retry


def _safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part."""
    p = urllib.parse.urlsplit(url)
    if p.username is None and p.password is None:
        return url
    host = p.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if p.port:
        netloc += f":{p.port}"
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()
# A forked child inherits the loop object but not the thread running it.
os.register_at_fork(after_in_child=lambda: globals().update(_loop=None, _loop_lock=threading.Lock()))


def _event_loop() -> asyncio.AbstractEventLoop:
    """This process's loop for HTTP calls, on a daemon thread (never the caller's loop)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="oir-openai", daemon=True).start()
        return _loop


class _MaskKeys(logging.Filter):
    """Masks live backends' keys in the HTTP libraries' log records (one filter on each of their loggers)."""

    backends: "weakref.WeakSet[OpenAIBackend]" = weakref.WeakSet()

    def filter(self, record: logging.LogRecord) -> bool:
        text = masked = record.getMessage()
        for backend in list(self.backends):
            masked = backend._redact(masked)
        if masked != text:
            record.msg, record.args = masked, None
        return True

    def install(self) -> None:
        for name, logger in list(logging.root.manager.loggerDict.items()):
            if name.split(".")[0] in ("openai", "httpx2", "httpcore2") and isinstance(logger, logging.Logger):
                if self not in logger.filters:
                    logger.addFilter(self)


_MASK = _MaskKeys()


def _capped_transport(inner: Any, cap: int) -> Any:
    """``inner`` (an ``httpx2`` transport) whose answers fail past ``cap`` bytes."""
    import httpx2

    class Capped(httpx2.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        async def __aiter__(self):
            total = 0
            async for chunk in self.stream:
                total += len(chunk)
                if total > cap:
                    raise _Failure("unusable", f"sent an answer over max_response_bytes={cap:,}")
                yield chunk

        async def aclose(self) -> None:
            await self.stream.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            resp = await inner.handle_async_request(request)
            encoding = resp.headers.get("Content-Encoding", "").strip().lower()
            length = resp.headers.get("Content-Length", "").strip()
            if encoding not in ("", "identity"):  # asked for none: a small compressed body can inflate past the cap
                await resp.aclose()
                raise _Failure("unusable", f"sent a {encoding[:40]!r}-encoded answer though asked for none")
            if length.isdigit() and int(length) > cap:
                await resp.aclose()
                raise _Failure("unusable", f"announced an answer of {int(length):,} bytes, over "
                                           f"max_response_bytes={cap:,}")
            return httpx2.Response(resp.status_code, headers=resp.headers, stream=Capped(resp.stream),
                                   extensions=resp.extensions)

        async def aclose(self) -> None:
            await inner.aclose()

    return Transport()


class OpenAIBackend:
    """Chat completions from any OpenAI-compatible server, with ``openai.AsyncOpenAI``.

    Args:
        base_url: server root including ``/v1`` (default: ``OPENAI_BASE_URL``, else :data:`DEFAULT_BASE_URL`).
        model: model name; empty or ``None``: the one model the server lists (else :class:`BackendError` here).
        api_key: the API key; default: the environment variable ``api_key_env`` (``None``: no key), read per request.
        timeout: seconds per HTTP request, total; a call ends within ``timeout * (max_retries + 1)``.
        max_retries: retries after a connection error, a short read, HTTP 429 or 5xx (backoff
            ``backoff * 2**i`` with jitter, or ``Retry-After``); timeouts only with ``retry_on_timeout``.
        concurrency: requests of one :meth:`generate` call in flight at once.
        response_format: ``"auto"`` steps down ``json_schema`` -> ``json_object`` -> ``none`` when the
            server says a format is unsupported; or one of those three.
        extra_body, max_response_bytes: extra JSON fields for every request; largest answer accepted.

    Raises ``TypeError`` / ``ValueError`` for a bad argument, ``ImportError`` without the ``openai`` package,
    :class:`BackendError` when ``model`` is empty and the server does not serve exactly one.
    """

    def __init__(
        self, base_url: Optional[str] = None, model: Optional[str] = None, *, api_key: Optional[str] = None,
        api_key_env: Optional[str] = "OPENAI_API_KEY", timeout: float = 60.0, max_retries: int = 2,
        backoff: float = 0.5, retry_on_timeout: bool = False, concurrency: int = 4, temperature: float = 0.7,
        max_tokens: Optional[int] = None, seed: Optional[int] = 0, response_format: str = "auto",
        extra_body: Optional[dict] = None, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        check_choice("response_format", response_format, ("auto", *_RF_MODES))
        check_str("base_url", base_url, none_ok=True, non_empty=False)
        check_str("model", model, none_ok=True, non_empty=False)
        check_str("api_key", api_key, none_ok=True, non_empty=False)
        check_str("api_key_env", api_key_env, none_ok=True)
        self.timeout = check_real("timeout", timeout, low=0, low_open=True, hint=" (seconds per request)")
        self.max_retries = check_int("max_retries", max_retries, minimum=0)
        self.backoff = check_real("backoff", backoff, low=0)
        self.retry_on_timeout = check_bool("retry_on_timeout", retry_on_timeout)
        self.concurrency = check_int("concurrency", concurrency, minimum=1)
        self.temperature = check_real("temperature", temperature, low=0)
        self.max_tokens = check_int("max_tokens", max_tokens, minimum=1, none_ok=True)
        self.seed = check_int("seed", seed, none_ok=True)
        self.max_response_bytes = check_int("max_response_bytes", max_response_bytes, minimum=1)
        self.extra_body = dict(check_instance("extra_body", extra_body, dict, none_ok=True) or {})
        try:
            import openai  # noqa: F401 - fail here, with the remedy, not at the first call
        except ImportError as e:
            raise ImportError(f"{OPENAI_INSTALL_HINT} ({e})") from None

        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL such as {DEFAULT_BASE_URL}, "
                             f"got {_safe_url(base_url)!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self._api_key = _Secret(api_key) if api_key else None
        self._rf_fixed = response_format != "auto"
        self._rf_mode = response_format if response_format != "auto" else "json_schema"
        # Proxies from the environment, as urllib does; loopback servers never go through one.
        host = parts.hostname
        bypass = host in _LOOPBACK or urllib.request.proxy_bypass(host)
        self._proxy = None if bypass else urllib.request.getproxies().get(parts.scheme)
        self._client: Any = None  # built on the event loop's thread, at the first request
        self._client_pid = 0

        self._lock = threading.Lock()
        self._inflight: set[concurrent.futures.Future] = set()
        self._closed = threading.Event()
        self._counts: dict[str, int] = dict.fromkeys(
            ("calls", "ok", "failures", *_FAILURE_KINDS, "requests", "retries", "format_step_downs"), 0)

        self.model = model or self._served_model()

    def __repr__(self) -> str:  # never shows the key, only where it comes from
        key = "api_key=<hidden>" if self._api_key else f"api_key_env={self.api_key_env!r}"
        return (f"OpenAIBackend(base_url={_safe_url(self.base_url)!r}, model={self.model!r}, {key}, "
                f"timeout={self.timeout}, response_format={self._rf_mode!r})")

    @property
    def response_format_mode(self) -> str:
        """The response format currently used (after any automatic step-down)."""
        return self._rf_mode

    def stats(self) -> dict[str, int]:
        """Counters since construction: ``calls``, ``ok``, ``failures`` (also by cause: ``timeouts``,
        ``connection_errors``, ``http_errors``, ``redirects``, ``unusable``), ``requests``, ``retries``,
        ``format_step_downs``."""
        with self._lock:
            return dict(self._counts)

    def list_models(self) -> list[str]:
        """The model ids the server serves (``GET {base_url}/models``). Raises :class:`BackendError`."""
        url = f"{_safe_url(self.base_url)}/models"
        try:
            status, data = self._run(self._request("GET", "/models", None, time.monotonic() + self.timeout))
        except _Failure as f:
            raise self._error(f, f"cannot ask {url} which model the server serves:") from None
        if status != 200:
            raise BackendError(self._redact(
                f"{url} answered HTTP {status} ({self._snippet(data)}): is {_safe_url(self.base_url)} an "
                "OpenAI-compatible LLM server (the URL usually ends in /v1)?"))
        try:
            ids = [e["id"] for e in json.loads(data)["data"]]
            if not all(isinstance(i, str) for i in ids):
                raise TypeError("model ids are not strings")
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            raise BackendError(self._redact(
                f"{url} sent no model list ({self._snippet(data)}): {_safe_url(self.base_url)} does not look "
                "like an OpenAI-compatible LLM server; check the URL (it usually ends in /v1)")) from None
        return ids

    def generate(self, prompts: Sequence[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """One request per (prompt, sample), ``concurrency`` at a time; the first failure raises :class:`BackendError`."""
        prompts = check_prompts(prompts)
        n = check_int("n", n, minimum=1)
        if self._closed.is_set():
            raise BackendError(f"OpenAIBackend for {_safe_url(self.base_url)} is closed")
        return self._run(self._generate(prompts, n, schema))

    def close(self) -> None:
        """Cancel requests in flight (their calls raise :class:`BackendError`); later calls raise. Idempotent."""
        self._closed.set()
        with self._lock:
            calls = list(self._inflight)
        for fut in calls:
            fut.cancel()  # cancels its task on the loop
        client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            asyncio.run_coroutine_threadsafe(client.close(), _event_loop())

    def _run(self, coro: Coroutine) -> Any:
        fut = asyncio.run_coroutine_threadsafe(coro, _event_loop())
        with self._lock:
            self._inflight.add(fut)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise BackendError(f"OpenAI-compatible server at {_safe_url(self.base_url)}: {_CLOSED}") from None
        finally:
            with self._lock:
                self._inflight.discard(fut)

    async def _generate(self, prompts: list[str], n: int, schema: Optional[dict]) -> list[list[str]]:
        jobs = iter([(i, j) for i in range(len(prompts)) for j in range(n)])
        out: list[list[str]] = [[""] * n for _ in prompts]
        errors: list[BaseException] = []

        async def work() -> None:
            for i, j in jobs:  # one shared iterator: each job is taken once
                if errors:
                    return
                try:
                    out[i][j] = await self._one(prompts[i], j, schema)
                except BackendError as e:
                    errors.append(e)
                    return

        await asyncio.gather(*(work() for _ in range(min(self.concurrency, len(prompts) * n))))
        if errors:
            raise errors[0]
        return out

    async def _one(self, prompt: str, sample: int, schema: Optional[dict]) -> str:
        deadline = time.monotonic() + self.timeout * (self.max_retries + 1)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.temperature,
            "max_tokens": int(self.max_tokens or default_max_tokens(*schema_shape(schema))),
            **self.extra_body,
        }
        if self.seed is not None:
            body["seed"] = self.seed + sample
        self._count("calls")
        try:
            while True:
                mode = self._rf_mode
                rf = None if schema is None or mode == "none" else (
                    {"type": "json_schema", "json_schema": {"name": "instructions", "schema": schema, "strict": True}}
                    if mode == "json_schema" else {"type": "json_object", "schema": schema})
                body.pop("response_format", None)
                if rf is not None:
                    body["response_format"] = rf
                status, payload = await self._request("POST", "/chat/completions", body, deadline)
                if rf is not None and not self._rf_fixed and _rejects_format(status, payload):
                    self._step_down(mode, status, payload)
                    continue
                if status != 200:
                    raise _Failure("http_errors", f"answered HTTP {status}{_hint(status)}: {self._snippet(payload)}")
                content = self._content(payload)
                self._count("ok")
                return content
        except _Failure as f:
            raise self._error(f, f"OpenAI-compatible server at {_safe_url(self.base_url)}") from None
        except asyncio.CancelledError:
            if self._closed.is_set():  # close() cut this call short
                self._count("failures", "connection_errors")
            raise

    def _error(self, f: _Failure, prefix: str) -> BackendError:
        """``f`` counted and as the caller's error (:class:`BackendTimeout` for a timeout), key masked."""
        self._count("failures", f.kind)
        return (BackendTimeout if f.kind == "timeouts" else BackendError)(self._redact(f"{prefix} {f.message}"))

    def _content(self, payload: bytes) -> str:
        try:
            msg = json.loads(payload)["choices"][0]["message"]
            content = msg.get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError):
            # RecursionError: a hostile answer nested thousands of levels deep
            raise _Failure("unusable", f"sent an unusable answer (no chat message): {self._snippet(payload)}") from None
        if content is None:
            return ""
        if not isinstance(content, str):
            raise _Failure("unusable", f"sent a message whose content is not text: {self._snippet(payload)}")
        return content

    def _step_down(self, mode: str, status: int, payload: bytes) -> None:
        with self._lock:  # step down once for everyone, then the caller retries its request
            if self._rf_mode != mode:
                return
            self._rf_mode = _RF_MODES[_RF_MODES.index(mode) + 1]
            self._counts["format_step_downs"] += 1
            new = self._rf_mode
        log.warning("%s", self._redact(
            f"server at {_safe_url(self.base_url)} does not support response_format {mode!r} "
            f"(HTTP {status}: {self._snippet(payload, 160)}); using {new!r} from now on"))

    # ------------------------------------------------------------------ HTTP
    async def _request(self, method: str, path: str, body: Optional[dict], deadline: float) -> tuple[int, bytes]:
        """One request with retries: ``(status, body)`` of a non-retryable answer, or :class:`_Failure`."""
        last: Optional[_Failure] = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
            try:
                status, headers, payload = await self._attempt(method, path, body, deadline)
            except _Failure as f:
                if not f.retry:
                    raise
                last, wait = f, 0.0
            else:
                if 300 <= status < 400:
                    where = headers.get("Location", "?")[:200]
                    raise _Failure(
                        "redirects", f"answered HTTP {status} redirecting to {where!r}: redirects are not followed "
                        "(they could carry the API key elsewhere); set base_url to the final address")
                if not (status == 429 or status >= 500) or _rejects_format(status, payload):
                    return status, payload
                wait = _retry_after(headers.get("Retry-After")) or 0.0
                last = _Failure("http_errors", f"answered HTTP {status}{_hint(status)}: {self._snippet(payload)}")
                if wait and time.monotonic() + wait >= deadline:
                    last.message += f" (it asked to retry after {wait:.0f} s, past this call's deadline)"
                    break
            if attempt == self.max_retries:
                break
            pause = max(wait, self.backoff * (2 ** attempt) * (0.75 + 0.5 * random.random()))
            if time.monotonic() + pause >= deadline:
                break
            await asyncio.sleep(pause)  # close() cancels it
        assert last is not None
        last.message = f"failed after {attempt + 1} attempt(s): {last.message}"
        raise last

    def _http(self) -> Any:
        """This backend's ``AsyncOpenAI`` (built on the loop's thread; again in a forked child)."""
        if self._client is None or self._client_pid != os.getpid():
            import httpx2
            import openai

            inner = httpx2.AsyncHTTPTransport(
                verify=ssl.create_default_context(), proxy=self._proxy, trust_env=False,
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=self.concurrency))
            http = httpx2.AsyncClient(transport=_capped_transport(inner, self.max_response_bytes),
                                      follow_redirects=False, trust_env=False, timeout=self.timeout)
            # The key goes with each request (read at each one); this placeholder is never sent.
            self._client = openai.AsyncOpenAI(
                api_key="unused", base_url=_safe_url(self.base_url), max_retries=0, timeout=self.timeout,
                http_client=http, default_headers={"Accept-Encoding": "identity"})
            self._client_pid = os.getpid()
            _MASK.backends.add(self)
            _MASK.install()
        return self._client

    async def _attempt(self, method: str, path: str, body: Optional[dict], deadline: float):
        """One HTTP exchange within ``deadline``: ``(status, headers, body)`` or :class:`_Failure`."""
        import httpx2
        import openai

        if self._closed.is_set():
            raise _Failure("connection_errors", _CLOSED)
        budget = min(self.timeout, deadline - time.monotonic())
        if budget <= 0:
            raise _Failure("timeouts", "timed out (no time left in this call)")
        key = self._key()
        options = {"headers": {"Authorization": f"Bearer {key}" if key else openai.Omit()}}
        client = self._http()
        self._count("requests")
        send = (client.get(path, cast_to=httpx2.Response, options=options) if method == "GET" else
                client.post(path, cast_to=httpx2.Response, body=body, options=options))
        try:
            resp = await asyncio.wait_for(send, budget)
        except openai.APIStatusError as e:  # any status but 2xx, its body read (and capped)
            resp = e.response
        except _Failure:
            raise
        except Exception as e:  # noqa: BLE001 - every client fault becomes a _Failure
            e = e.__cause__ or e if isinstance(e, openai.APIConnectionError) else e  # the transport's own error
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            if self._closed.is_set():
                raise _Failure("connection_errors", _CLOSED) from None
            if isinstance(e, (TimeoutError, httpx2.TimeoutException)):  # TimeoutError: the total deadline
                raise _Failure("timeouts", f"timed out: no complete answer within {budget:.1f} s",
                               retry=self.retry_on_timeout) from None
            if isinstance(e, httpx2.ConnectError):
                raise _Failure("connection_errors", f"cannot connect ({what})", retry=True) from None
            # "peer closed connection" (a short read) or "Server disconnected" may be the network: retried
            if isinstance(e, httpx2.ProtocolError) and not any(w in str(e).lower() for w in ("closed", "disconnected")):
                raise _Failure("unusable", f"sent malformed HTTP ({what})") from None
            if isinstance(e, (httpx2.TransportError, OSError)) or type(e).__name__ == "EndOfStream":
                raise _Failure("connection_errors", f"connection lost ({what})", retry=True) from None
            raise _Failure("unusable", f"sent an answer the client cannot read ({what})") from None
        return resp.status_code, resp.headers, resp.content

    def _raw_key(self) -> Optional[str]:
        if self._api_key is not None:
            return self._api_key.value
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def _key(self) -> Optional[str]:
        key = (self._raw_key() or "").strip()  # a key read from a file often ends in a newline
        if any(not (32 < ord(c) < 127) for c in key):
            # the HTTP library would quote the header, key included, in its own error: never let it
            where = "api_key" if self._api_key is not None else self.api_key_env
            raise _Failure("connection_errors", f"the API key ({where}) holds spaces, control or non-ASCII "
                                                "characters: fix it")
        return key or None

    def _redact(self, text: str) -> str:
        """``text`` with the API key masked."""
        raw = self._raw_key()
        for key in {k for k in (raw, (raw or "").strip()) if k}:
            text = text.replace(key, "***")
            if len(key) >= 16:  # also a truncated echo of it
                text = text.replace(key[: len(key) // 2], "***")
        return text

    def _snippet(self, payload: bytes, size: int = 300) -> str:
        return self._redact(payload[:size].decode("utf-8", errors="replace"))

    def _count(self, *keys: str) -> None:
        with self._lock:
            for k in keys:
                self._counts[k] += 1

    def _served_model(self) -> str:
        ids = self.list_models()
        url = _safe_url(self.base_url)
        if not ids:
            raise BackendError(f"the server at {url} serves no model; load one, or pass model=... (--llm.model)")
        if len(ids) > 1:
            shown = ", ".join(ids[:20]) + (f", ... ({len(ids) - 20} more)" if len(ids) > 20 else "")
            raise BackendError(self._redact(
                f"the server at {url} serves {len(ids)} models ({shown}): choose one with model=... (--llm.model)"))
        log.info("using model %r, the one served at %s", ids[0], url)
        return ids[0]


def _hint(status: int) -> str:
    key = " (check the API key: OPENAI_API_KEY or api_key)"
    return {401: key, 403: key, 404: " (check base_url, usually ending in /v1, and the model name)"}.get(status, "")
