"""The LLM in a child process: crashes, hangs and bad settings never take relabeling down.

The child builds real backend classes by spec (``tests/llm_child_backends.py``, imported in the
child): :class:`SegmentsBackend` does real (tiny) work and is killed with a real SIGKILL; a real
segmentation fault comes from ctypes. An illegal instruction at start-up and a hang cannot be
produced on demand by a real library, so ``SigillAtStart`` and ``HangsInGenerate`` inject them
(as said in their docstrings). Time bounds below only check that nothing hangs (a deadline of
1 s against a hang of an hour), not speed.
"""

from __future__ import annotations

import http.server
import os
import signal
import json
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np
import pytest

from oir_gym.relabel import BackendError, BackendTimeout, HindsightRelabeler
from oir_gym.relabel.synthetic import WOOD_TABLE_PICKAXE, make_trajectory
from oir_gym.relabel.llm.spec import BackendSpec, LLMCheckError, LLMProcessDied, LLMUnavailable, describe_exit
from oir_gym.relabel.llm.child import ChildConfig, ChildProcessBackend
from oir_gym.relabel.llm.health import LLMHealth
from oir_gym.relabel.llm.build import build_llm
from agents.pqn.ellm_proposer import GoalProposer, rule_goals
from conftest_llm import gguf_path  # noqa: F401 - pytest fixture (skips without the offline model)
from relabel_config import relabel_config

SEGMENTS = "llm_child_backends:SegmentsBackend"
FAST = ChildConfig(backoff=0.05, max_backoff=0.2, grace=2.0)


def traj(shift: int = 0, seed: int = 0):
    return make_trajectory([(t + shift, e) for t, e in WOOD_TABLE_PICKAXE], 64, seed=seed)


def obs(facing: str) -> str:
    return f"Facing: {facing}; Nearby: nothing; Inventory: empty; Status: health 9, food 9, drink 9, energy 9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


# ------------------------------------------------------------------------------------- the child itself
def test_child_answers_like_the_backend_and_names_its_identity():
    with ChildProcessBackend(SEGMENTS, config=FAST) as llm:
        out = llm.generate(["Segments:\n0-4: move\n5: collect wood\n6: place table"], 2)
        assert out == [['{"Mid-Level": ["collect wood", "place table"], "High-Level": []}'] * 2]
        assert llm.identity == "SegmentsBackend:segments-echo" and llm.token_method == "words"
        assert llm.count_tokens("three words here") == 3
        assert llm.pid is not None and llm.pid != os.getpid()
        pid = llm.pid
    assert llm.pid is None
    with pytest.raises(ProcessLookupError):  # closed means gone, not a zombie left running
        os.kill(pid, 0)


def test_sigkill_mid_call_fails_that_call_then_restarts_after_the_backoff():
    llm = ChildProcessBackend(SEGMENTS, {"delay": 0.5}, config=ChildConfig(backoff=0.5, grace=2.0))
    llm.generate(["Segments:\n1: collect wood"])  # up and answering
    pid = llm.pid
    threading.Timer(0.2, os.kill, (pid, signal.SIGKILL)).start()  # lands inside the 0.5 s call
    with pytest.raises(LLMProcessDied, match="SIGKILL"):
        llm.generate(["Segments:\n1: collect wood"])
    with pytest.raises(LLMUnavailable, match=r"LLM down .*SIGKILL.*restarting in"):  # within the backoff: fail fast
        llm.generate(["Segments:\n1: collect wood"])
    time.sleep(0.6)
    assert llm.generate(["Segments:\n1: collect wood"]) == [['{"Mid-Level": ["collect wood"], "High-Level": []}']]
    s = llm.stats()
    assert s["restarts"] == 1 and s["child_deaths"] == {"SIGKILL": 1} and llm.pid not in (None, pid)
    assert s["seconds_without_llm"] > 0.5 and not s["down"]
    llm.close()


