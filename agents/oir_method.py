"""Method ``oir``: hindsight instruction relabeling with an instruction buffer (steps 2-4 of the paper's loop).

After each rollout (:meth:`OIRRelabeling.update_batch`):

2. **Relabel** (host): every env's segment becomes a :class:`~oir_gym.trajectory.Trajectory`; the
   relabeler proposes up to K instructions. Rule instructions come back at once; LLM answers run
   in a background worker and are used one iteration later (their rollout is kept), so the loop
   never waits on the LLM.
3. **Ground** (device): each candidate's rewards and terminations along its trajectory are
   recomputed from the stored events (:func:`agents.oir.build_batch`).
4. **Buffer**: the candidates that paid a reward are inserted into each seed's PLR-style
   :class:`~oir_gym.buffer.InstructionBuffer`, whose contents new episodes draw uniformly.

The update batch D is the original trajectories plus the relabeled copies.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from agents.methods import MethodContext, TrainingMethod
from oir_gym.captions import NUM_EVENTS
from oir_gym.diversity import echo_share, instruction_diversity, paying_event
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
from oir_gym.relabel.background import BackgroundRelabeler
from oir_gym.relabel.prompts import load_template
from oir_gym.trajectory import Trajectory


def balanced_choice(candidates: Sequence[Sequence[str]], k: int) -> list[list[str]]:
    """Up to ``k`` instructions per trajectory, spreading the rows over instructions.

    Round by round, each trajectory in turn takes, among its candidates not yet taken, the one
    with the fewest rows so far (ties: the candidate's own order). A frequent instruction then
    fills a trajectory's slots only after the rarer ones it also accomplished.

    Args:
        candidates: per trajectory, its candidate texts in the relabeler's order (no repeats).
        k: slots per trajectory.

    Returns:
        Per trajectory, the chosen texts in the order they were taken.
    """
    counts: Counter = Counter()
    chosen: list[list[str]] = [[] for _ in candidates]
    for _ in range(k):
        for i, cands in enumerate(candidates):
            left = [c for c in cands if c not in chosen[i]]
            if left:
                pick = min(left, key=lambda c: counts[c])  # min keeps the first of equal counts
                chosen[i].append(pick)
                counts[pick] += 1
    return chosen


class OIRRelabeling(TrainingMethod):
    """``oir``: relabeled copies of the rollout's trajectories in the batch, an instruction buffer per seed.

    Args:
        ctx: what the method may use of its run.
        relabeler: the relabeler of ``cfg.oir.relabeler``: a
            :class:`~oir_gym.relabel.background.BackgroundRelabeler` (:func:`agents.relabeling.make_relabeler`:
            rules at once, LLM answers when they arrive), used as is; any other relabeler is the
            LLM half (``llm``, ``both``) or the rules (``rules``) of one.
    """

    def __init__(self, ctx: MethodContext, relabeler: Any) -> None:
        super().__init__(ctx)
        self.async_llm = self.cfg.oir.relabeler in ("llm", "both")
        if not isinstance(relabeler, BackgroundRelabeler):
            relabeler = BackgroundRelabeler(None if self.async_llm else relabeler, relabeler if self.async_llm else None,
                                            rules_lag=self.cfg.oir.relabel_lag)
        self.relabeler = relabeler
        #: the LLM prompt's few-shot answers, which a small model copies (``diversity/llm_echo_share``)
        self._prompt_examples = load_template(self.cfg.llm.template).examples() if self.async_llm else []
        #: recent rollouts, newest first (LLM answers and lagged rule relabels arrive late)
        self.history: list = []
        self.history_len = max(self.cfg.oir.llm_lag if self.async_llm else 1, 1 + self.cfg.oir.relabel_lag)
        self.stale_llm = 0
        self.in_time_llm = 0  # LLM answers that arrived within history_len updates (stale_llm: the others)
        #: the last iteration's relabeled texts per seed (one per batch row, "" for padding)
        self.last_texts: list[list[str]] = []
        #: the last iteration's chosen candidates per seed (the batch rows' order)
        self.last_candidates: list[list[Any]] = []
        #: every text offered to a buffer: (best cosine to any caption phrasing, paying event, source)
        self.offered: dict[str, tuple[float, int, str]] = {}
        self.offers_llm = 0
        self.offers_total = 0
        # the LLM's instructions that reached a training batch (rows) and a buffer (texts it took),
        # over the run: the progress line and the end-of-run summary say when it contributed nothing
        self.llm_rows = 0
        self.llm_buffered = 0
        # evaluation and original instructions keep their own table rows (never bound)
        self._fixed = set(ctx.all_eval_texts) | set(ORIGINAL_INSTRUCTIONS)

    # ------------------------------------------------------------ the hooks
    def buffer_rows(self, seed: int) -> np.ndarray:
        ctx = self.ctx
        return ctx.registry.rows(ctx.buffers[seed].contents(), protected=ctx.protected_rows)

    def update_batch(self, traj: dict, host: dict) -> tuple[dict, dict[str, float]]:
        slots, metrics = self.relabel(host)
        self.history = [traj] + self.history[: self.history_len - 1]
        ring = self.history + [traj] * (self.history_len - len(self.history))
        batch = self.ctx.build_batch(ring, slots)
        # steps of relabeled copies without a target: after the copy's first success in an original
        # episode, or where the original instruction's success ended the episode
        # a device scalar: the trainer reads it after starting the update (no wait for the batch here)
        metrics["relabel/cut_steps"] = jnp.sum(batch["cuts"]) / self.ctx.S
        return batch, metrics

    def generated_payload(self) -> dict[str, Any]:
        """Every relabeled instruction offered to a buffer, with counts (the buffer's priority order
        decides which of them it keeps)."""
        cfg = self.cfg
        return {
            "method": "oir", "source": f"relabeler {cfg.oir.relabeler}",
            "what": ("instructions offered to the instruction buffers (one count per seed and update; "
                     + ("grounded or not)" if cfg.oir.keep_ungrounded else "only those that paid a reward)")),
            "items": [{"text": t, "count": int(c)} for t, c in sorted(self.generated.items(), key=lambda kv: (-kv[1], kv[0]))],
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stale_llm": self.stale_llm, "in_time_llm": self.in_time_llm,
                "offers": {"llm": self.offers_llm, "total": self.offers_total,
                           "llm_rows": self.llm_rows, "llm_buffered": self.llm_buffered,
                           "texts": [[t, c, e, src] for t, (c, e, src) in self.offered.items()]},
                "diversity": self.diversity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.stale_llm = int(state.get("stale_llm", 0))
        self.in_time_llm = int(state.get("in_time_llm", 0))
        offers = state.get("offers") or {}  # absent in checkpoints written before the offer counts
        self.offers_llm, self.offers_total = int(offers.get("llm", 0)), int(offers.get("total", 0))
        self.llm_rows, self.llm_buffered = int(offers.get("llm_rows", 0)), int(offers.get("llm_buffered", 0))
        self.offered = {str(t): (float(c), int(e), str(src)) for t, c, e, src in offers.get("texts", [])}
        # Rollouts awaiting LLM answers or a lagged relabel are not checkpointed: those are lost on resume.
        self.history = []

    def close(self) -> None:
        self.relabeler.close()  # a lagged rule relabeling in flight finishes first

    # ------------------------------------------------------------ relabeling
    def trajectories(self, host: dict, update: int) -> list[Trajectory]:
        """Every env's segment of this rollout as a :class:`Trajectory` (``meta``: seed and update)."""
        ctx = self.ctx
        out = []
        for s in range(ctx.S):
            for e in range(self.cfg.pqn.num_envs):
                out.append(Trajectory(
                    instruction=ctx.registry.text(host["instr"][s, 0, e]), events=host["events"][s, :, e],
                    actions=host["action"][s, :, e], dones=host["done"][s, :, e], env_id=e,
                    meta={"seed": s, "update": update},
                ))
        return out

    def slots(self, results) -> tuple[dict, list[list[str]], np.ndarray]:
        """Relabel rows per seed from results of this or recent rollouts (``meta["update"]``).

        Each row carries its candidate's own embedding and grounding rows (``emb``, ``final``,
        ``pre``; :mod:`oir_gym.grounding`): nothing is encoded or compared with captions again here.
        Returns the slots, the texts per seed and row ("" for padding), and the valid mask; the
        chosen candidates per seed are kept in :attr:`last_candidates`.
        """
        cfg = self.cfg
        S = self.ctx.S
        update = self.ctx.update_idx()
        R = cfg.pqn.num_envs * cfg.oir.k
        rows: list[list[tuple[int, int, Any]]] = [[] for _ in range(S)]
        if cfg.oir.relabel_balance:  # every grounded event came back (make_relabeler); keep K per trajectory
            by_seed: list[list] = [[] for _ in range(S)]
            for r in results:
                by_seed[r.trajectory.meta["seed"]].append(r)
            for s, rs in enumerate(by_seed):
                firsts = [{} for _ in rs]  # per trajectory: text -> its first grounded candidate
                for f, r in zip(firsts, rs):
                    for c in r.candidates:
                        if c.grounded:
                            f.setdefault(c.text, c)
                picks = balanced_choice([list(f) for f in firsts], cfg.oir.k)
                for r, f, texts_r in zip(rs, firsts, picks):
                    age = update - r.trajectory.meta["update"]
                    rows[s] += [(age, r.trajectory.env_id, f[t]) for t in texts_r]
        else:
            for r in results:
                m = r.trajectory.meta
                age = update - m["update"]
                for c in r.candidates:
                    rows[m["seed"]].append((age, r.trajectory.env_id, c))
        src, env, valid, emb, final, pre = self._empty_slots()
        texts = [["" for _ in range(R)] for _ in range(S)]
        self.last_candidates = [[] for _ in range(S)]
        for s in range(S):
            # grounded candidates first (they carry reward), then older rollouts (LLM answers)
            chosen = sorted(rows[s], key=lambda x: (not x[2].grounded, -x[0]))[:R]
            for j, (sr, e, c) in enumerate(chosen):
                if c.emb is None or c.final_row is None or c.pre_row is None:
                    raise ValueError(f"relabeled candidate {c.text!r} carries no embedding or grounding rows "
                                     "(emb, final_row, pre_row): use oir_gym.relabel.HindsightRelabeler, whose "
                                     "candidates carry them")
                src[s, j], env[s, j], valid[s, j], texts[s][j] = sr, e, True, c.text
                emb[s, j], final[s, j], pre[s, j] = c.emb, c.final_row, c.pre_row
            self.last_candidates[s] = [c for _, _, c in chosen]
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

    def warmup_batch(self, traj: dict) -> dict:
        return self.ctx.build_batch([traj] * self.history_len, self._device_slots(*self._empty_slots()))

    def llm_subset(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The ``llm.per_update`` trajectories per seed with the most distinct achievement events.

        A small LLM on a CPU answers in seconds per trajectory while an update takes about a
        second: asking about every trajectory would only queue answers that arrive too late to
        use. Eventful trajectories are the ones worth an LLM's reading.
        """
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

    def relabel(self, host: dict) -> tuple[dict, dict[str, float]]:
        """Relabel this rollout (and collect late LLM answers): the batch's relabel slots and the
        relabel metrics; grounded candidates go into the seeds' buffers."""
        ctx, cfg = self.ctx, self.cfg
        update = ctx.update_idx()
        trajs = self.trajectories(host, update)
        stats: dict[str, float] = {}
        # the rules' results of this rollout (of the previous one with oir.relabel_lag 1); the LLM reads
        # the most eventful trajectories in the background, its answers joining when they arrive
        self.relabeler.submit(trajs, ask=self.llm_subset(trajs) if self.async_llm else [])
        results, late = self.relabeler.collect_by_source()
        if self.async_llm:
            fresh = [r for r in late if update - r.trajectory.meta["update"] < self.history_len]
            self.stale_llm += len(late) - len(fresh)
            self.in_time_llm += len(fresh)
            results += fresh
            stats["relabel/llm_results"] = float(len(fresh))
            stats["relabel/llm_stale"] = float(self.stale_llm)
            stats["relabel/llm_in_time_total"] = float(self.in_time_llm)
            stats["relabel/llm_pending"] = float(self.relabeler.pending)
            llm_stats = self.relabeler.stats()
            for k in ("calls", "cache_hit_rate", "errors", "fallbacks", "grounded_fraction", "latency_mean_s",
                      "prompt_tokens_mean", "candidates_llm", "candidates_kept_llm", "share", "restarts",
                      "down_seconds"):
                if isinstance(llm_stats.get(k), (int, float)):
                    stats[f"relabel/llm_{k}"] = float(llm_stats[k])
            # why answers fail and why candidates go: the run's record of what the LLM got wrong
            for kind, n in llm_stats.get("errors_by_type", {}).items():
                stats[f"relabel/llm_errors/{kind}"] = float(n)
            for reason, n in llm_stats.get("dropped", {}).items():
                stats[f"relabel/dropped/{reason}"] = float(n)
            stats["relabel/llm_warnings"] = float(llm_stats.get("llm_warnings", 0))
            stats["relabel/llm_repeats_rules"] = float(llm_stats.get("llm_repeats_rules", 0))
        slots, texts, valid = self.slots(results)
        self.last_texts = texts
        stats["relabel/rows"] = float(valid.sum() / ctx.S)
        stats["relabel/grounded_frac"] = float(np.mean([c.grounded for r in results for c in r.candidates] or [0.0]))
        llm_rows = sum(c.source == "llm" for cs in self.last_candidates for c in cs)
        # buffer: insert this iteration's candidates that paid a reward on their trajectory (all of
        # them with cfg.oir.keep_ungrounded, as the paper's Alg. 1). An ungrounded one, such as the
        # rules' "A then B" compounds that never exceed delta against any caption, can never succeed
        # as an episode instruction, and its R = 0 would rank it ahead of every failing-but-learnable
        # instruction (R in (0, tau_low]) in the buffer's priority order. The relabelers the trainer
        # builds already drop ungrounded candidates unless cfg.oir.keep_ungrounded; this check holds
        # the buffer to the config for a relabeler passed in (Trainer(relabeler=...)) as well.
        grounded = [set() for _ in range(ctx.S)]
        for r in results:
            grounded[r.trajectory.meta["seed"]].update(c.text for c in r.candidates if c.grounded)
        offers: list = []
        llm_buffered = 0
        for s in range(ctx.S):
            first = {}  # text -> the first chosen candidate with it (its source, binding, rows)
            for c in self.last_candidates[s]:
                first.setdefault(c.text, c)
            cands = [t for t in dict.fromkeys(texts[s]) if t and (cfg.oir.keep_ungrounded or t in grounded[s])]
            if cands:
                written = ctx.buffers[s].insert(cands)
                llm_buffered += sum(first[t].source == "llm" for t in written if t in first)
                self.generated.update(cands)
                if cfg.oir.grounding == "bound" and written:
                    # the env pays a buffer instruction at its bound event(s) (the first binding of a
                    # text wins); the evaluation and original instructions keep their own rows. Only
                    # what the buffer took: new episodes draw from it, and a call stays within its size
                    ctx.registry.rows(written, protected=ctx.protected_rows,
                                     bindings=[None if t in self._fixed else first[t].binding for t in written])
                offers += [first[t] for t in cands]
        stats.update(self._count_offers(offers))
        if self.async_llm:
            # what the LLM's instructions reached this update: batch rows (all seeds) and the texts
            # the buffers took; "answered" alone hides a run where they never get past the rules
            self.llm_rows += llm_rows
            self.llm_buffered += llm_buffered
            stats["relabel/llm_rows"] = float(llm_rows)
            stats["relabel/llm_buffered"] = float(llm_buffered)
            stats["relabel/llm_rows_total"] = float(self.llm_rows)
            stats["relabel/llm_buffered_total"] = float(self.llm_buffered)
        return slots, stats

    # ------------------------------------------------------------ offers and their diversity
    def _count_offers(self, offers: Sequence[Any]) -> dict[str, float]:
        """Record the candidates offered to the buffers this update (one per seed and text); their
        LLM share this update (``relabel/llm_offer_share``), how many texts no earlier update offered
        (``relabel/new_instructions``) and, for :meth:`diversity`, each new text's best cosine to any
        caption phrasing and the event it pays on."""
        new = [c for c in dict((c.text, c) for c in offers).values() if c.text not in self.offered]
        if new:
            # the registry's cosine to the caption phrasings (a bound candidate's final_row is an
            # indicator row, not a cosine); computed once per distinct text
            best = self.ctx.registry.similarity_to_events(np.stack([c.emb for c in new])).max(axis=-1)
            for c, b in zip(new, best):
                self.offered[c.text] = (float(b), paying_event(c.final_row, self.cfg.env.delta), c.source)
        n_llm = sum(c.source == "llm" for c in offers)
        self.offers_llm += n_llm
        self.offers_total += len(offers)
        # novelty: distinct texts offered to a buffer for the first time in the run
        return {"relabel/llm_offer_share": n_llm / len(offers) if offers else 0.0,
                "relabel/new_instructions": float(len(new))}

    def llm_report(self) -> dict[str, Any]:
        """The LLM relabeler's run so far, for the run directory (empty without an LLM): calls,
        prompts, latency, answers that came too late, errors by type with an example of each,
        candidates dropped by reason, and how many of its instructions reached a training batch
        (``rows_in_batch``) and a buffer (``into_buffer``)."""
        if not self.async_llm:
            return {}
        st = self.relabeler.stats()
        keys = ("calls", "prompts", "latency_mean_s", "prompt_tokens_mean", "errors", "errors_by_type",
                "error_examples", "dropped", "candidates_llm", "candidates_kept_llm", "restarts", "child_deaths",
                "down_seconds",
                "llm_warnings")
        return {**{k: st[k] for k in keys if k in st}, "stale": self.stale_llm, "in_time": self.in_time_llm,
                "rows_in_batch": self.llm_rows, "into_buffer": self.llm_buffered}

    def diversity(self) -> dict[str, float]:
        """Diversity of every instruction offered to the buffers so far (:mod:`oir_gym.diversity`):
        ``diversity/novelty_share``, ``diversity/wordings_per_event``, ``diversity/instructions``...,
        and ``relabel/llm_offer_share_total`` (LLM share of all buffer offers of the run); with an LLM
        relabeler also ``diversity/llm_instructions`` (distinct texts the LLM offered first) and
        ``diversity/llm_echo_share`` (the share of those copying the prompt's few-shot answers)."""
        texts = list(self.offered)
        stats = instruction_diversity(texts, [self.offered[t][0] for t in texts], [self.offered[t][1] for t in texts])
        out = {**stats.flat(), "relabel/llm_offer_share_total": self.offers_llm / max(self.offers_total, 1),
               "relabel/offers_total": float(self.offers_total)}
        if self.async_llm:
            # the LLM's own instructions (first offered by it), and how many copy the prompt's examples
            llm = [t for t in texts if self.offered[t][2] == "llm"]
            out["diversity/llm_instructions"] = float(len(llm))
            out["diversity/llm_echo_share"] = echo_share(llm, self._prompt_examples)
        return out
