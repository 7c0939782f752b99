"""The relabeler with the real offline model (Gemma 3 270M Q4_K_M, llama.cpp, 1 thread).

Marked ``llm``; skipped when llama-cpp-python, its server extras or the GGUF package are missing.
"""

from __future__ import annotations

import json

import pytest

from conftest_llm import gguf_path, llama_server  # noqa: F401 - pytest fixtures
from oir_gym.relabel import (
    BackendError, HindsightRelabeler, LlamaCppBackend, OpenAIBackend, load_template, parse_candidates,
)
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def backend(gguf_path):  # noqa: F811
    return LlamaCppBackend(gguf_path, n_threads=1, seed=0)


@pytest.fixture(scope="module")
def encoder():
    from oir_gym.encoder import get_encoder

    return get_encoder()


class Recording:
    """Wraps a backend and keeps its raw completions (to check them without a second generation)."""

    def __init__(self, inner):
        self.inner = inner
        self.raw: list[list[str]] = []

    def generate(self, prompts, n=1, *, schema=None):
        out = self.inner.generate(prompts, n, schema=schema)
        self.raw += out
        return out


class RecordingWithTokenizer(Recording):
    def count_tokens(self, text):
        return self.inner.count_tokens(text)


def test_llama_cpp_segments_parseable(backend, encoder):
    traj = make_trajectory(WOOD_TABLE_PICKAXE, 128)
    rec = RecordingWithTokenizer(backend)
    rl = HindsightRelabeler(backend=rec, k=4, encoder=encoder)
    (res,) = rl.relabel([traj])
    raw = rec.raw[0][0]
    obj = json.loads(raw)  # the grammar guarantees valid JSON with bounded lists
    assert set(obj) == {"Mid-Level", "High-Level"} and 1 <= len(obj["Mid-Level"]) <= 4
    assert parse_candidates(raw)[0], raw
    assert res.error is None and any(c.source == "llm" for c in res.candidates), (raw, res)
    s = rl.stats()
    assert s["calls"] == 1 and s["prompt_token_method"] != "approx-regex" and 50 < s["prompt_tokens"] < 1000
    assert rl.relabel([traj])[0].cache_hit


def test_llama_cpp_paper_template_parseable(backend):
    traj = make_trajectory(WOOD_TABLE_PICKAXE, 8)
    tpl = load_template("paper")
    (raw,) = backend.generate([tpl.render(traj, 2)], n=1, schema=tpl.schema(2))
    obj = json.loads(raw[0])
    assert set(obj) == {"Analysis", "Completed Instructions"}
    assert parse_candidates(raw[0])[0], raw


def test_openai_backend_against_llama_server(llama_server, encoder):  # noqa: F811
    be = OpenAIBackend(llama_server.url, model="gemma", api_key_env=None, timeout=120, max_retries=1, backoff=0.1)
    rec = Recording(be)  # an HTTP backend has no tokenizer: prompt tokens are approximated
    traj = make_trajectory(WOOD_TABLE_PICKAXE, 128)
    rl = HindsightRelabeler(backend=rec, k=4, encoder=encoder, cache_size=0)
    (res,) = rl.relabel([traj])
    raw = rec.raw[0][0]
    cands, reasons = parse_candidates(raw)
    assert cands, (raw, reasons)
    assert res.error is None and any(c.source == "llm" for c in res.candidates)
    # llama_cpp.server rejects OpenAI's json_schema format; the backend stepped down to its own
    assert be.response_format_mode == "json_object"

    # the server goes away: a clear error from the backend, rules fallback in the relabeler
    llama_server.stop()
    with pytest.raises(BackendError, match="cannot connect"):
        be.generate(["p"])
    (res,) = rl.relabel([traj])
    assert res.fallback == "rules" and res.candidates and "cannot connect" in res.error
    assert rl.stats()["errors"] == 1
