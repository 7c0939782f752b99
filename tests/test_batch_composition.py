"""examples/batch_composition.py: per-instruction counts of real OIR update batches add up."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]
from agents.tools import batch_composition  # noqa: E402


def test_counts_of_a_real_oir_iteration_add_up_to_the_batch(tmp_path):
    from agents.pqn.config import TrainConfig
    from agents.pqn.trainer import Trainer

    cfg = TrainConfig().replace(**{**batch_composition.CPU_DEFAULTS, "run.method": "oir", "pqn.num_envs": 8,
                                   "pqn.num_steps": 32, "pqn.num_minibatches": 2, "run.total_timesteps": 8 * 32 * 10,
                                   "oir.k": 2})
    trainer = Trainer(cfg, tmp_path / "run", log=lambda *_: None)
    trainer.init_state()
    try:
        totals: dict[str, Counter] = defaultdict(Counter)
        for _ in range(2):
            trainer.iteration()
            batch_composition.count(trainer, totals)
        b = trainer.last_batch
    finally:
        trainer.close()
    assert sum(c["rollout_steps"] for c in totals.values()) == 2 * 8 * 32
    assert sum(c["relabeled_rows"] for c in totals.values()) > 0
    # the last iteration alone: every rewarded step of a valid row is counted once
    last: dict[str, Counter] = defaultdict(Counter)
    batch_composition.count(trainer, last)
    w = np.asarray(b["weights"])[:, None, :] > 0
    assert sum(c["rewarded_steps"] for c in last.values()) == int(((np.asarray(b["rewards"]) > 0) & w).sum())
    assert sum(c["cut_steps"] for c in last.values()) == int((np.asarray(b["cuts"]) & w).sum())
    assert all(c["successes"] <= c["episodes"] for c in totals.values())
    text = batch_composition.table(totals)
    assert text.splitlines()[0].startswith("| instruction | rollout steps |") and len(text.splitlines()) == 2 + len(totals)


@pytest.mark.parametrize("argv, match", [
    (["--updates", "2", "--skip", "2"], "--skip must be"),
    (["--set", "no_such_field=1"], "unknown config field 'no_such_field'"),
    (["--set", "pqn.no_such_field=1"], r"unknown config field\(s\) \['pqn.no_such_field'\]"),
    (["--set", "pqn.max_grad_norm=-1"], "pqn.max_grad_norm=-1"),
    (["--set", "hidden_size"], "KEY=VALUE"),
])
def test_bad_arguments_get_a_clear_error(argv, match):
    with pytest.raises(SystemExit, match=match):
        batch_composition.main(argv)


def test_reference_files_hold_the_counts_results_doc_cites():
    for name in ("oir", "oir_every_match", "oir_balanced", "cosine"):
        data = json.loads((ROOT / "results" / "reference" / f"batch_composition_{name}.json").read_text())
        assert data["method"] == name.split("_")[0] and data["skip"] == 45 and data["updates"] == 60
        assert sum(c["rollout_steps"] for c in data["counts"].values()) == 15 * 64 * 128
