"""``HindsightRelabelCallback``: paper Alg. 1's relabeling around an SB3 agent.

Each env's experience is cut into segments for the relabeler; off-policy agents (``mode="replay"``) get
each grounded candidate's segment in their replay buffer, on-policy ones only the instruction buffer
update (a PPO rollout is consumed before an asynchronous relabeler answers).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
from stable_baselines3.common.buffers import DictReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback

from oir_gym.curriculum import CurriculumConfig, InstructionCurriculum
from oir_gym.event_rates import RateWindow
from oir_gym.instruction_registry import validate_instruction
from oir_gym.grounding import episode_starts_from_dones, first_paid_step, no_precondition
from oir_gym.recorder import OpenSegment
from oir_gym.relabel.results import Candidate, RelabelResult
from oir_gym.sb3.replay import INSTRUCTION_KEY, RelabelReplayBuffer
from oir_gym.sb3.vec_env import SB3VecEnv, find_instruction_env
from oir_gym.trajectory import Trajectory
from oir_gym.validation import check_choice, check_int, check_real
from oir_gym.vector_env import InstructionCraftax

__all__ = ["RelabelConfig", "HindsightRelabelCallback"]

MODES = ("auto", "replay", "curriculum")
INSERT = ("grounded", "all", "none")


@dataclass(frozen=True)
class RelabelConfig:
    """Settings of :class:`HindsightRelabelCallback` (docs/sb3.md); ValueError for a bad value."""

    mode: str = "auto"  # "replay" (RelabelReplayBuffer: DQN, QR-DQN), "curriculum" (instruction buffer only) or "auto"
    segment_length: int = 128  # longest segment sent to the relabeler
    submit_batch: Optional[int] = None  # finished segments per submission (default: num_envs)
    asynchronous: bool = True  # relabel on the relabeler's background worker
    insert: str = "grounded"  # candidates that enter the instruction buffer: "grounded", "all" or "none"
    max_candidates: Optional[int] = None  # grounded candidates replayed per segment (default: all)
    replay_ungrounded: bool = False  # also replay ungrounded candidates (reward 0) as negative examples
    end_timeout: float = 300.0  # seconds to wait for pending results at the end of learn()
    keep_history: bool = False  # keep every relabeled segment (HindsightRelabelCallback.trajectories)

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        check_choice("insert", self.insert, INSERT)
        check_int("segment_length", self.segment_length, minimum=1)
        for name in ("submit_batch", "max_candidates"):
            check_int(name, getattr(self, name), minimum=1, none_ok=True)
        check_real("end_timeout", self.end_timeout, low=0, hint=" (seconds)")


def _clean(text: Any) -> Optional[str]:
    try:
        return validate_instruction(text)
    except (TypeError, ValueError):
        return None


class HindsightRelabelCallback(BaseCallback):
    """Hindsight instruction relabeling for SB3 training with a ``relabeler`` (``relabel``; asynchronous:
    ``submit``/``collect``/``pending``) and ``config`` (``**options`` override its fields). :attr:`stats`
    and :meth:`metrics` are logged at every rollout end."""

    def __init__(self, relabeler: Any, config: Optional[RelabelConfig] = None, *, verbose: int = 0,
                 **options: Any) -> None:
        super().__init__(verbose)
        if relabeler is None:
            raise ValueError("relabeler is required (e.g. HindsightRelabeler.rules(k=4))")
        config = config or RelabelConfig()
        unknown = set(options) - {f.name for f in dataclasses.fields(RelabelConfig)}
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; RelabelConfig fields are "
                            f"{[f.name for f in dataclasses.fields(RelabelConfig)]}")
        self.config = dataclasses.replace(config, **options)
        self.relabeler = relabeler
        self.mode = self.config.mode
        self.trajectories: dict[int, Trajectory] = {}
        self._counts: Counter = Counter()
        self._window: Counter = Counter()  # since the last metrics(reset=True)
        self._rates: Optional[RateWindow] = None
        self._segments: list[OpenSegment] = []
        self._finished: list[Trajectory] = []
        self._ready: list[Any] = []
        self._cur_obs: Optional[dict[str, np.ndarray]] = None
        self._traj_counter = 0
        self.adapter: Optional[SB3VecEnv] = None
        self.instruction_env: Optional[InstructionCraftax] = None
        self.replay_buffer: Optional[RelabelReplayBuffer] = None

    def _init_callback(self) -> None:
        self.adapter, self.instruction_env = find_instruction_env(self.model.get_env())
        self.n_envs = self.adapter.num_envs
        self._rates = RateWindow(self.n_envs)
        buf = getattr(self.model, "replay_buffer", None)
        if self.config.mode == "auto":
            self.mode = "replay" if isinstance(buf, DictReplayBuffer) else "curriculum"
        if self.mode == "replay":
            if not isinstance(buf, RelabelReplayBuffer):
                raise TypeError("replay relabeling writes into a RelabelReplayBuffer: build the model with "
                                "replay_buffer_class=oir_gym.sb3.RelabelReplayBuffer (DQN/QR-DQN with "
                                "MultiInputPolicy), or pass mode='curriculum' to update only the instruction buffer; got "
                                f"{type(buf).__name__}")
            if buf.n_envs != self.n_envs:
                raise ValueError(f"replay buffer has {buf.n_envs} env columns, the env {self.n_envs}")
            if self.model.get_vec_normalize_env() is not None:
                raise TypeError("VecNormalize is not supported by HindsightRelabelCallback: relabeled rows would be "
                                "stored unnormalised beside normalised ones")
            self.replay_buffer = buf
        env = self.instruction_env
        #: the step after relabeling, as PQN's
        self.curriculum = InstructionCurriculum([env.buffer], env.registry, CurriculumConfig(
            k=int(getattr(self.relabeler, "k", 1) or 1), keep_ungrounded=self.config.insert == "all",
            grounding="bound" if getattr(self.relabeler, "grounding", "cosine") == "bound" else "cosine",
            delta=float(env.params.delta)),
            register=lambda texts, bindings: env.register_instructions(texts, bindings=bindings))
        env_delta = float(env.params.delta)
        rel_delta = getattr(self.relabeler, "delta", env_delta)
        if abs(float(rel_delta) - env_delta) > 1e-9:
            warnings.warn(f"relabeler delta {rel_delta} differs from the env's {env_delta}: grounding and rewards "
                          "are recomputed with the env's", stacklevel=2)

    def _on_training_start(self) -> None:
        # learn() resets the env unless reset_num_timesteps=False: partial segments are then dropped
        if bool(self.locals.get("reset_num_timesteps", True)) or not self._segments:
            last = getattr(self.model, "_last_obs", None)
            self._cur_obs = self._strip(last) if isinstance(last, dict) else None
            self._segments = [self._new_segment(i) for i in range(self.n_envs)]

    @staticmethod
    def _strip(obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in obs.items() if k != INSTRUCTION_KEY}

    def _new_segment(self, i: int) -> OpenSegment:
        first = None
        if self.mode == "replay" and self._cur_obs is not None:
            first = {k: v[i].copy() for k, v in self._cur_obs.items()}
        return OpenSegment(self.num_timesteps, first)

    def _encode(self, texts: list[str]) -> np.ndarray:
        # through the relabeler when it shares the env's encoder, so its worker is not encoding at the same time
        enc = self.instruction_env.encoder
        if getattr(self.relabeler, "encoder", None) is enc and hasattr(self.relabeler, "encode"):
            return np.asarray(self.relabeler.encode(texts), dtype=np.float32)
        return np.asarray(enc.encode(list(texts)), dtype=np.float32)

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        dones = np.asarray(self.locals["dones"], dtype=bool).reshape(-1)
        actions = self.locals.get("clipped_actions", self.locals.get("actions"))
        actions = self.adapter.last_actions if actions is None else np.asarray(actions).reshape(self.n_envs, -1)[:, 0]
        replay = self.mode == "replay"
        new_obs = self._strip(self.locals["new_obs"]) if replay else None
        limit = self.config.segment_length
        self._rates.add(np.stack([np.asarray(info["events"], dtype=bool) for info in infos]), dones)
        for i in range(self.n_envs):
            seg = self._segments[i]
            info = infos[i]
            if seg.instruction is None:
                seg.instruction = str(info.get("instruction", ""))
            seg.events.append(np.asarray(info["events"], dtype=bool))
            seg.actions.append(int(actions[i]))
            if "text" in info:
                seg.texts.append(str(info["text"]))
                seg.action_texts.append(str(info.get("action_text", "")))
            done = bool(dones[i])
            if replay:
                nxt = info["terminal_observation"] if done else None
                for k in new_obs:
                    seg.obs[k].append(np.array(nxt[k] if done else new_obs[k][i], copy=True))
            if done or len(seg.actions) >= limit:
                self._finish(i, done, bool(info.get("TimeLimit.truncated", False)), bool(info.get("success", False)))
        if replay:
            self._cur_obs = new_obs
        for i in range(self.n_envs):
            if self._segments[i] is None:
                self._segments[i] = self._new_segment(i)
        if len(self._finished) >= (self.config.submit_batch or self.n_envs):
            self._dispatch()
        return True

    def _finish(self, i: int, done: bool, timeout: bool, success: bool = False) -> None:
        seg = self._segments[i]
        meta: dict[str, Any] = {"sb3_id": self._traj_counter, "start_step": seg.start, "timeout": timeout and done,
                                "own_success": success and done}
        if self.mode == "replay":
            meta["obs"] = {k: np.stack(v) for k, v in seg.obs.items()}  # [T + 1, ...]
        traj = seg.trajectory(i, done, meta)
        self._traj_counter += 1
        self._counts["segments"] += 1
        self._finished.append(traj)
        self._segments[i] = None  # type: ignore[call-overload]

    def _dispatch(self) -> None:
        batch, self._finished = self._finished, []
        if not batch:
            return
        self._counts["submitted"] += len(batch)
        if self.config.asynchronous:
            self.relabeler.submit(batch)
        else:
            self._ready.extend(self.relabeler.relabel(batch))

    def _on_rollout_end(self) -> None:
        self._drain(block=False)
        self._log()

    def _drain(self, block: bool = False) -> None:
        if self.config.asynchronous:
            self._ready.extend(self.relabeler.collect(block=block, timeout=self.config.end_timeout if block else None))
        if self._ready:
            results, self._ready = self._ready, []
            self.process_results(results)

    def process_results(self, results: Sequence[Any]) -> None:
        """Apply relabeling results: replay rows (``mode="replay"``), then the instruction buffer (as PQN's)."""
        if not results:
            return
        cfg = self.config
        env = self.instruction_env
        delta = float(env.params.delta)
        # rows for candidates of a relabeler that hands back bare texts: the env registry's cosine rows
        bare = list(dict.fromkeys(t for r in results for c in r.candidates
                                  if (t := _clean(c.text)) and getattr(c, "final_row", None) is None))
        bare_emb = self._encode(bare) if bare else np.zeros((0, env.encoder.dim), np.float32)
        bare_sim = env.registry.similarity_to_events(bare_emb) if bare else np.zeros((0, 0), np.float32)
        bare_rows = {t: (bare_emb[j], bare_sim[j], no_precondition(bare_sim.shape[1])) for j, t in enumerate(bare)}
        grounded_results = []
        for res in results:
            traj = res.trajectory
            self._counts["results"] += 1
            if cfg.keep_history:
                self.trajectories[traj.meta.get("sb3_id", -1)] = traj
            replayed = 0
            kept = []
            for cand in res.candidates:
                text = _clean(cand.text)
                if text is None:
                    self._counts["invalid_candidates"] += 1
                    continue
                if getattr(cand, "final_row", None) is not None and getattr(cand, "emb", None) is not None:
                    emb_j, final, pre = cand.emb, cand.final_row, cand.pre_row
                else:
                    emb_j, final, pre = bare_rows[text]
                # the env's own rule (oir_gym.grounding) decides where the relabeled instruction pays
                first = first_paid_step(traj.events, final, pre, episode_starts_from_dones(traj.dones), delta)
                self._counts["candidates"] += 1
                if first != getattr(cand, "first_step", first):
                    self._counts["first_step_mismatch"] += 1
                grounded = first >= 0
                self._counts["grounded"] += grounded
                self._window["candidates"] += 1
                self._window["grounded"] += grounded
                kept.append(Candidate(text, getattr(cand, "source", "rules"), int(first), grounded,
                                      float(getattr(cand, "similarity", -1.0)), getattr(cand, "binding", None),
                                      emb_j, final, pre))
                if self.replay_buffer is None or "obs" not in traj.meta:
                    continue
                if grounded:
                    if cfg.max_candidates is not None and replayed >= cfg.max_candidates:
                        continue
                    replayed += 1
                elif not cfg.replay_ungrounded:
                    continue
                self._window["copies"] += 1
                self.replay_buffer.add_relabeled(
                    traj.meta["obs"], traj.actions, emb_j, first, done=bool(traj.dones[-1]),
                    # the original instruction's success ended the episode: no terminal for this one
                    timeout=bool(traj.meta.get("timeout") or traj.meta.get("own_success")),
                    tag=(traj.meta.get("sb3_id"), text))
            grounded_results.append(RelabelResult(traj, kept))
        if cfg.insert == "none":
            return
        offer = self.curriculum.apply(grounded_results)
        self._counts["buffer_inserted"] += len(offer.inserted[0])
        self._window["new_instructions"] += int(offer.metrics["relabel/new_instructions"])
        self._window["offers"] += len(offer.offered[0])
        self._window["offers_llm"] += round(offer.metrics["relabel/llm_offer_share"] * len(offer.offered[0]))
        if offer.inserted[0] and self.curriculum.config.grounding == "cosine":
            # the new entries' rows now (their embeddings are cached), so the env's next step does not encode them
            env.register_instructions(offer.inserted[0])

    def _on_training_end(self) -> None:
        self._dispatch()
        block = self.config.asynchronous and self.config.end_timeout > 0
        pending = int(getattr(self.relabeler, "pending", 0) or 0)
        if block and pending and self.verbose >= 1:
            print(f"HindsightRelabelCallback: waiting for {pending} pending relabelings "
                  f"(at most {self.config.end_timeout}s)", flush=True)
        self._drain(block=block)
        self._log()

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """The ``relabel/*`` metrics PQN logs and the training rates since the last ``reset``."""
        w = self._window
        out = {"relabel/rows": float(w["copies"]),
               "relabel/grounded_frac": w["grounded"] / w["candidates"] if w["candidates"] else 0.0,
               "relabel/new_instructions": float(w["new_instructions"]),
               "relabel/llm_offer_share": w["offers_llm"] / w["offers"] if w["offers"] else 0.0}
        out.update(self._rates.metrics(reset) if self._rates is not None else {})
        if reset:
            self._window = Counter()
        return out

    @property
    def stats(self) -> dict[str, Any]:
        """Callback, replay-buffer and relabeler counters (a fresh dict)."""
        c = self._counts
        out: dict[str, Any] = {k: int(c.get(k, 0)) for k in (
            "segments", "submitted", "results", "candidates", "grounded", "first_step_mismatch", "buffer_inserted")}
        out.update(self.replay_buffer.stats() if self.replay_buffer is not None
                   else {"rows_added": 0, "success_rows": 0, "rows_pending": 0})
        out["waiting_segments"] = len(self._finished)
        if self.instruction_env is not None:
            out["buffer_size"] = len(self.instruction_env.buffer.contents())
        out["pending"] = int(getattr(self.relabeler, "pending", 0) or 0)
        rs = self.relabeler.stats() if hasattr(self.relabeler, "stats") else {}
        for k in ("cache_hit_rate", "latency_mean_s", "errors", "fallbacks", "calls", "overflow_rules",
                  "overflow_skipped", "overflow_replaced", "rules_results", "llm_results", "llm_repeats_rules",
                  "kept_grounded_fraction"):
            if k in rs and isinstance(rs[k], (int, float)):
                out[f"relabeler_{k}"] = rs[k]
        return out

    def _log(self) -> None:
        if self.model is None:
            return
        for k, v in self.stats.items():
            self.logger.record(f"relabel/{k}", v)
        for k, v in self.metrics().items():
            self.logger.record(k, v)
