"""The OpenAI-compatible backend's protocol behaviour, against real HTTP servers on loopback.

:class:`FakeServer` is a real TCP server (raw sockets, so a test can also make it misbehave:
see ``test_relabel_openai_hostile.py``); each test scripts its answers. It stands in for the
vLLM / llama.cpp / hosted servers whose faults (several models, a 429 with ``Retry-After``, a
context-length 400, an echoed key) cannot be produced on demand by a real one. The same backend
against a real ``llama_cpp.server`` is tested in ``test_relabel_llm.py``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Callable, Optional

import pytest
from test_relabel_backends import _DummyEncoder, free_port

from oir_gym.relabel import BackendError, HindsightRelabeler, OpenAIBackend, output_schema
from oir_gym.relabel.backends import backend_kwargs
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from relabel_config import relabel_config

ANSWER = '{"Mid-Level": ["collect wood", "place table"], "High-Level": []}'
CANARY = "sk-canary-7f3e9a1c5b2d4e6f8a0b"


# --------------------------------------------------------------------------- the fake server
@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    t: float = field(default_factory=time.monotonic)

    def json(self) -> dict:
        return json.loads(self.body)


def http_bytes(status: int, payload, headers: Optional[dict] = None) -> bytes:
    """A complete HTTP/1.1 answer (JSON when ``payload`` is not bytes)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = {"Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close"}
    head.update(headers or {})
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in head.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def completion(content: str = ANSWER) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def openai_app(models=("m",), content: str = ANSWER) -> Callable:
    """A well-behaved OpenAI-compatible server's answers."""

    def app(req: Request, conn: socket.socket) -> None:
        if req.method == "GET" and req.path.endswith("/models"):
            conn.sendall(http_bytes(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]}))
        elif req.method == "POST" and req.path.endswith("/chat/completions"):
            conn.sendall(http_bytes(200, completion(content)))
        else:
            conn.sendall(http_bytes(404, {"error": "not found"}))

    return app


class FakeServer:
    """A real HTTP server on a free loopback port; ``handler(request, socket)`` writes the answer.

    Records every request (``requests``) and the bytes each handler managed to send (``sent``).
    Swap ``handler`` at any time (a server that recovers).
    """

    def __init__(self, handler: Callable) -> None:
        self.handler = handler
        self.requests: list[Request] = []
        self.stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            f = conn.makefile("rb")
            line = f.readline().decode("latin-1").split()
            if len(line) < 2:
                return
            headers = {}
            while (h := f.readline()) not in (b"\r\n", b"\n", b""):
                k, _, v = h.decode("latin-1").partition(":")
                headers[k.strip().lower()] = v.strip()
            body = f.read(int(headers.get("content-length", 0) or 0))
            req = Request(line[0], line[1], headers, body)
            self.requests.append(req)
            self.handler(req, conn)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self._sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture
def server():
    made: list[FakeServer] = []

    def make(handler: Callable = None) -> FakeServer:
        s = FakeServer(handler or openai_app())
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch):
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- model discovery
def test_no_model_given_uses_the_single_model_served(server):
    srv = server(openai_app(models=("Qwen/Qwen3-8B",)))
    be = OpenAIBackend(srv.url)
    assert be.model == "Qwen/Qwen3-8B"
    assert be.generate(["p"]) == [[ANSWER]]
    assert srv.requests[0].method == "GET" and srv.requests[0].path == "/v1/models"
    assert srv.requests[1].json()["model"] == "Qwen/Qwen3-8B"
    # the trainers' settings with no --llm.model: the same, before any training starts
    rl = HindsightRelabeler(relabel_config("openai", backend_kwargs=backend_kwargs("openai", "", srv.url)))
    assert rl.backend.llm.model == "Qwen/Qwen3-8B"


def test_several_models_served_fails_at_construction_with_the_list(server):
    srv = server(openai_app(models=("llama-3-8b", "qwen3-8b")))
    with pytest.raises(BackendError, match="serves 2 models") as ei:
        OpenAIBackend(srv.url)
    assert "llama-3-8b" in str(ei.value) and "qwen3-8b" in str(ei.value) and "model=" in str(ei.value)
    # through the relabeler the same error comes from its start-up check (a `both` run warns and
    # continues on rules, an `llm` run stops with it; see tests/test_relabel_worker.py)
    rl = HindsightRelabeler(relabel_config("openai", backend_kwargs=backend_kwargs("openai", "", srv.url)))
    with pytest.raises(RuntimeError, match="llama-3-8b, qwen3-8b"):
        rl.check_llm()
    assert all(r.method == "GET" for r in srv.requests)  # nothing was generated
    assert OpenAIBackend(srv.url, model="qwen3-8b").model == "qwen3-8b"  # an explicit model: no question asked