def test_a_real_segfault_in_the_library_is_named_with_the_portable_rebuild():
    llm = ChildProcessBackend("llm_child_backends:SegfaultsInGenerate", config=FAST)
    with pytest.raises(LLMProcessDied) as err:
        llm.generate(["anything"])
    assert "SIGSEGV" in str(err.value) and "GGML_NATIVE=OFF" in str(err.value)
    assert llm.stats()["child_deaths"] == {"SIGSEGV": 1}
    llm.close()


def test_a_hung_child_is_killed_at_its_deadline_and_the_call_returns():
    llm = ChildProcessBackend("llm_child_backends:HangsInGenerate",
                              config=ChildConfig(timeout=1.0, per_prompt_timeout=0.0, backoff=0.05, grace=2.0))
    llm.count_tokens  # noqa: B018 - attribute only; the child starts in the constructor
    t0 = time.monotonic()
    with pytest.raises(BackendTimeout, match="deadline"):
        llm.generate(["anything"])
    assert time.monotonic() - t0 < 30  # the child sleeps for an hour
    assert llm.stats()["child_deaths"] == {"hang": 1} and llm.pid is None
    llm.close()


def test_close_does_not_wait_on_a_child_stuck_in_a_call():
    llm = ChildProcessBackend("llm_child_backends:HangsInGenerate",
                              config=ChildConfig(timeout=3600, grace=1.0))
    errors: list = []

    def call():
        try:
            llm.generate(["anything"])
        except BackendError as e:
            errors.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: llm.stats()["calls"] == 1, "the call to start")
    pid = llm.pid
    t0 = time.monotonic()
    llm.close()
    caller.join(30)
    assert time.monotonic() - t0 < 30 and not caller.is_alive()
    assert len(errors) == 1 and "closed" in str(errors[0])
    wait_for(lambda: _gone(pid), "the child to be gone", 10)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie until its parent reaps it: gone all the same
        return f.read().split(")")[-1].split()[0] == "Z"


def test_exit_causes_are_named():
    assert describe_exit(-signal.SIGILL)[0] == "SIGILL" and "rebuild llama-cpp-python" in describe_exit(-4)[1]
    assert "out-of-memory" in describe_exit(-signal.SIGKILL)[1]
    assert describe_exit(3) == ("exit 3", describe_exit(3)[1]) and "code 3" in describe_exit(3)[1]


