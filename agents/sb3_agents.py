"""Stable-Baselines3 agents on InstructionCraftax: RecurrentPPO, QR-DQN and DQN with OIR relabeling.

The instruction is part of the observation (``Dict({"obs", "instruction"})``), so all three use
SB3's multi-input policies: ``MultiInputLstmPolicy`` (sb3-contrib ``RecurrentPPO``) and
``MultiInputPolicy`` (sb3-contrib ``QRDQN``, SB3 ``DQN``). Relabeling is attached with
:class:`oir_gym.sb3.HindsightRelabelCallback`: DQN and QR-DQN get relabeled transitions in their
:class:`~oir_gym.sb3.RelabelReplayBuffer`, RecurrentPPO gets the curriculum (instruction buffer)
only (see :mod:`oir_gym.sb3`).

Building blocks (each usable alone)::

    configure_torch_threads()                       # 1 thread on small CPUs (much faster for SB3)
    venv = make_env(num_envs=16, seed=0)            # SB3 VecEnv over InstructionCraftax
    model = make_model("qrdqn", venv, seed=0)       # Craftax defaults (DEFAULT_HYPERPARAMS), device "auto"
    relabeler = make_relabeler("rules", k=4)
    model.learn(100_000, callback=make_relabel_callback(relabeler, "qrdqn"))
    result = evaluate(model)                        # oir_gym.evaluation protocol, greedy

:func:`train` runs all of it in a run directory (:mod:`agents.run_dir`; what
``examples/train_sb3.py`` calls), and :func:`load_sb3_policy` gives a trained run's policy back as
an object with ``reset()`` and ``act(obs)`` for the Gymnasium env.

Checkpoints: SB3's ``model.zip`` holds pickled Python objects, and SB3's own ``load`` unpickles
them, which runs whatever code they name. :func:`load_model` never does: it builds a fresh model
of the known class from the run's validated config and reads only the zip's parameters (tensors,
``torch.load(weights_only=True)``) and plain JSON counters into it. A run also records the sha256
of every ``model.zip`` it saves (``state.json``), and :func:`train` (``--resume``) and
:func:`load_sb3_policy` load only a zip with that checksum (a damaged or swapped file is caught
before anything is built).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from agents.config import LLMConfig, redact_url
from agents import relabeling
from agents.llm import check_llm
from agents.run_dir import (
    CorruptFileError, MetricsWriter, RunDir, atomic_write_bytes, atomic_write_json, read_json, sha256_bytes,
    require_wandb, sha256_file,
)

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
    """The SB3 class of ``algo``; ``ImportError`` naming the extra to install when SB3 is missing."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")
    try:
        if algo == "recurrent_ppo":
            from sb3_contrib import RecurrentPPO

            return RecurrentPPO
        if algo == "qrdqn":
            from sb3_contrib import QRDQN

            return QRDQN
        from stable_baselines3 import DQN

        return DQN
    except ImportError as e:
        raise ImportError(f"algo {algo!r} needs stable-baselines3 and sb3-contrib: pip install 'oir-gym[sb3]' "
                          f"({e})") from e


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


def make_relabeler(kind: str, k: int = 4, delta: float = 0.9, *, encoder: Any = None, llm: Optional[LLMConfig] = None,
                   cache_path: Optional[str] = None, grounding: str = "cosine", bind_threshold: float = 0.5,
                   oracle: str = "canonical", seed: int = 0, eval_files: Sequence[str] = (), **kwargs: Any):
    """``"rules"`` (no LLM), ``"llm"`` (LLM candidates only), ``"both"`` (the rules at once, the LLM's
    answers when they arrive) or ``"none"``: :func:`agents.relabeling.make_relabeler`, the PQN
    trainer's factory, with the SB3 trainer's settings (the LLM is not called here).

    ``llm``: the LLM part shared with the PQN trainer (:class:`agents.config.LLMConfig`: backend,
    model, server URL, prompt template, call timeout; default: the offline transformers backend).
    ``grounding``: ``"cosine"`` (the paper's rule) or ``"bound"`` (event-bound, with
    ``bind_threshold``; :mod:`oir_gym.grounding`). ``oracle``: the rule relabeler's variant
    (:mod:`oir_gym.relabel.oracle`), its draws seeded by ``seed``; a wording pool is checked against
    every evaluation string (``eval_files`` too) before anything runs. ``kwargs``: more keywords of
    :func:`agents.relabeling.make_relabeler` (``keep_ungrounded``, ``queue_size``...)."""
    return relabeling.make_relabeler(kind, llm, k=k, delta=delta, encoder=encoder, cache_path=cache_path,
                                     grounding=grounding, bind_threshold=bind_threshold, oracle=oracle, seed=seed,
                                     eval_files=eval_files, **kwargs)


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


#: Constructor arguments that :func:`make_model` sets itself (not hyperparameters), and what to use instead.
RESERVED_HYPERPARAMS = {"policy": "--algo", "env": "the run's env", "seed": "--seed", "verbose": "nothing",
                        "tensorboard_log": "the run directory (tb/)"}


def check_device(device: Any) -> str:
    """``"auto"`` or a torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``...); else ValueError."""
    import torch

    if device == "auto":
        return device
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device ('auto', 'cpu', 'cuda', 'cuda:0'...): {e}") from None
    return str(device)


