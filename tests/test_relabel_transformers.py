"""The transformers backend (the offline default) with the real packaged Gemma 3 270M GGUF.

Marked ``llm``; skipped when the GGUF package or transformers / gguf / accelerate / xgrammar are
missing. The model is loaded once per test process (``tf_backend``); the first load ever on a
machine converts the GGUF (~30-40 s on 2 cores), later loads read the converted copy (~3 s).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
from test_relabel_llm import RecordingWithTokenizer

from conftest_llm import gguf_path, tf_backend  # noqa: F401 - pytest fixtures
from oir_gym.relabel import (
    BackendError, HindsightRelabeler, TransformersBackend, load_template, make_backend, parse_candidates,
)
from oir_gym.relabel.backends import backend_kwargs
from oir_gym.relabel.llm.child import ChildProcessBackend
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from relabel_config import relabel_config

pytestmark = pytest.mark.llm

DRINK_EAT_SLEEP = [(3, "collect_drink"), (10, "attack_cow"), (11, "eat_cow"), (31, "fall_asleep"), (61, "wake_up")]
STONE = [(5, "collect_wood"), (9, "collect_wood"), (12, "place_table"), (14, "make_wood_pickaxe"),
         (40, "collect_stone"), (44, "place_stone")]


@pytest.fixture(scope="module")
def encoder():
    from oir_gym.encoder import get_encoder

    return get_encoder()


def _check_answer(raw: str, k: int) -> list[str]:
    """The answer contract: JSON of the schema, bounded lists, parseable into candidates."""
    obj = json.loads(raw)  # the grammar guarantees valid JSON
    assert set(obj) == {"Mid-Level", "High-Level"}, raw
    assert 1 <= len(obj["Mid-Level"]) <= k and len(obj["High-Level"]) <= k, raw
    cands, reasons = parse_candidates(raw)
    assert cands, (raw, reasons)
    return cands


# ------------------------------------------------------------------------------ bad input (no model load)
def test_missing_model_file_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="GGUF model file not found: .*nope.gguf"):
        TransformersBackend(str(missing))
    with pytest.raises(FileNotFoundError, match="GGUF model file not found"):
        make_backend("transformers", **backend_kwargs("transformers", str(missing)))
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        TransformersBackend(str(tmp_path / "no_such_folder"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        TransformersBackend(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="GGUF model file not found"):
        TransformersBackend(str(tmp_path), gguf_file="missing.gguf")
    with pytest.raises(FileNotFoundError, match="neither a local path nor in the local Hugging Face cache"):
        TransformersBackend("oir-gym-test/no-such-model")  # never downloaded


def test_broken_model_file_is_a_backend_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"this is not a GGUF file" * 10)
    be = TransformersBackend(str(bad), cache_dir=str(tmp_path / "cache"))  # the file exists: checked on load
    with pytest.raises(BackendError, match="cannot load model .*broken.gguf.*not a GGUF file"):
        be.load()
    assert not (tmp_path / "cache").exists() or not os.listdir(tmp_path / "cache")  # nothing half-written


def test_bad_options_are_refused_before_loading():
    with pytest.raises(ValueError, match="grammar=.* is not one of"):
        TransformersBackend(grammar="regex")
    with pytest.raises(ValueError, match="chat_template=.* is not one of"):
        TransformersBackend(chat_template="chatml")
    with pytest.raises(ValueError, match="dtype=.* is not one of"):
        TransformersBackend(dtype="int8")
    with pytest.raises(ValueError, match="num_threads"):
        TransformersBackend(num_threads=0)
    with pytest.raises(ValueError, match="unknown backend 'transformer'.*'transformers'"):
        make_backend("transformer")


def test_backend_kwargs_for_transformers():
    assert backend_kwargs("transformers") == {}  # the packaged Gemma
    assert backend_kwargs("transformers", "/m/x.gguf") == {"model": "/m/x.gguf"}


# ------------------------------------------------------------------------------ real model
def test_relabeler_gets_llm_candidates_for_a_real_trajectory(tf_backend, encoder):
    rec = RecordingWithTokenizer(tf_backend)
    rl = HindsightRelabeler(relabel_config(k=4), llm=rec, encoder=encoder)
    (res,) = rl.relabel([make_trajectory(WOOD_TABLE_PICKAXE, 128)])
    _check_answer(rec.raw[0][0], 4)
    assert res.error is None and any(c.source == "llm" for c in res.candidates), (rec.raw, res)
    s = rl.stats()
    assert s["calls"] == 1 and s["prompt_token_method"] == "model" and 300 < s["prompt_tokens"] < 1000, s


@pytest.mark.slow  # ~12-25 s on 2 shared cores; the server test below batches 3 prompts in the default suite
def test_batched_generation_returns_prompts_x_n_answers(tf_backend):
    tpl = load_template("segments")
    prompts = [tpl.render(make_trajectory(script, 128, seed=i), 2)
               for i, script in enumerate((DRINK_EAT_SLEEP, STONE))]
    out = tf_backend.generate(prompts, n=2, schema=tpl.schema(2))  # 4 rows, one left-padded batch
    assert len(out) == 2 and all(len(o) == 2 for o in out)
    for answers in out:
        for raw in answers:
            _check_answer(raw, 2)
    assert tf_backend.generate([], n=2, schema=tpl.schema(2)) == []


@pytest.mark.slow
def test_a_call_is_reproducible_from_its_seed(tf_backend):
    tpl = load_template("segments")
    prompt = tpl.render(make_trajectory(STONE, 128), 4)
    first = tf_backend.generate([prompt], n=2, schema=tpl.schema(4))
    assert tf_backend.generate([prompt], n=2, schema=tpl.schema(4)) == first
    greedy = tf_backend.generate([prompt], n=1, schema=tpl.schema(4), temperature=0.0)
    _check_answer(greedy[0][0], 4)


@pytest.mark.slow
def test_relabeler_by_name_and_paper_template(encoder, gguf_path):  # noqa: F811
    rl = HindsightRelabeler(relabel_config("transformers", k=4, cache_size=0, use_rules=False), encoder=encoder)
    # by name, the in-process native LLM runs in a child process (its crash cannot end training)
    assert isinstance(rl.backend.llm, ChildProcessBackend) and rl.backend.llm.spec.name == "transformers"
    (res,) = rl.relabel([make_trajectory(DRINK_EAT_SLEEP, 128)])
    assert res.error is None and res.num_scored > 0, res  # the LLM's own instructions (no rules here)
    # the paper's answer shape (analysis + lists) through the same grammar route; with the long
    # per-step prompt the 270M base model's instructions are poor, but the contract holds
    tpl = load_template("paper")
    (raw,) = rl.backend.llm.generate([tpl.render(make_trajectory(WOOD_TABLE_PICKAXE, 8), 2)], schema=tpl.schema(2))
    obj = json.loads(raw[0])
    assert set(obj) == {"Analysis", "Completed Instructions"}, raw
    assert set(obj["Completed Instructions"]) == {"Mid-Level", "High-Level"}, raw
    assert 1 <= len(obj["Completed Instructions"]["Mid-Level"]) <= 2, raw


@pytest.mark.slow
def test_json_schema_grammar_mode(gguf_path):  # noqa: F811
    be = TransformersBackend(gguf_path, grammar="json_schema")
    tpl = load_template("segments")
    (raw,) = be.generate([tpl.render(make_trajectory(WOOD_TABLE_PICKAXE, 128), 4)], schema=tpl.schema(4))
    _check_answer(raw[0], 4)


def _child(kwargs: dict, prompt: str, schema: dict, q) -> None:
    try:
        q.put(make_backend("transformers", **kwargs).generate([prompt], schema=schema))
    except BaseException as e:  # noqa: BLE001 - report to the parent
        q.put(repr(e))


@pytest.mark.slow
def test_constructed_in_a_child_process_from_picklable_kwargs(gguf_path):  # noqa: F811
    # what the child-process worker does: name + plain kwargs cross the process boundary
    kwargs = {**backend_kwargs("transformers", gguf_path), "seed": 0, "num_threads": 1}
    tpl = load_template("segments")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(kwargs, tpl.render(make_trajectory(WOOD_TABLE_PICKAXE, 128), 4),
                                         tpl.schema(4), q))
    p.start()
    out = q.get(timeout=300)
    p.join(30)
    assert isinstance(out, list), out
    _check_answer(out[0][0], 4)


# ------------------------------------------------------------------------------ the local server
def _http(url: str, body=None, method: str = "GET") -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_request_validation_says_what_to_fix():
    from oir_gym.relabel.serve import RequestError, parse_request

    ok = parse_request({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                        "n": 2, "temperature": 0, "max_tokens": 16, "seed": 3,
                        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}})
    assert ok == {"prompt": "Be brief.\n\nHi", "n": 2, "schema": {"type": "object"}, "temperature": 0.0,
                  "max_tokens": 16, "seed": 3}
    assert parse_request({"messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "json_object"}})["schema"] == {"type": "object"}
    user = [{"role": "user", "content": "x"}]
    for body, msg in [
        ([], "JSON object"),
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 3}]}, "content"),
        ({"messages": user, "n": 99}, "'n'"),
        ({"messages": user, "stream": True}, "streaming"),
        ({"messages": user, "temperature": 5}, "temperature"),
        ({"messages": user, "response_format": {"type": "json_schema"}}, "json_schema needs"),
    ]:
        with pytest.raises(RequestError, match=msg):
            parse_request(body)


def test_serve_refuses_non_loopback_hosts(tf_backend):
    from oir_gym.relabel.serve import make_server

    with pytest.raises(ValueError, match="loopback"):
        make_server(tf_backend, "0.0.0.0", 0)


class Counting:
    """Counts the backend calls (to see concurrent requests batched into one)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, n=1, *, schema=None, **kw):
        self.calls.append(len(prompts))
        return self.inner.generate(prompts, n, schema=schema, **kw)

    def count_tokens(self, text):
        return self.inner.count_tokens(text)