def test_no_model_or_not_an_llm_server_is_a_clear_error(server):
    with pytest.raises(BackendError, match="serves no model"):
        OpenAIBackend(server(openai_app(models=())).url)

    def web_page(req, conn):  # some other web server at the URL
        conn.sendall(http_bytes(200, b"<html><body>hello</body></html>", {"Content-Type": "text/html"}))

    with pytest.raises(BackendError, match="does not look like an OpenAI-compatible LLM server"):
        OpenAIBackend(server(web_page).url)

    def not_found(req, conn):
        conn.sendall(http_bytes(404, b"Not Found", {"Content-Type": "text/plain"}))

    with pytest.raises(BackendError, match=r"HTTP 404 .*OpenAI-compatible LLM server .*/v1"):
        OpenAIBackend(server(not_found).url)

    url = dead_url()
    with pytest.raises(BackendError) as ei:
        OpenAIBackend(url, max_retries=0)
    assert f"cannot ask {url}/models" in str(ei.value) and "cannot connect" in str(ei.value)


# --------------------------------------------------------------------------- environment
def test_openai_base_url_and_key_from_the_environment(server, monkeypatch):
    srv = server()
    monkeypatch.setenv("OPENAI_BASE_URL", srv.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key")
    be = OpenAIBackend(model="m")
    assert be.base_url == srv.url
    be.generate(["p"])
    assert srv.requests[-1].headers["authorization"] == "Bearer sk-env-key"
    # the trainers' loopback default yields to the variable; an explicit other URL wins over it
    assert OpenAIBackend(**backend_kwargs("openai", "m", "http://127.0.0.1:8000/v1")).base_url == srv.url
    other = server()
    assert OpenAIBackend(**backend_kwargs("openai", "m", other.url)).base_url == other.url
    # an explicit key wins over the variable
    OpenAIBackend(other.url, "m", api_key="sk-explicit").generate(["p"])
    assert other.requests[-1].headers["authorization"] == "Bearer sk-explicit"
    # no key anywhere: no Authorization header (local servers)
    monkeypatch.delenv("OPENAI_API_KEY")
    OpenAIBackend(other.url, "m").generate(["p"])
    assert "authorization" not in other.requests[-1].headers


def test_bad_base_url_is_a_clear_error():
    with pytest.raises(ValueError, match="http:// or https://"):
        OpenAIBackend("127.0.0.1:8000/v1", model="m")


def test_loopback_never_goes_through_a_proxy_but_other_hosts_do(server, monkeypatch):
    srv = server()
    monkeypatch.setenv("http_proxy", dead_url().rsplit("/v1", 1)[0])
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert OpenAIBackend(srv.url, "m").generate(["p"]) == [[ANSWER]]

    proxy = server()  # answers as the proxy would, after forwarding
    monkeypatch.setenv("http_proxy", proxy.url.rsplit("/v1", 1)[0])
    be = OpenAIBackend("http://llm.oir-test.invalid/v1", "m", max_retries=0)
    assert be.generate(["p"]) == [[ANSWER]]
    # the proxy is sent the absolute URL (the default port may be written out or not)
    assert proxy.requests[-1].path.replace(":80/", "/") == "http://llm.oir-test.invalid/v1/chat/completions"


# --------------------------------------------------------------------------- the API key
def echo_key_app(mode: str) -> Callable:
    """A server that quotes the request's Authorization header back in an error (fault injection)."""

    def app(req: Request, conn: socket.socket) -> None:
        auth = req.headers.get("authorization", "")
        if mode == "400":
            conn.sendall(http_bytes(400, {"error": {"message": f"bad request; you sent Authorization: {auth}"}}))
        elif mode == "500":
            conn.sendall(http_bytes(500, f"internal error with headers {req.headers}".encode(), {"Content-Type": "text/plain"}))
        elif mode == "redirect":
            conn.sendall(http_bytes(302, b"", {"Location": f"http://127.0.0.1:9/v1?key={auth[7:]}"}))
        elif mode == "status":
            conn.sendall(f"HTTP/1.1 {auth} nonsense\r\n\r\n".encode())
        elif mode == "models":
            conn.sendall(http_bytes(401, {"error": f"invalid key {auth[7:]}"}))
        elif mode == "content":  # a valid answer whose *content* is not text
            conn.sendall(http_bytes(200, {"choices": [{"message": {"content": {"k": auth}}}]}))

    return app


def test_the_key_never_appears_in_errors_logs_repr_or_stats(server, monkeypatch, caplog):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    for mode in ("400", "500", "redirect", "status", "content"):
        srv = server(echo_key_app(mode))
        be = OpenAIBackend(srv.url, "m", max_retries=1, backoff=0.01)
        with pytest.raises(BackendError) as ei:
            be.generate(["p"], schema=output_schema(2))
        assert srv.requests[0].headers["authorization"] == f"Bearer {CANARY}"  # it was sent
        seen += [str(ei.value), repr(ei.value), "".join(traceback.format_exception(ei.value)),
                 repr(be), str(vars(be)), json.dumps(be.stats())]
        # the relabeler's view of the failure (result error text and its stats)
        rl = HindsightRelabeler(relabel_config(use_rules=True, cache_size=0), llm=be, encoder=_DummyEncoder())
        (res,) = rl.relabel([make_trajectory(WOOD_TABLE_PICKAXE, 32)])
        assert res.error and res.fallback == "rules"
        seen += [res.error, json.dumps(rl.stats())]
    with pytest.raises(BackendError) as ei:
        OpenAIBackend(server(echo_key_app("models")).url)
    seen += [str(ei.value), "".join(traceback.format_exception(ei.value))]
    explicit = OpenAIBackend(server().url, "m", api_key=CANARY)
    seen += [repr(explicit), str(vars(explicit)), str(backend_kwargs("openai", "m", explicit.base_url))]
    seen += [r.getMessage() for r in caplog.records]
    text = "\n".join(seen)
    assert "Bearer ***" in text or "***" in text  # the echoes were there, masked
    assert CANARY not in text and CANARY[:10] not in text


# --------------------------------------------------------------------------- structured output
def picky_app(context_limit: bool = False, reject: tuple = (), reject_status: int = 400) -> Callable:
    """Rejects some response formats (as llama.cpp / older vLLM do), or long prompts (context length)."""

    def app(req: Request, conn: socket.socket) -> None:
        body = req.json()
        if context_limit and "LONG" in body["messages"][0]["content"]:
            conn.sendall(http_bytes(400, {"error": {"message": "This model's maximum context length is 4096 "
                                                    "tokens. However, you requested 9000 tokens.",
                                                    "type": "invalid_request_error"}}))
            return
        rf = (body.get("response_format") or {}).get("type")
        if rf in reject:
            conn.sendall(http_bytes(reject_status, {"detail": f"response_format type {rf} is not supported"}))
            return
        conn.sendall(http_bytes(200, completion()))

    return app


def test_a_context_length_400_does_not_switch_structured_output_off(server):
    srv = server(picky_app(context_limit=True))
    be = OpenAIBackend(srv.url, "m", backoff=0.01)
    with pytest.raises(BackendError, match="HTTP 400.*maximum context length"):
        be.generate(["LONG prompt"], schema=output_schema(2))
    assert be.response_format_mode == "json_schema" and be.stats()["format_step_downs"] == 0
    assert be.generate(["short"], schema=output_schema(2)) == [[ANSWER]]
    assert srv.requests[-1].json()["response_format"]["type"] == "json_schema"
    assert len(srv.requests) == 2  # a 400 is not retried
    s = be.stats()
    assert s["failures"] == 1 and s["http_errors"] == 1 and s["ok"] == 1


def test_format_step_down_when_the_server_says_so(server, caplog):
    srv = server(picky_app(reject=("json_schema",)))
    be = OpenAIBackend(srv.url, "m")
    with caplog.at_level(logging.WARNING):
        assert be.generate(["p"], schema=output_schema(2)) == [[ANSWER]]
    assert be.response_format_mode == "json_object" and be.stats()["format_step_downs"] == 1
    assert "does not support response_format 'json_schema'" in caplog.text
    # llama_cpp.server says it with HTTP 500: a step-down, not a retry of the same request
    srv2 = server(picky_app(reject=("json_schema", "json_object"), reject_status=500))
    be2 = OpenAIBackend(srv2.url, "m", backoff=0.01)
    assert be2.generate(["p"], schema=output_schema(2)) == [[ANSWER]]
    assert be2.response_format_mode == "none" and [r.json().get("response_format", {}).get("type")
                                                    for r in srv2.requests] == ["json_schema", "json_object", None]


# --------------------------------------------------------------------------- Retry-After
def test_retry_after_is_honoured_in_seconds_and_as_a_date(server):
    for header in ("1", None):
        requests: list[Request] = []

        def app(req, conn, requests=requests, header=header):
            requests.append(req)
            if len(requests) == 1:
                value = header or formatdate(time.time() + 2, usegmt=True)
                conn.sendall(http_bytes(429, {"error": "rate limited"}, {"Retry-After": value}))
            else:
                conn.sendall(http_bytes(200, completion()))

        srv = server(app)
        be = OpenAIBackend(srv.url, "m", backoff=0.01, max_retries=2, timeout=10)
        assert be.generate(["p"]) == [[ANSWER]]
        gap = requests[1].t - requests[0].t
        assert gap >= 0.9, (header, gap)  # the backoff alone would have waited ~0.01 s
        assert be.stats()["retries"] == 1


def test_retry_after_past_the_deadline_fails_the_call_at_once(server):
    def app(req, conn):
        conn.sendall(http_bytes(503, {"error": "overloaded"}, {"Retry-After": "3600"}))

    srv = server(app)
    be = OpenAIBackend(srv.url, "m", timeout=2, max_retries=3, backoff=0.01)
    with pytest.raises(BackendError, match="HTTP 503.*retry after 3600 s"):
        be.generate(["p"])
    assert len(srv.requests) == 1 and be.stats()["http_errors"] == 1


def test_a_key_with_a_trailing_newline_is_stripped_and_a_broken_key_never_quoted(server, monkeypatch):
    srv = server()
    monkeypatch.setenv("OPENAI_API_KEY", CANARY + "\n")  # as read from a file
    OpenAIBackend(srv.url, "m").generate(["p"])
    assert srv.requests[-1].headers["authorization"] == f"Bearer {CANARY}"
    monkeypatch.setenv("OPENAI_API_KEY", CANARY[:12] + "\r\nX-Injected: 1" + CANARY[12:])
    with pytest.raises(BackendError, match=r"API key \(OPENAI_API_KEY\) holds spaces") as ei:
        OpenAIBackend(srv.url, "m").generate(["p"])
    text = str(ei.value) + "".join(traceback.format_exception(ei.value))
    assert CANARY[:12] not in text and CANARY[12:] not in text
    assert len(srv.requests) == 1  # nothing was sent with it


# --------------------------------------------------------------------------- arguments and callers
@pytest.mark.parametrize("kwargs, error, match", [
    ({"timeout": float("nan")}, ValueError, "timeout"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"timeout": -1.0}, ValueError, "timeout"),
    ({"timeout": True}, TypeError, "timeout"),
    ({"max_retries": -1}, ValueError, "max_retries"),
    ({"max_retries": 1.5}, TypeError, "max_retries"),
    ({"max_retries": True}, TypeError, "max_retries"),
    ({"concurrency": 0}, ValueError, "concurrency"),
    ({"concurrency": 2.0}, TypeError, "concurrency"),
    ({"max_response_bytes": 0}, ValueError, "max_response_bytes"),
    ({"max_response_bytes": -5}, ValueError, "max_response_bytes"),
    ({"max_response_bytes": 1e6}, TypeError, "max_response_bytes"),
    ({"backoff": float("nan")}, ValueError, "backoff"),
    ({"max_tokens": 0}, ValueError, "max_tokens"),
    ({"seed": 1.5}, TypeError, "seed"),
    ({"retry_on_timeout": 1}, TypeError, "retry_on_timeout"),
    ({"response_format": "xml"}, ValueError, "response_format"),
    ({"extra_body": "x"}, TypeError, "extra_body"),
])
def test_bad_numbers_and_types_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        OpenAIBackend(dead_url(), "m", **kwargs)  # refused before any connection is tried


