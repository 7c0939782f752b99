"""Method ``ellm``: the ELLM baseline (Du et al. 2023) on the PQN backbone; the batch is the original trajectories,
each env pinned at its next reset to a goal proposed from its current observation (``ellm.reward="any"``: every goal
proposed for it pays too)."""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from agents.pqn.methods import MethodContext, MethodStep, TrainingMethod
from oir_gym.text import batch_observations

if TYPE_CHECKING:  # pragma: no cover
    from agents.pqn.config import TrainConfig


def also_pays_slots(cfg: "TrainConfig") -> int:
    """Extra rows per env whose captions also pay: its K proposed goals with ``ellm.reward="any"``."""
    return cfg.ellm.k if cfg.ellm.reward == "any" else 0


def table_capacity(cfg: "TrainConfig", n_eval: int) -> int:
    """Table rows ELLM needs (its envs' goals and the evaluation's), at least ``env.table_capacity``."""
    return max(cfg.env.table_capacity,
               n_eval + (2 + also_pays_slots(cfg)) * cfg.run.num_seeds * cfg.pqn.num_envs + 32)


class ELLMProposals(TrainingMethod):
    """``ellm``: envs pinned to goals the ``proposer`` (LLM or rules) proposes from their observations."""

    def __init__(self, ctx: MethodContext, proposer: Any) -> None:
        super().__init__(ctx)
        self.proposer = proposer
        self.pinned_counts: Counter = Counter()  # goals envs were pinned to
        self._goal_rng = np.random.default_rng(self.cfg.run.seed + 7919 + ctx.seed_offset)

    def step(self, update: int, host: dict, env_state: Any) -> MethodStep:
        """Goals from every env's current observation (the states the next episodes start from), each env pinned
        to one; the rollout's rows stay protected."""
        ctx = self.ctx
        t0 = time.time()
        goals = self.proposer.propose(batch_observations(env_state.env.craftax))
        chosen = [g[int(self._goal_rng.integers(len(g)))] if g else "" for g in goals]
        for g in goals:
            self.generated.update(dict.fromkeys(g, 1))
        self.pinned_counts.update(t for t in chosen if t)
        protected = ctx.protected_rows(env_state, extra=np.unique(host["instr"]))
        n_also = also_pays_slots(self.cfg)
        # "any": every proposed goal needs a row (it pays); "pinned": only the chosen ones
        uniq = sorted({t for g in goals for t in g[:n_also]} | {t for t in chosen if t})
        try:
            row_of = dict(zip(uniq, ctx.registry.rows(uniq, protected=protected).tolist()))
        except (ValueError, RuntimeError, KeyError) as e:  # table full or a bad text: keep what is there
            ctx.log(f"ellm: could not register the proposed goals ({type(e).__name__}: {e}); "
                    "pinning only goals already in the table")
            row_of = ctx.registry.find(uniq)
        pinned = np.array([row_of.get(t, -1) for t in chosen], np.int32)
        also = None
        if n_also:  # from now on every goal proposed for an env pays its reward
            also = np.full((len(goals), n_also), -1, np.int32)
            for i, g in enumerate(goals):
                rows = [row_of[t] for t in g[:n_also] if t in row_of]
                also[i, : len(rows)] = rows
        ok = pinned[pinned >= 0]
        groundable = 1.0 - float(np.mean(~self.payable_rows()[ok])) if len(ok) else 0.0
        stats = self.proposer.stats()
        metrics = {
            "ellm/distinct_goals": float(len(self.generated)),
            "ellm/distinct_goals_update": float(len({t for g in goals for t in g})),
            "ellm/distinct_pinned": float(len(set(ok.tolist()))),
            "ellm/goals_per_env": float(np.mean([len(g) for g in goals])),
            "ellm/pinned_frac": float(len(ok) / max(len(pinned), 1)),
            # goals some caption matches above delta (others can never pay a reward)
            "ellm/groundable_frac": float(groundable),
            "ellm/propose_s": time.time() - t0,
        }
        for k in ("requests", "cache_hit_rate", "fallbacks", "llm_calls", "llm_prompts", "llm_timeouts", "llm_errors",
                  "llm_busy", "llm_fraction", "latency_mean_s", "llm_restarts", "llm_down_seconds"):
            if isinstance(stats.get(k), (int, float)):
                metrics[f"ellm/{k}"] = float(stats[k])
        return MethodStep(metrics, pinned=pinned, also_pays=also)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.generated), "pinned": dict(self.pinned_counts),
                "goal_rng": self._goal_rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.pinned_counts = Counter(state.get("pinned", {}))
        if state.get("goal_rng") is not None:
            self._goal_rng.bit_generator.state = state["goal_rng"]

    def generated_payload(self) -> dict[str, Any]:
        """Every goal proposed (``count``: per env and update) and how often an env was pinned to it."""
        items = [{"text": t, "count": int(c), "pinned": int(self.pinned_counts.get(t, 0))}
                 for t, c in sorted(self.generated.items(), key=lambda kv: (-kv[1], kv[0]))]
        return {"method": "ellm", "source": f"proposer {self.cfg.ellm.proposer}",
                "what": "goals proposed (one count per env and update)", "items": items}

    def close(self) -> None:
        if self.proposer is not None and hasattr(self.proposer, "close"):
            self.proposer.close()
