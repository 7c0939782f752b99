"""Record a vector env's steps as :class:`~oir_gym.trajectory.Trajectory` objects for relabeling.

The recorder reads the step infos (``events``, ``instruction``, with ``info_text=True`` ``text`` /
``action_text``) and the env's ``reset_count``; it never changes the env. Wrap the env::

    envs = oir_gym.RecordTrajectories(gym.make_vec("OIR-CraftaxClassic-v0", num_envs=64))
    obs, info = envs.reset(seed=0)
    for _ in range(64):
        obs, reward, terminated, truncated, info = envs.step(policy(obs))
    results = relabeler.relabel(envs.trajectories())

or, for a quick look, ``oir_gym.rollout(envs, policy, steps=64)``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from oir_gym.captions import NUM_EVENTS
from oir_gym.trajectory import Trajectory
from oir_gym.validation import MAX_NUM_ENVS, ArgumentTypeError, check_int, show


class OpenSegment:
    """The steps of one env's trajectory so far (``obs``: per key, the observations from ``first_obs`` on)."""

    __slots__ = ("instruction", "start", "events", "actions", "texts", "action_texts", "ret", "obs")

    def __init__(self, start: int, first_obs: Optional[dict[str, np.ndarray]] = None) -> None:
        self.instruction: Optional[str] = None
        self.start = start
        self.events: list[np.ndarray] = []
        self.actions: list[int] = []
        self.texts: list[str] = []
        self.action_texts: list[str] = []
        self.ret = 0.0
        self.obs: dict[str, list[np.ndarray]] = {k: [v] for k, v in (first_obs or {}).items()}

    def trajectory(self, env_id: int, ended: bool, meta: dict[str, Any]) -> Trajectory:
        """These steps as a trajectory of env ``env_id`` (``ended``: its last step ended the episode)."""
        dones = np.zeros(len(self.actions), dtype=bool)
        dones[-1] = ended
        return Trajectory(instruction=self.instruction or "", events=np.stack(self.events),
                          actions=np.asarray(self.actions, np.int32), dones=dones,
                          texts=list(self.texts) if self.texts else None,
                          action_texts=list(self.action_texts) if self.texts else None, env_id=env_id, meta=meta)