def check_hyperparams(algo: str, hyperparams: Mapping[str, Any], device: str = "auto") -> None:
    """Refuse overrides that the SB3 class of ``algo`` does not take, or that :func:`make_model`
    sets itself, before anything is built (the error names the key and what to use instead)."""
    params = inspect.signature(algo_class(algo).__init__).parameters
    for key in hyperparams:
        if key in RESERVED_HYPERPARAMS:
            raise ValueError(f"hyperparameter {key!r} is set by the trainer; use {RESERVED_HYPERPARAMS[key]}")
        if key not in params:
            raise ValueError(f"{algo_class(algo).__name__} has no argument {key!r} (hyperparameter override)")
    hp_device = hyperparams.get("device")
    if hp_device is not None and device not in ("auto", hp_device):
        raise ValueError(f"device given twice: device={device!r} and hyperparameter device={hp_device!r}; give one")
    check_device(hp_device if hp_device is not None else device)


def make_model(algo: str, venv, seed: int = 0, hyperparams: Optional[dict[str, Any]] = None,
               tensorboard_log: Optional[str] = None, verbose: int = 0, device: str = "auto"):
    """An SB3 model of ``algo`` on ``venv`` with :func:`resolve_hyperparams`.

    ``device``: where the networks live (``"auto"``: CUDA when available, else CPU). A
    ``"device"`` key in ``hyperparams`` is the same setting (refused when it contradicts
    ``device``). DQN and QR-DQN get a :class:`~oir_gym.sb3.RelabelReplayBuffer` (a
    ``DictReplayBuffer`` that also takes relabeled rows) unless ``replay_buffer_class`` is given.
    """
    hp = resolve_hyperparams(algo, venv.num_envs, hyperparams)
    check_hyperparams(algo, hp, device)
    device = hp.pop("device", device)
    hp["policy_kwargs"] = _policy_kwargs(hp.get("policy_kwargs", {}))
    if algo in ("dqn", "qrdqn"):
        from oir_gym.sb3 import RelabelReplayBuffer

        hp.setdefault("replay_buffer_class", RelabelReplayBuffer)
    cls = algo_class(algo)
    return cls(POLICIES[algo], venv, seed=seed, tensorboard_log=tensorboard_log, verbose=verbose, device=device, **hp)


#: The members of an SB3 zip that :func:`load_model` reads: the parameters (tensors only).
_PARAMETER_FILES = ("policy.pth", "policy.optimizer.pth")
#: Counters of training progress that :func:`load_model` takes from the zip's ``data`` (plain JSON
#: values there) into the fresh model, so that training continues where it stopped.
_PROGRESS_COUNTERS = ("num_timesteps", "_n_updates", "_episode_num", "_n_calls")


def _is_pickled(v: Any) -> bool:
    return isinstance(v, dict) and ":serialized:" in v


