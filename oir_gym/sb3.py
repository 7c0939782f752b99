"""Stable-Baselines3 integration: a ``VecEnv`` adapter and the hindsight relabeling callback.

Quick use::

    from stable_baselines3 import DQN
    from oir_gym import InstructionCraftax, HindsightRelabeler
    from oir_gym.sb3 import SB3VecEnv, HindsightRelabelCallback

    venv = SB3VecEnv(InstructionCraftax(num_envs=16, seed=0))
    model = DQN("MultiInputPolicy", venv, seed=0)
    model.learn(100_000, callback=HindsightRelabelCallback(HindsightRelabeler(backend="rules")))

Why an adapter at all
---------------------
SB3 does not take a Gymnasium ``VectorEnv``: it has its own :class:`VecEnv` API (``step`` returns
``(obs, rewards, dones, infos)`` with ``infos`` a *list of per-env dicts*, ``reset()`` takes no
arguments, seeds/options are queued with ``seed()``/``set_options()``) and it always assumes that a
finished env was reset *in the same step*: the returned observation is the first observation of the
next episode and the last one sits in ``infos[i]["terminal_observation"]``.

Gymnasium 1.x vector envs default to the *next-step* autoreset: the step that ends an episode
returns its last observation, and the *following* ``step`` call resets that env and ignores its
action. Feeding that to SB3 would store a transition from the terminal observation to the reset
observation (with an action the env never executed) and would lose ``terminal_observation``, so
DQN's targets and RecurrentPPO's timeout bootstrapping would both be wrong. Gymnasium's
``SAME_STEP`` mode is the one that maps one-to-one: ``infos["final_obs"][i]`` becomes
``terminal_observation``. :class:`SB3VecEnv` therefore requires ``autoreset_mode="same_step"``
(the :class:`~oir_gym.vector_env.InstructionCraftax` default) and refuses ``"next_step"``.

Seeding: ``InstructionCraftax`` is **one** JAX batch driven by **one** PRNG key, not ``n``
independent envs. SB3's ``VecEnv.seed(s)`` queues ``s + i`` for env ``i``; the adapter seeds the
batch with ``s`` (the seed of env 0, i.e. ``seeds[i] - i`` for the first queued env) and the batch
splits that key into one world key per env. Hence ``seed(s)`` + ``reset()`` reproduces every env
exactly, and different ``s`` give different worlds everywhere, but env ``i`` of a batch seeded with
``s`` is *not* the same world as env ``0`` of a batch seeded with ``s + i``. Seeds that are not
consecutive (``seeds[i] != seeds[0] + i``) cannot be honoured and raise a warning.

Everything returned is a fresh, writable numpy array (SB3 writes into ``rewards`` in place, e.g.
RecurrentPPO's timeout bootstrapping), and every per-env info dict is independent.

The callback
------------
:class:`HindsightRelabelCallback` cuts each env's experience into trajectory segments (an episode,
or ``segment_length`` steps of a longer episode: the paper relabels per PQN rollout), submits the
finished segments to a :class:`~oir_gym.relabel.HindsightRelabeler`, and when the candidates come
back:

* **off-policy agents** (DQN, QR-DQN; ``mode="replay"``): writes relabeled transitions into the
  agent's ``DictReplayBuffer``: the segment's observations with the candidate's embedding in the
  ``"instruction"`` key, reward 1 and ``done=True`` at the first step whose events match the
  candidate under the *env's own* cosine reward (the relabeled episode ends there, later steps are
  dropped), reward 0 and ``done=False`` before it;
* **on-policy agents** (RecurrentPPO; ``mode="curriculum"``): updates only the instruction buffer
  (the curriculum) and the statistics. The rollout is *not* rewritten: PPO's rollout buffer stores
  the log-probabilities, values and LSTM states computed under the original instruction, so
  relabeled observations would make the importance ratios and the recurrent states stale; the
  returns and advantages are computed at the end of ``collect_rollouts`` and the rollout is
  consumed by the very next ``train()``, long before an asynchronous relabeler can answer.

In both modes the env's :class:`~oir_gym.buffer.InstructionBuffer` is updated: every kept
candidate's relabeled return (1 if grounded, else 0) is recorded, then the grounded candidates are
inserted in the paper's priority order (see :meth:`InstructionBuffer.insert`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections import Counter
from typing import Any, Optional, Sequence

import gymnasium as gym
import numpy as np
from stable_baselines3.common.buffers import DictReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from oir_gym.instruction_registry import validate_instruction
from oir_gym.reward import first_success_step
from oir_gym.trajectory import Trajectory
from oir_gym.vector_env import InstructionCraftax

__all__ = ["SB3VecEnv", "HindsightRelabelCallback", "find_instruction_env", "make_sb3_env", "PER_ENV_ATTRS"]

#: Per-env "virtual" attributes understood by :meth:`SB3VecEnv.get_attr` / :meth:`SB3VecEnv.set_attr`.
PER_ENV_ATTRS = ("instruction",)

_STEP_INFO_KEYS = ("instruction", "success", "events", "achievements", "similarity", "text", "action_text")


def _clean(text: Any) -> Optional[str]:
    """The env's normal form of an instruction, or ``None`` for one the env would refuse."""
    try:
        return validate_instruction(text)
    except (TypeError, ValueError):
        return None