class TrajectoryRecorder:
    """Turns the step outputs of an instruction vector env (or ``num_envs`` envs) into one trajectory per
    segment, which ends with its episode, after ``max_length`` steps, or at a reset (then ``dones[-1]``
    False: seen through :meth:`record_reset`, the env's ``reset_count`` or a changed ``info["instruction"]``).
    Its ``meta`` holds ``start_step``, ``terminated``, ``truncated``, ``success`` and ``return``."""

    def __init__(self, envs: Any = None, *, max_length: Optional[int] = None, num_envs: Optional[int] = None) -> None:
        if envs is None and num_envs is None:
            raise ValueError("give the vector env (TrajectoryRecorder(envs)) or num_envs=")
        if num_envs is not None:
            n = check_int("num_envs", num_envs, minimum=1, maximum=MAX_NUM_ENVS)
        elif not hasattr(envs, "num_envs"):
            raise ArgumentTypeError(f"envs={show(envs)} must be a vector env (with num_envs), got {type(envs).__name__}")
        else:
            n = check_int("envs.num_envs", envs.num_envs, minimum=1, maximum=MAX_NUM_ENVS)
        max_length = check_int("max_length", max_length, minimum=1, none_ok=True)
        mode = getattr(envs, "metadata", {}).get("autoreset_mode") if envs is not None else None
        self.num_envs = n
        self.max_length = max_length
        # next-step autoreset: the step after an episode's end only resets that env (no trajectory's)
        self._next_step = str(getattr(mode, "name", mode or "")).lower() == "next_step"
        self._resetting = np.zeros(n, dtype=bool)
        self._steps = 0
        self._open = [OpenSegment(0) for _ in range(n)]
        self._done: list[Trajectory] = []
        self._envs = envs
        self._seen_resets = self._reset_count()

    def _reset_count(self) -> Optional[int]:
        if self._envs is None:
            return None
        count = getattr(getattr(self._envs, "unwrapped", self._envs), "reset_count", None)
        return count if isinstance(count, int) and not isinstance(count, bool) else None

    def record_reset(self) -> None:
        """Tell the recorder that ``envs.reset`` ran: every running segment ends (unfinished)."""
        for i, seg in enumerate(self._open):
            if seg.actions:
                self._done.append(self._close(i, seg, False, False, False, False))
            self._open[i] = OpenSegment(self._steps)
        self._resetting[:] = False  # a pending next-step autoreset was done by the reset
        self._seen_resets = self._reset_count()

    def record(self, actions: Any, rewards: Any, terminated: Any, truncated: Any, info: dict) -> None:
        """Record one step of all envs: the actions taken and what ``envs.step(actions)`` returned."""
        n = self.num_envs
        if not isinstance(info, dict) or "events" not in info or "instruction" not in info:
            raise ValueError("info must be the info dict of an oir_gym vector env step "
                             "(with 'events' and 'instruction'); got keys "
                             f"{sorted(info) if isinstance(info, dict) else type(info).__name__}")
        acts = _array("actions", actions, np.int64).reshape(-1)
        events = _array("info['events']", info["events"], bool)
        rewards = _array("rewards", rewards, np.float64).reshape(-1)
        term = _array("terminated", terminated, bool).reshape(-1)
        trunc = _array("truncated", truncated, bool).reshape(-1)
        if events.shape != (n, NUM_EVENTS):
            raise ValueError(f"info['events'] must be [{n}, {NUM_EVENTS}] bool, got shape {events.shape}")
        for name, arr in (("actions", acts), ("rewards", rewards), ("terminated", term), ("truncated", trunc)):
            if arr.shape != (n,):
                raise ValueError(f"{name} must hold one value per env ({n}), got shape {arr.shape}")
        instructions = np.asarray(info["instruction"], dtype=object).reshape(-1)
        if instructions.shape != (n,):
            raise ValueError(f"info['instruction'] must hold one instruction per env ({n}), got shape "
                             f"{instructions.shape}")
        texts = info.get("text")
        action_texts = info.get("action_text")
        count = self._reset_count()
        if count is not None and count != self._seen_resets:  # envs.reset ran since the last step
            self.record_reset()
        for i in range(n):
            if self._resetting[i]:
                self._open[i].start = self._steps + 1
                continue
            seg = self._open[i]
            instruction = str(instructions[i])
            if seg.instruction is None:
                seg.instruction = instruction
            elif instruction != seg.instruction:  # a reset the recorder was not told of
                if seg.actions:
                    self._done.append(self._close(i, seg, False, False, False, False))
                seg = self._open[i] = OpenSegment(self._steps)
                seg.instruction = instruction
            seg.events.append(events[i])
            seg.actions.append(int(acts[i]))
            seg.ret += float(rewards[i])
            if texts is not None:
                seg.texts.append(str(texts[i]))
                seg.action_texts.append(str(action_texts[i]) if action_texts is not None else "")
            ended = bool(term[i] or trunc[i])
            if ended or (self.max_length is not None and len(seg.actions) >= self.max_length):
                success = bool(info["success"][i]) if "success" in info else False
                self._done.append(self._close(i, seg, ended, bool(term[i]), bool(trunc[i]), success))
                self._open[i] = OpenSegment(self._steps + 1)
        if self._next_step:
            self._resetting = term | trunc
        self._steps += 1

    def _close(self, i: int, seg: OpenSegment, ended: bool, term: bool, trunc: bool, success: bool) -> Trajectory:
        return seg.trajectory(i, ended, {"start_step": seg.start, "terminated": term and ended,
                                         "truncated": trunc and ended, "success": success and ended, "return": seg.ret})

    def trajectories(self, include_open: bool = True) -> list[Trajectory]:
        """The trajectories recorded since the last call, finished first; ``include_open``: running ones cut too."""
        out, self._done = self._done, []
        if include_open:
            for i, seg in enumerate(self._open):
                if seg.actions:
                    out.append(self._close(i, seg, False, False, False, False))
                    self._open[i] = OpenSegment(self._steps)
                    self._open[i].instruction = seg.instruction
        return out

    def __len__(self) -> int:
        return len(self._done)


