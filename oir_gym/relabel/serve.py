"""A small OpenAI-compatible chat-completions server over :class:`TransformersBackend` (loopback only).

Serves any model the transformers backend loads (default: the packaged Gemma 3 270M GGUF), e.g. to
share one loaded model between training processes (``--llm.backend openai``)::

    python -m oir_gym.relabel.serve --port 8000 [--model /models/qwen3-0.6b]

Endpoints: ``GET /v1/models``, ``GET /health``, ``POST /v1/chat/completions`` (``messages``, ``n``,
``temperature``, ``top_p``, ``max_tokens``, ``seed``, ``response_format``; ``stream`` and tools are
refused). Concurrent requests with the same settings (within ``--batch-wait`` s) are one batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from oir_gym.relabel.backends.base import BackendError, default_max_tokens, schema_shape

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_BODY = 4 * 1024 * 1024  # bytes of a request body


class RequestError(ValueError):
    """A request the server refuses (HTTP 400), with a message that says what to fix."""


def parse_request(body: dict) -> dict[str, Any]:
    """Validate a chat-completions request: ``prompt``, ``n``, ``schema`` and sampling settings; raises
    :class:`RequestError` for a malformed one."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects")
    parts = []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise RequestError("every message needs a role: system, developer, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise RequestError("message content must be a string (or a list of text parts)")
        parts.append(content)
    if body.get("stream"):
        raise RequestError("streaming is not supported: send stream=false")
    if body.get("tools") or body.get("functions"):
        raise RequestError("tools / function calling are not supported")
    n = body.get("n", 1)
    if not isinstance(n, int) or not 1 <= n <= 16:
        raise RequestError("'n' must be an integer from 1 to 16")
    out: dict[str, Any] = {"prompt": "\n\n".join(parts), "n": n, "schema": None}
    for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        v = body.get(key)
        if v is not None:
            if not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise RequestError(f"'{key}' must be a number from {lo} to {hi}")
            out[key] = float(v)
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    if mt is not None:
        if not isinstance(mt, int) or not 1 <= mt <= 8192:
            raise RequestError("'max_tokens' must be an integer from 1 to 8192")
        out["max_tokens"] = mt
    seed = body.get("seed")
    if seed is not None:
        if not isinstance(seed, int):
            raise RequestError("'seed' must be an integer")
        out["seed"] = seed
    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
            raise RequestError("'response_format' type must be 'text', 'json_object' or 'json_schema'")
        if rf["type"] == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
                raise RequestError("response_format json_schema needs {'json_schema': {'schema': {...}}}")
            out["schema"] = js["schema"]
        elif rf["type"] == "json_object":
            schema = rf.get("schema", {"type": "object"})
            if not isinstance(schema, dict):
                raise RequestError("response_format json_object 'schema' must be a JSON schema object")
            out["schema"] = schema
    return out


class _Batcher:
    """Collects concurrent requests with the same settings into one ``generate`` call."""

    def __init__(self, backend: Any, batch_size: int, wait: float) -> None:
        self.backend, self.batch_size, self.wait = backend, max(1, batch_size), max(0.0, wait)
        self._q: "queue.Queue[tuple[dict, Future]]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="oir-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, req: dict) -> Future:
        fut: Future = Future()
        self._q.put((req, fut))
        return fut

    @staticmethod
    def _key(req: dict) -> str:
        return json.dumps({k: v for k, v in req.items() if k not in ("prompt", "seed")}, sort_keys=True)

    def _run(self) -> None:
        held: list[tuple[dict, Future]] = []
        while True:
            first = held.pop(0) if held else self._q.get()
            batch, rows = [first], first[0]["n"]
            deadline = time.monotonic() + self.wait
            while rows < self.batch_size:
                try:
                    item = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if self._key(item[0]) == self._key(first[0]):
                    batch.append(item)
                    rows += item[0]["n"]
                else:
                    held.append(item)  # another setting: its own batch next
            req = first[0]
            extra = {k: req[k] for k in ("temperature", "top_p", "max_tokens", "seed") if k in req}
            try:
                out = self.backend.generate([r["prompt"] for r, _ in batch], req["n"], schema=req["schema"], **extra)
            except Exception as e:  # noqa: BLE001 - every waiting request gets the error
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            for (_, fut), texts in zip(batch, out):
                fut.set_result(texts)