def _to_list(x: Any, n: int) -> list:
    return list(x) if isinstance(x, (list, tuple, np.ndarray)) else [x] * n


class SB3VecEnv(VecEnv):
    """:class:`~oir_gym.vector_env.InstructionCraftax` as a Stable-Baselines3 ``VecEnv``.

    Args:
        env: the batched env (its ``autoreset_mode`` must be ``"same_step"``); when ``None`` one is
            built from ``env_kwargs``.
        **env_kwargs: passed to :class:`InstructionCraftax` when ``env`` is ``None``.

    Step infos (one dict per env): ``instruction`` (the instruction the step was taken under),
    ``success``, ``events`` (``[E]`` bool), ``achievements`` (``[22]`` bool), ``similarity``,
    ``TimeLimit.truncated`` (truncated and not terminated, as SB3's own ``DummyVecEnv``), and for
    a finished env ``terminal_observation`` (its last observation), ``episode``
    (``{"r", "l", "t"}``, the format of SB3's ``Monitor``/``VecMonitor``, so ``rollout/ep_rew_mean``
    is logged without wrapping) and ``is_success`` (the episode's instruction was accomplished).
    ``reset_infos[i]`` holds ``{"instruction": ...}`` of env ``i``'s current episode (refreshed
    at every reset, including autoresets).

    ``get_attr``/``set_attr``/``env_method``: the batch is one Python object, so an attribute is
    shared by all envs (``get_attr`` returns the same value once per index, ``set_attr`` with a
    strict subset of indices raises) and ``env_method`` calls the method **once** and returns its
    result once per index. The per-env exception is ``"instruction"``: ``get_attr("instruction")``
    gives each env's current instruction and ``set_attr("instruction", text, indices)`` pins the
    instruction of those envs from their next reset (see :meth:`InstructionCraftax.set_instructions`).
    ``set_options({"instruction": ...})`` (per env or shared) pins at the next ``reset()``.
    """

    def __init__(self, env: Optional[InstructionCraftax] = None, **env_kwargs: Any) -> None:
        if env is None:
            env = InstructionCraftax(**env_kwargs)
        elif env_kwargs:
            raise TypeError("pass either an env or env keyword arguments, not both")
        if not isinstance(env, InstructionCraftax):
            raise TypeError(f"SB3VecEnv wraps an InstructionCraftax, got {type(env).__name__}")
        if getattr(env, "autoreset", "same_step") != "same_step":
            raise ValueError(
                "SB3 needs same-step autoreset (the step that ends an episode returns the next episode's "
                "first observation and the last one in terminal_observation); build InstructionCraftax "
                f"with autoreset_mode='same_step', not {env.autoreset!r}"
            )
        self.env = env
        self._actions: Optional[np.ndarray] = None
        self._t_start = time.time()
        self._pins: list[Optional[str]] = [None] * env.num_envs
        super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
        self.metadata = dict(self.metadata, autoreset_mode="same_step")

    # ------------------------------------------------------------------ pass-throughs
    @property
    def encoder(self):
        """The env's sentence encoder (the one that embeds the ``"instruction"`` observation)."""
        return self.env.encoder

    @property
    def buffer(self):
        """The env's :class:`~oir_gym.buffer.InstructionBuffer` (the curriculum)."""
        return self.env.buffer

    @property
    def last_actions(self) -> Optional[np.ndarray]:
        """The actions of the last step (a copy), or ``None`` before the first step."""
        return None if self._actions is None else self._actions.copy()

    def current_instructions(self) -> list[str]:
        return self.env.current_instructions()

    # ------------------------------------------------------------------ VecEnv API
    def _batch_seed(self) -> Optional[int]:
        first = next(((i, s) for i, s in enumerate(self._seeds) if s is not None), None)
        if first is None:
            return None
        i0, s0 = first
        base = int(s0) - i0
        expected = [base + i for i in range(self.num_envs)]
        if any(s is not None and int(s) != e for s, e in zip(self._seeds, expected)):
            warnings.warn(
                f"InstructionCraftax is one JAX batch seeded once: per-env seeds {self._seeds} are not "
                f"consecutive; seeding the batch with {base} (env i gets world i of that key)",
                stacklevel=3,
            )
        return base

    def _reset_options_arg(self) -> Optional[dict[str, Any]]:
        if not any(self._options):
            return None
        unknown = {k for o in self._options for k in o} - {"instruction"}
        if unknown:
            warnings.warn(f"ignoring unsupported reset options {sorted(unknown)} (only 'instruction')", stacklevel=3)
        if not any("instruction" in o for o in self._options):
            return None
        pins = [o.get("instruction", p) if o else p for o, p in zip(self._options, self._pins)]
        self._pins = list(pins)
        return {"instruction": pins}

    def reset(self):
        seed = self._batch_seed()
        options = self._reset_options_arg()
        obs, infos = self.env.reset(seed=seed, options=options)
        instr = infos["instruction"]
        self.reset_infos = [{"instruction": str(instr[i])} for i in range(self.num_envs)]
        if "text" in infos:
            for i in range(self.num_envs):
                self.reset_infos[i]["text"] = str(infos["text"][i])
        self._reset_seeds()
        self._reset_options()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.array(actions).reshape(self.num_envs)

    def step_wait(self):
        if self._actions is None:
            raise RuntimeError("step_async() must be called before step_wait()")
        obs, rewards, terms, truncs, infos = self.env.step(self._actions)
        n = self.num_envs
        dones = np.logical_or(terms, truncs)
        out: list[dict[str, Any]] = []
        for i in range(n):
            d: dict[str, Any] = {}
            for k in _STEP_INFO_KEYS:
                if k in infos:
                    v = infos[k][i]
                    d[k] = v.copy() if isinstance(v, np.ndarray) else (v.item() if isinstance(v, np.generic) else v)
            d["TimeLimit.truncated"] = bool(truncs[i] and not terms[i])
            out.append(d)
        if dones.any():
            t = round(time.time() - self._t_start, 6)
            final = infos["final_obs"]
            ep = infos["episode"]
            current = self.env.current_instructions()
            for i in np.flatnonzero(dones):
                d = out[i]
                d["terminal_observation"] = {k: np.array(v, copy=True) for k, v in final[i].items()}
                r = float(ep["r"][i])
                d["episode"] = {"r": r, "l": int(ep["l"][i]), "t": t}
                d["is_success"] = r > 0.0
                self.reset_infos[i] = {"instruction": current[i]}
        return obs, np.array(rewards, dtype=np.float32, copy=True), dones.astype(bool), out

    def close(self) -> None:
        self.env.close()

    def _indices(self, indices) -> list[int]:
        idx = list(self._get_indices(indices))
        for i in idx:
            if not 0 <= int(i) < self.num_envs:
                raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
        return [int(i) for i in idx]

    def get_attr(self, attr_name: str, indices=None) -> list[Any]:
        idx = self._indices(indices)
        if attr_name == "instruction":
            cur = self.env.current_instructions()
            return [cur[i] for i in idx]
        value = getattr(self.env, attr_name)
        return [value for _ in idx]

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        idx = self._indices(indices)
        if attr_name == "instruction":
            vals = _to_list(value, len(idx)) if not isinstance(value, str) else [value] * len(idx)
            if len(vals) != len(idx):
                raise ValueError(f"got {len(vals)} instructions for {len(idx)} envs")
            for i, v in zip(idx, vals):
                self._pins[i] = v
            self.env.set_instructions(list(self._pins))
            return
        if sorted(set(idx)) != list(range(self.num_envs)):
            raise ValueError(
                f"{attr_name!r} is an attribute of the whole JAX batch: set it for all envs (indices=None), "
                f"not for {idx}"
            )
        setattr(self.env, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> list[Any]:
        idx = self._indices(indices)
        result = getattr(self.env, method_name)(*method_args, **method_kwargs)
        return [result for _ in idx]

    def env_is_wrapped(self, wrapper_class: type[gym.Wrapper], indices=None) -> list[bool]:
        return [False for _ in self._indices(indices)]

    def get_images(self) -> Sequence[Optional[np.ndarray]]:
        if self.render_mode != "rgb_array":
            warnings.warn(f"render_mode is {self.render_mode!r}; get_images needs 'rgb_array'", stacklevel=2)
            return [None] * self.num_envs
        return list(self.env.render())


def make_sb3_env(num_envs: int = 16, *, monitor: bool = False, monitor_file: Optional[str] = None,
                 **env_kwargs: Any) -> VecEnv:
    """Build ``InstructionCraftax(num_envs, **env_kwargs)`` as an SB3 ``VecEnv``.

    The adapter already reports ``Monitor``-style episode statistics; ``monitor=True`` adds SB3's
    ``VecMonitor`` on top anyway (e.g. to write a ``monitor.csv`` with ``monitor_file``).
    """
    venv: VecEnv = SB3VecEnv(InstructionCraftax(num_envs=num_envs, **env_kwargs))
    if monitor or monitor_file:
        from stable_baselines3.common.vec_env import VecMonitor

        venv = VecMonitor(venv, filename=monitor_file, info_keywords=("instruction",))
    return venv


def find_instruction_env(venv: Any) -> tuple[SB3VecEnv, InstructionCraftax]:
    """The :class:`SB3VecEnv` under any stack of ``VecEnvWrapper`` and its ``InstructionCraftax``."""
    cur = venv
    while isinstance(cur, VecEnvWrapper):
        cur = cur.venv
    if not isinstance(cur, SB3VecEnv):
        raise TypeError(
            f"expected an oir_gym.sb3.SB3VecEnv (possibly wrapped), got {type(cur).__name__}; "
            "build the training env with SB3VecEnv(InstructionCraftax(...))"
        )
    return cur, cur.env


# ====================================================================================== callback


class _Segment:
    """The trajectory segment an env is currently recording (host-side lists)."""

    __slots__ = ("obs", "events", "actions", "texts", "action_texts", "instruction", "start")

    def __init__(self, first_obs: Optional[dict[str, np.ndarray]], start: int) -> None:
        self.obs: dict[str, list[np.ndarray]] = {k: [v] for k, v in (first_obs or {}).items()}
        self.events: list[np.ndarray] = []
        self.actions: list[int] = []
        self.texts: list[str] = []
        self.action_texts: list[str] = []
        self.instruction: Optional[str] = None
        self.start = start

    def __len__(self) -> int:
        return len(self.actions)


class HindsightRelabelCallback(BaseCallback):
    """Hindsight instruction relabeling for SB3 training (paper Alg. 1 around an SB3 agent).

    Args:
        relabeler: a :class:`~oir_gym.relabel.HindsightRelabeler` (or any object with
            ``relabel(list[Trajectory])`` and, for ``asynchronous=True``, ``submit``/``collect``
            and ``pending``).
        mode: ``"replay"`` (write relabeled transitions into the replay buffer: DQN, QR-DQN),
            ``"curriculum"`` (instruction buffer and statistics only: RecurrentPPO, PPO, A2C) or
            ``"auto"`` (``"replay"`` when the model has a ``DictReplayBuffer``).
        segment_length: longest trajectory segment sent to the relabeler; an episode longer than
            this is relabeled in consecutive pieces (the paper relabels per 128-step PQN rollout).
        submit_batch: finished segments gathered before one ``submit`` (default: ``num_envs``);
            the LLM backend batches the prompts of one submission.
        asynchronous: relabel on the relabeler's background thread (``submit``/``collect``); with
            ``False`` the relabeling runs in the training thread (lock-step, deterministic).
        update_buffer: update the env's instruction buffer with the candidates.
        record_candidate_returns: record each kept candidate's relabeled return (1 grounded, 0 not)
            in the buffer statistics before inserting, so the priority order sees how often the
            agent's behaviour accomplishes it.
        insert: ``"grounded"`` (insert only candidates that pay a reward in their trajectory) or
            ``"all"`` kept candidates.
        max_candidates: at most this many grounded candidates per trajectory are replayed
            (default: all the relabeler kept, i.e. up to its ``k``).
        replay_ungrounded: also replay ungrounded candidates (reward 0 everywhere, original
            episode end), as negative examples.
        instruction_key: the observation key holding the instruction embedding.
        wait_on_end: at the end of ``learn``, submit the last finished segments and wait (up to
            ``end_timeout`` seconds) for every pending result.
        keep_history: keep a record of every relabeled row written (``self.history``: dicts with
            ``pos``, ``col``, ``text``, ``t``, ``first_step``, ``traj``) and of the relabeled
            trajectories (``self.trajectories[traj]``), for tests and debugging (memory grows).
        verbose: SB3 verbosity.

    Statistics (``self.stats`` and SB3's logger under ``relabel/``): ``segments``, ``submitted``,
    ``results``, ``candidates``, ``grounded``, ``grounded_fraction``, ``first_step_mismatch`` (the
    relabeler and the env disagree on the first matching step; the env wins), ``rows_added``,
    ``success_rows``, ``rows_pending``, ``buffer_inserted``, ``buffer_size``, ``pending``, and the
    relabeler's own counters (``cache_hit_rate``, ``latency_mean_s``, ``errors``, ``fallbacks``...).
    """

    def __init__(
        self,
        relabeler: Any,
        *,
        mode: str = "auto",
        segment_length: int = 128,
        submit_batch: Optional[int] = None,
        asynchronous: bool = True,
        update_buffer: bool = True,
        record_candidate_returns: bool = True,
        insert: str = "grounded",
        max_candidates: Optional[int] = None,
        replay_ungrounded: bool = False,
        instruction_key: str = "instruction",
        wait_on_end: bool = True,
        end_timeout: Optional[float] = 300.0,
        keep_history: bool = False,
        verbose: int = 0,
    ) -> None:
        super().__init__(verbose)
        if mode not in ("auto", "replay", "curriculum"):
            raise ValueError(f"mode must be 'auto', 'replay' or 'curriculum', got {mode!r}")
        if insert not in ("grounded", "all"):
            raise ValueError(f"insert must be 'grounded' or 'all', got {insert!r}")
        if segment_length < 1:
            raise ValueError(f"segment_length must be >= 1, got {segment_length}")
        if relabeler is None:
            raise ValueError("relabeler is required (e.g. HindsightRelabeler(backend='rules'))")
        self.relabeler = relabeler
        self.requested_mode = mode
        self.mode = mode
        self.segment_length = int(segment_length)
        self.submit_batch = submit_batch
        self.asynchronous = bool(asynchronous)
        self.update_buffer = update_buffer
        self.record_candidate_returns = record_candidate_returns
        self.insert = insert
        self.max_candidates = max_candidates
        self.replay_ungrounded = replay_ungrounded
        self.instruction_key = instruction_key
        self.wait_on_end = wait_on_end
        self.end_timeout = end_timeout
        self.keep_history = keep_history
        self.history: list[dict[str, Any]] = []
        self.trajectories: dict[int, Trajectory] = {}
        self._counts: Counter = Counter()
        self._segments: list[_Segment] = []
        self._finished: list[Trajectory] = []
        self._ready: list[Any] = []
        self._pending_rows: list[dict[str, Any]] = []
        self._counts_rows_pending = 0
        self._cur_obs: Optional[dict[str, np.ndarray]] = None
        self._traj_counter = 0
        self.adapter: Optional[SB3VecEnv] = None
        self.instruction_env: Optional[InstructionCraftax] = None

    # ------------------------------------------------------------------ setup
    def _init_callback(self) -> None:
        self.adapter, self.instruction_env = find_instruction_env(self.model.get_env())
        self.n_envs = self.adapter.num_envs
        buf = getattr(self.model, "replay_buffer", None)
        if self.requested_mode == "auto":
            self.mode = "replay" if isinstance(buf, DictReplayBuffer) else "curriculum"
        if self.mode == "replay":
            if not isinstance(buf, DictReplayBuffer):
                raise TypeError(
                    "mode='replay' needs an off-policy model with a DictReplayBuffer (DQN/QR-DQN with "
                    f"MultiInputPolicy); got {type(buf).__name__}"
                )
            if type(buf).__name__.startswith("NStep") or getattr(buf, "n_steps", 1) != 1:
                raise TypeError("relabeled rows are packed as independent 1-step transitions: n-step buffers are not supported")
            if buf.n_envs != self.n_envs:
                raise ValueError(f"replay buffer has {buf.n_envs} env columns, the env {self.n_envs}")
            if self.instruction_key not in buf.observations:
                raise KeyError(f"observation key {self.instruction_key!r} not in the replay buffer")
            if getattr(self.model, "_vec_normalize_env", None) is not None:
                warnings.warn("VecNormalize is not supported by HindsightRelabelCallback: rows are written unnormalised", stacklevel=2)
        if self.submit_batch is None:
            self.submit_batch = self.n_envs
        env_delta = float(self.instruction_env.params.delta)
        rel_delta = getattr(self.relabeler, "delta", env_delta)
        if abs(float(rel_delta) - env_delta) > 1e-9:
            warnings.warn(
                f"relabeler delta {rel_delta} differs from the env's {env_delta}: grounding and rewards "
                "are recomputed with the env's", stacklevel=2,
            )

    def _on_training_start(self) -> None:
        # learn() resets the env unless reset_num_timesteps=False: partial segments then belong to
        # dead episodes and are dropped; otherwise they continue where the last learn() stopped.
        fresh = bool(self.locals.get("reset_num_timesteps", True)) or not self._segments
        if fresh:
            last = getattr(self.model, "_last_obs", None)
            self._cur_obs = self._strip(last) if isinstance(last, dict) else None
            self._segments = [self._new_segment(i) for i in range(self.n_envs)]

    # ------------------------------------------------------------------ helpers
    def _strip(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.array(v, copy=True) for k, v in obs.items() if k != self.instruction_key}

    def _new_segment(self, i: int) -> _Segment:
        first = None
        if self.mode == "replay" and self._cur_obs is not None:
            first = {k: v[i].copy() for k, v in self._cur_obs.items()}
        return _Segment(first, self.num_timesteps)

    def _encode(self, texts: list[str]) -> np.ndarray:
        lock = getattr(self.relabeler, "_enc_lock", None)  # the relabeler's worker may share the encoder
        with (lock if lock is not None else contextlib.nullcontext()):
            return np.asarray(self.instruction_env.encoder.encode(list(texts)), dtype=np.float32)

    # ------------------------------------------------------------------ per step
    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        dones = np.asarray(self.locals["dones"], dtype=bool).reshape(-1)
        actions = self.locals.get("clipped_actions", self.locals.get("actions"))
        actions = self.adapter.last_actions if actions is None else np.asarray(actions).reshape(self.n_envs, -1)[:, 0]
        replay = self.mode == "replay"
        new_obs = self._strip(self.locals["new_obs"]) if replay else None
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
            if done or len(seg) >= self.segment_length:
                self._finish(i, done, bool(info.get("TimeLimit.truncated", False)), bool(info.get("success", False)))
        if replay:
            self._cur_obs = new_obs
        for i in range(self.n_envs):
            if self._segments[i] is None:
                self._segments[i] = self._new_segment(i)
        if len(self._finished) >= self.submit_batch:
            self._dispatch()
        return True

    def _finish(self, i: int, done: bool, timeout: bool, success: bool = False) -> None:
        seg = self._segments[i]
        T = len(seg)
        dones = np.zeros(T, dtype=bool)
        dones[-1] = done
        meta: dict[str, Any] = {"sb3_id": self._traj_counter, "start_step": seg.start, "timeout": timeout and done,
                                "own_success": success and done}
        if self.mode == "replay":
            meta["obs"] = {k: np.stack(v) for k, v in seg.obs.items()}  # [T + 1, ...]
        traj = Trajectory(
            instruction=seg.instruction or "", events=np.stack(seg.events), actions=np.asarray(seg.actions, np.int32),
            dones=dones, texts=list(seg.texts) if seg.texts else None,
            action_texts=list(seg.action_texts) if seg.texts else None, env_id=i, meta=meta,
        )
        self._traj_counter += 1
        self._counts["segments"] += 1
        self._finished.append(traj)
        self._segments[i] = None  # type: ignore[call-overload]

    def _dispatch(self) -> None:
        batch, self._finished = self._finished, []
        if not batch:
            return
        self._counts["submitted"] += len(batch)
        if self.asynchronous:
            self.relabeler.submit(batch)
        else:
            self._ready.extend(self.relabeler.relabel(batch))

    # ------------------------------------------------------------------ results
    def _on_rollout_end(self) -> None:
        self._drain(block=False)
        self._log()

    def _drain(self, block: bool = False) -> None:
        if self.asynchronous:
            if block:
                self._ready.extend(self.relabeler.collect(block=True, timeout=self.end_timeout))
            else:
                self._ready.extend(self.relabeler.collect(block=False))
        if self._ready:
            results, self._ready = self._ready, []
            self.process_results(results)

    def process_results(self, results: Sequence[Any]) -> None:
        """Apply relabeling results: replay rows (``mode="replay"``) and the instruction buffer."""
        if not results:
            return
        env = self.instruction_env
        delta = float(env.params.delta)
        texts = list(dict.fromkeys(t for r in results for c in r.candidates if (t := _clean(c.text))))
        emb = self._encode(texts) if texts else np.zeros((0, env.encoder.dim), np.float32)
        sims = env.registry.similarity_to_events(emb) if texts else np.zeros((0, 0), np.float32)
        row = {t: j for j, t in enumerate(texts)}
        recorded: list[tuple[str, float]] = []
        to_insert: list[str] = []
        for res in results:
            traj = res.trajectory
            self._counts["results"] += 1
            if self.keep_history:
                self.trajectories[traj.meta.get("sb3_id", -1)] = traj
            replayed = 0
            for cand in res.candidates:
                text = _clean(cand.text)
                if text is None:
                    self._counts["invalid_candidates"] += 1
                    continue
                j = row[text]
                first = first_success_step(traj.events, sims[j], delta)
                self._counts["candidates"] += 1
                if first != getattr(cand, "first_step", first):
                    self._counts["first_step_mismatch"] += 1
                grounded = first >= 0
                self._counts["grounded"] += grounded
                recorded.append((text, 1.0 if grounded else 0.0))
                if grounded or self.insert == "all":
                    to_insert.append(text)
                if self.mode != "replay" or "obs" not in traj.meta:
                    continue
                if grounded and (self.max_candidates is None or replayed < self.max_candidates):
                    self._queue_rows(traj, text, emb[j], first)
                    replayed += 1
                elif not grounded and self.replay_ungrounded:
                    self._queue_rows(traj, text, emb[j], -1)
        if self.mode == "replay":
            self._flush_rows()
        if self.update_buffer and recorded:
            buf = env.buffer
            if self.record_candidate_returns:
                buf.record_many([t for t, _ in recorded], [r for _, r in recorded])
            if to_insert:
                written = buf.insert(to_insert)
                self._counts["buffer_inserted"] += len(written)
                if written:
                    # Encode the new buffer entries now, under the relabeler's encoder lock, so the
                    # env's next step finds them in its table instead of encoding concurrently.
                    lock = getattr(self.relabeler, "_enc_lock", None)
                    with (lock if lock is not None else contextlib.nullcontext()):
                        env.register_instructions(list(dict.fromkeys(buf.contents())))

    def _queue_rows(self, traj: Trajectory, text: str, emb: np.ndarray, first: int) -> None:
        obs = traj.meta["obs"]
        T = len(traj)
        L = first + 1 if first >= 0 else T
        rewards = np.zeros(L, np.float32)
        dones = np.zeros(L, bool)
        timeouts = np.zeros(L, bool)
        if first >= 0:
            rewards[first] = 1.0
            dones[first] = True
        else:
            dones[-1] = bool(traj.dones[-1])
            # The original instruction's success ended the episode: for the relabeled instruction
            # that is no terminal, so it is stored as a truncation (SB3 bootstraps from the next obs).
            timeouts[-1] = bool(traj.meta.get("timeout", False) or traj.meta.get("own_success", False))
        self._pending_rows.append({
            "obs": {k: v[:L] for k, v in obs.items()},
            "next_obs": {k: v[1:L + 1] for k, v in obs.items()},
            "instruction": np.broadcast_to(emb, (L,) + emb.shape),
            "actions": traj.actions[:L],
            "rewards": rewards, "dones": dones, "timeouts": timeouts,
            "tags": [(traj.meta.get("sb3_id"), text, first, t) for t in range(L)],
        })

    def _flush_rows(self) -> None:
        """Write pending relabeled transitions into the replay buffer, ``n_envs`` per row.

        SB3's ``DictReplayBuffer`` stores rows of ``n_envs`` transitions and samples (row, column)
        pairs independently; with 1-step targets (SB3 refuses n-step returns for Dict observations)
        each stored transition stands alone, so relabeled transitions from any trajectories can
        share a row. Fewer than ``n_envs`` left over wait for the next batch.
        """
        n = self.n_envs
        total = sum(len(p["rewards"]) for p in self._pending_rows)
        self._counts_rows_pending = total
        if total < n:
            return
        cat = lambda f: np.concatenate([p[f] for p in self._pending_rows])  # noqa: E731
        keys = list(self._pending_rows[0]["obs"])
        obs = {k: np.concatenate([p["obs"][k] for p in self._pending_rows]) for k in keys}
        nxt = {k: np.concatenate([p["next_obs"][k] for p in self._pending_rows]) for k in keys}
        instr, actions, rewards = cat("instruction"), cat("actions"), cat("rewards")
        dones, timeouts = cat("dones"), cat("timeouts")
        tags = [tag for p in self._pending_rows for tag in p["tags"]]
        usable = (total // n) * n
        buf = self.model.replay_buffer
        ik = self.instruction_key
        for s in range(0, usable, n):
            sl = slice(s, s + n)
            o = {k: v[sl] for k, v in obs.items()}
            o2 = {k: v[sl] for k, v in nxt.items()}
            o[ik] = o2[ik] = instr[sl]
            pos = buf.pos
            buf.add(o, o2, actions[sl].reshape(n, 1), rewards[sl], dones[sl].astype(np.float32),
                    [{"TimeLimit.truncated": bool(x)} for x in timeouts[sl]])
            self._counts["rows_added"] += n
            self._counts["success_rows"] += int(rewards[sl].sum())
            if self.keep_history:
                for col in range(n):
                    tid, text, first, t = tags[s + col]
                    self.history.append({"pos": pos, "col": col, "traj": tid, "text": text, "t": t,
                                         "first_step": first})
        rest = slice(usable, total)
        self._pending_rows = [] if usable == total else [{
            "obs": {k: v[rest] for k, v in obs.items()},
            "next_obs": {k: v[rest] for k, v in nxt.items()},
            "instruction": instr[rest], "actions": actions[rest], "rewards": rewards[rest],
            "dones": dones[rest], "timeouts": timeouts[rest], "tags": tags[usable:],
        }]
        self._counts_rows_pending = total - usable

    # ------------------------------------------------------------------ end and logging
    def _on_training_end(self) -> None:
        if self.wait_on_end:
            self._dispatch()
            pending = int(getattr(self.relabeler, "pending", 0) or 0) if self.asynchronous else 0
            if pending and self.verbose >= 1:
                print(f"HindsightRelabelCallback: waiting for {pending} pending relabelings "
                      f"(at most {self.end_timeout}s)", flush=True)
            self._drain(block=True)
        self._log()

    @property
    def stats(self) -> dict[str, Any]:
        """Callback and relabeler counters (a fresh dict)."""
        c = self._counts
        out: dict[str, Any] = {k: int(c.get(k, 0)) for k in (
            "segments", "submitted", "results", "candidates", "grounded", "first_step_mismatch",
            "rows_added", "success_rows", "buffer_inserted")}
        out["grounded_fraction"] = c["grounded"] / c["candidates"] if c["candidates"] else 0.0
        out["rows_pending"] = int(self._counts_rows_pending)
        out["waiting_segments"] = len(self._finished)
        if self.instruction_env is not None:
            out["buffer_size"] = len(self.instruction_env.buffer.contents())
        out["pending"] = int(getattr(self.relabeler, "pending", 0) or 0)
        rs = self.relabeler.stats() if hasattr(self.relabeler, "stats") else {}
        for k in ("cache_hit_rate", "latency_mean_s", "errors", "fallbacks", "calls", "overflow_rules",
                  "overflow_skipped", "kept_grounded_fraction"):
            if k in rs and isinstance(rs[k], (int, float)):
                out[f"relabeler_{k}"] = rs[k]
        return out

    def _log(self) -> None:
        if self.model is None:
            return
        for k, v in self.stats.items():
            self.logger.record(f"relabel/{k}", v)
