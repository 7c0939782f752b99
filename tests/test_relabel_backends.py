"""OpenAI-compatible and vLLM backends without a model.

The HTTP server here is a tiny local ``http.server`` stub: it is *fault injection* for behaviours
a real server cannot produce on demand (answering slower than the client's timeout, rejecting a
``response_format``, failing with 503, checking the bearer token). The same backend against a real
``llama_cpp.server`` with the Gemma model is tested in ``test_relabel_llm.py``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from oir_gym.relabel import (
    BackendError, BackendTimeout, HindsightRelabeler, OpenAIBackend, VLLMBackend, instruction_gbnf, output_schema,
)
from oir_gym.relabel.backends import VLLM_INSTALL_HINT
from oir_gym.relabel.composite import CompositeBackend
from oir_gym.relabel.rules import RuleBackend
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from oir_gym.relabel.llm.spec import LLMCheckError
from relabel_config import relabel_config

ANSWER = '{"Mid-Level": ["collect wood", "place table"], "High-Level": []}'


class Stub:
    """Configurable OpenAI-style chat completions stub (fault injection)."""

    def __init__(self, delay: float = 0.0, reject: tuple[str, ...] = (), fail_first: int = 0) -> None:
        self.delay, self.reject, self.fail_first = delay, reject, fail_first
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output quiet
                pass

            def do_GET(self):  # one model served: backends built without a model ask for it
                self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                stub.headers.append(dict(self.headers))
                if stub.delay:
                    time.sleep(stub.delay)
                if len(stub.requests) <= stub.fail_first:
                    return self._send(503, {"error": "overloaded"})
                rf = (body.get("response_format") or {}).get("type")
                if rf in stub.reject:
                    return self._send(400, {"error": f"response_format {rf} not supported"})
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}}]})

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_factory():
    stubs = []

    def make(**kw):
        s = Stub(**kw)
        stubs.append(s)
        return s

    yield make
    for s in stubs:
        s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_ok_with_json_schema(stub_factory):
    stub = stub_factory()
    be = OpenAIBackend(stub.url, model="m", api_key_env=None)
    out = be.generate(["p1", "p2"], n=2, schema=output_schema(4))
    assert out == [[ANSWER, ANSWER], [ANSWER, ANSWER]]
    assert len(stub.requests) == 4
    req = stub.requests[0]
    assert req["model"] == "m" and req["messages"][0] == {"role": "user", "content": req["messages"][0]["content"]}
    assert req["response_format"]["type"] == "json_schema"
    assert req["response_format"]["json_schema"]["schema"]["properties"]["Mid-Level"]["maxItems"] == 4
    assert {r["seed"] for r in stub.requests} == {0, 1}


def test_openai_response_format_step_down(stub_factory):
    stub = stub_factory(reject=("json_schema",))
    be = OpenAIBackend(stub.url, api_key_env=None)
    assert be.generate(["p"], schema=output_schema(2)) == [[ANSWER]]
    assert be.response_format_mode == "json_object"
    assert stub.requests[-1]["response_format"] == {"type": "json_object", "schema": output_schema(2)}
    stub2 = stub_factory(reject=("json_schema", "json_object"))
    be2 = OpenAIBackend(stub2.url, api_key_env=None)
    assert be2.generate(["p"], schema=output_schema(2)) == [[ANSWER]]
    assert be2.response_format_mode == "none" and "response_format" not in stub2.requests[-1]
    forced = OpenAIBackend(stub2.url, api_key_env=None, response_format="json_schema")
    with pytest.raises(BackendError, match="HTTP 400"):
        forced.generate(["p"], schema=output_schema(2))


def test_openai_api_key_from_env_never_shown(stub_factory, monkeypatch):
    stub = stub_factory()
    monkeypatch.setenv("OIR_TEST_KEY", "sk-secret-123")
    be = OpenAIBackend(stub.url, api_key_env="OIR_TEST_KEY")
    be.generate(["p"])
    assert {k.lower(): v for k, v in stub.headers[0].items()}["authorization"] == "Bearer sk-secret-123"  # any case
    assert "sk-secret" not in repr(be) and "sk-secret" not in str(vars(be))
    assert "OIR_TEST_KEY" in repr(be)


def test_openai_retries_on_503(stub_factory):
    stub = stub_factory(fail_first=2)
    be = OpenAIBackend(stub.url, api_key_env=None, max_retries=2, backoff=0.01)
    assert be.generate(["p"]) == [[ANSWER]] and len(stub.requests) == 3
    stub2 = stub_factory(fail_first=100)
    with pytest.raises(BackendError, match="HTTP 503"):
        OpenAIBackend(stub2.url, api_key_env=None, max_retries=1, backoff=0.01).generate(["p"])


def test_openai_slow_server_timeout_honoured(stub_factory):
    """Fault injection: the stub sleeps 3 s before answering; the client's 0.5 s timeout must hold."""
    stub = stub_factory(delay=3.0)
    be = OpenAIBackend(stub.url, api_key_env=None, timeout=0.5, max_retries=2)
    t0 = time.perf_counter()
    with pytest.raises(BackendTimeout, match="timed out"):
        be.generate(["p"])
    assert time.perf_counter() - t0 < 1.5
    # in the relabeler: no exception, rule fallback, error counted
    rl = HindsightRelabeler(relabel_config(use_rules=False), llm=be, encoder=_DummyEncoder())
    (res,) = rl.relabel([make_trajectory(WOOD_TABLE_PICKAXE, 32)])
    assert res.fallback == "rules" and res.candidates and rl.stats()["errors_by_type"] == {"BackendTimeout": 1}


