"""The real offline model (Gemma 3 270M Q4_K_M) through llama.cpp and through OpenAI-compatible servers.

Marked ``llm``. The llama.cpp tests skip when llama-cpp-python is missing or crashes on this CPU
(probed in a child process); the server test uses ``python -m oir_gym.relabel.serve`` (the
transformers backend, any CPU). The transformers backend itself: ``test_relabel_transformers.py``.
"""

from __future__ import annotations

import json

import pytest

from conftest_llm import gguf_path, llama_gguf_path, llama_server, oir_server  # noqa: F401 - pytest fixtures
from oir_gym.relabel import (
    BackendError, HindsightRelabeler, LlamaCppBackend, OpenAIBackend, load_template, parse_candidates,
)
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from relabel_config import relabel_config

pytestmark = pytest.mark.llm


@pytest.fixture(scope="module")
def backend(llama_gguf_path):  # noqa: F811
    return LlamaCppBackend(llama_gguf_path, n_threads=1, seed=0)


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
    rl = HindsightRelabeler(relabel_config(k=4), llm=rec, encoder=encoder)
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


def _openai_round_trip(url: str, encoder) -> tuple[OpenAIBackend, HindsightRelabeler]:
    be = OpenAIBackend(url, model="gemma", api_key_env=None, timeout=120, max_retries=1, backoff=0.1)
    rec = Recording(be)  # an HTTP backend has no tokenizer: prompt tokens are approximated
    traj = make_trajectory(WOOD_TABLE_PICKAXE, 128)
    rl = HindsightRelabeler(relabel_config(k=4, cache_size=0), llm=rec, encoder=encoder)
    (res,) = rl.relabel([traj])
    raw = rec.raw[0][0]
    cands, reasons = parse_candidates(raw)
    assert cands, (raw, reasons)
    assert res.error is None and any(c.source == "llm" for c in res.candidates)
    return be, rl


def _server_goes_away(server, be: OpenAIBackend, rl: HindsightRelabeler) -> None:
    # the server goes away: a clear error from the backend, rules fallback in the relabeler
    server.stop()
    with pytest.raises(BackendError, match="cannot connect"):
        be.generate(["p"])
    (res,) = rl.relabel([make_trajectory(WOOD_TABLE_PICKAXE, 128)])
    assert res.fallback == "rules" and res.candidates and "cannot connect" in res.error
    assert rl.stats()["errors"] == 1


@pytest.mark.slow  # the offline Gemma behind `oir_gym.relabel.serve` (~30 s); the server itself: test_relabel_transformers
def test_openai_backend_against_oir_server(oir_server, encoder):  # noqa: F811
    be, rl = _openai_round_trip(oir_server.url, encoder)
    # our server takes OpenAI's json_schema response format: no step-down
    assert be.response_format_mode == "json_schema"
    raw = Recording(be)
    (out,) = raw.generate(["Answer with JSON."], 2, schema=load_template("segments").schema(2))
    assert len(out) == 2 and all(set(json.loads(o)) == {"Mid-Level", "High-Level"} for o in out)
    _server_goes_away(oir_server, be, rl)


def test_openai_backend_against_llama_server(llama_server, encoder):  # noqa: F811
    be, rl = _openai_round_trip(llama_server.url, encoder)
    # llama_cpp.server rejects OpenAI's json_schema format; the backend stepped down to its own
    assert be.response_format_mode == "json_object"
    _server_goes_away(llama_server, be, rl)
