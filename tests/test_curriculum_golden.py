"""The PQN hindsight step (rows to train on, buffer inserts, bindings, offer counts, metrics) stays
what the golden file recorded (``tests/curriculum_golden.py``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jax")

from curriculum_golden import GOLDEN, SCENARIOS, dumps, run_scenario  # noqa: E402


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_pqn_hindsight_step_matches_its_golden_record(golden, encoder, name):
    got = json.loads(dumps({name: run_scenario(name, encoder)}))[name]
    want = golden[name]
    for u, (g, w) in enumerate(zip(got["updates"], want["updates"])):
        for key in w:
            assert g[key] == w[key], f"{name}, update {u}: {key} differs from the golden record"
    assert got == want
