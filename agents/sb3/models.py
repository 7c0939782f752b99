"""Stable-Baselines3 agents on InstructionCraftax with OIR relabeling (docs/sb3.md): RecurrentPPO (curriculum only),
QR-DQN and DQN (also trained on relabeled transitions). SB3's ``model.zip`` holds pickles: :func:`load_model` reads
only its tensors and plain counters, and a run loads only the zip whose sha256 it recorded (``state.json``)."""

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
    load_sb3_config,
)
from agents.run.run_dir import (
    CONFIG, CorruptFileError, RunDir, atomic_write_bytes, atomic_write_json, read_json, sha256_bytes, sha256_file,
)

_DQN_FAMILY = dict(learning_rate=1e-4, buffer_size=50_000, learning_starts=2_000, batch_size=128, gamma=0.99,
                   train_freq=4, gradient_steps=1, target_update_interval=10_000, exploration_fraction=0.1,
                   exploration_initial_eps=1.0, exploration_final_eps=0.05)
_TINY_DQN_FAMILY = dict(learning_starts=100, buffer_size=2_000, batch_size=32, target_update_interval=200)

#: Craftax-Classic defaults per algorithm (SB3 constructor arguments): RecurrentPPO after the Craftax PPO-RNN
#: baseline with a smaller LSTM (``batch_size``: ``n_envs * n_steps / 4`` unless given); DQN and QR-DQN with
#: 1-step targets and a 50k-transition replay buffer (about 0.5 GB).
DEFAULT_HYPERPARAMS: dict[str, dict[str, Any]] = {
    "recurrent_ppo": dict(
        learning_rate=2.5e-4, n_steps=64, n_epochs=4, gamma=0.99, gae_lambda=0.8, clip_range=0.2,
        ent_coef=0.01, vf_coef=0.5, max_grad_norm=1.0,
        policy_kwargs=dict(lstm_hidden_size=256, n_lstm_layers=1, shared_lstm=True, enable_critic_lstm=False,
                           net_arch=dict(pi=[256], vf=[256])),
    ),
    "dqn": dict(_DQN_FAMILY, max_grad_norm=10.0, policy_kwargs=dict(net_arch=[256, 256])),
    "qrdqn": dict(_DQN_FAMILY, policy_kwargs=dict(n_quantiles=50, net_arch=[256, 256])),
}

#: What ``sb3.defaults="tiny"`` (the smoke preset) changes in :data:`DEFAULT_HYPERPARAMS`: small networks and
#: buffers, to check that a run goes through.
TINY_HYPERPARAMS: dict[str, dict[str, Any]] = {
    "recurrent_ppo": dict(n_steps=50, n_epochs=2,
                          policy_kwargs=dict(lstm_hidden_size=32, net_arch=dict(pi=[32], vf=[32]))),
    "dqn": dict(_TINY_DQN_FAMILY, policy_kwargs=dict(net_arch=[32, 32])),
    "qrdqn": dict(_TINY_DQN_FAMILY, policy_kwargs=dict(n_quantiles=5, net_arch=[32, 32])),
}


