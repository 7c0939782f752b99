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

:class:`agents.sb3.trainer.SB3Trainer` runs all of it in a run directory through the run driver
(:mod:`agents.run.train`; what ``examples/train_sb3.py`` calls), and :func:`load_sb3_policy` gives a trained run's policy back as
an object with ``reset()`` and ``act(obs)`` for the Gymnasium env.

Checkpoints: SB3's ``model.zip`` holds pickled Python objects, and SB3's own ``load`` unpickles
them, which runs whatever code they name. :func:`load_model` never does: it builds a fresh model
of the known class from the run's validated config and reads only the zip's parameters (tensors,
``torch.load(weights_only=True)``) and plain JSON counters into it. A run also records the sha256
of every ``model.zip`` it saves (``state.json``), and ``--resume`` and
:func:`load_sb3_policy` load only a zip with that checksum (a damaged or swapped file is caught
before anything is built).
"""

from __future__ import annotations

import inspect
import io
import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from agents.run import relabeling
from agents.run.config import LLMConfig, RelabelSettings
from agents.sb3.config import (  # noqa: F401  (re-exported: the algorithms and their checks)
    ALGOS, HYPERPARAM_DEFAULTS, POLICIES, RESERVED_HYPERPARAMS, algo_class, check_device, check_hyperparams,
)
from agents.run.run_dir import (
    CorruptFileError, RunDir, atomic_write_bytes, atomic_write_json, read_json, sha256_bytes, sha256_file,
)

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

#: What ``sb3.defaults="tiny"`` (the smoke preset) changes in :data:`DEFAULT_HYPERPARAMS`, per
#: algorithm: networks of 32 units, a 2,000-transition replay buffer that starts learning after 100
#: steps, RecurrentPPO rollouts of 50 steps per env. For checking that a run goes through, not for learning.
TINY_HYPERPARAMS: dict[str, dict[str, Any]] = {
    "recurrent_ppo": dict(n_steps=50, n_epochs=2,
                          policy_kwargs=dict(lstm_hidden_size=32, net_arch=dict(pi=[32], vf=[32]))),
    "dqn": dict(learning_starts=100, buffer_size=2_000, batch_size=32, target_update_interval=200,
                policy_kwargs=dict(net_arch=[32, 32])),
    "qrdqn": dict(learning_starts=100, buffer_size=2_000, batch_size=32, target_update_interval=200,
                  policy_kwargs=dict(n_quantiles=5, net_arch=[32, 32])),
}


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


def make_relabeler(kind: str = "rules", settings: Optional[RelabelSettings] = None, *, llm: Optional[LLMConfig] = None,
                   delta: float = 0.9, encoder: Any = None, seed: int = 0, eval_files: Sequence[str] = (),
                   **overrides: Any):
    """``"rules"`` (no LLM), ``"llm"`` (LLM candidates only), ``"both"`` (the rules at once, the LLM's
    answers when they arrive) or ``"none"``: :func:`agents.run.relabeling.make_relabeler`, the PQN
    trainer's factory, with the SB3 trainer's settings (the LLM is not called here).

    ``settings``: K, grounding and oracle (:class:`agents.run.config.RelabelSettings`); ``overrides``
    replace its fields (``k=8``, ``grounding="bound"``, ``oracle="diverse"``...) or set those of
    :class:`agents.run.relabeling.RelabelerOptions` (``keep_ungrounded``, ``cache_path``,
    ``queue_size``...). ``llm``: the LLM part shared with the PQN trainer (backend, model, server URL,
    prompt template, call timeout; default: the offline transformers backend). The oracle's draws are
    seeded by ``seed``, and a wording pool is checked against every evaluation string (``eval_files``
    too) before anything runs."""
    from dataclasses import fields, replace

    from agents.run.relabeling import RelabelerOptions

    own = {f.name for f in fields(RelabelerOptions)}
    settings = replace(settings or RelabelSettings(), **{k: v for k, v in overrides.items() if k not in own})
    options = RelabelerOptions(seed=seed, eval_files=tuple(eval_files), **{k: v for k, v in overrides.items() if k in own})
    return relabeling.make_relabeler(kind, settings, llm, delta=delta, encoder=encoder, options=options)


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


def resolve_hyperparams(algo: str, num_envs: int, overrides: Optional[dict[str, Any]] = None,
                        defaults: str = "craftax") -> dict[str, Any]:
    """:data:`DEFAULT_HYPERPARAMS` of ``algo`` (with ``defaults="tiny"``: updated with
    :data:`TINY_HYPERPARAMS`), updated with ``overrides`` (``policy_kwargs`` merged)."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")
    if defaults not in HYPERPARAM_DEFAULTS:
        raise ValueError(f"defaults={defaults!r}; expected one of {HYPERPARAM_DEFAULTS}")
    hp = json.loads(json.dumps(DEFAULT_HYPERPARAMS[algo]))
    for layer in ([TINY_HYPERPARAMS[algo]] if defaults == "tiny" else []) + [overrides or {}]:
        layer = dict(layer)
        pk = layer.pop("policy_kwargs", None)
        hp.update(layer)
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
def make_model(algo: str, venv, seed: int = 0, hyperparams: Optional[dict[str, Any]] = None,
               tensorboard_log: Optional[str] = None, verbose: int = 0, device: str = "auto", *,
               defaults: str = "craftax"):
    """An SB3 model of ``algo`` on ``venv`` with :func:`resolve_hyperparams` (``hyperparams`` over
    the ``defaults`` set: ``"craftax"`` or ``"tiny"``).

    ``device``: where the networks live (``"auto"``: CUDA when available, else CPU). A
    ``"device"`` key in ``hyperparams`` is the same setting (refused when it contradicts
    ``device``). DQN and QR-DQN get a :class:`~oir_gym.sb3.RelabelReplayBuffer` (a
    ``DictReplayBuffer`` that also takes relabeled rows) unless ``replay_buffer_class`` is given.

    Raises:
        ValueError: a hyperparameter the class or its policy does not take, or a value it refuses
            (the message names the algorithm and the hyperparameters).
    """
    hp = resolve_hyperparams(algo, venv.num_envs, hyperparams, defaults)
    check_hyperparams(algo, hp, device)
    device = hp.pop("device", device)
    hp["policy_kwargs"] = _policy_kwargs(hp.get("policy_kwargs", {}))
    if algo in ("dqn", "qrdqn"):
        from oir_gym.sb3 import RelabelReplayBuffer

        hp.setdefault("replay_buffer_class", RelabelReplayBuffer)
    cls = algo_class(algo)
    try:
        return cls(POLICIES[algo], venv, seed=seed, tensorboard_log=tensorboard_log, verbose=verbose, device=device,
                   **hp)
    except (TypeError, ValueError, AssertionError, AttributeError) as e:  # a value of the wrong kind or range
        given = f"--sb3.hp {hyperparams}" if hyperparams else "the defaults"
        raise ValueError(f"{cls.__name__} (--sb3.algo {algo}, --sb3.defaults {defaults}) could not be built with "
                         f"{given}: {type(e).__name__}: {str(e).strip()[:300]}") from e


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


