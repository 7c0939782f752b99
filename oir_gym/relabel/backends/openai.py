"""Chat completions from any OpenAI-compatible server (standard library HTTP only).

The transport is :mod:`http.client`, driven directly so that a broken or hostile server cannot
hurt the training run (each rule is tested against a real fake server on loopback in
``tests/test_relabel_openai_hostile.py``):

* every request has a **total** deadline (connect + send + the whole answer), enforced by a
  watchdog that shuts the socket down, so an answer trickled a byte at a time ends on time (the
  backend keeps its own reference to the socket: :mod:`http.client` hands it over to the response
  when the answer says ``Connection: close`` or has no length);
* answers are read in chunks and capped (``max_response_bytes``, 4 MiB by default);
* redirects are never followed: a redirect could carry the API key to another host;
* malformed HTTP, short reads and unparsable or absurdly nested JSON raise :class:`BackendError`;
* every failed call is counted by cause (:meth:`OpenAIBackend.stats`);
* requests run on daemon threads, and :meth:`OpenAIBackend.close` aborts those in flight, so
  shutdown never waits on a stuck server.

The API key never appears in ``repr``, exceptions, logs or :meth:`~OpenAIBackend.stats`: any
server text quoted in an error has the key masked.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import json
import logging
import math
import os
import random
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, BackendTimeout, default_max_tokens, schema_shape

log = logging.getLogger(__name__)

#: Where the backend connects when neither ``base_url`` nor ``OPENAI_BASE_URL`` is given.
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
#: Largest answer read from the server (bytes).
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024

_RF_MODES = ("json_schema", "json_object", "none")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_CHUNK = 64 * 1024
_FAILURE_KINDS = ("timeouts", "connection_errors", "http_errors", "redirects", "unusable")


def _rejects_format(status: int, payload: bytes) -> bool:
    """True when an error answer says the *response format* is what the server cannot do.

    Only then is structured output stepped down; any other 4xx/5xx (a context-length 400, an
    overloaded 503) is an error of that one call. llama_cpp.server answers an unsupported
    ``response_format`` with HTTP 500 (a validation error), OpenAI and vLLM with 400.
    """
    if status < 400:
        return False
    text = payload[:4000].decode("utf-8", errors="replace").lower()
    if any(w in text for w in ("response_format", "response format", "json_schema", "json_object")):
        return True
    return ("not supported" in text or "unsupported" in text) and ("format" in text or "schema" in text)


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delay in seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        secs = (when - datetime.now(timezone.utc)).total_seconds()
    return max(0.0, secs) if math.isfinite(secs) else None


class _Secret:
    """Holds an explicitly given API key; shows as ``<hidden>`` in ``repr``/``vars``."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"

    __str__ = __repr__


