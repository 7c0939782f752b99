"""Comparing the metrics of two runs of the same seeds on other layouts (devices, processes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest


def read_rows(run_dir: Path) -> list[dict]:
    """A run directory's metrics rows."""
    return [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]


def assert_same_seeds_metrics(a: list[dict], b: list[dict], skip: Callable[[str], bool] = lambda k: False) -> None:
    """Rows of the same seeds on another layout: rollout metrics exact, losses to 1e-4 relative (XLA's
    kernels round a batch of seeds' matmuls and one seed's differently), evaluation successes to
    1/20 (a greedy argmax between near-equal Q-values can flip an episode), the rates pooled over the seeds to
    their rounding (a several-process row averages its processes' rounded rates); wall-clock columns and
    ``skip(key)`` columns are not compared."""
    assert len(a) == len(b)
    for one, two in zip(a, b):
        assert {k for k in one if not k.startswith("time/")} == {k for k in two if not k.startswith("time/")}
        for k, v in one.items():
            if k in ("sps", "time") or k.startswith("time/") or skip(k):
                continue
            if "loss" in k or k == "q_mean":
                assert two[k] == pytest.approx(v, rel=1e-4), k
            elif "/eval/" in f"/{k}" and "success" in k:
                assert abs(two[k] - v) <= 0.05, k
            elif "/eval/" in f"/{k}":
                continue  # counts / aggregate scores follow the success rates
            elif k.startswith(("rate/", "episode_rate/")):
                assert abs(two[k] - v) <= 1e-3, k  # the seeds' pooled rates: processes' rounded rates, averaged
            else:
                assert two[k] == v, k