def test_openai_no_server_clear_error():
    url = f"http://127.0.0.1:{free_port()}/v1"
    be = OpenAIBackend(url, model="m", api_key_env=None, max_retries=1, backoff=0.01, timeout=2)
    with pytest.raises(BackendError) as ei:
        be.generate(["p"])
    msg = str(ei.value)
    assert url in msg and "cannot connect" in msg and "2 attempt" in msg


def test_composite_records_errors_instead_of_raising():
    class Boom:
        def generate(self, prompts, n=1, *, schema=None):
            raise RuntimeError("boom")

    comp = CompositeBackend(Boom(), RuleBackend())
    traj = make_trajectory(WOOD_TABLE_PICKAXE, 32, texts=False)
    (p,) = comp.propose([traj], ["prompt"])
    assert p.error == "RuntimeError: boom" and p.rules[0] == "collect wood" and p.llm_raw == []
    with pytest.raises(ValueError):
        CompositeBackend(None, None)


def test_vllm_missing_gives_install_hint():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - only where vllm is installed
        pytest.skip("vllm is installed here")
    with pytest.raises(ImportError) as ei:
        VLLMBackend("Qwen/Qwen3-8B")
    assert "pip install" in str(ei.value) and str(ei.value) == VLLM_INSTALL_HINT
    # the relabeler builds vLLM in a child process: its check says what to install
    rl = HindsightRelabeler(relabel_config("vllm", backend_kwargs={"model": "Qwen/Qwen3-8B"}))
    with pytest.raises(LLMCheckError, match="ImportError: VLLMBackend needs .*pip install"):
        rl.check_llm()
    rl.close()
    with pytest.raises(ImportError, match="vllm"):  # built in this process: at once
        HindsightRelabeler(relabel_config("vllm", backend_kwargs={"model": "Qwen/Qwen3-8B"}, isolate=False))


def test_gbnf_grammar_shape():
    g = instruction_gbnf(3)
    assert "root ::= lists" in g and "{0,2}" in g and "{0,79}" in g
    assert '"\\"Analysis\\":"' in instruction_gbnf(4, analysis=True)


class _DummyEncoder:
    """Deterministic bag-of-words embedding: enough for fallback plumbing, avoids loading a model."""

    dim = 64

    def encode(self, texts):
        import numpy as np

        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in t.split():
                out[i, hash(w) % self.dim] += 1.0
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out


def test_backend_kwargs_maps_the_common_model_settings():
    from oir_gym.relabel.backends import backend_kwargs

    # openai: an empty model means "ask the server"; the loopback default yields to OPENAI_BASE_URL
    assert backend_kwargs("openai", "", "http://127.0.0.1:9/v1") == {"base_url": "http://127.0.0.1:9/v1", "model": None}
    assert backend_kwargs("openai", "m", "http://127.0.0.1:8000/v1") == {"model": "m"}
    assert backend_kwargs("vllm", "Qwen/Qwen3-8B") == {"model": "Qwen/Qwen3-8B"}
    assert backend_kwargs("vllm") == {}
    assert backend_kwargs("llama_cpp") == {}  # the packaged Gemma
    assert backend_kwargs("llama_cpp", "/m.gguf") == {"model_path": "/m.gguf"}