def configure_torch_threads(n: Optional[int] = None) -> int:
    """Set torch's intra-op threads: ``n``, or 1 on machines with <= 4 cores (small networks), else half (<= 8)."""
    import torch

    if n is None:
        cores = os.cpu_count() or 1
        n = 1 if cores <= 4 else min(8, cores // 2)
    torch.set_num_threads(int(n))
    return int(n)


def make_env(num_envs: int = 16, seed: int = 0, *, obs_mode: str = "paper", delta: float = 0.9,
             max_episode_steps: int = 10_000, reward: str = "cosine", buffer_size: Optional[int] = 10,
             tau_low: float = 0.1, tau_high: float = 0.9):
    """An SB3 VecEnv over a fresh :class:`~oir_gym.vector_env.InstructionCraftax` whose instruction buffer holds the
    first ``buffer_size`` original instructions (None: all 22, the fixed-instruction baselines)."""
    from oir_gym.buffer import InstructionBuffer
    from oir_gym.instructions import ORIGINAL_INSTRUCTIONS
    from oir_gym.sb3 import SB3VecEnv
    from oir_gym.vector_env import InstructionCraftax

    cap = len(ORIGINAL_INSTRUCTIONS) if buffer_size is None else int(buffer_size)
    buf = InstructionBuffer(cap, tau_low, tau_high, initial=list(ORIGINAL_INSTRUCTIONS)[:cap], seed=seed)
    return SB3VecEnv(InstructionCraftax(num_envs=num_envs, obs_mode=obs_mode, delta=delta, seed=seed, buffer=buf,
                                        max_episode_steps=max_episode_steps, reward=reward))


def make_relabeler(kind: str = "rules", settings: Optional[RelabelSettings] = None, *, llm: Optional[LLMConfig] = None,
                   delta: float = 0.9, encoder: Any = None, seed: int = 0, eval_files: Sequence[str] = (),
                   **overrides: Any):
    """:func:`agents.run.relabeling.make_relabeler` of ``kind``; ``overrides`` replace fields of ``settings``
    (``k=8``...) or set those of :class:`agents.run.relabeling.RelabelerOptions` (``cache_path``...)."""
    from dataclasses import fields, replace

    own = {f.name for f in fields(relabeling.RelabelerOptions)}
    settings = replace(settings or RelabelSettings(), **{k: v for k, v in overrides.items() if k not in own})
    options = relabeling.RelabelerOptions(seed=seed, eval_files=tuple(eval_files),
                                          **{k: v for k, v in overrides.items() if k in own})
    return relabeling.make_relabeler(kind, settings, llm, delta=delta, encoder=encoder, options=options)


def make_relabel_callback(relabeler, algo: str, **kwargs: Any):
    """:class:`~oir_gym.sb3.HindsightRelabelCallback` in ``algo``'s mode (replay or curriculum); synchronous for
    a rules-only relabeler unless ``asynchronous`` is given."""
    from oir_gym.sb3 import HindsightRelabelCallback

    kwargs.setdefault("asynchronous", getattr(getattr(relabeler, "backend", None), "llm", "?") is not None)
    return HindsightRelabelCallback(relabeler, mode="curriculum" if algo == "recurrent_ppo" else "replay", **kwargs)


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


def make_model(algo: str, venv, seed: int = 0, hyperparams: Optional[dict[str, Any]] = None, device: str = "auto", *,
               defaults: str = "craftax"):
    """An SB3 model of ``algo`` on ``venv`` with :func:`resolve_hyperparams` on ``device`` (or the ``device``
    hyperparameter); ValueError naming the algorithm for an argument it refuses."""
    hp = resolve_hyperparams(algo, venv.num_envs, hyperparams, defaults)
    check_hyperparams(algo, hp, device)
    device = hp.pop("device", device)
    pk = hp["policy_kwargs"] = dict(hp.get("policy_kwargs", {}))
    if isinstance(pk.get("activation_fn"), str):  # by name in JSON: a class of torch.nn
        import torch

        pk["activation_fn"] = getattr(torch.nn, pk["activation_fn"])
    if algo in ("dqn", "qrdqn"):
        from oir_gym.sb3 import RelabelReplayBuffer

        hp.setdefault("replay_buffer_class", RelabelReplayBuffer)
    cls = algo_class(algo)
    try:
        return cls(POLICIES[algo], venv, seed=seed, device=device, **hp)
    except (TypeError, ValueError, AssertionError, AttributeError) as e:  # a value of the wrong kind or range
        given = f"--sb3.hp {hyperparams}" if hyperparams else "the defaults"
        raise ValueError(f"{cls.__name__} (--sb3.algo {algo}, --sb3.defaults {defaults}) could not be built with "
                         f"{given}: {type(e).__name__}: {str(e).strip()[:300]}") from e


_PARAMETER_FILES = ("policy.pth", "policy.optimizer.pth")  # the tensors load_model reads
_PROGRESS_COUNTERS = ("num_timesteps", "_n_updates", "_episode_num", "_n_calls")


def _is_pickled(v: Any) -> bool:
    return isinstance(v, dict) and ":serialized:" in v


def _policy_kwargs_from_data(path: Path, value: Any) -> dict[str, Any]:
    """``policy_kwargs`` as ``data`` shows it: a pickled dict's readable members, the default optimizer and a
    ``torch.nn`` activation by name; any other class is a CorruptFileError (pass the hyperparameters)."""
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
    """A VecEnv of ``num_envs`` envs that only declare InstructionCraftax's spaces (it cannot be stepped)."""
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
    """``path``'s ``data`` as JSON if it is an SB3 zip with parameters (nothing unpickled), else CorruptFileError."""
    import zipfile

    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            data = json.loads(archive.read("data").decode("utf-8")) if "data" in names else {}
    except zipfile.BadZipFile:
        raise CorruptFileError(path, "is not a zip file (an SB3 model.zip)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:  # its ":serialized:" pickles are never decoded
        raise CorruptFileError(path, f"its 'data' member is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CorruptFileError(path, "its 'data' member is not a JSON object")
    missing = [m for m in _PARAMETER_FILES if m not in names]
    if missing:
        raise CorruptFileError(path, f"lacks {missing}: it is not a model saved by stable-baselines3")
    return data


def load_model(algo: str, path: str | os.PathLike, venv=None, device: str = "auto", *,
               hyperparams: Optional[dict[str, Any]] = None, seed: Optional[int] = None, obs_mode: str = "paper",
               defaults: str = "craftax"):
    """A model of ``algo`` saved with ``model.save``, loaded without unpickling: a fresh :func:`make_model`
    (``hyperparams`` default: the zip's plain JSON ones) gets the zip's parameters and progress counters.
    CorruptFileError naming the file: not a zip of ``algo`` with these hyperparameters, or non-finite weights."""
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
    seed = seed if seed is not None else plain["seed"] if isinstance(plain.get("seed"), int) else 0
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
    # what SB3's load would restore of these (the schedules' progress follows num_timesteps)
    for name in _PROGRESS_COUNTERS:
        if name in plain and hasattr(model, name):
            v = plain[name]
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                raise CorruptFileError(path, f"data's {name}={v!r} is not a count (an integer >= 0)")
            setattr(model, name, v)
    return model


class SB3AgentPolicy:
    """A trained SB3 model acting greedily. ``policy(obs, state, episode_start) -> (actions, state)`` acts on a batch
    (``state``: a recurrent model's LSTM states, None at the start and for feed-forward models); :meth:`act` (the
    ``Policy`` of ``agents.tools.policy``) keeps the state itself until :meth:`reset`. ``env_kwargs``: those of the
    training env."""

    def __init__(self, model, algo: Optional[str] = None, env_kwargs: Optional[dict[str, Any]] = None,
                 deterministic: bool = True) -> None:
        self.model = model
        self.algo = algo
        self.env_kwargs = dict(env_kwargs or {})
        self.deterministic = deterministic
        self.recurrent = hasattr(model.policy, "lstm_actor")  # keeps a memory between steps
        self.reset()

    def __call__(self, obs: dict[str, np.ndarray], state=None, episode_start: Optional[np.ndarray] = None):
        if not self.recurrent:
            return np.asarray(self.model.predict(obs, deterministic=self.deterministic)[0]).reshape(-1), None
        n = next(iter(obs.values())).shape[0]
        start = np.ones(n, bool) if episode_start is None else np.asarray(episode_start, bool)
        actions, state = self.model.predict(obs, state=state, episode_start=start, deterministic=self.deterministic)
        return np.asarray(actions).reshape(-1), state

    def reset(self) -> None:
        """Forget the recurrent state (:attr:`state`: None): the next :meth:`act` starts an episode."""
        self.state: Any = None
        self._start = True
        self._n: Optional[int] = None

    def act(self, obs: Mapping[str, np.ndarray], episode_start: Any = None):
        """The greedy action for ``obs``; ``episode_start`` (bool or ``[n]``): envs whose episode starts here."""
        space = self.model.observation_space
        missing = set(space.spaces) - set(obs)
        if missing:
            raise KeyError(f"observation lacks {sorted(missing)} (expected keys {sorted(space.spaces)})")
        single = np.ndim(obs["obs"]) == 1
        batch = {k: np.asarray(obs[k], np.float32)[None] if single else np.asarray(obs[k], np.float32)
                 for k in space.spaces}
        for k, sub in space.spaces.items():
            if batch[k].shape[1:] != sub.shape:
                hint = f" (the run used {self.env_kwargs})" if k == "obs" and self.env_kwargs else ""
                raise ValueError(f"obs[{k!r}] has shape {batch[k].shape[1:]} per env, the policy was trained on "
                                 f"{sub.shape}{hint}")
        n = batch["obs"].shape[0]
        if self._n is not None and n != self._n:  # another env or batch: its own fresh state
            self.state, self._start = None, True
        start = np.zeros(n, bool) if episode_start is None else np.broadcast_to(np.asarray(episode_start, bool), (n,))
        actions, self.state = self(batch, self.state, start | self._start)
        self._start, self._n = False, n
        return int(actions[0]) if single else np.asarray(actions, np.int64).reshape(-1)


#: The batch form of :class:`SB3AgentPolicy` (``SB3Policy(model)``), one implementation.
SB3Policy = SB3AgentPolicy


def evaluate(model, eval_cfg=None, seed: int = 0, env_kwargs: Optional[dict[str, Any]] = None):
    """Greedy evaluation with ground-truth success (:func:`oir_gym.evaluation.evaluate_python_policy`)."""
    from oir_gym.evaluation import EvalConfig, evaluate_python_policy

    return evaluate_python_policy(SB3Policy(model), eval_cfg or EvalConfig(), seed=seed, env_kwargs=env_kwargs)


MODEL_ZIP = "model.zip"
STATE_JSON = "state.json"
INSTRUCTION_BUFFER_JSON = "instruction_buffer.json"
#: The next model.zip while a checkpoint is being written (a ".*.tmp" name: run_dir's outputs).
MODEL_NEXT = ".model.zip.next.tmp"
CHECKPOINT_FORMAT = 1


class UntrustedModelError(RuntimeError):
    """A run's ``model.zip`` is not the file the run saved (or it has no recorded checksum): nothing is loaded."""


def save_checkpoint(run_dir: str | os.PathLike, model, state: Mapping[str, Any]) -> str:
    """Save ``model`` as ``model.zip`` and ``state`` as ``state.json`` (recording the zip's sha256, returned). The
    zip is written beside the old one first: a kill leaves the old checkpoint or the new state with the new zip
    under its temporary name (:func:`verified_model_zip` moves it into place)."""
    run_dir = Path(run_dir)
    buf = io.BytesIO()
    model.save(buf)
    data = buf.getvalue()
    sha = sha256_bytes(data)
    atomic_write_bytes(run_dir / MODEL_NEXT, data)
    atomic_write_json(run_dir / STATE_JSON, {**state, "format": CHECKPOINT_FORMAT, "model_sha256": sha,
                                             "num_timesteps": int(model.num_timesteps)}, indent=None)
    # no directory fsync: if this rename is lost, verified_model_zip rolls MODEL_NEXT forward
    os.replace(run_dir / MODEL_NEXT, run_dir / MODEL_ZIP)
    return sha


def read_checkpoint_state(run_dir: str | os.PathLike) -> Optional[dict[str, Any]]:
    """``state.json`` of a run (None before its first checkpoint); CorruptFileError for a damaged one."""
    path = Path(run_dir) / STATE_JSON
    if not path.exists():
        return None
    state = read_json(path)
    if not isinstance(state, dict):
        raise CorruptFileError(path, "is not a JSON object")
    return state


def verified_model_zip(run_dir: str | os.PathLike, *, repair: bool = False) -> tuple[Path, dict[str, Any]]:
    """The run's model zip with the recorded sha256, and ``state.json`` (else :class:`UntrustedModelError`);
    ``repair``: move a complete new zip left by a killed save into place."""
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
    """Record the sha256 of the run's current ``model.zip`` (only a file you trust) as the run's; returns it."""
    run_dir = Path(run_dir)
    zip_path = run_dir / MODEL_ZIP
    if not zip_path.exists():
        raise FileNotFoundError(f"{zip_path} does not exist")
    state = read_checkpoint_state(run_dir) or {}
    sha = sha256_file(zip_path)
    atomic_write_json(run_dir / STATE_JSON, {**state, "model_sha256": sha}, indent=None)
    return sha


def load_sb3_policy(run_dir: str | os.PathLike, seed: int = 0, device: Optional[str] = None) -> SB3AgentPolicy:
    """The :class:`SB3AgentPolicy` of an SB3 run directory (``seed``: only 0); FileNotFoundError, ValueError (a PQN
    run), :class:`UntrustedModelError` or CorruptFileError otherwise."""
    if seed != 0:
        raise ValueError(f"seed={seed!r}: an SB3 run directory holds one trained seed (index 0)")
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