def _zip_data(path: Path, archive) -> dict[str, Any]:
    """The zip's ``data`` as JSON. SB3 stores objects JSON cannot hold (spaces, schedules, classes)
    as base64 pickles under ``":serialized:"``, beside their readable members: nothing here
    decodes those."""
    if "data" not in archive.namelist():
        return {}
    try:
        data = json.loads(archive.read("data").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(path, f"its 'data' member is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CorruptFileError(path, "its 'data' member is not a JSON object")
    return data


def _policy_kwargs_from_data(path: Path, value: Any) -> dict[str, Any]:
    """``policy_kwargs`` as ``data`` shows it. With a class among them (QR-DQN adds its optimizer),
    SB3 pickles the whole dict and writes the readable members beside it, classes as their repr:
    the default optimizer and a ``torch.nn`` activation are taken by name; any other class cannot
    be rebuilt without unpickling (the caller then passes the hyperparameters)."""
    if not _is_pickled(value):
        return dict(value) if isinstance(value, dict) else {}
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k in (":type:", ":serialized:"):
            continue
        if isinstance(v, str) and v.startswith("<class "):
            name = v[len("<class '"):-len("'>")]
            if k == "optimizer_class" and name == "torch.optim.adam.Adam":  # every algo's default
                continue
            if k == "activation_fn" and name.startswith("torch.nn.modules.activation."):
                out[k] = name.rsplit(".", 1)[1]  # by name: make_model resolves it in torch.nn
                continue
            raise CorruptFileError(path, f"its policy_kwargs.{k} is a class stored only as a pickle ({name}); "
                                         "pass hyperparams= (the run's config) to load it")
        out[k] = v
    return out


def spaces_only_venv(obs_mode: str = "paper"):
    """A VecEnv of one env that only declares InstructionCraftax's spaces (observation mode
    ``obs_mode``, the default encoder's embeddings): enough to build a model that acts on
    observations given to it (:func:`load_model`); it cannot be stepped."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv

    from oir_gym.craftax_compat import NUM_ACTIONS
    from oir_gym.encoder import EMBED_DIM
    from oir_gym.observation import obs_dim

    class SpacesOnly(gym.Env):
        observation_space = gym.spaces.Dict({
            "obs": gym.spaces.Box(0.0, 1.0, (obs_dim(obs_mode),), np.float32),
            "instruction": gym.spaces.Box(-1.0, 1.0, (EMBED_DIM,), np.float32),
        })
        action_space = gym.spaces.Discrete(NUM_ACTIONS)

    return DummyVecEnv([SpacesOnly])


def load_model(algo: str, path: str | os.PathLike, venv=None, device: str = "auto", *,
               hyperparams: Optional[dict[str, Any]] = None, seed: Optional[int] = None, obs_mode: str = "paper"):
    """A model saved with ``model.save`` (or :func:`save_checkpoint`), loaded without unpickling anything.

    SB3's own ``load`` unpickles the zip's ``data`` (spaces, schedules, classes), which runs any
    code the file names. Here a fresh model of ``algo``'s class is built (:func:`make_model`) and
    only the zip's parameters are read into it: ``policy.pth`` and ``policy.optimizer.pth``, with
    ``torch.load(weights_only=True)`` (tensors and numbers only), and the progress counters
    (``num_timesteps``...) that ``data`` holds as plain JSON. The pickled entries are never read.

    Args:
        algo: ``"recurrent_ppo"``, ``"qrdqn"`` or ``"dqn"``: the class the file must fit.
        path: the zip.
        venv: the env to attach (training continues on it); default: one that only declares the
            spaces of InstructionCraftax with ``obs_mode`` (enough to act).
        device: torch device of the networks.
        hyperparams: overrides of :data:`DEFAULT_HYPERPARAMS` that built the saved model (a run's
            config holds them); default: those of ``data`` that are plain JSON (settings SB3
            stored only as pickles, e.g. schedules, take their defaults).
        seed: the model's seed (default: ``data``'s, else 0).

    Raises:
        agents.run_dir.CorruptFileError: not an SB3 zip of ``algo`` with these hyperparameters, or
            non-finite weights (the message names the file).
    """
    import zipfile

    import torch

    algo_class(algo)  # without SB3: the ImportError that names the extra to install
    from stable_baselines3.common.save_util import load_from_zip_file

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            data = _zip_data(path, archive)
            missing = [m for m in _PARAMETER_FILES if m not in archive.namelist()]
    except zipfile.BadZipFile:
        raise CorruptFileError(path, "is not a zip file (an SB3 model.zip)") from None
    if missing:
        raise CorruptFileError(path, f"lacks {missing}: it is not a model saved by stable-baselines3")
    plain = {k: v for k, v in data.items() if not _is_pickled(v)}
    if hyperparams is None:
        accepted = set(inspect.signature(algo_class(algo).__init__).parameters) - set(RESERVED_HYPERPARAMS) - {
            "device", "_init_setup_model", "self"}
        hyperparams = {k: v for k, v in plain.items() if k in accepted}
        if "policy_kwargs" in data:
            hyperparams["policy_kwargs"] = _policy_kwargs_from_data(path, data["policy_kwargs"])
    if seed is None:
        seed = plain.get("seed") if isinstance(plain.get("seed"), int) else 0
    if device != "auto":  # the device asked for here wins over the one the model was trained on
        hyperparams = {k: v for k, v in hyperparams.items() if k != "device"}
    model = make_model(algo, venv if venv is not None else spaces_only_venv(obs_mode), seed, hyperparams, device=device)
    try:
        _, params, _ = load_from_zip_file(str(path), load_data=False, device=model.device)
        model.set_parameters({k: params[k] for k in ("policy", "policy.optimizer")}, exact_match=True,
                             device=model.device)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CorruptFileError(path, f"its parameters do not fit a {algo} model with hyperparameters "
                                     f"{hyperparams or 'the defaults'} ({str(e).strip().splitlines()[0][:300]})") from None
    for name, t in model.policy.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CorruptFileError(path, f"parameter {name} holds NaN or infinite values: the model diverged or "
                                         "the file was changed")
    # what SB3's load would restore of these (its __dict__.update(data)); the schedules' progress
    # is recomputed from num_timesteps before each use
    for name in _PROGRESS_COUNTERS:
        if name in plain and hasattr(model, name):
            v = plain[name]
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise CorruptFileError(path, f"data's {name}={v!r} is not a count (an integer >= 0)")
            setattr(model, name, v)
    return model


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


class SB3AgentPolicy:
    """A trained SB3 model acting greedily in the Gymnasium env: ``reset()`` and ``act(obs) -> action``.

    The ``Policy`` interface of ``agents.policy`` (what ``load_policy`` returns for PQN runs too).
    ``obs`` is the env's Dict observation: one env's (``obs["obs"]`` of shape ``[D]``; ``act``
    returns an ``int``) or a vector env's batch (``[n, D]``; returns ``[n]`` int64 actions). A
    recurrent model (RecurrentPPO) keeps its LSTM state from one ``act`` to the next;
    :meth:`reset` starts a new episode, and with a vector env ``episode_start`` (the previous
    step's ``terminated | truncated``) restarts the state of those envs. The instruction is
    whatever text the env embedded in ``obs["instruction"]``: any instruction works, as long as the
    env uses the run's encoder.

    Attributes:
        model: the SB3 model.
        algo: ``"recurrent_ppo"``, ``"qrdqn"`` or ``"dqn"`` (when known).
        env_kwargs: keyword arguments that match the training env (``obs_mode``, ``delta``),
            for ``gym.make(ENV_ID, **policy.env_kwargs)``.
    """

    def __init__(self, model, algo: Optional[str] = None, env_kwargs: Optional[dict[str, Any]] = None,
                 deterministic: bool = True) -> None:
        self.model = model
        self.algo = algo
        self.env_kwargs = dict(env_kwargs or {})
        self._policy = SB3Policy(model, deterministic=deterministic)
        self._state = None
        self._start = True
        self._n: Optional[int] = None

    @property
    def recurrent(self) -> bool:
        """Whether the policy keeps a memory between steps (reset it with :meth:`reset`)."""
        return self._policy.recurrent

    @property
    def state(self) -> Any:
        """The recurrent state the next :meth:`act` continues from (``None`` after :meth:`reset`
        and for feed-forward models): RecurrentPPO's ``(h, c)`` LSTM arrays."""
        return self._state

    def reset(self) -> None:
        """Forget the recurrent state: the next :meth:`act` starts an episode."""
        self._state = None
        self._start = True
        self._n = None

    def act(self, obs: Mapping[str, np.ndarray], episode_start: Any = None):
        """The greedy action for ``obs`` (an ``int`` for one env, an ``[n]`` int64 array for a batch).

        ``episode_start`` (bool or ``[n]`` bool): envs whose episode starts at this observation
        (after :meth:`reset`, or when the batch size changes, the first call starts all).
        """
        space = self.model.observation_space
        missing = set(space.spaces) - set(obs)
        if missing:
            raise KeyError(f"observation lacks {sorted(missing)} (expected keys {sorted(space.spaces)})")
        single = np.ndim(obs["obs"]) == 1
        batch = {}
        for k, sub in space.spaces.items():
            v = np.asarray(obs[k], np.float32)
            v = v[None] if single else v
            if v.shape[1:] != sub.shape:
                hint = f" (the run used {self.env_kwargs})" if k == "obs" and self.env_kwargs else ""
                raise ValueError(f"obs[{k!r}] has shape {v.shape[1:]} per env, the policy was trained on {sub.shape}"
                                 f"{hint}")
            batch[k] = v
        n = batch["obs"].shape[0]
        if self._n is not None and n != self._n:  # another env or batch: its own fresh state
            self._state, self._start = None, True
        start = np.zeros(n, bool) if episode_start is None else np.broadcast_to(np.asarray(episode_start, bool), (n,))
        actions, self._state = self._policy(batch, self._state, start | self._start)
        self._start, self._n = False, n
        return int(actions[0]) if single else np.asarray(actions, np.int64).reshape(-1)


# ----------------------------------------------------------------------------- checkpoints

MODEL_ZIP = "model.zip"
STATE_JSON = "state.json"
INSTRUCTION_BUFFER_JSON = "instruction_buffer.json"
#: The next model.zip while a checkpoint is being written (a ".*.tmp" name: run_dir's outputs).
MODEL_NEXT = ".model.zip.next.tmp"
CHECKPOINT_FORMAT = 1


class UntrustedModelError(RuntimeError):
    """A run's ``model.zip`` is not the file the run saved (or the run recorded no checksum for it).

    Loading it would run whatever code its pickles name, so nothing is loaded.
    """


def save_checkpoint(run_dir: str | os.PathLike, model, state: Mapping[str, Any]) -> str:
    """Save ``model`` as ``model.zip`` and ``state`` (JSON) as ``state.json``; returns the zip's sha256.

    Atomic: the zip is written in full (fsynced) beside the old one, then ``state.json`` (which
    records its sha256) replaces the old state in one ``os.replace``, then the zip replaces the old
    zip. A kill at any moment leaves the previous checkpoint, or the new state with the new zip
    still under its temporary name, which :func:`verified_model_zip` moves into place.
    """
    run_dir = Path(run_dir)
    buf = io.BytesIO()
    model.save(buf)
    data = buf.getvalue()
    sha = sha256_bytes(data)
    atomic_write_bytes(run_dir / MODEL_NEXT, data)
    atomic_write_json(run_dir / STATE_JSON, {**state, "format": CHECKPOINT_FORMAT, "model_sha256": sha,
                                             "num_timesteps": int(model.num_timesteps)}, indent=None)
    # No directory fsync needed after this rename: if it is lost, the state names the zip that is
    # still (durably) under MODEL_NEXT, and verified_model_zip rolls it forward.
    os.replace(run_dir / MODEL_NEXT, run_dir / MODEL_ZIP)
    return sha


def read_checkpoint_state(run_dir: str | os.PathLike) -> Optional[dict[str, Any]]:
    """``state.json`` of a run (None when the run saved no checkpoint yet); a damaged file is a
    :class:`~agents.run_dir.CorruptFileError` naming it."""
    path = Path(run_dir) / STATE_JSON
    if not path.exists():
        return None
    state = read_json(path)
    if not isinstance(state, dict):
        raise CorruptFileError(path, "is not a JSON object")
    return state


def verified_model_zip(run_dir: str | os.PathLike, *, repair: bool = False) -> tuple[Path, dict[str, Any]]:
    """The run's model zip whose sha256 matches the one recorded at save time, and ``state.json``.

    Args:
        repair: when a kill interrupted :func:`save_checkpoint` after its state was written, move
            the complete new zip into place (``--resume`` does); otherwise it is returned where it is.

    Raises:
        UntrustedModelError: no recorded checksum, or no file with it (replaced, damaged, foreign).
    """
    run_dir = Path(run_dir)
    zip_path = run_dir / MODEL_ZIP
    state = read_checkpoint_state(run_dir)
    why = ("SB3's model.zip holds pickled Python objects, so loading it runs the code they name; a run "
           "loads only the model.zip whose sha256 it recorded when it saved it.")
    if state is None or not state.get("model_sha256"):
        raise UntrustedModelError(
            f"{zip_path}: this run recorded no checksum for it ({run_dir / STATE_JSON} "
            f"{'is missing' if state is None else 'has no model_sha256: saved by an older version'}). {why} "
            "If you made this file yourself and trust it, record its checksum with "
            f"agents.sb3_agents.trust_model_zip({str(run_dir)!r}).")
    sha = str(state["model_sha256"])
    if zip_path.exists() and sha256_file(zip_path) == sha:
        return zip_path, state
    nxt = run_dir / MODEL_NEXT
    if nxt.exists() and sha256_file(nxt) == sha:  # a kill between the state and the zip replace
        if not repair:
            return nxt, state
        os.replace(nxt, zip_path)
        return zip_path, state
    found = sha256_file(zip_path) if zip_path.exists() else None
    raise UntrustedModelError(
        f"{zip_path}: {'missing' if found is None else f'its sha256 {found[:16]}... is not'} the file this run saved "
        f"(recorded sha256 {sha[:16]}...): it was replaced or damaged. {why} Refusing to load it.")


def trust_model_zip(run_dir: str | os.PathLike) -> str:
    """Record the sha256 of the run's current ``model.zip`` as trusted (for runs saved before
    checksums existed). Only for a file you made or trust: loading it runs its code. Returns the sha256."""
    run_dir = Path(run_dir)
    zip_path = run_dir / MODEL_ZIP
    if not zip_path.exists():
        raise FileNotFoundError(f"{zip_path} does not exist")
    state = read_checkpoint_state(run_dir) or {}
    sha = sha256_file(zip_path)
    atomic_write_json(run_dir / STATE_JSON, {**state, "model_sha256": sha}, indent=None)
    return sha


def load_sb3_policy(run_dir: str | os.PathLike, seed: int = 0, device: Optional[str] = None) -> SB3AgentPolicy:
    """The trained policy of an SB3 run directory, for ``gym.make("OIR-CraftaxClassic-v0")``.

    Args:
        run_dir: a folder written by :func:`train` / ``examples/train_sb3.py``.
        seed: which of the run's seeds; an SB3 run trains one (its ``--seed``), so only 0.
        device: torch device for the networks (default ``"auto"``).

    Returns:
        An :class:`SB3AgentPolicy` (``reset()``, ``act(obs) -> action``).

    Raises:
        UntrustedModelError: the run's ``model.zip`` is not the file it saved (nothing is loaded).
        agents.run_dir.CorruptFileError: the zip does not fit the run's config, or holds non-finite
            weights (nothing in it is unpickled either way; see :func:`load_model`).
    """
    if seed != 0:
        raise ValueError(f"seed={seed!r}: an SB3 run directory holds one trained seed (index 0)")
    run = RunDir(run_dir)
    saved = run.read_config()
    saved.pop("resolved_hyperparams", None)
    cfg = SB3Config.from_dict(saved)
    path, _ = verified_model_zip(run.path)
    model = load_model(cfg.algo, path, device=check_device(device or "auto"), hyperparams=cfg.hyperparams,
                       seed=cfg.seed, obs_mode=cfg.obs_mode)
    return SB3AgentPolicy(model, cfg.algo, {"obs_mode": cfg.obs_mode, "delta": cfg.delta})


# ----------------------------------------------------------------------------- training run


@dataclass
class SB3Config:
    """Every setting of an SB3 run (``examples/train_sb3.py`` exposes each as a flag)."""

    algo: str = "qrdqn"
    relabeler: str = "rules"  # rules | llm | both | none
    total_timesteps: int = 30_000
    num_envs: int = 8
    seed: int = 0
    device: str = "auto"  # torch device of the networks: auto | cpu | cuda | cuda:N
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
    llm: LLMConfig = field(default_factory=LLMConfig)  # the LLM part shared with the PQN trainer (llm.per_update unused)
    grounding: str = "cosine"  # cosine (the paper's rule) | bound (event-bound; oir_gym.grounding)
    bind_threshold: float = 0.5  # grounding=bound: loosest cosine that binds an instruction to an event
    oracle: str = "canonical"  # canonical | diverse | tasks | compound | noisy (the rule labels; oir_gym.relabel.oracle)
    # algorithm (overrides of DEFAULT_HYPERPARAMS[algo])
    hyperparams: dict = field(default_factory=dict)
    # bookkeeping (in env steps)
    log_every: int = 2_000
    eval_every: int = 0  # 0: final evaluation only
    eval_episodes: int = 1
    eval_horizon: int = 300
    eval_sets: str = "original,simple,complex"  # comma-separated built-in sets; "": only eval_instructions' sets
    eval_instructions: tuple = ()  # JSON files of named instruction sets also evaluated (docs/evaluation.md)
    checkpoint_every: int = 10_000
    threads: int = 0  # 0: automatic (see configure_torch_threads)
    progress_bar: bool = False  # SB3's progress bar (needs tqdm and rich)
    wandb: bool = False  # also log the metrics rows to Weights & Biases (config = config.json; needs wandb)

    def validate(self) -> "SB3Config":
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(self.algo in ALGOS, f"algo={self.algo!r}; expected one of {ALGOS}")
        need(self.relabeler in RELABELERS, f"relabeler={self.relabeler!r}; expected one of {RELABELERS}")
        need(self.reward in ("cosine", "gt"), f"reward={self.reward!r}; expected 'cosine' or 'gt'")
        need(self.grounding in ("cosine", "bound"), f"grounding={self.grounding!r}; expected 'cosine' or 'bound'")
        need(-1 <= self.bind_threshold <= 1, f"bind_threshold={self.bind_threshold} must be a cosine in [-1, 1]")
        from oir_gym.relabel.oracle import check_oracle

        try:
            check_oracle(self.oracle, self.grounding)
        except ValueError as e:
            raise ValueError(f"oracle={self.oracle!r}: {e}") from None
        need(self.oracle == "canonical" or self.relabeler in ("rules", "both"),
             f"oracle={self.oracle!r} picks the rule relabeler's labels: it needs relabeler rules or both")
        for name in ("total_timesteps", "num_envs", "k", "segment_length", "log_every", "eval_episodes",
                     "eval_horizon", "checkpoint_every", "max_episode_steps"):
            need(int(getattr(self, name)) >= 1, f"{name}={getattr(self, name)!r} must be >= 1")
        need(self.buffer_size >= 0 and self.eval_every >= 0 and self.threads >= 0,
             "buffer_size, eval_every and threads must be >= 0")
        need(0 <= self.tau_low < self.tau_high, f"need 0 <= tau_low ({self.tau_low}) < tau_high ({self.tau_high})")
        need(isinstance(self.hyperparams, dict), f"hyperparams must be a dict, got {self.hyperparams!r}")
        need(isinstance(self.llm, LLMConfig), f"llm must be an LLMConfig, got {type(self.llm).__name__}")
        self.llm.validate()
        from oir_gym.instructions import PACKAGED_SET_NAMES, load_instruction_files

        self.eval_instructions = tuple(str(p) for p in self.eval_instructions)
        load_instruction_files(self.eval_instructions)  # ValueError naming the file, entry and field
        for s in self.eval_set_names:
            need(s in PACKAGED_SET_NAMES, f"eval set {s!r}; expected some of {PACKAGED_SET_NAMES}")
        need(bool(self.eval_set_names or self.eval_instructions),
             "eval_sets is empty and no eval_instructions file is given: nothing to evaluate")
        check_hyperparams(self.algo, self.hyperparams, self.device)
        if self.wandb:
            require_wandb()
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (what ``config.json`` holds), credentials in ``llm.base_url`` redacted."""
        d = asdict(self)
        d["llm"]["base_url"] = redact_url(d["llm"]["base_url"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SB3Config":
        """A config from ``config.json``'s contents; the flat ``llm_*`` keys of older runs map to ``llm``."""
        d = dict(d)
        llm = dict(d.pop("llm", None) or {})
        for old in ("llm_backend", "llm_model", "llm_base_url", "llm_template"):
            if old in d:
                llm.setdefault(old[len("llm_"):], d.pop(old))
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        llm_names = {f.name for f in dataclasses.fields(LLMConfig)}
        if set(llm) - llm_names:
            raise ValueError(f"unknown config keys {sorted('llm.' + k for k in set(llm) - llm_names)}")
        return cls(**d, llm=LLMConfig(**llm))

    @property
    def eval_set_names(self) -> tuple[str, ...]:
        """The built-in sets of ``eval_sets`` (comma-separated; empty: only the files' sets)."""
        return tuple(s for s in self.eval_sets.split(",") if s)

    @property
    def resolved_device(self) -> str:
        """The device, whether given as ``device`` or as the ``device`` hyperparameter."""
        return self.hyperparams.get("device", self.device)


def _make_callbacks(trainer: "_Trainer"):
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter

    class LastValues(KVWriter):
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
        """Every ``log_every`` steps: a metrics row (also into SB3's logger, dumped to TensorBoard),
        periodic evaluations and checkpoints."""

        def __init__(self) -> None:
            super().__init__(0)
            self.capture = LastValues()

        def _on_training_start(self) -> None:
            if self.capture not in self.model.logger.output_formats:
                self.model.logger.output_formats.append(self.capture)
            t = self.num_timesteps
            c = trainer.cfg
            self._next_log = (t // c.log_every + 1) * c.log_every
            self._next_ckpt = (t // c.checkpoint_every + 1) * c.checkpoint_every
            self._next_eval = (t // c.eval_every + 1) * c.eval_every if c.eval_every else None

        def _on_step(self) -> bool:
            t = self.num_timesteps
            c = trainer.cfg
            if t >= c.total_timesteps:
                # the last steps of learn(): finish() writes the final row, evaluation and checkpoint
                # (a row and an evaluation here too would repeat them at the same step)
                return True
            if t >= self._next_log:
                self._next_log += c.log_every
                row = trainer.metrics_row(self.capture.values)
                if self._next_eval is not None and t >= self._next_eval:
                    self._next_eval += c.eval_every
                    row.update(trainer.run_eval(f"{t:09d}"))
                trainer.write_row(row)
            if t >= self._next_ckpt:
                self._next_ckpt += c.checkpoint_every
                trainer.save()
            return True

    return RunCallback()


def _sb3_logger(tb_dir: Optional[Path]):
    """SB3's logger writing TensorBoard events to ``tb_dir`` (no output when None)."""
    from stable_baselines3.common.logger import Logger, configure

    if tb_dir is None:
        return Logger(folder=None, output_formats=[])
    return configure(str(tb_dir), ["tensorboard"])


def _tensorboard_installed() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


class _Trainer:
    """One SB3 training run in a :class:`~agents.run_dir.RunDir` (used by :func:`train`)."""

    def __init__(self, cfg: SB3Config, run: RunDir, print_fn: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.run = run
        self.print = print_fn
        self.t0 = time.time()
        self._last = (self.t0, 0)
        self.update = 0
        self.venv = None
        self.model = None
        self.relabeler = None
        self.relabel_cb = None
        self.metrics: Optional[MetricsWriter] = None
        self._last_eval = None
        self._run_callback = None  # made by learn(); its captured SB3 values fill the final row

    # ---------------------------------------------------------------- setup
    def setup(self, state: Optional[dict[str, Any]], model_path: Optional[Path]) -> None:
        cfg = self.cfg
        configure_torch_threads(cfg.threads or None)
        self.venv = make_env(cfg.num_envs, cfg.seed, obs_mode=cfg.obs_mode, delta=cfg.delta,
                             max_episode_steps=cfg.max_episode_steps, reward=cfg.reward,
                             buffer_size=(cfg.buffer_size or None) if cfg.relabeler != "none" else None,
                             tau_low=cfg.tau_low, tau_high=cfg.tau_high)
        self.relabeler = make_relabeler(cfg.relabeler, cfg.k, cfg.delta, encoder=self.venv.encoder, llm=cfg.llm,
                                        grounding=cfg.grounding, bind_threshold=cfg.bind_threshold, oracle=cfg.oracle,
                                        seed=cfg.seed, eval_files=cfg.eval_instructions)
        if self.relabeler is not None:  # the PQN trainer's start-up check: --relabeler llm stops, both warns
            check_llm(self.relabeler, cfg.relabeler == "llm", "--relabeler")
        if model_path is not None:
            self.model = load_model(cfg.algo, model_path, self.venv, device=cfg.resolved_device,
                                    hyperparams=cfg.hyperparams, seed=cfg.seed)
            if "instruction_buffer" in state:
                self.venv.buffer.load_state_dict(state["instruction_buffer"])
            elif (self.run / INSTRUCTION_BUFFER_JSON).exists():  # checkpoints before format 1
                self.venv.buffer.load_state_dict(read_json(self.run / INSTRUCTION_BUFFER_JSON))
            self.update = int(state.get("update", 0))
        else:
            self.model = make_model(cfg.algo, self.venv, cfg.seed, cfg.hyperparams, device=cfg.device)
        self.model.set_logger(_sb3_logger(self.run / "tb" if _tensorboard_installed() else None))
        if self.relabeler is not None:
            kw: dict[str, Any] = {"segment_length": cfg.segment_length, "verbose": 1}
            if cfg.asynchronous is not None:
                kw["asynchronous"] = cfg.asynchronous
            self.relabel_cb = make_relabel_callback(self.relabeler, cfg.algo, **kw)

    # ---------------------------------------------------------------- rows
    def metrics_row(self, sb3_values: dict[str, float]) -> dict[str, Any]:
        model = self.model
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
        self.metrics.write(row)
        # The same numbers through SB3's logger (TensorBoard), dumped at this step: off-policy
        # SB3 dumps only every few episodes, which can mean never in a short run.
        logger = self.model.logger
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("update", "env_steps", "time"):
                logger.record(k if "/" in k else f"run/{k}", v)
        logger.dump(step=int(row["env_steps"]))
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

    def run_eval(self, tag: str) -> dict[str, float]:
        from oir_gym.evaluation import EvalConfig

        c = self.cfg
        ecfg = EvalConfig(sets=c.eval_set_names, episodes=c.eval_episodes, horizon=c.eval_horizon,
                          instruction_files=c.eval_instructions)
        res = evaluate(self.model, ecfg, seed=c.seed + 12345, env_kwargs={"obs_mode": c.obs_mode})
        self.run.write_eval(tag, [res.to_dict()])
        self._last_eval = res
        return res.flat_metrics()

    def save(self) -> None:
        """A checkpoint: model.zip (checksummed), and in state.json the instruction buffer, the
        metrics position (rows after it are cut on resume) and the row counter."""
        position = self.metrics.sync()
        save_checkpoint(self.run.path, self.model, {
            "update": self.update, "metrics": position.to_dict(),
            "instruction_buffer": self.venv.buffer.state_dict(),
        })

    # ---------------------------------------------------------------- main
    def learn(self) -> None:
        from stable_baselines3.common.callbacks import CallbackList

        remaining = self.cfg.total_timesteps - int(self.model.num_timesteps)
        if remaining <= 0:
            return
        self._run_callback = _make_callbacks(self)
        cbs = [self._run_callback]
        if self.relabel_cb is not None:
            cbs.insert(0, self.relabel_cb)
        self.model.learn(remaining, callback=CallbackList(cbs), reset_num_timesteps=self.model.num_timesteps == 0,
                         progress_bar=self.cfg.progress_bar)

    def finish(self) -> dict[str, Any]:
        """Final checkpoint, evaluation, tables, plots, then the completion marker. Returns the final row."""
        from oir_gym import analysis

        self.save()
        row = self.metrics_row(self._run_callback.capture.values if self._run_callback is not None else {})
        row.pop("sps", None)  # not a training throughput: the row is written after learn()
        row.update(self.run_eval("final"))
        self.write_row(row)
        res = self._last_eval
        table = res.to_markdown()
        self.run.write_eval("final", [res.to_dict()], markdown=(
            f"# Final evaluation ({self.cfg.algo}, relabeler {self.cfg.relabeler}, {self.model.num_timesteps:,} env "
            f"steps, {self.cfg.eval_episodes} episode(s) x {self.cfg.eval_horizon} steps per instruction)\n\n{table}\n"))
        self.metrics.sync()
        self.run.write_csv()
        rows = self.run.read_metrics()
        analysis.plot_training(rows, self.run / "training.png")
        analysis.plot_learning_curves({self.cfg.algo: [rows]}, self.run / "learning_curves.png")
        analysis.plot_instruction_bars({self.cfg.algo: [res.to_dict()]}, self.run / "instruction_success.png")
        analysis.write_overview_plots({self.cfg.algo: [rows]}, self.run.path)  # success.png, gain.png, relabeling.png
        self.run.mark_complete(update=self.update, env_steps=int(self.model.num_timesteps),
                               model_sha256=read_checkpoint_state(self.run.path)["model_sha256"])
        self.print("\nFinal evaluation:\n" + table)
        return row

    def close(self) -> None:
        if self.relabeler is not None and hasattr(self.relabeler, "close"):
            self.relabeler.close()
        if self.venv is not None:
            self.venv.close()
        if self.metrics is not None:
            self.metrics.close()


def train(cfg: SB3Config, run_dir: str | os.PathLike, resume: bool = False, overwrite: bool = False,
          print_fn: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir``; returns the final metrics row.

    Every check runs before anything is written or deleted: the config, the flags against the
    folder (:meth:`RunDir.prepare`: ``resume`` with ``overwrite`` refused, an existing run never
    reused without one of them), and on ``resume`` the checkpoint (a ``model.zip`` without the
    checksum the run recorded is refused, :class:`UntrustedModelError`); then the LLM's start-up
    check (``relabeler="llm"`` with an LLM that does not answer: :class:`~agents.llm.LLMCheckError`
    with the cause and the fix, before config.json or metrics are written; ``"both"``: a warning,
    rules meanwhile), as in the PQN trainer. A resumed run continues
    from its checkpoint and cuts the metrics rows written after it; a complete run is left alone
    unless ``total_timesteps`` grew. ``KeyboardInterrupt`` (SIGINT; the script maps SIGTERM to it)
    saves a checkpoint first.
    """
    cfg.validate()
    model_path, state = None, None
    if resume:
        # Check the flags and the checkpoint before anything touches the folder.
        if overwrite or not (Path(run_dir) / "config.json").is_file():
            RunDir.prepare(run_dir, resume=True, overwrite=overwrite)  # raises its clear error
        state = read_checkpoint_state(run_dir)
        if state is not None or (Path(run_dir) / MODEL_ZIP).exists():
            model_path, state = verified_model_zip(run_dir, repair=True)
    run = RunDir.prepare(run_dir, resume=resume, overwrite=overwrite)
    if state is not None and run.is_complete() and cfg.total_timesteps <= int(state.get("num_timesteps", 0)):
        print_fn(f"{run.path} is complete ({int(state['num_timesteps']):,} env steps); nothing to do "
                 "(raise --total-timesteps to train further)")
        return {"complete": True, **(run.completion() or {})}
    # the checkpoint's metrics rows (cut after it on resume); before metrics positions: by update
    position = ({"position": state["metrics"]} if state is not None and "metrics" in state
                else {"after_update": int(state.get("update", 0)) if state else 0})
    run.check_metrics(**position)  # a damaged metrics.jsonl: an error naming it, before anything is written
    trainer = _Trainer(cfg, run, print_fn)
    try:
        trainer.setup(state, model_path)  # env, relabeler (its LLM checked: LLMCheckError), model
        run.clear_complete()
        run.write_config({**cfg.to_dict(),
                          "resolved_hyperparams": resolve_hyperparams(cfg.algo, cfg.num_envs, cfg.hyperparams)})
        trainer.metrics = run.open_metrics(**position, tensorboard=False, wandb=cfg.wandb)
        print_fn(f"oir-gym SB3 | algo={cfg.algo} relabeler={cfg.relabeler} device={trainer.model.device} | "
                 f"{cfg.num_envs} envs | {cfg.total_timesteps:,} env steps | run dir {run.path}")
        try:
            trainer.learn()
        except KeyboardInterrupt:
            print_fn("interrupted: saving a checkpoint")
            trainer.save()
            raise
        return trainer.finish()
    finally:
        trainer.close()