def test_serve_answers_batches_concurrent_requests_and_reports_errors(tf_backend):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from oir_gym.relabel.serve import make_server

    be = Counting(tf_backend)
    server = make_server(be, "127.0.0.1", 0, model_name="gemma", batch_wait=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _http(f"{url}/v1/models") == (200, {"object": "list", "data": [
            {"id": "gemma", "object": "model", "created": 0, "owned_by": "oir-gym"}]})
        status, err = _http(f"{url}/v1/chat/completions", b"{not json", "POST")
        assert status == 400 and "bad request" in err["error"]["message"]
        assert _http(f"{url}/v1/completions", {"prompt": "x"}, "POST")[0] == 404
        tpl = load_template("segments")
        body = lambda traj: {  # noqa: E731
            "messages": [{"role": "user", "content": tpl.render(traj, 2)}], "max_tokens": 96,
            "response_format": {"type": "json_schema", "json_schema": {"name": "i", "schema": tpl.schema(2)}}}
        trajs = [make_trajectory(s, 128) for s in (WOOD_TABLE_PICKAXE, DRINK_EAT_SLEEP, STONE)]
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda t: _http(f"{url}/v1/chat/completions", body(t), "POST"), trajs))
        assert be.calls == [3], be.calls  # one batched generation for the three requests
        for status, ans in answers:
            assert status == 200 and ans["object"] == "chat.completion", ans
            _check_answer(ans["choices"][0]["message"]["content"], 2)
            assert ans["usage"]["prompt_tokens"] > 300 and ans["choices"][0]["finish_reason"] == "stop"
    finally:
        server.shutdown()
        server.server_close()