def test_native_backends_run_in_a_child_unless_opted_out():
    child = build_llm(SEGMENTS)
    assert isinstance(child, ChildProcessBackend)
    child.close()
    local = build_llm(SEGMENTS, isolate=False)
    assert type(local).__name__ == "SegmentsBackend"
    http_client = build_llm("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert type(http_client).__name__ == "OpenAIBackend"  # HTTP only: no child
    assert build_llm("rules") is None
    spec = BackendSpec(SEGMENTS, {"delay": 0.0})
    assert isinstance(build_llm(spec), ChildProcessBackend)


def test_a_script_without_a_main_guard_runs_once_and_exits_with_a_hung_child(tmp_path):
    """The child is a fresh interpreter that does not re-run the caller's script (multiprocessing's
    "spawn" would, and fail); at exit a child stuck in a call is stopped, not waited for."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from oir_gym.relabel.llm.child import ChildProcessBackend, ChildConfig\n"
        "print('script body ran', flush=True)\n"
        f"ok = ChildProcessBackend({SEGMENTS!r})\n"
        "print(ok.generate(['Segments:\\n1: collect wood'])[0][0], flush=True)\n"
        "import threading\n"
        "hung = ChildProcessBackend('llm_child_backends:HangsInGenerate', config=ChildConfig(timeout=3600))\n"
        "threading.Thread(target=hung.generate, args=(['x'],), daemon=True).start()\n"
        "import time; time.sleep(1.0)\n"
        "print(hung.pid, flush=True)\n")
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(here), here])}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["script body ran", '{"Mid-Level": ["collect wood"], "High-Level": []}'] and len(lines) == 3
    assert time.monotonic() - t0 < 60  # not the hung call's hour
    wait_for(lambda: _gone(int(lines[2])), "the hung child to be stopped at exit", 10)


# ------------------------------------------------------------------------------------- the relabeler
def test_async_relabeling_survives_a_sigkilled_child(encoder):
    """Done-when (a): every batch completes; stats show the death, the restart and the rules."""
    rl = HindsightRelabeler(relabel_config(SEGMENTS, backend_kwargs={"delay": 0.3}, use_rules=False, cache_size=0,
                                           on_full="block", queue_size=32,
                                           child_config=ChildConfig(backoff=0.3, grace=2.0)), encoder=encoder)
    ids = []
    for i in range(4):
        ids += rl.submit([traj(i)])
    wait_for(lambda: rl.stats()["completed"] >= 2, "two answered batches")
    os.kill(rl.backend.llm.pid, signal.SIGKILL)  # a real fault: the live child dies mid-run
    for i in range(4, 10):
        ids += rl.submit([traj(i)])
    out = rl.collect(block=True, timeout=120)
    assert sorted(r.request_id for r in out) == ids  # nothing lost
    assert all(r.candidates for r in out)
    by_rules = [r for r in out if r.fallback == "rules"]
    assert by_rules and all("SIGKILL" in r.error for r in by_rules)
    assert all(c.source == "rules" for r in by_rules for c in r.candidates)
    assert [c.source for c in out[0].candidates][0] == "llm"
    time.sleep(0.4)  # past the backoff: the next batch restarts the child
    (late,) = rl.relabel([traj(20)])
    assert late.error is None and late.candidates[0].source == "llm"
    s = rl.stats()
    assert s["restarts"] == 1 and s["child_deaths"] == {"SIGKILL": 1}
    assert s["fallbacks"] == len(by_rules) and s["errors"] == len(by_rules) and s["failed_calls"] >= 1
    assert s["down_seconds"] > 0 and s["llm_down"] == 0 and 0 < s["share"] < 1
    rl.close()


def test_sigill_at_start_relabels_with_rules_and_says_why_once(encoder, capsys):
    """Done-when (b): the child dies with SIGILL at once; complete results on rules, one message."""
    rl = HindsightRelabeler(relabel_config("llm_child_backends:SigillAtStart", use_rules=False, cache_size=0,
                                           on_full="block", child_config=ChildConfig(backoff=0.05, max_backoff=0.1)),
                            encoder=encoder)
    ids = []
    for i in range(6):
        ids += rl.submit([traj(i, seed=i)])
    out = rl.collect(block=True, timeout=120)
    assert sorted(r.request_id for r in out) == ids
    assert all(r.fallback == "rules" and r.instructions[:2] == ["collect wood", "place table"] for r in out)
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, err
    assert "SIGILL" in warnings[0] and "GGML_NATIVE=OFF" in warnings[0] and "transformers backend" in warnings[0]
    s = rl.stats()
    assert s["child_deaths"].get("SIGILL", 0) >= 1 and s["errors"] == 6 and s["share"] == 0.0
    assert s["llm_warnings"] == 1 and s["llm_down"] == 1
    rl.close()


def test_a_hung_child_is_abandoned_and_relabel_answers_with_rules(encoder):
    """Done-when (c): the call returns after the deadline with rule instructions."""
    rl = HindsightRelabeler(relabel_config("llm_child_backends:HangsInGenerate", use_rules=False, llm_timeout=1.0),
                            encoder=encoder)
    t0 = time.monotonic()
    (res,) = rl.relabel([traj()])
    assert time.monotonic() - t0 < 30  # the child sleeps for an hour
    assert res.fallback == "rules" and "deadline" in res.error and res.candidates
    assert rl.stats()["child_deaths"] == {"hang": 1} and rl.stats()["errors_by_type"] == {"BackendTimeout": 1}
    rl.close()


def test_close_kills_a_child_that_stopped_answering_without_dying(encoder):
    """A real SIGSTOP after a few answers: the child is alive but silent, the worker waits in a call
    with an hour's deadline and the next batch waits in the trainer's full queue (one slot, newer
    rollouts replace older ones). close() returns within its bound and the child is gone."""
    grace = 1.0
    rl = HindsightRelabeler(relabel_config(SEGMENTS, use_rules=False, cache_size=0, on_full="replace", queue_size=1,
                                           child_config=ChildConfig(timeout=3600, grace=grace)), encoder=encoder)
    pid = None
    try:
        for i in range(3):
            (res,) = rl.relabel([traj(i)])
            assert res.error is None and res.candidates[0].source == "llm"
        pid, calls = rl.backend.llm.pid, rl.backend.llm.stats()["calls"]
        os.kill(pid, signal.SIGSTOP)
        rl.submit([traj(10)])
        wait_for(lambda: rl.backend.llm.stats()["calls"] > calls, "the worker's call to the stopped child")
        rl.submit([traj(11)])  # waits in the full queue
        t0 = time.monotonic()
        closing = threading.Thread(target=rl.close, kwargs={"timeout": 1.0}, daemon=True)
        closing.start()
        closing.join(1.0 + 3 * grace + 1.0 + 10)  # close's documented bound, with slack
        assert not closing.is_alive(), "close() waited on the stopped child"
        assert time.monotonic() - t0 >= 0.9
        wait_for(lambda: _gone(pid), "the stopped child to be killed", 10)
        assert rl.pending == 0 and rl.stats()["closed_in_flight"] == 2
    finally:
        if pid is not None and not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_garbage_answers_count_as_errors_fall_back_to_rules_and_warn_once(encoder, capsys):
    class Babbler:
        """Fault injection: a model that only talks nonsense (real small models do, not on demand)."""

        def generate(self, prompts, n=1, *, schema=None):
            return [["I like trains."] * n for _ in prompts]

    rl = HindsightRelabeler(relabel_config(use_rules=False, cache_size=0, warn_after=3), llm=Babbler(), encoder=encoder)
    results = [rl.relabel([traj(i)])[0] for i in range(5)]
    assert all(r.fallback == "rules" and r.error.startswith("UnusableAnswer") for r in results)
    s = rl.stats()
    assert s["errors"] == 5 and s["errors_by_type"] == {"UnusableAnswer": 5} and s["failed_calls"] == 5
    assert len(rl.cache) == 0  # asked again next time
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "3 call(s) in a row" in warnings[0] and "instruction-tuned" in warnings[0]


def test_a_model_that_fails_most_prompts_is_warned_about_once_and_its_errors_are_counted(encoder, capsys):
    class MostlyBabbler:
        """Fault injection: answers only the first prompt of each call, babbles on the others (as a
        small model did on long GPU prompts; not reproducible on demand with a real one)."""

        def generate(self, prompts, n=1, *, schema=None):
            good = json.dumps({"Mid-Level": ["collect wood"], "High-Level": []})
            return [[good if i == 0 else "I like trains."] * n for i in range(len(prompts))]

    rl = HindsightRelabeler(relabel_config(use_rules=False, cache_size=0, warn_after=3), llm=MostlyBabbler(),
                            encoder=encoder)
    scripts = [[(5, "collect_wood")], [(5, "collect_sapling")], [(5, "collect_drink")]]  # 3 distinct prompts
    for call in range(4):  # 4 calls of 3 prompts: each call has a good answer, so none is an outage
        rl.relabel([make_trajectory(sc, 32, seed=call) for sc in scripts])
    s = rl.stats()
    assert s["failed_calls"] == 0 and s["errors"] == 8 and s["errors_by_type"] == {"UnusableAnswer": 4}  # by call
    assert s["error_examples"]["UnusableAnswer"].startswith("UnusableAnswer: nothing usable in the LLM's answer")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "6 of 9 LLM answers in the last 3 calls were unusable" in warnings[0]
    assert "UnusableAnswer" in warnings[0] and s["llm_warnings"] == 1


def test_answer_quality_warning_needs_a_majority_of_bad_answers_and_rearms_after_a_recovery():
    lines: list[str] = []
    h = LLMHealth("relabeler", warn_after=2, report=lines.append)
    for _ in range(5):
        h.answers(4, 1, "UnusableAnswer: x")  # a quarter: no warning
    assert lines == []
    h.answers(4, 3, "UnusableAnswer: x")
    h.answers(4, 4, "BackendError: y")
    assert len(lines) == 1 and "7 of 8" in lines[0] and "BackendError: y" in lines[0]
    h.answers(4, 3, "BackendError: y")
    assert len(lines) == 1  # once per bad spell
    h.answers(4, 0)
    h.answers(4, 0)  # recovered over a whole window
    h.answers(4, 3, "UnusableAnswer: z")
    h.answers(4, 4, "UnusableAnswer: z")
    assert len(lines) == 2 and h.stats()["warnings"] == 2
    h.answers(4, 4, "UnusableAnswer: z")
    h.answers(4, 4, "UnusableAnswer: z")  # nothing answered: an outage, failed()'s warning
    assert len(lines) == 2
    h.answers(0, 0)  # a call without prompts changes nothing
    assert len(lines) == 2


def test_health_warns_once_per_outage_and_again_after_a_recovery():
    lines: list[str] = []
    h = LLMHealth("relabeler", warn_after=2, report=lines.append)
    for _ in range(5):
        h.failed("BackendError: server at http://x/v1 failed after 3 attempt(s): cannot connect")
    assert len(lines) == 1 and "start the LLM server" in lines[0]
    h.ok()
    assert len(lines) == 2 and "answers again" in lines[1]
    h.failed("BackendTimeout: timed out")
    assert len(lines) == 2  # one failure is not an outage yet
    h.failed("BackendTimeout: timed out")
    assert len(lines) == 3 and "too slow" in lines[2]
    assert h.stats()["outages"] == 2 and h.stats()["warnings"] == 2 and h.down_seconds() > 0
    h.failed("could not build the LLM backend", permanent=True)  # already warned for this outage
    assert len(lines) == 3


# ------------------------------------------------------------------------------------- bad input
def test_wrong_backend_names_fail_at_construction(encoder):
    with pytest.raises(ValueError, match="unknown backend 'lama_cpp'"):
        HindsightRelabeler(relabel_config("lama_cpp"), encoder=encoder)
    with pytest.raises(ValueError, match="no module 'no_such_module'"):
        HindsightRelabeler(relabel_config("no_such_module:Backend"), encoder=encoder)
    rl = HindsightRelabeler(relabel_config("llm_child_backends:NoSuchClass"), encoder=encoder)
    with pytest.raises(LLMCheckError, match="cannot import 'NoSuchClass'"):
        rl.check_llm()
    rl.close()


def test_missing_or_broken_model_file_is_one_clear_line(encoder, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed")
    rl = HindsightRelabeler(relabel_config("llama_cpp", backend_kwargs={"model_path": str(tmp_path / "none.gguf")}),
                            encoder=encoder)
    with pytest.raises(LLMCheckError) as err:
        rl.check_llm()
    msg = str(err.value)
    assert "\n" not in msg and "GGUF model not found" in msg and "Fix: fix the model path" in msg
    rl.close()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(4096))
    rl = HindsightRelabeler(relabel_config("llama_cpp", backend_kwargs={"model_path": str(broken)}), encoder=encoder)
    with pytest.raises(LLMCheckError, match="(?s)broken.gguf.*Fix:"):
        rl.check_llm()
    rl.close()


def test_unreachable_server_and_a_server_that_is_not_an_llm(encoder, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    rl = HindsightRelabeler(relabel_config("openai", backend_kwargs={"base_url": url, "max_retries": 0}),
                            encoder=encoder)
    with pytest.raises(LLMCheckError, match="cannot connect.*Fix: start the LLM server"):
        rl.check_llm()
    # a real web server that is no LLM server: a static file server
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        rl = HindsightRelabeler(relabel_config("openai", backend_kwargs={"base_url": url, "max_retries": 0}),
                                encoder=encoder)
        with pytest.raises(LLMCheckError, match="HTTP 404.*an OpenAI-compatible LLM server") as err:
            rl.check_llm()
        assert "\n" not in str(err.value)  # the server's HTML page, flattened
    finally:
        server.shutdown()


def test_trainer_factory_stops_on_a_broken_llm_or_warns_with_both(capsys):
    from agents.pqn.config import preset
    from agents.pqn.trainer import make_relabeler

    cfg = preset("smoke").replace(**{"run.method": "oir", "oir.relabeler": "llm",
                                     "llm.backend": "llm_child_backends:SigillAtStart"})
    with pytest.raises(RuntimeError, match="--oir.relabeler llm: .*SIGILL.*--oir.relabeler rules") as err:
        make_relabeler(cfg)
    assert "\n" not in str(err.value)
    both = make_relabeler(cfg.replace(**{"oir.relabeler": "both"}))
    err = capsys.readouterr().err
    assert "WARNING: --oir.relabeler both" in err and "SIGILL" in err and "relabeling with rules" in err
    (res,) = both.relabel([traj()])  # the rules answer at once; the LLM half's failure adds nothing
    assert res.candidates and {c.source for c in res.candidates} == {"rules"}
    (llm,) = both.collect(block=True, timeout=60)
    assert llm.error is not None and llm.candidates == []
    both.close()


# ------------------------------------------------------------------------------------- the ELLM proposer
def test_proposer_in_a_child_survives_sigkill_and_counts_it():
    prop = GoalProposer(SEGMENTS, k=2, cache_size=0, child_config=ChildConfig(backoff=0.2, grace=2.0))
    assert prop.check_llm() is not None
    assert prop.propose([obs("tree")]) == [["collect wood"]]
    os.kill(prop.llm.pid, signal.SIGKILL)
    assert prop.propose([obs("water")]) == [rule_goals(obs("water"), 2)]  # the dead child: rules
    time.sleep(0.3)
    assert prop.propose([obs("water")]) == [["drink water"]]  # restarted
    s = prop.stats()
    assert s["llm_restarts"] == 1 and s["llm_child_deaths"] == {"SIGKILL": 1} and s["llm_errors"] == 1
    assert s["llm_down"] == 0 and s["llm_down_seconds"] > 0
    prop.close()


def test_proposer_with_a_crashing_llm_proposes_rule_goals_and_warns(capsys):
    prop = GoalProposer("llm_child_backends:SigillAtStart", k=2, cache_size=0,
                        child_config=ChildConfig(backoff=0.05, max_backoff=0.1))
    with pytest.raises(LLMCheckError, match="SIGILL"):
        prop.check_llm()
    texts = [obs("tree"), obs("cow")]
    for _ in range(4):
        assert prop.propose(texts) == [rule_goals(t, 2) for t in texts]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "ELLM proposer" in warnings[0] and "SIGILL" in warnings[0]
    prop.close()


# ------------------------------------------------------------------------------------- training
@pytest.mark.slow
def test_training_whose_llm_child_is_killed_completes_every_update(tmp_path):
    """Done-when (a) on the real trainer: a SIGKILLed LLM child costs no update; the metrics show
    the failed LLM call and the restart (the relabeler test above checks the rules fallback)."""
    pytest.importorskip("jax")
    from agents.pqn.trainer import Trainer
    from test_train_pqn import tiny

    cfg = tiny(**{"oir.relabeler": "llm", "llm.backend": SEGMENTS, "run.total_timesteps": 4 * 16 * 8,
                  "llm.per_update": 2})
    tr = Trainer(cfg, tmp_path, log=lambda s: None)  # make_relabeler checks the LLM with one real call
    tr.init_state()
    logs = [tr.iteration() for _ in range(3)]
    wait_for(lambda: tr.method.relabeler.pending == 0, "the first LLM answers")
    os.kill(tr.method.relabeler.backend.llm.pid, signal.SIGKILL)
    logs.append(tr.iteration())  # its LLM call finds the child dead
    wait_for(lambda: tr.method.relabeler.stats()["child_deaths"], "the death to be noticed")
    time.sleep(0.6)  # past the first restart backoff (0.5 s)
    while tr.update_idx < cfg.num_updates:
        logs.append(tr.iteration())
    wait_for(lambda: tr.method.relabeler.pending == 0, "the last LLM answers")
    assert [log.update for log in logs] == list(range(1, cfg.num_updates + 1))
    last = logs[-1].metrics
    assert last["relabel/llm_restarts"] >= 1 and last["relabel/llm_errors"] > logs[2].metrics["relabel/llm_errors"]
    assert 0 < last["relabel/llm_share"] < 1 and last["relabel/llm_down_seconds"] > 0
    assert all(np.isfinite(log.metrics["loss"]) for log in logs)
    s = tr.method.relabeler.stats()
    assert s["child_deaths"] == {"SIGKILL": 1}
    # the LLM call after the kill failed on the dead child (a rules fallback where rules had anything)
    assert {"LLMProcessDied", "LLMUnavailable"} & set(s["errors_by_type"])
    # the metrics name the failures by type (what a GPU run with a failing model left unexplained)
    typed = {k.rsplit("/", 1)[-1]: v for k, v in last.items() if k.startswith("relabel/llm_errors/")}
    assert {"LLMProcessDied", "LLMUnavailable"} & set(typed)
    assert all(0 < v <= s["errors_by_type"][k] for k, v in typed.items())  # counts up to now
    report = tr.method.llm_report()  # what train_pqn.py writes under diversity.json's "llm"
    assert report["errors_by_type"] == s["errors_by_type"] and set(report["error_examples"]) == set(s["errors_by_type"])
    assert report["calls"] == s["calls"] and report["stale"] >= 0
    # this backend names the events it reads, never the prompt's example answers
    div = tr.method.diversity()
    assert div["diversity/llm_instructions"] > 0 and div["diversity/llm_echo_share"] == 0.0
    tr.close()


def _llm_child_of(pid: int) -> Optional[int]:
    """The process id of the LLM child that process ``pid`` started (None while there is none)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"_child_entry" in cmdline:
            return int(entry)
    return None


@pytest.mark.slow
@pytest.mark.llm
def test_train_pqn_exits_with_its_outputs_when_its_llm_child_is_stopped_mid_run(tmp_path, gguf_path):
    """The offline default LLM (transformers with the packaged Gemma, in its child process) gets a
    real SIGSTOP after two updates: it never answers again but does not die, and a call's deadline
    is an hour (``--llm.call-timeout 3600``, as for a slow model). The run still finishes, writes
    its final outputs and exits soon after its last update; the stopped child is killed."""
    pytest.importorskip("jax")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = tmp_path / "run"
    cmd = [sys.executable, os.path.join(root, "examples", "train_pqn.py"), "smoke", "--run-dir", str(run),
           "--no-progress", "--eval.horizon", "4", "--run.total-timesteps", str(4 * 16 * 8),
           "--oir.relabeler", "both", "--llm.backend", "transformers", "--llm.call-timeout", "3600"]
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=root)
    child = None
    last = None
    limit = threading.Timer(840, proc.kill)  # a hung run fails the test instead of hanging it
    limit.start()
    try:
        for line in proc.stdout:
            if line.startswith("[    2/8]") and child is None:
                child = _llm_child_of(proc.pid)
                assert child is not None, "no LLM child found"
                os.kill(child, signal.SIGSTOP)
            if line.startswith("[    8/8]"):
                last = time.monotonic()
        rc = proc.wait(60)
    finally:
        limit.cancel()
        if proc.poll() is None:
            proc.kill()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)
    assert rc == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    assert child is not None and last is not None
    assert time.monotonic() - last < 120  # close's bound and the plots, not the hour
    for name in ("eval_final.md", "metrics.csv", "training.png", "learning_curves.png", "complete.json"):
        assert (run / name).exists(), name
    wait_for(lambda: _gone(child), "the stopped child to be killed", 10)
