"""Fixtures for the tests that run the real offline model (imported by the LLM test modules).

Not a ``conftest.py`` on purpose: only the LLM tests load these. They skip cleanly when the
packaged Gemma GGUF or the transformers route (transformers, gguf, accelerate, xgrammar) is
missing; the llama.cpp fixtures also skip when llama-cpp-python is not installed or its build
crashes on this CPU (probed once in a child process, so an illegal instruction cannot end the
test run).
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REBUILD_HINT = ('rebuild it portably: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON '
                '-DGGML_F16C=ON" pip install --no-cache-dir --force-reinstall llama-cpp-python')


def _gguf_or_skip() -> str:
    """Path of the packaged Gemma GGUF, or skip."""
    try:
        from oir_gym.relabel.backends import default_gguf_path

        path = default_gguf_path()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"offline Gemma GGUF unavailable: {e}")
    if not os.path.isfile(path):
        pytest.skip(f"offline Gemma GGUF missing at {path}")
    return path


@functools.lru_cache(maxsize=1)
def _llama_cpp_probe(path: str) -> str:
    """``""`` when llama.cpp generates in a child process, else why not."""
    code = ("import sys; from llama_cpp import Llama; "
            "m = Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, verbose=False); "
            "print(len(m('Hello', max_tokens=4)['choices']))")
    try:
        r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return "llama.cpp generation did not finish in 180 s"
    if r.returncode < 0:
        return f"llama.cpp crashed with {signal.Signals(-r.returncode).name} on this CPU; {REBUILD_HINT}"
    if r.returncode != 0:
        return f"llama.cpp failed: {r.stderr.strip()[-300:]}"
    return ""


def _llama_cpp_or_skip() -> str:
    """GGUF path when llama-cpp-python is installed and works on this CPU, else skip."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (pip install 'oir-gym[llamacpp]')")
    path = _gguf_or_skip()
    why = _llama_cpp_probe(path)
    if why:
        pytest.skip(why)
    return path


@functools.lru_cache(maxsize=1)
def _shared_transformers_backend(path: str):
    from oir_gym.relabel.backends.transformers import TransformersBackend

    return TransformersBackend(path, seed=0).load()


def _transformers_or_skip():
    for mod in ("transformers", "gguf", "accelerate", "xgrammar"):
        pytest.importorskip(mod, reason=f"{mod} not installed (pip install 'oir-gym[llm]')")
    return _gguf_or_skip()


@pytest.fixture(scope="session")
def gguf_path() -> str:
    """The packaged Gemma GGUF, for the transformers route."""
    return _transformers_or_skip()


@pytest.fixture(scope="session")
def llama_gguf_path() -> str:
    """The packaged Gemma GGUF, when llama.cpp works here."""
    return _llama_cpp_or_skip()


@pytest.fixture(scope="session")
def tf_backend(gguf_path):
    """The offline default: TransformersBackend with the packaged Gemma, loaded once per process."""
    return _shared_transformers_backend(gguf_path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """An OpenAI-compatible server subprocess on 127.0.0.1 (started and stopped by the test)."""

    def __init__(self, argv: list[str], log_path: str, url: str = "") -> None:
        self.url = url
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            if not self.url:  # --port 0: the server prints where it listens
                m = re.search(r"on (http://127\.0\.0\.1:\d+/v1)", self.log_tail())
                if m:
                    self.url = m.group(1)
            if self.url:
                try:
                    with opener.open(f"{self.url}/models", timeout=2) as r:
                        json.loads(r.read())
                        return
                except OSError:
                    pass
            time.sleep(0.25)
        raise TimeoutError(f"server not ready after {timeout}s: {self.log_tail()}")

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
        if not self._log.closed:
            self._log.close()


def _started(server: ServerProcess):
    try:
        server.wait_ready()
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture
def oir_server(gguf_path, tmp_path):
    """``python -m oir_gym.relabel.serve`` with the Gemma model on a free loopback port (any CPU)."""
    server = _started(ServerProcess(
        [sys.executable, "-m", "oir_gym.relabel.serve", "--model", gguf_path, "--port", "0", "--model-name", "gemma",
         "--num-threads", "1"],
        str(tmp_path / "oir_server.log")))
    yield server
    server.stop()


@pytest.fixture
def llama_server(llama_gguf_path, tmp_path):
    """A real ``python -m llama_cpp.server`` with the Gemma model (needs llama-cpp-python[server])."""
    pytest.importorskip("fastapi", reason="llama-cpp-python[server] extras not installed")
    pytest.importorskip("uvicorn", reason="llama-cpp-python[server] extras not installed")
    port = free_port()
    server = _started(ServerProcess(
        [sys.executable, "-m", "llama_cpp.server", "--model", llama_gguf_path, "--host", "127.0.0.1",
         "--port", str(port), "--n_threads", "1", "--n_ctx", "4096", "--chat_format", "gemma"],
        str(tmp_path / "llama_server.log"), url=f"http://127.0.0.1:{port}/v1"))
    yield server
    server.stop()