def make_server(backend: Any, host: str = "127.0.0.1", port: int = 8000, *, model_name: str = "default",
                batch_size: int = 16, batch_wait: float = 0.05, timeout: float = 600.0) -> ThreadingHTTPServer:
    """An HTTP server answering OpenAI chat completions with ``backend`` (not started yet); ``ValueError``
    for a host that is not a loopback address."""
    if host not in LOOPBACK:
        raise ValueError(f"host must be a loopback address {LOOPBACK}, got {host!r}: this server has no "
                         "authentication; put a real server (vllm serve, llama_cpp.server) on a network")
    batcher = _Batcher(backend, batch_size, batch_wait)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "oir-gym-serve"

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: one line per error only
            pass

        def _send(self, status: int, obj: dict) -> None:
            data = json.dumps(obj).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "oir-gym"}]})
            elif self.path.rstrip("/") == "/health":
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}: use /v1/models or /v1/chat/completions")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._error(404, f"no route {self.path}: use POST /v1/chat/completions")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0 or length > MAX_BODY:
                self._error(413 if length > MAX_BODY else 400, f"request body must be 0..{MAX_BODY} bytes")
                self.close_connection = True
                return
            try:
                req = parse_request(json.loads(self.rfile.read(length) or b"null"))
            except (ValueError, RecursionError) as e:  # JSONDecodeError and RequestError are ValueErrors
                self._error(400, f"bad request: {e}")
                return
            try:
                texts = batcher.submit(req).result(timeout=timeout)
            except BackendError as e:
                self._error(500, f"generation failed: {e}", "server_error")
                return
            except Exception as e:  # noqa: BLE001 - a 500 with the cause, never a dropped connection
                self._error(500, f"generation failed: {type(e).__name__}: {e}", "server_error")
                return
            count = getattr(backend, "count_tokens", None)
            base = int(count("")) if callable(count) else 0  # <bos>
            p_tok = int(count(req["prompt"])) if callable(count) else 0
            c_toks = [max(0, int(count(t)) - base) if callable(count) else 0 for t in texts]
            limit = req.get("max_tokens") or getattr(backend, "max_tokens", None) or \
                default_max_tokens(*schema_shape(req["schema"]))
            self._send(200, {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
                "created": int(time.time()), "model": model_name,
                "choices": [{"index": i, "message": {"role": "assistant", "content": t},
                             "finish_reason": "length" if c >= limit else "stop"}
                            for i, (t, c) in enumerate(zip(texts, c_toks))],
                "usage": {"prompt_tokens": p_tok, "completion_tokens": sum(c_toks),
                          "total_tokens": p_tok + sum(c_toks)},
            })

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="local model folder, .gguf file or cached hub id "
                                                  "(default: the packaged Gemma 3 270M GGUF)")
    ap.add_argument("--model-name", default=None, help="name served by /v1/models (default: the file / folder name)")
    ap.add_argument("--host", default="127.0.0.1", help=f"one of {LOOPBACK}")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--num-threads", type=int, default=0,
                    help="PyTorch CPU threads per generation (default 0: PyTorch's own setting, all cores)")
    ap.add_argument("--batch-size", type=int, default=16, help="most rows generated together")
    ap.add_argument("--batch-wait", type=float, default=0.05, help="seconds to gather concurrent requests")
    args = ap.parse_args(argv)

    from oir_gym.relabel.backends.transformers import TransformersBackend

    try:
        backend = TransformersBackend(args.model, device=args.device, dtype=args.dtype,
                                      num_threads=args.num_threads or None, batch_size=args.batch_size).load()
        server = make_server(backend, args.host, args.port, batch_size=args.batch_size, batch_wait=args.batch_wait,
                             model_name=args.model_name or os.path.basename(backend.model.rstrip("/")))
    except (FileNotFoundError, ValueError, BackendError, ImportError) as e:
        print(f"oir_gym.relabel.serve: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    host, port = server.server_address[:2]
    url_host = f"[{host}]" if ":" in host else host
    print(f"oir_gym.relabel.serve: {backend.model} on http://{url_host}:{port}/v1", flush=True)
    with server, contextlib.suppress(KeyboardInterrupt):  # the server closes on leaving the block
        server.serve_forever()


if __name__ == "__main__":
    main()