def test_a_lone_string_is_not_a_list_of_prompts(server):
    srv = server()
    be = OpenAIBackend(srv.url, "m")
    with pytest.raises(TypeError, match=r"list of prompt strings.*\[prompt\]"):
        be.generate("abc")  # would otherwise be 3 prompts: "a", "b", "c"
    with pytest.raises(TypeError, match=r"prompts\[1\]"):
        be.generate(["a", 2])
    with pytest.raises(TypeError, match="n="):
        be.generate(["a"], n=True)
    assert srv.requests == []
    assert be.generate(("a", "b"), n=2) == [[ANSWER, ANSWER], [ANSWER, ANSWER]]  # any sequence of strings


def test_generate_works_from_threads_and_from_inside_a_running_event_loop(server):
    """The trainers call the backend from worker threads; a notebook or an async app calls it
    from a thread whose event loop is running. Neither may break or block the other."""
    import asyncio

    srv = server()
    be = OpenAIBackend(srv.url, "m", concurrency=2)

    async def inside_a_loop():
        return be.generate(["p"])

    assert asyncio.run(inside_a_loop()) == [[ANSWER]]
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(be.generate(["a", "b", "c"]))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [[[ANSWER]] * 3] * 4
    s = be.stats()
    assert s["calls"] == s["ok"] == 13 and s["failures"] == 0