class RecordTrajectories(VectorWrapper):
    """A vector env wrapper that records every ``reset`` and ``step`` of ``env`` into ``self.recorder``, a
    :class:`TrajectoryRecorder` (``max_length``: see there); the env's public attributes stay reachable."""

    def __init__(self, env: VectorEnv, *, max_length: Optional[int] = None) -> None:
        if not isinstance(env, VectorEnv):
            raise ArgumentTypeError(f"env={show(env)} must be a gymnasium.vector.VectorEnv (e.g. gym.make_vec("
                                    f"'OIR-CraftaxClassic-v0', num_envs=4)), got {type(env).__name__}")
        super().__init__(env)
        self.recorder = TrajectoryRecorder(env, max_length=max_length)

    def __getattr__(self, name: str) -> Any:
        env = self.__dict__.get("env")
        if env is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(env, name)

    def reset(self, *, seed: Any = None, options: Optional[dict] = None) -> tuple[Any, dict]:
        """``env.reset(seed=seed, options=options)``, then :meth:`TrajectoryRecorder.record_reset`."""
        obs, info = self.env.reset(seed=seed, options=options)
        self.recorder.record_reset()
        return obs, info

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict]:
        """``env.step(actions)``, recorded with :meth:`TrajectoryRecorder.record`."""
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.recorder.record(actions, rewards, terminated, truncated, info)
        return obs, rewards, terminated, truncated, info

    def trajectories(self, include_open: bool = True) -> list[Trajectory]:
        """The trajectories recorded since the last call (:meth:`TrajectoryRecorder.trajectories`)."""
        return self.recorder.trajectories(include_open)


def _array(name: str, value: Any, dtype: Any) -> np.ndarray:
    try:
        a = np.asarray(value)
        if dtype is np.int64 and a.size and not (np.issubdtype(a.dtype, np.integer) or (
                np.issubdtype(a.dtype, np.floating) and np.all(np.mod(a, 1) == 0))):
            raise TypeError(f"dtype {a.dtype}")
        if dtype is bool and a.size and not (a.dtype == bool or np.issubdtype(a.dtype, np.number)):
            raise TypeError(f"dtype {a.dtype}")
        return a.astype(dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise ArgumentTypeError(f"{name}={show(value)} must be an array of {np.dtype(dtype).name} values, one per "
                                f"env ({e})") from None


def rollout(envs: Any, policy: Optional[Callable[[Any], Any]] = None, steps: int = 64, *, seed: Optional[int] = None,
            options: Optional[dict] = None, max_length: Optional[int] = None) -> list[Trajectory]:
    """Reset ``envs`` (``seed``, ``options``), run ``policy(obs) -> actions`` (``None``: random) for ``steps``
    steps and return every finished episode, then the running ones cut at the last step."""
    steps = check_int("steps", steps, minimum=1)
    if policy is not None and not callable(policy):
        raise ArgumentTypeError(f"policy={show(policy)} must be a callable policy(obs) -> actions or None")
    recorder = TrajectoryRecorder(envs, max_length=max_length)
    obs, _ = envs.reset(seed=seed, options=options)
    recorder.record_reset()
    for _ in range(int(steps)):
        actions = envs.action_space.sample() if policy is None else policy(obs)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        recorder.record(actions, rewards, terminated, truncated, info)
    return recorder.trajectories()
