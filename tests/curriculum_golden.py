"""The PQN hindsight step's golden snapshot: what the step after relabeling makes of fixed results.

A frozen record of what method ``oir`` does with relabeling results (the rows it trains on, the
texts each seed's instruction buffer takes, the table rows and bindings of those texts, its
``relabel/*`` metrics, the offer counts and the diversity of what was offered) over three updates
of synthetic trajectories, two seeds of four envs, for: balance on and off, keep-ungrounded on and
off, cosine and bound grounding, and LLM results of ages 0 and 1 next to the rules' of age 0. The
results come from real :class:`~oir_gym.relabel.HindsightRelabeler` s (rules, and the scripted LLM
of ``tests/relabel_golden.py``); they are delivered to the method as its background relabeler
would deliver them. Any refactor of that step must leave the record identical
(``tests/test_curriculum_golden.py``).

Rewrite the file (only for an intended behaviour change, and say so in the commit)::

    PYTHONPATH=$PWD python tests/curriculum_golden.py --write
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from oir_gym.relabel.background import BackgroundRelabeler
from oir_gym.relabel.synthetic import training_run
from relabel_config import relabel_config

GOLDEN = Path(__file__).resolve().parent / "data" / "curriculum_golden.json"
S, E, UPDATES = 2, 4, 3
#: metrics that measure time, not behaviour
TIMING = ("latency_mean_s", "down_seconds")

#: name -> (oir.relabeler, relabel_balance, keep_ungrounded, grounding)
SCENARIOS = {
    "rules_cosine": ("rules", False, False, "cosine"),
    "rules_cosine_balance": ("rules", True, False, "cosine"),
    "rules_cosine_keep": ("rules", False, True, "cosine"),
    "rules_bound_balance_keep": ("rules", True, True, "bound"),
    "both_cosine": ("both", False, False, "cosine"),
    "both_cosine_keep": ("both", False, True, "cosine"),
    "both_bound_keep": ("both", False, True, "bound"),
    "both_bound_balance": ("both", True, False, "bound"),
}


def _rollouts(seed: int) -> list[list[Any]]:
    """Per update, S * E synthetic trajectories (seed-major) with ``meta`` seed and update."""
    run = training_run(UPDATES * S, E, length=40, seed=seed, texts=True)
    out = []
    for u in range(UPDATES):
        trajs = []
        for s in range(S):
            for e, t in enumerate(run[u * S + s]):
                t.env_id, t.meta = e, {"seed": s, "update": u}
                trajs.append(t)
        out.append(trajs)
    return out


def _results(name: str, encoder: Any) -> list[tuple[list, list]]:
    """Per update, (rules results of this update, LLM results: this update's and the previous one's)."""
    from oir_gym.relabel import HindsightRelabeler
    from relabel_golden import ScriptedLLM

    backend, balance, keep, grounding = SCENARIOS[name]
    rollouts = _rollouts(seed=11)
    rules = HindsightRelabeler(relabel_config("rules", k=64 if balance else 2, grounding=grounding,
                                              keep_ungrounded=keep), encoder=encoder)
    llm = HindsightRelabeler(relabel_config(None, k=2, grounding=grounding, keep_ungrounded=keep, use_rules=False),
                             llm=ScriptedLLM(), encoder=encoder) if backend == "both" else None
    try:
        out = []
        for u, trajs in enumerate(rollouts):
            late: list = []
            if llm is not None:
                late = llm.relabel(trajs[::3]) + (llm.relabel(rollouts[u - 1][1::3]) if u else [])
            out.append((rules.relabel(trajs), late))
        return out
    finally:
        rules.close()
        if llm is not None:
            llm.close()


def _host(trajs: list) -> dict:
    """The rollout's host arrays ``[S, T, E, ...]`` (as the trainer hands them to its method)."""
    def stack(f: Any) -> np.ndarray:
        return np.stack([np.stack([f(trajs[s * E + e]) for e in range(E)], axis=1) for s in range(S)])
    return {"events": stack(lambda t: t.events), "action": stack(lambda t: t.actions),
            "done": stack(lambda t: t.dones), "instr": np.zeros((S, len(trajs[0].actions), E), np.int32)}


def _clean(metrics: dict) -> dict:
    return {k: round(float(v), 6) for k, v in sorted(metrics.items()) if not k.endswith(TIMING)}


