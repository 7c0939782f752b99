"""Stable-Baselines3 agents on InstructionCraftax: RecurrentPPO, QR-DQN and DQN with OIR relabeling.

The instruction is part of the observation (``Dict({"obs", "instruction"})``), so all three use
SB3's multi-input policies: ``MultiInputLstmPolicy`` (sb3-contrib ``RecurrentPPO``) and
``MultiInputPolicy`` (sb3-contrib ``QRDQN``, SB3 ``DQN``). Relabeling is attached with
:class:`oir_gym.sb3.HindsightRelabelCallback`: DQN and QR-DQN get relabeled transitions in their
replay buffer, RecurrentPPO gets the curriculum (instruction buffer) only (see :mod:`oir_gym.sb3`).

Building blocks (each usable alone)::

    configure_torch_threads()                       # 1 thread on small CPUs (much faster for SB3)
    venv = make_env(num_envs=16, seed=0)            # SB3 VecEnv over InstructionCraftax
    model = make_model("qrdqn", venv, seed=0)       # Craftax defaults (DEFAULT_HYPERPARAMS)
    relabeler = make_relabeler("rules", k=4)
    model.learn(100_000, callback=make_relabel_callback(relabeler, "qrdqn"))
    result = evaluate(model)                        # oir_gym.evaluation protocol, greedy

and :func:`train` runs all of it and writes a run directory (what ``examples/train_sb3.py`` calls).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

ALGOS = ("recurrent_ppo", "qrdqn", "dqn")
RELABELERS = ("rules", "llm", "both", "none")

#: Craftax-Classic defaults per algorithm (SB3 constructor keyword arguments).
#:
#: * RecurrentPPO follows the Craftax PPO-RNN baseline where a CPU allows it (gamma 0.99, GAE
#:   lambda 0.8, clip 0.2, entropy 0.01, 4 epochs, 4 minibatches per rollout, grad-norm 1.0)
#:   with a smaller LSTM (256, shared by actor and critic); ``batch_size`` is derived from
#:   ``n_envs * n_steps / 4`` when not given.
#: * DQN and QR-DQN: Adam 1e-4, 1-step targets (SB3 has no n-step returns for Dict observations),
#:   hard target updates every 10k steps, epsilon 1 -> 0.05 over 10% of training, 2 x 256 MLP.
#:   The replay buffer holds ~10 kB per transition here (888 + 384 floats, obs and next obs),
#:   so 50k transitions take ~0.5 GB.
DEFAULT_HYPERPARAMS: dict[str, dict[str, Any]] = {
    "recurrent_ppo": dict(
        learning_rate=2.5e-4, n_steps=64, n_epochs=4, gamma=0.99, gae_lambda=0.8, clip_range=0.2,
        ent_coef=0.01, vf_coef=0.5, max_grad_norm=1.0,
        policy_kwargs=dict(lstm_hidden_size=256, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False,
                           net_arch=dict(pi=[256], vf=[256])),
    ),
    "dqn": dict(
        learning_rate=1e-4, buffer_size=50_000, learning_starts=2_000, batch_size=128, gamma=0.99,
        train_freq=4, gradient_steps=1, target_update_interval=10_000, exploration_fraction=0.1,
        exploration_initial_eps=1.0, exploration_final_eps=0.05, max_grad_norm=10.0,
        policy_kwargs=dict(net_arch=[256, 256]),
    ),
    "qrdqn": dict(
        learning_rate=1e-4, buffer_size=50_000, learning_starts=2_000, batch_size=128, gamma=0.99,
        train_freq=4, gradient_steps=1, target_update_interval=10_000, exploration_fraction=0.1,
        exploration_initial_eps=1.0, exploration_final_eps=0.05,
        policy_kwargs=dict(n_quantiles=50, net_arch=[256, 256]),
    ),
}

POLICIES = {"recurrent_ppo": "MultiInputLstmPolicy", "qrdqn": "MultiInputPolicy", "dqn": "MultiInputPolicy"}


def configure_torch_threads(n: Optional[int] = None) -> int:
    """Set torch's intra-op threads: ``n``, or 1 on machines with <= 4 cores, else half the cores (<= 8).

    SB3's networks are small; on a 2-core box one thread measured 2-50x faster than two.
    """
    import torch

    if n is None:
        cores = os.cpu_count() or 1
        n = 1 if cores <= 4 else min(8, cores // 2)
    torch.set_num_threads(int(n))
    return int(n)


def algo_class(algo: str):
    """The SB3 class of ``algo``."""
    if algo == "recurrent_ppo":
        from sb3_contrib import RecurrentPPO

        return RecurrentPPO
    if algo == "qrdqn":
        from sb3_contrib import QRDQN

        return QRDQN
    if algo == "dqn":
        from stable_baselines3 import DQN

        return DQN
    raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")


# ----------------------------------------------------------------------------- env and relabeler


def make_env(num_envs: int = 16, seed: int = 0, *, obs_mode: str = "paper", delta: float = 0.9,
             max_episode_steps: int = 10_000, reward: str = "cosine", buffer_size: Optional[int] = 10,
             tau_low: float = 0.1, tau_high: float = 0.9, instructions=None, info_text: bool = False,
             encoder: Any = "default", **env_kwargs: Any):
    """An SB3 VecEnv over a fresh :class:`~oir_gym.vector_env.InstructionCraftax`.

    The instruction buffer holds ``buffer_size`` slots (the paper's B_max = 10) seeded with the
    first ``buffer_size`` original Craftax instructions (as the PQN trainer does);
    ``buffer_size=None`` keeps all 22 (the fixed-instruction baselines).
    """
    from oir_gym.buffer import InstructionBuffer
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
    from oir_gym.sb3 import SB3VecEnv
    from oir_gym.vector_env import InstructionCraftax

    initial = list(ORIGINAL_INSTRUCTIONS if instructions is None else instructions)
    cap = len(initial) if buffer_size is None else int(buffer_size)
    buf = InstructionBuffer(cap, tau_low, tau_high, initial=initial[:cap], seed=seed)
    env = InstructionCraftax(num_envs=num_envs, obs_mode=obs_mode, delta=delta, max_episode_steps=max_episode_steps,
                             buffer=buf, reward=reward, info_text=info_text, encoder=encoder, seed=seed, **env_kwargs)
    return SB3VecEnv(env)


def make_relabeler(kind: str, k: int = 4, delta: float = 0.9, *, encoder: Any = None, llm_backend: str = "llama_cpp",
                   llm_model: str = "", llm_base_url: str = "http://127.0.0.1:8000/v1", template: str = "segments",
                   cache_path: Optional[str] = None, **kwargs: Any):
    """``"rules"`` (no LLM), ``"llm"`` (LLM candidates only), ``"both"`` (LLM + rules) or ``"none"``."""
    if kind == "none":
        return None
    if kind not in RELABELERS:
        raise ValueError(f"unknown relabeler {kind!r}; expected one of {RELABELERS}")
    from oir_gym.relabel import HindsightRelabeler

    if kind == "rules":
        return HindsightRelabeler("rules", k=k, delta=delta, encoder=encoder, cache_size=0, **kwargs)
    from oir_gym.relabel.backends import backend_kwargs

    return HindsightRelabeler(llm_backend, k=k, delta=delta, encoder=encoder, template=template,
                              use_rules=(kind == "both"), cache_path=cache_path,
                              backend_kwargs=backend_kwargs(llm_backend, llm_model, llm_base_url), **kwargs)


def make_relabel_callback(relabeler, algo: str, **kwargs: Any):
    """:class:`~oir_gym.sb3.HindsightRelabelCallback` with the mode of ``algo`` (replay or curriculum).

    A rules-only relabeler runs synchronously (cheap and deterministic); an LLM one in the
    relabeler's background worker.
    """
    from oir_gym.sb3 import HindsightRelabelCallback

    mode = "curriculum" if algo == "recurrent_ppo" else "replay"
    sync = getattr(getattr(relabeler, "backend", None), "llm", "?") is None
    kwargs.setdefault("asynchronous", not sync)
    return HindsightRelabelCallback(relabeler, mode=mode, **kwargs)


# ----------------------------------------------------------------------------- models


def resolve_hyperparams(algo: str, num_envs: int, overrides: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """:data:`DEFAULT_HYPERPARAMS` of ``algo`` updated with ``overrides`` (``policy_kwargs`` merged)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")
    hp = json.loads(json.dumps(DEFAULT_HYPERPARAMS[algo]))
    overrides = dict(overrides or {})
    pk = overrides.pop("policy_kwargs", None)
    hp.update(overrides)
    if pk:
        hp["policy_kwargs"] = {**hp.get("policy_kwargs", {}), **pk}
    if algo == "recurrent_ppo" and "batch_size" not in hp:
        hp["batch_size"] = max(1, num_envs * int(hp["n_steps"]) // 4)
    return hp


def _policy_kwargs(pk: dict[str, Any]) -> dict[str, Any]:
    import torch

    pk = dict(pk)
    if isinstance(pk.get("activation_fn"), str):
        pk["activation_fn"] = getattr(torch.nn, pk["activation_fn"])
    return pk


def make_model(algo: str, venv, seed: int = 0, hyperparams: Optional[dict[str, Any]] = None,
               tensorboard_log: Optional[str] = None, verbose: int = 0, device: str = "cpu"):
    """An SB3 model of ``algo`` on ``venv`` with :func:`resolve_hyperparams`."""
    hp = resolve_hyperparams(algo, venv.num_envs, hyperparams)
    hp["policy_kwargs"] = _policy_kwargs(hp.get("policy_kwargs", {}))
    cls = algo_class(algo)
    return cls(POLICIES[algo], venv, seed=seed, tensorboard_log=tensorboard_log, verbose=verbose, device=device, **hp)


def load_model(algo: str, path: str | os.PathLike, venv=None, device: str = "cpu"):
    """Load a model saved with ``model.save`` (optionally attached to ``venv``)."""
    return algo_class(algo).load(str(path), env=venv, device=device)


# ----------------------------------------------------------------------------- evaluation


class SB3Policy:
    """A greedy SB3 model as a policy of the evaluation protocol (:mod:`oir_gym.evaluation`).

    ``policy(obs, state, episode_start) -> (actions, state)``: ``obs`` is the batched Dict
    observation, ``state`` the policy's memory (``None`` at the start): the LSTM states of a
    recurrent model, carried from step to step and reset where ``episode_start`` is True;
    ``None`` for feed-forward models.
    """

    def __init__(self, model, deterministic: bool = True) -> None:
        self.model = model
        self.deterministic = deterministic
        self.recurrent = hasattr(model.policy, "lstm_actor")

    def __call__(self, obs: dict[str, np.ndarray], state=None, episode_start: Optional[np.ndarray] = None):
        if self.recurrent:
            n = next(iter(obs.values())).shape[0]
            start = np.ones(n, bool) if episode_start is None else np.asarray(episode_start, bool)
            actions, state = self.model.predict(obs, state=state, episode_start=start, deterministic=self.deterministic)
        else:
            actions, _ = self.model.predict(obs, deterministic=self.deterministic)
            state = None
        return np.asarray(actions).reshape(-1), state


def evaluate(model, eval_cfg=None, seed: int = 0, env_kwargs: Optional[dict[str, Any]] = None):
    """Greedy evaluation with ground-truth success (:func:`oir_gym.evaluation.evaluate_python_policy`)."""
    from oir_gym.evaluation import EvalConfig, evaluate_python_policy

    return evaluate_python_policy(SB3Policy(model), eval_cfg or EvalConfig(), seed=seed, env_kwargs=env_kwargs)


# ----------------------------------------------------------------------------- training run


@dataclass
class SB3Config:
    """Every setting of an SB3 run (``examples/train_sb3.py`` exposes each as a flag)."""

    algo: str = "qrdqn"
    relabeler: str = "rules"  # rules | llm | both | none
    total_timesteps: int = 30_000
    num_envs: int = 8
    seed: int = 0
    # environment
    obs_mode: str = "paper"
    delta: float = 0.9
    max_episode_steps: int = 10_000
    reward: str = "cosine"  # cosine | gt
    buffer_size: int = 10  # instruction buffer B_max (0: keep the 22 original instructions)
    tau_low: float = 0.1
    tau_high: float = 0.9
    # relabeling
    k: int = 4
    segment_length: int = 128
    asynchronous: Optional[bool] = None  # None: sync for rules, async for an LLM
    llm_backend: str = "llama_cpp"
    llm_model: str = ""
    llm_base_url: str = "http://127.0.0.1:8000/v1"
    llm_template: str = "segments"
    # algorithm (overrides of DEFAULT_HYPERPARAMS[algo])
    hyperparams: dict = field(default_factory=dict)
    # bookkeeping (in env steps)
    log_every: int = 2_000
    eval_every: int = 0  # 0: final evaluation only
    eval_episodes: int = 1
    eval_horizon: int = 300
    eval_sets: str = "original,simple,complex"
    checkpoint_every: int = 10_000
    threads: int = 0  # 0: automatic (see configure_torch_threads)

    def validate(self) -> "SB3Config":
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.algo in ALGOS, f"algo={self.algo!r}; expected one of {ALGOS}")
        need(self.relabeler in RELABELERS, f"relabeler={self.relabeler!r}; expected one of {RELABELERS}")
        need(self.reward in ("cosine", "gt"), f"reward={self.reward!r}; expected 'cosine' or 'gt'")
        for name in ("total_timesteps", "num_envs", "k", "segment_length", "log_every", "eval_episodes",
                     "eval_horizon", "checkpoint_every", "max_episode_steps"):
            need(int(getattr(self, name)) >= 1, f"{name}={getattr(self, name)!r} must be >= 1")
        need(self.buffer_size >= 0 and self.eval_every >= 0 and self.threads >= 0,
             "buffer_size, eval_every and threads must be >= 0")
        need(0 <= self.tau_low < self.tau_high, f"need 0 <= tau_low ({self.tau_low}) < tau_high ({self.tau_high})")
        from oir_gym.instructions import SET_NAMES

        for s in self.eval_sets.split(","):
            need(s in SET_NAMES, f"eval set {s!r}; expected some of {SET_NAMES}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SB3Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        return cls(**d)


def _make_run_callback():
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter

    class _LastValues(KVWriter):
        """An SB3 logger output that remembers the last value of every numeric key."""

        def __init__(self) -> None:
            self.values: dict[str, float] = {}

        def write(self, key_values, key_excluded, step: int = 0) -> None:
            for k, v in key_values.items():
                if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool):
                    self.values[k] = float(v)

        def close(self) -> None:
            pass

    class RunCallback(BaseCallback):
        """Writes metrics rows, runs periodic evaluations and checkpoints (the run directory)."""

        def __init__(self, trainer: "SB3Run") -> None:
            super().__init__(0)
            self.trainer = trainer
            self.capture = _LastValues()
            self._next_log = trainer.cfg.log_every
            self._next_eval = trainer.cfg.eval_every or None
            self._next_ckpt = trainer.cfg.checkpoint_every

        def _on_training_start(self) -> None:
            if self.capture not in self.model.logger.output_formats:
                self.model.logger.output_formats.append(self.capture)
            t = self.num_timesteps
            c = self.trainer.cfg
            self._next_log = (t // c.log_every + 1) * c.log_every
            self._next_ckpt = (t // c.checkpoint_every + 1) * c.checkpoint_every
            if c.eval_every:
                self._next_eval = (t // c.eval_every + 1) * c.eval_every

        def _on_step(self) -> bool:
            t = self.num_timesteps
            if t >= self._next_log:
                self._next_log += self.trainer.cfg.log_every
                row = self.trainer.metrics_row(self.model, self.capture.values)
                if self._next_eval is not None and t >= self._next_eval:
                    self._next_eval += self.trainer.cfg.eval_every
                    row.update(self.trainer.run_eval(self.model, f"{t:09d}"))
                self.trainer.write_row(row)
            if t >= self._next_ckpt:
                self._next_ckpt += self.trainer.cfg.checkpoint_every
                self.trainer.save(self.model)
            return True

    return RunCallback


class SB3Run:
    """One training run with a run directory (config, metrics, checkpoints, evaluation, plots).

    Files: ``config.json``; ``metrics.jsonl`` / ``metrics.csv`` (one row per ``log_every`` env
    steps: ``update`` (row index), ``env_steps``, ``time``, ``sps``, ``loss``, ``epsilon``,
    ``train/success_rate``, ``train/ep_return_mean``, ``train/ep_length_mean``, ``relabel/*``, and
    ``eval/<set>/<metric>`` on evaluation rows); ``model.zip`` + ``instruction_buffer.json`` +
    ``state.json`` (checkpoint); ``eval_<steps>.json`` / ``eval_final.json`` (a one-element list of
    :meth:`EvalResult.to_dict`, the format of ``train_pqn.py``); ``eval_final.md``; ``training.png``,
    ``learning_curves.png`` and ``instruction_success.png``; ``tb/`` when TensorBoard is installed.
    """

    def __init__(self, cfg: SB3Config, run_dir: str | os.PathLike, print_fn: Callable[[str], None] = print) -> None:
        self.cfg = cfg.validate()
        self.run_dir = Path(run_dir)
        self.print = print_fn
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        self._last = (self.t0, 0)
        self.update = 0
        self.venv = None
        self.model = None
        self.relabeler = None
        self.relabel_cb = None
        self.eval_env_kwargs = {"obs_mode": cfg.obs_mode}

    # ---------------------------------------------------------------- setup
    def setup(self, resume: bool = False) -> None:
        cfg = self.cfg
        configure_torch_threads(cfg.threads or None)
        self.venv = make_env(cfg.num_envs, cfg.seed, obs_mode=cfg.obs_mode, delta=cfg.delta,
                             max_episode_steps=cfg.max_episode_steps, reward=cfg.reward,
                             buffer_size=(cfg.buffer_size or None) if cfg.relabeler != "none" else None,
                             tau_low=cfg.tau_low, tau_high=cfg.tau_high)
        ckpt = self.run_dir / "model.zip"
        if resume:
            if not ckpt.exists():
                raise FileNotFoundError(f"--resume: {ckpt} does not exist")
            self.model = load_model(cfg.algo, ckpt, self.venv)
            buf_path = self.run_dir / "instruction_buffer.json"
            if buf_path.exists():
                self.venv.buffer.load_state_dict(json.loads(buf_path.read_text()))
            state = json.loads((self.run_dir / "state.json").read_text()) if (self.run_dir / "state.json").exists() else {}
            self.update = int(state.get("update", 0))
        else:
            tb = None
            try:
                import tensorboard  # noqa: F401

                tb = str(self.run_dir / "tb")
            except ImportError:
                pass
            self.model = make_model(cfg.algo, self.venv, cfg.seed, cfg.hyperparams, tensorboard_log=tb)
            (self.run_dir / "config.json").write_text(json.dumps(
                {**cfg.to_dict(), "resolved_hyperparams": resolve_hyperparams(cfg.algo, cfg.num_envs, cfg.hyperparams)},
                indent=2, default=str))
        self.relabeler = make_relabeler(cfg.relabeler, cfg.k, cfg.delta, encoder=self.venv.encoder,
                                        llm_backend=cfg.llm_backend, llm_model=cfg.llm_model,
                                        llm_base_url=cfg.llm_base_url, template=cfg.llm_template)
        if self.relabeler is not None:
            kw = {"segment_length": cfg.segment_length, "verbose": 1}
            if cfg.asynchronous is not None:
                kw["asynchronous"] = cfg.asynchronous
            self.relabel_cb = make_relabel_callback(self.relabeler, cfg.algo, **kw)

    # ---------------------------------------------------------------- rows
    def metrics_row(self, model, sb3_values: dict[str, float]) -> dict[str, Any]:
        t = model.num_timesteps
        now = time.time()
        dt = max(now - self._last[0], 1e-9)
        sps = (t - self._last[1]) / dt
        self._last = (now, t)
        self.update += 1
        row: dict[str, Any] = {"update": self.update, "env_steps": int(t), "time": now - self.t0, "sps": sps}
        vals = {**sb3_values, **{k: float(v) for k, v in model.logger.name_to_value.items()
                                 if isinstance(v, (int, float, np.floating))}}
        if "train/loss" in vals:
            row["loss"] = vals["train/loss"]
        if hasattr(model, "exploration_rate"):
            row["epsilon"] = float(model.exploration_rate)
        for k in ("train/entropy_loss", "train/value_loss", "train/approx_kl", "train/explained_variance"):
            if k in vals:
                row[k] = vals[k]
        if len(model.ep_success_buffer):
            row["train/success_rate"] = float(np.mean(model.ep_success_buffer))
        if len(model.ep_info_buffer):
            row["train/ep_return_mean"] = float(np.mean([e["r"] for e in model.ep_info_buffer]))
            row["train/ep_length_mean"] = float(np.mean([e["l"] for e in model.ep_info_buffer]))
        if self.relabel_cb is not None:
            for k, v in self.relabel_cb.stats.items():
                if isinstance(v, (int, float)):
                    row[f"relabel/{k}"] = float(v)
        row["buffer/size"] = len(self.venv.buffer.contents())
        return row

    def write_row(self, row: dict[str, Any]) -> None:
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        parts = [f"steps {row['env_steps']:>9,}"] + ([f"{row['sps']:6.0f} sps"] if "sps" in row else [])
        if "epsilon" in row:
            parts.append(f"eps {row['epsilon']:.2f}")
        if "loss" in row:
            parts.append(f"loss {row['loss']:.4f}")
        if "train/success_rate" in row:
            parts.append(f"train success {row['train/success_rate']:.3f}")
        if "relabel/rows_added" in row:
            parts.append(f"relabel rows {row['relabel/rows_added']:.0f} grounded {row['relabel/grounded_fraction']:.2f}")
        if "eval/original/mean_success_rate" in row:
            parts.append(f"eval success {row['eval/original/mean_success_rate']:.3f}")
        self.print(f"[{self.cfg.algo}] " + " | ".join(parts))

    def run_eval(self, model, tag: str) -> dict[str, float]:
        from oir_gym.evaluation import EvalConfig

        c = self.cfg
        ecfg = EvalConfig(sets=tuple(c.eval_sets.split(",")), episodes=c.eval_episodes, horizon=c.eval_horizon)
        res = evaluate(model, ecfg, seed=c.seed + 12345, env_kwargs=self.eval_env_kwargs)
        (self.run_dir / f"eval_{tag}.json").write_text(json.dumps([res.to_dict()], indent=1))
        self._last_eval = res
        return res.flat_metrics()

    def save(self, model=None) -> None:
        model = model or self.model
        model.save(str(self.run_dir / "model.zip"))
        self.venv.buffer.save(self.run_dir / "instruction_buffer.json")
        (self.run_dir / "state.json").write_text(json.dumps({"num_timesteps": int(model.num_timesteps),
                                                             "update": self.update}))

    # ---------------------------------------------------------------- main
    def learn(self) -> None:
        from stable_baselines3.common.callbacks import CallbackList

        remaining = self.cfg.total_timesteps - int(self.model.num_timesteps)
        if remaining <= 0:
            return
        cbs = [self._run_cb()]
        if self.relabel_cb is not None:
            cbs.insert(0, self.relabel_cb)
        self.model.learn(remaining, callback=CallbackList(cbs), reset_num_timesteps=self.model.num_timesteps == 0,
                         progress_bar=False)

    def _run_cb(self):
        return _make_run_callback()(self)

    def finish(self) -> dict[str, Any]:
        """Final evaluation, checkpoint, tables and plots. Returns the final row."""
        from oir_gym import analysis

        self.save()
        row = self.metrics_row(self.model, {})
        row.pop("sps", None)  # not a training throughput: the row is written after learn()
        row.update(self.run_eval(self.model, "final"))
        self.write_row(row)
        res = self._last_eval
        (self.run_dir / "eval_final.json").write_text(json.dumps([res.to_dict()], indent=1))
        table = res.to_markdown()
        (self.run_dir / "eval_final.md").write_text(
            f"# Final evaluation ({self.cfg.algo}, relabeler {self.cfg.relabeler}, {self.model.num_timesteps:,} env "
            f"steps, {self.cfg.eval_episodes} episode(s) x {self.cfg.eval_horizon} steps per instruction)\n\n{table}\n")
        rows = analysis.read_jsonl(self.run_dir / "metrics.jsonl")
        analysis.write_csv(rows, self.run_dir / "metrics.csv")
        analysis.plot_training(rows, self.run_dir / "training.png")
        analysis.plot_learning_curves({self.cfg.algo: [self.run_dir]}, self.run_dir / "learning_curves.png")
        analysis.plot_instruction_bars({self.cfg.algo: [res.to_dict()]}, self.run_dir / "instruction_success.png")
        self.print("\nFinal evaluation:\n" + table)
        return row

    def close(self) -> None:
        if self.relabeler is not None and hasattr(self.relabeler, "close"):
            self.relabeler.close()
        if self.venv is not None:
            self.venv.close()


def train(cfg: SB3Config, run_dir: str | os.PathLike, resume: bool = False,
          print_fn: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` (resuming from its checkpoint when ``resume``); returns the final row."""
    run = SB3Run(cfg, run_dir, print_fn)
    try:
        run.setup(resume=resume)
        run.print(f"oir-gym SB3 | algo={cfg.algo} relabeler={cfg.relabeler} | {cfg.num_envs} envs | "
                  f"{cfg.total_timesteps:,} env steps | run dir {run.run_dir}")
        try:
            run.learn()
        except KeyboardInterrupt:
            run.print("interrupted: saving a checkpoint")
            run.save()
            raise
        return run.finish()
    finally:
        run.close()
