"""Fixtures for the tests that run the real offline model (imported by ``test_relabel_llm.py``).

Not a ``conftest.py`` on purpose: only the LLM tests load these, and they skip cleanly when
llama-cpp-python (or its server extras) or the packaged Gemma GGUF are missing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest


def _gguf_or_skip() -> str:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (pip install 'oir-gym[llm]')")
    try:
        from oir_gym.relabel.backends import default_gguf_path

        path = default_gguf_path()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"offline Gemma GGUF unavailable: {e}")
    if not os.path.isfile(path):
        pytest.skip(f"offline Gemma GGUF missing at {path}")
    return path


@pytest.fixture(scope="session")
def gguf_path() -> str:
    return _gguf_or_skip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A ``python -m llama_cpp.server`` subprocess on 127.0.0.1 (started and stopped by the test)."""

    def __init__(self, model: str, port: int, log_path: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/v1"
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
             "--port", str(port), "--n_threads", "1", "--n_ctx", "4096", "--chat_format", "gemma"],
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                handler = urllib.request.ProxyHandler({})
                with urllib.request.build_opener(handler).open(f"{self.url}/models", timeout=2) as r:
                    json.loads(r.read())
                    return
            except OSError:
                time.sleep(0.25)
        raise TimeoutError(f"llama_cpp.server not ready after {timeout}s: {self.log_tail()}")

    def log_tail(self) -> str:
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


@pytest.fixture
def llama_server(gguf_path, tmp_path):
    """A real OpenAI-compatible llama.cpp server with the Gemma model on a free loopback port."""
    pytest.importorskip("fastapi", reason="llama-cpp-python[server] extras not installed")
    pytest.importorskip("uvicorn", reason="llama-cpp-python[server] extras not installed")
    server = LlamaServer(gguf_path, free_port(), str(tmp_path / "llama_server.log"))
    try:
        server.wait_ready()
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()