class Delivered(BackgroundRelabeler):
    """The method's background relabeler, delivering fixed results: the rules' of this update at once,
    the LLM's as late answers (fault injection's kind of stand-in: real results, a fixed arrival)."""

    def __init__(self) -> None:  # no worker: nothing runs in the background
        self.now: tuple[list, list] = ([], [])

    def submit(self, trajectories: Any, *, ask: Any = None) -> None:
        pass

    def collect_by_source(self, block: bool = False, timeout: Any = None) -> tuple[list, list]:
        rules, late = self.now
        return list(rules), list(late)

    @property
    def pending(self) -> int:
        return 0

    def stats(self) -> dict:
        return {}

    def close(self, timeout: Any = None) -> None:
        pass


def make_method(cfg: Any, seeds: int, registry: Any, buffers: list, encoder: Any, orig: np.ndarray) -> Any:
    """Method ``oir`` on a context built without a trainer, its relabeler a :class:`Delivered`."""
    from agents.pqn.methods import MethodContext
    from agents.pqn.oir_method import OIRRelabeling

    ctx = MethodContext(cfg=cfg, S=seeds, seed_offset=0, registry=registry, buffers=buffers, encoder=encoder,
                        all_eval_texts=[], log=print)
    return OIRRelabeling(ctx, Delivered())


def step(method: Any, update: int, host: dict, rules: list, late: list) -> dict:
    """One update's hindsight step of ``method`` on these results."""
    method.relabeler.now = (rules, late)
    out = method.step(update, host, None)
    slots, metrics = out.slots, out.metrics
    reg, orig = method.ctx.registry, method.ctx.registry.find(method.ctx.fixed_texts).values()
    return {"texts": method.last_texts, "src": np.asarray(slots["src"]).tolist(),
            "env": np.asarray(slots["env"]).tolist(), "valid": np.asarray(slots["valid"]).tolist(),
            "metrics": metrics, "diversity": method.diversity(), "offers": method.state_dict()["offers"],
            "generated": dict(method.generated),
            # the rows new episodes draw (the trainer asks before each rollout; new texts get rows)
            "draw_rows": [sorted(reg.rows(method.draw_texts(s), protected=list(orig)).tolist()) for s in range(S)]}


def run_scenario(name: str, encoder: Any) -> dict:
    """The record of one scenario: per update the rows, metrics and buffers; then the totals."""
    from agents.pqn.config import preset
    from oir_gym.buffer import InstructionBuffer
    from oir_gym.instruction_registry import InstructionRegistry
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS

    backend, balance, keep, grounding = SCENARIOS[name]
    cfg = preset("smoke").replace(**{
        "run.method": "oir", "oir.relabeler": backend, "pqn.num_envs": E, "oir.k": 2,
        "oir.relabel_balance": balance, "oir.keep_ungrounded": keep, "oir.grounding": grounding,
        "oir.instruction_buffer_size": 6})
    registry = InstructionRegistry(encoder, capacity=cfg.env.table_capacity)
    orig = registry.rows(list(ORIGINAL_INSTRUCTIONS), list(range(len(ORIGINAL_INSTRUCTIONS))))
    buffers = [InstructionBuffer(6, cfg.oir.tau_low, cfg.oir.tau_high, initial=list(ORIGINAL_INSTRUCTIONS)[:6], seed=s)
               for s in range(S)]
    delivered = _results(name, encoder)
    method = make_method(cfg, S, registry, buffers, encoder, orig)
    updates = []
    try:
        for u, (rules, late) in enumerate(delivered):
            # the trainer records the returns of finished episodes between updates
            for s, b in enumerate(buffers):
                texts = b.contents()
                b.record_many(texts, [((i * 7 + u + s) % 5) / 4 for i in range(len(texts))])
            out = step(method, u, _host(_rollouts(seed=11)[u]), rules, late)
            buf_texts = sorted({t for b in buffers for t in b.contents()})
            updates.append({
                "texts": out["texts"], "src": out["src"], "env": out["env"], "valid": out["valid"],
                "metrics": _clean(out["metrics"]), "buffers": [b.contents() for b in buffers],
                "draw_rows": out["draw_rows"], "rows": {t: int(registry.find([t])[t]) for t in buf_texts},
                "bindings": {t: registry.bindings[t].to_list() for t in buf_texts if t in registry.bindings},
            })
        return {"updates": updates, "diversity": _clean(out["diversity"]), "offers": out["offers"],
                "generated": dict(sorted(out["generated"].items()))}
    finally:
        method.close()


def snapshot(encoder: Any) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: run_scenario(name, encoder) for name in SCENARIOS}


def dumps(snap: dict) -> str:
    return json.dumps(snap, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from oir_gym.encoder import get_encoder

    text = dumps(snapshot(get_encoder()))
    if "--write" in sys.argv:
        GOLDEN.write_text(text)
        print(f"wrote {GOLDEN} ({len(text)} bytes)")
    else:
        sys.stdout.write(text)
