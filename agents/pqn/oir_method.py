"""Method ``oir``: hindsight instruction relabeling with an instruction buffer (steps 2-4 of the paper's loop).

After each rollout every env's segment is relabeled (LLM answers used when they arrive), the candidates
that paid go into each seed's instruction buffer and the batch gets the relabeled copies.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from agents.pqn.methods import MethodContext, MethodStep, TrainingMethod
from oir_gym.captions import NUM_EVENTS
from oir_gym.curriculum import CurriculumConfig, InstructionCurriculum, balanced_choice  # noqa: F401 (re-export)
from oir_gym.relabel.background import BackgroundRelabeler
from oir_gym.relabel.prompts import load_template
from oir_gym.trajectory import Trajectory


class OIRRelabeling(TrainingMethod):
    """``oir``: relabeled copies of the rollout's trajectories in the batch, an instruction buffer per seed
    (``relabeler``: a ``BackgroundRelabeler`` as is, else the LLM or rules half of one)."""

    def __init__(self, ctx: MethodContext, relabeler: Any) -> None:
        super().__init__(ctx)
        self.async_llm = self.cfg.oir.relabeler in ("llm", "both")
        if not isinstance(relabeler, BackgroundRelabeler):
            relabeler = BackgroundRelabeler(None if self.async_llm else relabeler, relabeler if self.async_llm else None,
                                            rules_lag=self.cfg.oir.relabel_lag)
        self.relabeler = relabeler
        self.history_len = max(self.cfg.oir.llm_lag if self.async_llm else 1, 1 + self.cfg.oir.relabel_lag)
        self.stale_llm = 0
        self.in_time_llm = 0  # LLM answers that arrived within history_len updates (stale_llm: the others)
        #: the last iteration's relabeled texts ("" for padding) and chosen candidates per seed, in row order
        self.last_texts: list[list[str]] = []
        self.last_candidates: list[list[Any]] = []
        o = self.cfg.oir
        self.curriculum = InstructionCurriculum(ctx.buffers, ctx.registry, CurriculumConfig(
            k=o.k, balance=o.relabel_balance, keep_ungrounded=o.keep_ungrounded, grounding=o.grounding,
            delta=self.cfg.env.delta, llm=self.async_llm,
            fixed_texts=tuple(ctx.fixed_texts),
            prompt_examples=tuple(load_template(self.cfg.llm.template).examples()) if self.async_llm else ()),
            register=lambda texts, bindings: ctx.registry.rows(texts, protected=self._protected, bindings=bindings))
        self._env_state: Any = None  # the envs' state of the current step (rows they still use)

    def _protected(self) -> list[int]:
        return self.ctx.protected_rows(self._env_state)

    @property
    def offered(self) -> dict[str, tuple[float, int, str]]:
        return self.curriculum.offered

    def draw_texts(self, seed: int) -> list[str]:
        return self.ctx.buffers[seed].contents()

    def step(self, update: int, host: dict, env_state: Any) -> MethodStep:
        slots, metrics = self.relabel(host, update, env_state)
        return MethodStep(metrics, slots=slots)

    def generated_payload(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "method": "oir", "source": f"relabeler {cfg.oir.relabeler}",
            "what": ("instructions offered to the instruction buffers (one count per seed and update; "
                     + ("grounded or not)" if cfg.oir.keep_ungrounded else "only those that paid a reward)")),
            "items": [{"text": t, "count": int(c)} for t, c in sorted(self.generated.items(), key=lambda kv: (-kv[1], kv[0]))],
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stale_llm": self.stale_llm, "in_time_llm": self.in_time_llm,
                "offers": self.curriculum.state_dict(),
                "diversity": self.diversity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stale_llm = int(state.get("stale_llm", 0))
        self.in_time_llm = int(state.get("in_time_llm", 0))
        self.curriculum.load_state_dict(state.get("offers") or {})  # absent in checkpoints before the offer counts

    def close(self) -> None:
        self.relabeler.close()  # a lagged rule relabeling in flight finishes first

    def trajectories(self, host: dict, update: int) -> list[Trajectory]:
        """Every env's segment of this rollout as a :class:`Trajectory` (``meta``: seed and update)."""
        ctx = self.ctx
        return [Trajectory(instruction=ctx.registry.text(host["instr"][s, 0, e]), events=host["events"][s, :, e],
                           actions=host["action"][s, :, e], dones=host["done"][s, :, e], env_id=e,
                           meta={"seed": s, "update": update})
                for s in range(ctx.S) for e in range(self.cfg.pqn.num_envs)]

    def slots(self, rows: list[list[Any]]) -> tuple[dict, list[list[str]], np.ndarray]:
        """The batch's relabel slots from the curriculum's rows per seed, the texts ("" padding) and the valid mask."""
        src, env, valid, emb, final, pre = self._empty_slots()
        texts = [["" for _ in range(src.shape[1])] for _ in range(self.ctx.S)]
        for s, chosen in enumerate(rows):
            for j, (age, traj, c) in enumerate(chosen):
                src[s, j], env[s, j], valid[s, j], texts[s][j] = age, traj.env_id, True, c.text
                emb[s, j], final[s, j], pre[s, j] = c.emb, c.final_row, c.pre_row
        return self._device_slots(src, env, valid, emb, final, pre), texts, valid

    def _empty_slots(self) -> tuple[np.ndarray, ...]:
        """Host arrays of every relabel slot, none valid: src, env, valid, emb, final, pre."""
        S, R = self.ctx.S, self.cfg.pqn.num_envs * self.cfg.oir.k
        return (np.zeros((S, R), np.int32), np.zeros((S, R), np.int32), np.zeros((S, R), bool),
                np.zeros((S, R, self.ctx.encoder.dim), np.float32), np.full((S, R, NUM_EVENTS), -1.0, np.float32),
                np.full((S, R, NUM_EVENTS), -1.0, np.float32))

    @staticmethod
    def _device_slots(src, env, valid, emb, final, pre) -> dict:
        return dict(src=jnp.asarray(src), env=jnp.asarray(env), emb=jnp.asarray(emb), final=jnp.asarray(final),
                    pre=jnp.asarray(pre), valid=jnp.asarray(valid))

    def warmup_slots(self) -> dict:
        return self._device_slots(*self._empty_slots())

    def llm_subset(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The ``llm.per_update`` trajectories per seed with the most distinct achievement events."""
        n = self.cfg.llm.per_update
        if n >= self.cfg.pqn.num_envs:
            return trajs
        chosen = []
        for s in range(self.ctx.S):
            mine = [t for t in trajs if t.meta["seed"] == s]
            score = [int(t.events[:, :22].any(axis=0).sum()) for t in mine]
            order = np.argsort(score, kind="stable")[::-1][:n]
            chosen += [mine[i] for i in order]
        return chosen

    def relabel(self, host: dict, update: int = 0, env_state: Any = None) -> tuple[dict, dict[str, float]]:
        """Relabel this rollout (and collect late LLM answers); grounded candidates go into the buffers."""
        cfg = self.cfg
        self._env_state = env_state
        trajs = self.trajectories(host, update)
        stats: dict[str, float] = {}
        self.relabeler.submit(trajs, ask=self.llm_subset(trajs) if self.async_llm else [])
        results, late = self.relabeler.collect_by_source()
        if self.async_llm:
            fresh = [r for r in late if update - r.trajectory.meta["update"] < self.history_len]
            self.stale_llm += len(late) - len(fresh)
            self.in_time_llm += len(fresh)
            results += fresh
            stats = {"relabel/llm_results": float(len(fresh)), "relabel/llm_stale": float(self.stale_llm),
                     "relabel/llm_in_time_total": float(self.in_time_llm),
                     "relabel/llm_pending": float(self.relabeler.pending)}
            llm_stats = self.relabeler.stats()
            stats.update({f"relabel/llm_{k}": float(llm_stats[k]) for k in (
                "calls", "cache_hit_rate", "errors", "fallbacks", "grounded_fraction", "latency_mean_s",
                "prompt_tokens_mean", "candidates_llm", "candidates_kept_llm", "share", "restarts", "down_seconds")
                if isinstance(llm_stats.get(k), (int, float))})
            stats.update({f"relabel/llm_errors/{kind}": float(n)
                          for kind, n in llm_stats.get("errors_by_type", {}).items()})
            stats.update({f"relabel/dropped/{reason}": float(n) for reason, n in llm_stats.get("dropped", {}).items()})
            stats["relabel/llm_warnings"] = float(llm_stats.get("llm_warnings", 0))
            stats["relabel/llm_repeats_rules"] = float(llm_stats.get("llm_repeats_rules", 0))
        offer = self.curriculum.apply(results, now=update, rows_per_group=cfg.pqn.num_envs * cfg.oir.k)
        slots, self.last_texts, _ = self.slots(offer.rows)
        self.last_candidates = [[row.candidate for row in rs] for rs in offer.rows]
        self.generated.update(t for texts in offer.offered for t in texts)
        stats.update(offer.metrics)
        return slots, stats

    def llm_report(self) -> dict[str, Any]:
        """The LLM relabeler's record so far (empty without an LLM)."""
        if not self.async_llm:
            return {}
        st = self.relabeler.stats()
        keys = ("calls", "prompts", "latency_mean_s", "prompt_tokens_mean", "errors", "errors_by_type",
                "error_examples", "dropped", "candidates_llm", "candidates_kept_llm", "restarts", "child_deaths",
                "down_seconds", "llm_warnings")
        rep = self.curriculum.report()
        return {**{k: st[k] for k in keys if k in st}, "stale": self.stale_llm, "in_time": self.in_time_llm,
                "rows_in_batch": rep["rows_in_batch"], "into_buffer": rep["into_buffer"]}

    def diversity(self) -> dict[str, float]:
        """Diversity of every instruction offered to the buffers so far."""
        return self.curriculum.diversity()
