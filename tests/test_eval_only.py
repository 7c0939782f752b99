"""``--eval-only TAG`` (issues 37.5, 37.14, 39.5): exactly the sets asked for, from the checkpoint it
names, without building anything of training; the run's own files are never replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("jax")

from agents.pqn import recipe  # noqa: E402


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture
def run_copy(smoke_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(smoke_run, dst)
    return dst


def _no_training_parts(monkeypatch) -> None:
    """Building a trainer or a relabeler fails the test: an evaluation must build neither (the only
    fault injected here; every other part is the real one)."""
    from agents.pqn import trainer as oir
    from agents.run import relabeling

    def refuse(*a, **k):
        raise AssertionError("an evaluation built part of training")

    monkeypatch.setattr(oir, "Trainer", refuse)
    monkeypatch.setattr(relabeling, "make_relabeler", refuse)


def test_eval_only_reproduces_the_runs_final_evaluation_from_its_checkpoint(run_copy, capsys, monkeypatch):
    """Named with their flags, the final evaluation's sets give exactly the run's eval_final.json:
    the same network, table, worlds and program, built without the trainer."""
    _no_training_parts(monkeypatch)
    before = _snapshot(run_copy)
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--eval-only", "again",
                           "--eval.final-sets", "heldout", "ordered", "ordered_reverse"]) == 0
    out = capsys.readouterr().out
    ckpt = run_copy / "checkpoints" / "000004"
    assert f"evaluating the checkpoint {ckpt} (update 4, 256 env steps) on the sets original, simple, complex, " \
           "heldout, ordered, ordered_reverse" in out
    assert "resumed" not in out and "compil" not in out
    again = json.loads((run_copy / "eval_again.json").read_text())
    assert again == json.loads((run_copy / "eval_final.json").read_text())
    after = _snapshot(run_copy)
    assert set(after) - set(before) == {"eval_again.json", "eval_again.md"}
    assert all(after[p] == before[p] for p in before)  # config, metrics, eval_final untouched


def test_eval_only_evaluates_a_users_file_on_a_pool_oracle_run_with_a_warning(run_copy, tmp_path, capsys,
                                                                                monkeypatch):
    """Issue 39.5: a diverse-oracle run (its config.json says so; the labels do not change what an
    evaluation reads) and a file holding one of the run's pool wordings: evaluated, with one warning
    naming that text, and only the file's set (an empty --eval.sets)."""
    from oir_gym.relabel.oracle import load_pool

    _no_training_parts(monkeypatch)
    cfg = json.loads((run_copy / "config.json").read_text())
    cfg["oir"].update(oracle="diverse", grounding="bound")
    (run_copy / "config.json").write_text(json.dumps(cfg))
    wording = next(iter(load_pool().owner()))
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"sets": {"mine": [{"text": wording, "achievement": "collect_wood"},
                                                  {"text": "have a drink", "achievement": "collect_drink"}]}}))
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--eval-only", "mine", "--eval.instruction-files", str(mine),
                           "--eval.sets"]) == 0
    cap = capsys.readouterr()
    assert "on the sets mine (1 episode(s) per instruction)" in cap.out
    warnings = [line for line in cap.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"1 of the 2 texts" in warnings[0] and repr(wording) in warnings[0]
    assert "have a drink" not in warnings[0]
    res = json.loads((run_copy / "eval_mine.json").read_text())
    assert set(res[0]) == {"mine"} and res[0]["mine"]["texts"] == [wording, "have a drink"]


@pytest.mark.parametrize("tag, match", [("final", "the run's own final evaluation"),
                                        ("000004", "the run's own periodic evaluation"),
                                        ("a" * 300, "has 300 characters; at most 64")])
def test_eval_only_refuses_the_runs_own_tags_and_long_ones_before_evaluating(run_copy, capsys, tag, match):
    before = _snapshot(run_copy)
    assert recipe.pqn_main(["--run-dir", str(run_copy), "--eval-only", tag]) == 2
    err = capsys.readouterr().err
    assert match in err and "ready after" not in err
    assert _snapshot(run_copy) == before


def test_load_policy_builds_nothing_of_training(run_copy, monkeypatch):
    """``load_policy`` of a diverse-oracle run's folder (issue 39.5): the network and its weights
    only, ready to act."""
    import numpy as np

    from agents.tools.policy import load_policy

    _no_training_parts(monkeypatch)
    cfg = json.loads((run_copy / "config.json").read_text())
    cfg["oir"].update(oracle="diverse", grounding="bound")
    (run_copy / "config.json").write_text(json.dumps(cfg))
    policy = load_policy(run_copy, device="cpu")
    obs = {"obs": np.zeros(policy.obs_dim, np.float32), "instruction": np.zeros(384, np.float32)}
    assert 0 <= policy.act(obs) < 17
