"""``RelabelReplayBuffer``: SB3's ``DictReplayBuffer`` that also stores hindsight-relabeled transitions.

The :class:`~oir_gym.sb3.callback.HindsightRelabelCallback` hands every grounded candidate's segment to
:meth:`RelabelReplayBuffer.add_relabeled`, written ``n_envs`` transitions to a row. Rows may mix segments:
DQN and QR-DQN use 1-step targets with Dict observations, so every stored transition stands alone.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.buffers import DictReplayBuffer

__all__ = ["RelabelReplayBuffer", "INSTRUCTION_KEY"]

#: The observation key that holds the instruction embedding.
INSTRUCTION_KEY = "instruction"


class RelabelReplayBuffer(DictReplayBuffer):
    """A ``DictReplayBuffer`` with :meth:`add_relabeled` for hindsight-relabeled segments.

    Args (beyond ``DictReplayBuffer``'s):
        instruction_key: the observation key holding the instruction embedding.
        keep_history: record every relabeled transition written in :attr:`history` (``pos``, ``col``,
            ``t``, ``first_step``, ``tag``; memory grows with training).

    Counters: :attr:`relabeled_transitions` (written), :attr:`relabeled_successes` (written with
    reward 1), :attr:`pending_transitions` (queued, waiting to fill a row).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Dict, action_space: spaces.Space, *args: Any,
                 instruction_key: str = INSTRUCTION_KEY, keep_history: bool = False, **kwargs: Any) -> None:
        super().__init__(buffer_size, observation_space, action_space, *args, **kwargs)
        if instruction_key not in self.observations:
            raise KeyError(f"observation key {instruction_key!r} not in the observation space "
                           f"(keys {sorted(self.observations)})")
        self.instruction_key = instruction_key
        self.keep_history = bool(keep_history)
        self.history: list[dict[str, Any]] = []
        self.relabeled_transitions = 0
        self.relabeled_successes = 0
        self._pending: list[dict[str, Any]] = []

    @property
    def pending_transitions(self) -> int:
        """Relabeled transitions queued until ``n_envs`` of them fill a row."""
        return sum(len(p["rewards"]) for p in self._pending)

    def add_relabeled(self, obs: Mapping[str, np.ndarray], actions: np.ndarray, instruction: np.ndarray,
                      first_step: int, *, done: bool = False, timeout: bool = False, tag: Any = None) -> int:
        """Store one segment relabeled with one instruction; returns the transitions queued.

        Args:
            obs: ``[T + 1, ...]`` per key (the instruction key is replaced by ``instruction``).
            actions: ``[T]``.
            instruction: ``[D]`` the relabeled instruction's embedding.
            first_step: steps ``0 .. first_step`` are stored, reward 1 and done at ``first_step``;
                ``-1``: never accomplished, all ``T`` steps with reward 0.
            done: (``first_step == -1``) the segment's last step ended its episode.
            timeout: (``first_step == -1``) that end is stored as a truncation (SB3 bootstraps).
            tag: stored in :attr:`history` with each transition.
        """
        actions = np.asarray(actions).reshape(-1)
        T = len(actions)
        first = int(first_step)
        if not -1 <= first < T:
            raise ValueError(f"first_step={first_step} outside [-1, {T}) for a segment of {T} steps")
        keys = [k for k in self.observations if k != self.instruction_key]
        for k in keys:
            if k not in obs or len(obs[k]) != T + 1:
                raise ValueError(f"obs[{k!r}] must hold the segment's {T + 1} observations "
                                 f"(got {None if k not in obs else len(obs[k])})")
        L = first + 1 if first >= 0 else T
        if L == 0:
            return 0
        rewards = np.zeros(L, np.float32)
        dones = np.zeros(L, bool)
        timeouts = np.zeros(L, bool)
        if first >= 0:
            rewards[first] = 1.0
            dones[first] = True
        else:
            dones[-1] = bool(done)
            timeouts[-1] = bool(done and timeout)
        emb = np.asarray(instruction, np.float32)
        self._pending.append({
            "obs": {k: np.asarray(obs[k][:L]) for k in keys},
            "next_obs": {k: np.asarray(obs[k][1:L + 1]) for k in keys},
            "instruction": np.broadcast_to(emb, (L,) + emb.shape),
            "actions": actions[:L], "rewards": rewards, "dones": dones, "timeouts": timeouts,
            "tags": [(tag, first, t) for t in range(L)],
        })
        self._write_full_rows()
        return L

    def _write_full_rows(self) -> None:
        n = self.n_envs
        total = self.pending_transitions
        if total < n:
            return
        pend = self._pending
        cat = lambda f: np.concatenate([p[f] for p in pend])  # noqa: E731
        keys = list(pend[0]["obs"])
        obs = {k: np.concatenate([p["obs"][k] for p in pend]) for k in keys}
        nxt = {k: np.concatenate([p["next_obs"][k] for p in pend]) for k in keys}
        instr, actions, rewards, dones, timeouts = (cat(f) for f in ("instruction", "actions", "rewards", "dones",
                                                                    "timeouts"))
        tags = [tag for p in pend for tag in p["tags"]]
        usable = (total // n) * n
        ik = self.instruction_key
        for s in range(0, usable, n):
            sl = slice(s, s + n)
            o = {k: v[sl] for k, v in obs.items()}
            o2 = {k: v[sl] for k, v in nxt.items()}
            o[ik] = o2[ik] = instr[sl]
            pos = self.pos
            super().add(o, o2, actions[sl].reshape(n, 1), rewards[sl], dones[sl].astype(np.float32),
                        [{"TimeLimit.truncated": bool(x)} for x in timeouts[sl]])
            self.relabeled_transitions += n
            self.relabeled_successes += int(rewards[sl].sum())
            if self.keep_history:
                for col in range(n):
                    tag, first, t = tags[s + col]
                    self.history.append({"pos": pos, "col": col, "t": t, "first_step": first, "tag": tag})
        rest = slice(usable, total)
        self._pending = [] if usable == total else [{
            "obs": {k: v[rest] for k, v in obs.items()},
            "next_obs": {k: v[rest] for k, v in nxt.items()},
            "instruction": instr[rest], "actions": actions[rest], "rewards": rewards[rest],
            "dones": dones[rest], "timeouts": timeouts[rest], "tags": tags[usable:],
        }]

    def stats(self) -> dict[str, int]:
        """``rows_added`` (relabeled transitions written), ``success_rows`` (of them with reward 1),
        ``rows_pending`` (queued until a row is full)."""
        return {"rows_added": self.relabeled_transitions, "success_rows": self.relabeled_successes,
                "rows_pending": self.pending_transitions}

