"""ParallelRelabeler: the rule relabeler over worker processes gives the in-process results."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import time

import numpy as np
import pytest

from oir_gym.relabel import HindsightRelabeler
from oir_gym.relabel.parallel import ParallelRelabeler, default_workers
from oir_gym.relabel.synthetic import random_trajectories
from relabel_config import relabel_config


def _summary(results):
    return [[(c.text, c.source, c.first_step, c.grounded, c.binding) for c in r.candidates] for r in results]


# bound under -m slow: ~25 s each on 2 cores (worker processes loading the encoder); cosine covers the pool
@pytest.mark.parametrize("grounding", ["cosine", pytest.param("bound", marks=pytest.mark.slow)])
def test_workers_give_the_in_process_results_in_order_with_the_callers_trajectories(grounding):
    trajs = random_trajectories(96, 64, seed=3, texts=False)
    kw = dict(k=4, delta=0.9, grounding=grounding)
    ref = HindsightRelabeler.rules(**kw).relabel(trajs)
    with ParallelRelabeler(functools.partial(HindsightRelabeler.rules, **kw), workers=2, min_batch=64) as par:
        assert par.wait_ready(timeout=300)
        got = par.relabel(trajs)
        again = par.relabel(trajs[:10])  # below min_batch: in process
        stats = par.stats()
        assert stats.pop("ready_s") > 0 and stats == {"workers": 2, "in_workers": 96, "in_process": 10}
    assert _summary(got) == _summary(ref)
    assert sum(len(r.candidates) for r in got) > 96  # the comparison is not between empty lists
    for r, t, r0 in zip(got, trajs, ref):
        assert r.trajectory is t  # the caller's objects, not copies from the workers
        for c, c0 in zip(r.candidates, r0.candidates):
            # the encoder batches texts differently in each process: floats agree to rounding
            np.testing.assert_allclose(c.emb, c0.emb, atol=1e-5)
            np.testing.assert_allclose(c.final_row, c0.final_row, atol=1e-5)
            np.testing.assert_allclose(c.pre_row, c0.pre_row, atol=1e-5)
    assert [r.request_id for r in got] == list(range(96))
    assert _summary(again) == _summary(ref[:10])


class _GatedFactory:
    """Injected delay: builds the real rule relabeler (on a table of the rules' texts, as the
    trainer's workers do), but in a worker process only once the file ``gate`` exists (at most
    120 s), so that the test decides when the workers are ready; a real start takes seconds, too
    few to rely on."""

    def __init__(self, gate: str, table):
        self.gate, self.table = gate, table

    def __call__(self):
        if multiprocessing.parent_process() is not None:
            deadline = time.monotonic() + 120
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.05)
        from agents.run.relabeling import relabeler_config

        return HindsightRelabeler(relabeler_config("rules", k=4), encoder=self.table)


def test_a_batch_while_the_workers_start_is_relabeled_in_process_as_the_workers_relabel_it(tmp_path, encoder):
    from oir_gym.relabel.encoding import TableEncoder
    from oir_gym.relabel.rules import RuleBackend

    gate = tmp_path / "workers-may-start"
    trajs = random_trajectories(80, 64, seed=5, texts=False)
    table = TableEncoder.of(encoder, RuleBackend().vocabulary())
    before = set(multiprocessing.active_children())
    par = ParallelRelabeler(_GatedFactory(str(gate), table), workers=2, min_batch=64)
    try:
        early = par.relabel(trajs)  # the workers wait at the gate, this batch does not wait for them
        assert par.stats() == {"workers": 2, "in_process_warming": 80}
        assert not par.wait_ready(timeout=0.1)
        gate.touch()
        assert par.wait_ready(timeout=300)
        # both workers started at construction: none starts (and blocks) in a later batch
        assert len(set(multiprocessing.active_children()) - before) == 2
        late = par.relabel(trajs)
        stats = par.stats()
    finally:
        par.close()
    assert stats.pop("ready_s") > 0 and stats == {"workers": 2, "in_process_warming": 80, "in_workers": 80}
    assert _summary(early) == _summary(late)
    assert sum(len(r.candidates) for r in early) > 80  # the comparison is not between empty lists
    for r, r0, t in zip(early, late, trajs):
        assert r.trajectory is t and r0.trajectory is t
        for c, c0 in zip(r.candidates, r0.candidates):
            np.testing.assert_allclose(c.emb, c0.emb, atol=1e-5)
            np.testing.assert_allclose(c.final_row, c0.final_row, atol=1e-5)
    # one numbering over the batches, wherever they were relabeled
    assert [r.request_id for r in early + late] == list(range(160))


class _ReportsItsJax:
    """Builds the real rule relabeler; in a worker it first writes the worker's ``JAX_PLATFORMS``
    and JAX backend to a file of ``folder`` (what the test reads)."""

    def __init__(self, folder: str, table):
        self.folder, self.table = folder, table

    def __call__(self):
        if multiprocessing.parent_process() is not None:
            import jax

            with open(os.path.join(self.folder, f"worker{os.getpid()}.txt"), "w") as f:
                f.write(f"{os.environ.get('JAX_PLATFORMS')} {jax.default_backend()}")
        from agents.run.relabeling import relabeler_config

        return HindsightRelabeler(relabeler_config("rules", k=4), encoder=self.table)


def test_workers_run_jax_on_the_cpu_and_the_callers_environment_is_left_as_it_was(tmp_path, encoder):
    """Importing the package initialises JAX's default backend: a worker on a GPU machine would open
    a CUDA context for nothing. Workers start with ``JAX_PLATFORMS=cpu``; the caller's environment
    does not keep it."""
    from oir_gym.relabel.encoding import TableEncoder
    from oir_gym.relabel.rules import RuleBackend

    before = os.environ.get("JAX_PLATFORMS")
    table = TableEncoder.of(encoder, RuleBackend().vocabulary())
    par = ParallelRelabeler(_ReportsItsJax(str(tmp_path), table), workers=2, min_batch=1)
    try:
        assert par.wait_ready(timeout=300)
    finally:
        par.close()
    reports = sorted(p.read_text() for p in tmp_path.glob("worker*.txt"))
    assert reports == ["cpu cpu", "cpu cpu"]
    assert os.environ.get("JAX_PLATFORMS") == before


class _DiesInWorker:
    """Fault injection: a relabeler that ends its process when it runs in a worker (a real process
    death, which a healthy relabeler cannot be made to produce on demand)."""

    def __init__(self):
        self.inner = HindsightRelabeler(relabel_config("rules", k=2, delta=0.9, cache_size=0))

    def relabel(self, trajs):
        if multiprocessing.parent_process() is not None:
            os._exit(3)
        return self.inner.relabel(trajs)


def test_a_dead_worker_warns_once_and_the_batch_is_relabeled_in_process():
    trajs = random_trajectories(64, 32, seed=1, texts=False)
    par = ParallelRelabeler(_DiesInWorker, workers=2, min_batch=16)
    try:
        assert par.wait_ready(timeout=300)  # else the batch is relabeled in process while they start
        with pytest.warns(RuntimeWarning, match="worker process died"):
            got = par.relabel(trajs)
        assert _summary(got) == _summary(HindsightRelabeler(relabel_config("rules", k=2, delta=0.9,
                                                                           cache_size=0)).relabel(trajs))
        assert par.stats()["workers"] == 0 and "died" in par.stats()["broken"]
        par.relabel(trajs)  # in process from now on, without a second warning
    finally:
        par.close()
        par.close()  # idempotent


class _FailsToStartInWorker:
    """Fault injection: a factory that raises in a worker process (a worker that cannot start, which
    a healthy factory cannot be made to produce on demand); in the calling process it builds the
    real rule relabeler."""

    def __call__(self):
        if multiprocessing.parent_process() is not None:
            raise RuntimeError("no relabeler in this worker")
        from agents.run.relabeling import relabeler_config

        return HindsightRelabeler(relabeler_config("rules", k=2))


def test_workers_that_fail_to_start_are_given_up_with_one_warning_and_batches_stay_in_process():
    trajs = random_trajectories(64, 32, seed=2, texts=False)
    par = ParallelRelabeler(_FailsToStartInWorker(), workers=2, min_batch=16)
    try:
        with pytest.warns(RuntimeWarning, match="did not start"):
            assert not par.wait_ready(timeout=300)
        got = par.relabel(trajs)
        stats = par.stats()
        assert stats["workers"] == 0 and "did not start" in stats["broken"] and stats["in_process"] == 64
        assert _summary(got) == _summary(_FailsToStartInWorker()().relabel(trajs))
    finally:
        par.close()


def test_bad_arguments_and_the_automatic_worker_count():
    with pytest.raises(ValueError, match="workers=0"):
        ParallelRelabeler(functools.partial(HindsightRelabeler, "rules"), workers=0)
    with pytest.raises(ValueError, match="min_batch"):
        ParallelRelabeler(functools.partial(HindsightRelabeler, "rules"), workers=1, min_batch=0)
    with pytest.raises((pickle.PicklingError, AttributeError)):  # found here, not in a worker
        ParallelRelabeler(lambda: HindsightRelabeler(relabel_config("rules")), workers=1)
    assert [default_workers(c) for c in (1, 2, 3, 4, 8, 16, 128)] == [0, 0, 0, 2, 6, 8, 8]


def test_the_trainer_relabels_over_workers_when_asked_and_its_batch_is_large_enough(tmp_path):
    from agents.pqn.config import TrainConfig
    from agents.pqn.trainer import make_relabeler

    base = TrainConfig().replace(**{"run.method": "oir", "oir.relabeler": "rules", "pqn.num_envs": 32,
                                    "run.num_seeds": 2, "oir.relabel_workers": 2})
    par = make_relabeler(base.validate()).rules
    try:
        assert isinstance(par, ParallelRelabeler) and par.workers == 2
    finally:
        par.close()
    for change in ({"run.num_seeds": 1}, {"oir.relabel_workers": 0}):  # 32 trajectories; in process
        assert isinstance(make_relabeler(base.replace(**change).validate()).rules, HindsightRelabeler)
    with pytest.raises(ValueError, match="relabel_workers=-2"):
        base.replace(**{"oir.relabel_workers": -2}).validate()

