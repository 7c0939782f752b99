"""TableEncoder: the rule relabeler's workers answer from one table of embeddings made in the parent
instead of each loading the sentence model (issue 29: the encoder once, not once per worker)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from oir_gym.relabel.encoding import TableEncoder
from oir_gym.relabel.rules import RuleBackend
from oir_gym.relabel.synthetic import random_trajectories, training_run


def test_table_texts_come_from_the_table_and_others_from_the_model_loaded_once(encoder):
    table = TableEncoder.of(encoder, ["collect wood", "place table", "collect wood"])
    assert "collect wood" in table and "eat cow" not in table and not table.loaded
    np.testing.assert_allclose(table.encode(["place table", "collect wood"]),
                               encoder.encode(["place table", "collect wood"]), atol=1e-6)
    assert table.encode("collect wood").shape == (encoder.dim,) and not table.loaded
    got = table.encode(["collect wood", "eat cow", "drink water"])
    np.testing.assert_allclose(got, encoder.encode(["collect wood", "eat cow", "drink water"]), atol=1e-5)
    assert table.loaded and table.misses == 2
    table.encode(["eat cow"])
    assert table.misses == 3


def test_a_pickled_table_travels_without_the_model(encoder):
    table = TableEncoder.of(encoder, ["collect wood"])
    table.encode(["eat cow"])  # loaded here
    copy = pickle.loads(pickle.dumps(table))
    assert not copy.loaded and copy.misses == 0 and "collect wood" in copy
    np.testing.assert_array_equal(copy.encode(["collect wood"]), table.encode(["collect wood"]))
    assert len(pickle.dumps(table)) < 10_000  # a table of one row, not a model


def test_bad_table_shapes_are_refused():
    with pytest.raises(ValueError, match="need embeddings of shape"):
        TableEncoder(["a", "b"], np.zeros((3, 4)))


@pytest.mark.parametrize("oracle", ["canonical", "tasks", "diverse"])
def test_the_rules_vocabulary_holds_every_label_they_give(oracle):
    rules = RuleBackend(oracle=oracle)
    vocab = set(rules.vocabulary())
    trajs = random_trajectories(60, seed=1) + [t for batch in training_run(4, 10, seed=2) for t in batch]
    texts = {text for t in trajs for text in rules.instructions(t)}
    assert texts and texts <= vocab, sorted(texts - vocab)


def test_parallel_rule_relabeling_builds_workers_on_the_table(encoder):
    from agents.run.relabeling import make_rules_relabeler

    parallel = make_rules_relabeler(4, encoder=encoder, workers=2, batch=64)
    try:
        assert parallel.wait_ready(timeout=300)  # else the batch is relabeled in process while they start
        trajs = random_trajectories(80, seed=4)
        local = make_rules_relabeler(4, encoder=encoder)
        got, want = parallel.relabel(trajs), local.relabel(trajs)
        assert parallel.stats()["in_workers"] == 80
        assert [[c.text for c in r.candidates] for r in got] == [[c.text for c in r.candidates] for r in want]
        for r, w in zip(got, want):
            for c, d in zip(r.candidates, w.candidates):
                np.testing.assert_allclose(c.emb, d.emb, atol=1e-5)
                assert (c.first_step, c.grounded) == (d.first_step, d.grounded)
    finally:
        parallel.close()