def spaces_only_venv(obs_mode: str = "paper", num_envs: int = 1):
    """A VecEnv of ``num_envs`` envs that only declare InstructionCraftax's spaces (observation mode
    ``obs_mode``, the default encoder's embeddings): enough to build a model that acts on
    observations given to it (:func:`load_model`), or to check that a config's model builds; it
    cannot be stepped."""
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

    return DummyVecEnv([SpacesOnly] * num_envs)


def check_model_zip(path: str | os.PathLike) -> dict[str, Any]:
    """Check that ``path`` is an SB3 zip with parameters (nothing unpickled); returns its ``data``
    as JSON. Raises :class:`~agents.run.run_dir.CorruptFileError` naming the file otherwise."""
    import zipfile

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            data = _zip_data(path, archive)
            missing = [m for m in _PARAMETER_FILES if m not in archive.namelist()]
    except zipfile.BadZipFile:
        raise CorruptFileError(path, "is not a zip file (an SB3 model.zip)") from None
    if missing:
        raise CorruptFileError(path, f"lacks {missing}: it is not a model saved by stable-baselines3")
    return data


def load_model(algo: str, path: str | os.PathLike, venv=None, device: str = "auto", *,
               hyperparams: Optional[dict[str, Any]] = None, seed: Optional[int] = None, obs_mode: str = "paper",
               defaults: str = "craftax"):
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
        hyperparams: overrides of the ``defaults`` set that built the saved model (a run's config
            holds both); default: those of ``data`` that are plain JSON (settings SB3 stored only as
            pickles, e.g. schedules, take their defaults).
        seed: the model's seed (default: ``data``'s, else 0).

    Raises:
        agents.run.run_dir.CorruptFileError: not an SB3 zip of ``algo`` with these hyperparameters, or
            non-finite weights (the message names the file).
    """
    import zipfile

    import torch

    algo_class(algo)  # without SB3: the ImportError that names the extra to install
    from stable_baselines3.common.save_util import load_from_zip_file

    path = Path(path)
    data = check_model_zip(path)
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
    model = make_model(algo, venv if venv is not None else spaces_only_venv(obs_mode), seed, hyperparams, device=device,
                       defaults=defaults)
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

    The ``Policy`` interface of ``agents.tools.policy`` (what ``load_policy`` returns for PQN runs too).
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
    :class:`~agents.run.run_dir.CorruptFileError` naming it."""
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
            f"agents.sb3.models.trust_model_zip({str(run_dir)!r}).")
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
        run_dir: a folder written by ``examples/train_sb3.py``.
        seed: which of the run's seeds; an SB3 run trains one (its ``--run.seed``), so only 0.
        device: torch device for the networks (default ``"auto"``).

    Returns:
        An :class:`SB3AgentPolicy` (``reset()``, ``act(obs) -> action``).

    Raises:
        FileNotFoundError: ``run_dir`` is not a folder, or holds no ``config.json`` (the message names
            the folder and what an SB3 run directory holds).
        UntrustedModelError: the run's ``model.zip`` is not the file it saved (nothing is loaded).
        agents.run.run_dir.CorruptFileError: the zip does not fit the run's config, or holds non-finite
            weights (nothing in it is unpickled either way; see :func:`load_model`).
    """
    if seed != 0:
        raise ValueError(f"seed={seed!r}: an SB3 run directory holds one trained seed (index 0)")
    from agents.run.run_dir import CONFIG
    from agents.sb3.config import load_sb3_config

    folder = Path(run_dir)
    expected = (f"load_sb3_policy expects a run directory written by examples/train_sb3.py --run-dir "
                f"(it holds {CONFIG}, {MODEL_ZIP} and {STATE_JSON})")
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder{' (it is a file)' if folder.exists() else ''}; {expected}")
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"{folder}: no {CONFIG} there, so not a run directory; {expected}")
    run = RunDir(folder)
    raw = run.read_config()
    if "sb3" not in raw and "algo" not in raw:  # nested, or flat (older runs)
        raise ValueError(f"{folder}: a PQN run (its {CONFIG} has no 'sb3' part); load it with "
                         "agents.tools.policy.load_policy, which loads PQN and SB3 runs")
    if not (folder / MODEL_ZIP).exists() and not (folder / STATE_JSON).exists():
        raise FileNotFoundError(f"{folder}: no checkpoint yet ({MODEL_ZIP}, {STATE_JSON}): the run stopped before "
                                f"its first; continue it with examples/train_sb3.py --run-dir {folder} --resume")
    cfg = load_sb3_config(raw)
    path, _ = verified_model_zip(run.path)
    model = load_model(cfg.sb3.algo, path, device=check_device(device or "auto"), hyperparams=cfg.sb3.hyperparams,
                       seed=cfg.run.seed, obs_mode=cfg.env.obs_mode, defaults=cfg.sb3.defaults)
    return SB3AgentPolicy(model, cfg.sb3.algo, {"obs_mode": cfg.env.obs_mode, "delta": cfg.env.delta})