class _Failure(Exception):
    """One attempt's failure (internal): ``kind`` is a key of :meth:`OpenAIBackend.stats`."""

    def __init__(self, kind: str, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.kind, self.message, self.retry = kind, message, retry


def _safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part (for messages and ``repr``)."""
    p = urllib.parse.urlsplit(url)
    if p.username is None and p.password is None:
        return url
    host = p.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if p.port:
        netloc += f":{p.port}"
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


class OpenAIBackend:
    """Chat completions from any OpenAI-compatible server, with the standard library only.

    Args:
        base_url: server root including ``/v1`` (e.g. ``http://127.0.0.1:8000/v1``). Default: the
            ``OPENAI_BASE_URL`` environment variable, else ``http://127.0.0.1:8000/v1`` (as the
            OpenAI client: the argument wins over the variable).
        model: model name sent to the server. Empty or ``None``: ask the server
            (``GET {base_url}/models``) and use the one model it serves; a server serving several
            models, none, or no model list at all (not an OpenAI-compatible LLM server, wrong
            URL, unreachable) raises :class:`BackendError` here, before any training starts.
        api_key: the API key. Default: read from the environment variable ``api_key_env``
            (``OPENAI_API_KEY``) at each request. Sent as a bearer token; never stored in
            clear in ``repr``/``vars``, never logged, masked in any error text. Local servers
            need none.
        api_key_env: name of the environment variable holding the key (``None``: no key).
        timeout: seconds per HTTP request, **total**: connect, send and the whole answer (an
            answer still trickling in at the deadline is abandoned). The whole call, retries and
            waits included, ends within ``timeout * (max_retries + 1)`` seconds.
        max_retries: retries after a connection error, a short read, HTTP 429 or 5xx
            (exponential backoff ``backoff * 2**i`` with jitter, or the server's
            ``Retry-After`` when longer; a ``Retry-After`` beyond the call's deadline ends the
            call at once). Timeouts are not retried unless ``retry_on_timeout``.
        concurrency: requests in flight at once (daemon threads).
        response_format: ``"auto"`` tries the OpenAI ``json_schema`` format, steps down to
            llama.cpp's ``json_object`` + schema, then to none, when (and only when) the server's
            error says the format is not supported, and remembers what worked; or force one of
            ``"json_schema"``, ``"json_object"``, ``"none"``.
        extra_body: extra JSON fields for every request (e.g. ``{"chat_template_kwargs":
            {"enable_thinking": False}}`` for Qwen3 on vLLM).
        max_response_bytes: largest answer accepted; a longer one is an unusable answer.

    Raises:
        BackendError: from the constructor only when ``model`` is empty and the server cannot
            tell which model to use; from :meth:`generate` when a call fails.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        model: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
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
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if response_format not in ("auto", *_RF_MODES):
            raise ValueError(f"response_format must be 'auto' or one of {_RF_MODES}, got {response_format!r}")
        if not timeout or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        parts = urllib.parse.urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http:// or https:// URL such as {DEFAULT_BASE_URL}, "
                             f"got {_safe_url(base_url)!r}")
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self._api_key = _Secret(api_key) if api_key else None
        self.timeout = float(timeout)
        self.max_retries = max(0, int(max_retries))
        self.backoff = float(backoff)
        self.retry_on_timeout = retry_on_timeout
        self.concurrency = max(1, int(concurrency))
        self.temperature = float(temperature)
        self.max_tokens = max_tokens
        self.seed = seed
        self.max_response_bytes = int(max_response_bytes)
        self._rf_fixed = response_format != "auto"
        self._rf_mode = response_format if response_format != "auto" else "json_schema"
        self.extra_body = dict(extra_body or {})

        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = parts.path
        # Proxies from the environment, as urllib does; loopback servers never go through one.
        proxy = None
        if self._host not in _LOOPBACK and not urllib.request.proxy_bypass(self._host):
            proxy = urllib.request.getproxies().get(parts.scheme)
        self._proxy = urllib.parse.urlsplit(proxy) if proxy else None
        self._ssl: Optional[ssl.SSLContext] = None

        self._lock = threading.Lock()
        self._inflight: set[_Link] = set()
        self._closed = threading.Event()
        self._counts: dict[str, int] = dict.fromkeys(
            ("calls", "ok", "failures", *_FAILURE_KINDS, "requests", "retries", "format_step_downs"), 0)

        self.model = model or self._served_model()

    # ------------------------------------------------------------------ public
    def __repr__(self) -> str:  # never shows the key, only where it comes from
        key = "api_key=<hidden>" if self._api_key else f"api_key_env={self.api_key_env!r}"
        return (f"OpenAIBackend(base_url={_safe_url(self.base_url)!r}, model={self.model!r}, {key}, "
                f"timeout={self.timeout}, response_format={self._rf_mode!r})")

    @property
    def response_format_mode(self) -> str:
        """The response format currently used (after any automatic step-down)."""
        return self._rf_mode

    def stats(self) -> dict[str, int]:
        """Counters since construction (for the run's metrics).

        ``calls`` (one per completion asked for), ``ok``, ``failures`` (failed calls, each counted
        once under its final cause: ``timeouts``, ``connection_errors``, ``http_errors`` (an HTTP
        error status), ``redirects``, ``unusable`` (malformed HTTP, a short read, an answer too
        large, not JSON or without a message)), ``requests`` (HTTP requests sent, retries
        included), ``retries`` and ``format_step_downs``.
        """
        with self._lock:
            return dict(self._counts)

    def list_models(self) -> list[str]:
        """The model ids the server serves (``GET {base_url}/models``). Raises :class:`BackendError`."""
        url = f"{_safe_url(self.base_url)}/models"
        try:
            status, data = self._request("GET", "/models", None, time.monotonic() + self.timeout)
        except _Failure as f:
            self._count("failures", f.kind)
            cls = BackendTimeout if f.kind == "timeouts" else BackendError
            raise cls(self._redact(f"cannot ask {url} which model the server serves: {f.message}")) from None
        if status != 200:
            raise BackendError(self._redact(
                f"{url} answered HTTP {status} ({self._snippet(data)}): is {_safe_url(self.base_url)} an "
                "OpenAI-compatible LLM server (the URL usually ends in /v1)?"))
        try:
            entries = json.loads(data)["data"]
            ids = [e["id"] for e in entries]
            if not all(isinstance(i, str) for i in ids):
                raise TypeError("model ids are not strings")
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            raise BackendError(self._redact(
                f"{url} sent no model list ({self._snippet(data)}): {_safe_url(self.base_url)} does not look "
                "like an OpenAI-compatible LLM server; check the URL (it usually ends in /v1)")) from None
        return ids

    def generate(self, prompts: list[str], n: int = 1, *, schema: Optional[dict] = None) -> list[list[str]]:
        """One request per (prompt, sample), ``concurrency`` at a time. Raises :class:`BackendError`.

        The first failed request stops the call (requests not yet sent are dropped).
        """
        if self._closed.is_set():
            raise BackendError(f"OpenAIBackend for {_safe_url(self.base_url)} is closed")
        jobs = [(i, j) for i in range(len(prompts)) for j in range(n)]
        out: list[list[str]] = [[""] * n for _ in prompts]
        if len(jobs) == 1:
            out[0][0] = self._one(prompts[0], 0, schema)
            return out
        lock = threading.Lock()
        pending = iter(jobs)
        errors: list[BaseException] = []

        def work() -> None:
            while True:
                with lock:
                    job = None if errors else next(pending, None)
                if job is None:
                    return
                i, j = job
                try:
                    out[i][j] = self._one(prompts[i], j, schema)
                except BaseException as e:  # noqa: BLE001 - handed to the caller below
                    with lock:
                        errors.append(e)
                    return

        # Daemon threads: a stuck request can never hold the interpreter at exit.
        threads = [threading.Thread(target=work, name="oir-openai", daemon=True)
                   for _ in range(min(self.concurrency, len(jobs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out

    def close(self) -> None:
        """Abort requests in flight (their calls raise :class:`BackendError` at once); idempotent.

        Later :meth:`generate` calls raise. Shutdown therefore never waits on a stuck server.
        """
        self._closed.set()
        with self._lock:
            links = list(self._inflight)
        for link in links:
            link.abort()

    # ------------------------------------------------------------------ one completion
    def _response_format(self, mode: str, schema: Optional[dict]) -> Optional[dict]:
        if schema is None or mode == "none":
            return None
        if mode == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "instructions", "schema": schema, "strict": True}}
        return {"type": "json_object", "schema": schema}

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
        self._count("calls")
        try:
            while True:
                mode = self._rf_mode
                rf = self._response_format(mode, schema)
                if rf is not None:
                    body["response_format"] = rf
                else:
                    body.pop("response_format", None)
                status, payload = self._request("POST", "/chat/completions", body, deadline)
                if rf is not None and not self._rf_fixed and _rejects_format(status, payload):
                    self._step_down(mode, status, payload)
                    continue
                if status != 200:
                    raise _Failure("http_errors", f"answered HTTP {status}{_hint(status)}: {self._snippet(payload)}")
                content = self._content(payload)
                self._count("ok")
                return content
        except _Failure as f:
            self._count("failures", f.kind)
            cls = BackendTimeout if f.kind == "timeouts" else BackendError
            raise cls(self._redact(f"OpenAI-compatible server at {_safe_url(self.base_url)} {f.message}")) from None

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
    def _request(self, method: str, path: str, body: Optional[dict], deadline: float) -> tuple[int, bytes]:
        """One request with retries: ``(status, body)`` of a non-retryable HTTP answer, or :class:`_Failure`."""
        data = json.dumps(body).encode("utf-8") if body is not None else None
        last: Optional[_Failure] = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
            try:
                status, headers, payload = self._attempt(method, path, data, deadline)
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
            if self._closed.wait(pause):
                raise _Failure("connection_errors", "closed (backend.close() was called)")
        assert last is not None
        last.message = f"failed after {attempt + 1} attempt(s): {last.message}"
        raise last

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, str]:
        """A new connection and the request target for ``self._path`` + suffix (prefix returned)."""
        kw: dict[str, Any] = {"timeout": timeout}
        if self._https:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            kw["context"] = self._ssl
        if self._proxy is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            return cls(self._host, self._port, **kw), self._path
        p = self._proxy
        if self._https:  # CONNECT tunnel: the proxy sees neither the request nor the key
            conn = http.client.HTTPSConnection(p.hostname, p.port or 8080, **kw)
            headers = {}
            if p.username:
                cred = f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}"
                headers["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
            conn.set_tunnel(self._host, self._port, headers=headers)
            return conn, self._path
        conn = http.client.HTTPConnection(p.hostname, p.port or 8080, timeout=timeout)
        return conn, f"http://{self._host}:{self._port}{self._path}"  # absolute form for the proxy

    def _headers(self, has_body: bool) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "oir-gym", "Connection": "close"}
        if has_body:
            h["Content-Type"] = "application/json"
        key = self._key()
        if key:
            h["Authorization"] = f"Bearer {key}"
        if self._proxy is not None and not self._https and self._proxy.username:
            p = self._proxy
            cred = f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}"
            h["Proxy-Authorization"] = "Basic " + base64.b64encode(cred.encode()).decode()
        return h

    def _attempt(self, method: str, path: str, data: Optional[bytes], deadline: float):
        """One HTTP exchange within ``deadline``: ``(status, headers, body)`` or :class:`_Failure`."""
        if self._closed.is_set():
            raise _Failure("connection_errors", "closed (backend.close() was called)")
        budget = min(self.timeout, deadline - time.monotonic())
        if budget <= 0:
            raise _Failure("timeouts", "timed out (no time left in this call)")
        conn, prefix = self._connection(budget)
        link = _Link(conn)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            link.abort()

        # The socket timeout only bounds each read; the watchdog bounds the whole exchange.
        watchdog = threading.Timer(budget, expire)
        watchdog.daemon = True
        with self._lock:
            self._inflight.add(link)
            self._counts["requests"] += 1
        watchdog.start()
        connected = False
        resp = None
        try:
            conn.connect()
            link.sock = conn.sock  # before the check below: an expiry from now on reaches the socket
            if expired.is_set() or self._closed.is_set():
                raise TimeoutError
            connected = True
            conn.request(method, prefix + path, body=data, headers=self._headers(data is not None))
            resp = conn.getresponse()
            length = resp.getheader("Content-Length", "").strip()
            announced = int(length) if length.isdigit() else None
            if announced is not None and announced > self.max_response_bytes:
                raise _Failure("unusable", f"announced an answer of {announced:,} bytes, over "
                                           f"max_response_bytes={self.max_response_bytes:,}")
            chunks, total = [], 0
            while True:
                chunk = resp.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > self.max_response_bytes:
                    raise _Failure("unusable", f"sent an answer over max_response_bytes={self.max_response_bytes:,}")
                chunks.append(chunk)
            # An aborted socket reads as a clean end of file: say why it ended.
            if expired.is_set() or self._closed.is_set():
                raise TimeoutError
            if announced is not None and total < announced:
                raise http.client.IncompleteRead(b"", announced - total)
            return resp.status, resp.headers, b"".join(chunks)
        except _Failure:
            raise
        except Exception as e:  # noqa: BLE001 - every transport fault becomes a _Failure
            raise self._classify(e, expired.is_set(), connected, budget) from None
        finally:
            watchdog.cancel()
            with self._lock:
                self._inflight.discard(link)
            if resp is not None:
                resp.close()
            conn.close()

    def _classify(self, e: Exception, expired: bool, connected: bool, budget: float) -> _Failure:
        what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if self._closed.is_set():
            return _Failure("connection_errors", "closed (backend.close() was called)")
        if expired or isinstance(e, (socket.timeout, TimeoutError)):
            return _Failure("timeouts", f"timed out: no complete answer within {budget:.1f} s",
                            retry=self.retry_on_timeout)
        if not connected and isinstance(e, OSError):
            return _Failure("connection_errors", f"cannot connect ({what})", retry=True)
        if isinstance(e, (http.client.IncompleteRead, ConnectionError)):
            # short reads and dropped connections may be the network: worth another try
            return _Failure("connection_errors", f"connection lost ({what})", retry=True)
        if isinstance(e, http.client.HTTPException):
            return _Failure("unusable", f"sent malformed HTTP ({what})")
        if isinstance(e, OSError):
            return _Failure("connection_errors", f"connection error ({what})", retry=True)
        return _Failure("unusable", f"sent an answer the client cannot read ({what})")

    # ------------------------------------------------------------------ helpers
    def _raw_key(self) -> Optional[str]:
        if self._api_key is not None:
            return self._api_key.value
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def _key(self) -> Optional[str]:
        key = (self._raw_key() or "").strip()  # a key read from a file often ends in a newline
        if any(not (32 < ord(c) < 127) for c in key):
            # http.client would quote the header, key included, in its own error: never let it
            where = "api_key" if self._api_key is not None else self.api_key_env
            raise _Failure("connection_errors", f"the API key ({where}) holds spaces, control or non-ASCII "
                                                "characters: fix it")
        return key or None

    def _redact(self, text: str) -> str:
        """``text`` with the API key masked (a server may echo request headers back)."""
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


class _Link:
    """The socket of one HTTP exchange, held by the backend itself.

    :mod:`http.client` drops the connection's reference (``conn.sock`` becomes ``None``) when it
    hands the socket to the response (an answer with ``Connection: close`` or without a length),
    so a deadline or :meth:`OpenAIBackend.close` that looked only at ``conn.sock`` would abort
    nothing while a body trickles in: :meth:`abort` reaches the socket either way.
    """

    __slots__ = ("conn", "sock")

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn
        self.sock: Optional[socket.socket] = None  # set once connected

    def abort(self) -> None:
        """Wake any thread blocked on the socket (shutdown, not close: close may not wake it)."""
        for sock in {id(s): s for s in (self.sock, self.conn.sock) if s is not None}.values():
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _hint(status: int) -> str:
    if status in (401, 403):
        return " (check the API key: OPENAI_API_KEY or api_key)"
    if status == 404:
        return " (check base_url, usually ending in /v1, and the model name)"
    return ""
