"""The configuration of an SB3 run: :class:`SB3TrainConfig`, the PQN config's parts for what the two share and
``sb3`` for what only SB3 has; an *update* is ``sb3.steps_per_update`` env steps. :func:`load_sb3_config` also
reads the flat ``config.json`` of older runs (:data:`FLAT_SB3_KEYS`)."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping, Optional

import tyro

from agents.run.config import EnvSettings, EvalSettings, LLMConfig, NestedConfig, RelabelSettings, need

SB3Method = Literal["oir", "cosine", "gt"]
Algo = Literal["recurrent_ppo", "qrdqn", "dqn"]
ALGOS: tuple[str, ...] = ("recurrent_ppo", "qrdqn", "dqn")
HyperparamDefaults = Literal["craftax", "tiny"]
HYPERPARAM_DEFAULTS: tuple[str, ...] = ("craftax", "tiny")

#: The SB3 policy of each algorithm: the instruction is part of a Dict observation.
POLICIES = {"recurrent_ppo": "MultiInputLstmPolicy", "qrdqn": "MultiInputPolicy", "dqn": "MultiInputPolicy"}


def algo_class(algo: str):
    """The SB3 class of ``algo``; ``ImportError`` naming the extra to install when SB3 is missing."""
    if algo not in ALGOS:
        raise ValueError(f"unknown algo {algo!r}; expected one of {ALGOS}")
    module, name = {"recurrent_ppo": ("sb3_contrib", "RecurrentPPO"), "qrdqn": ("sb3_contrib", "QRDQN"),
                    "dqn": ("stable_baselines3", "DQN")}[algo]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ImportError(f"algo {algo!r} needs stable-baselines3 and sb3-contrib: pip install 'oir-gym[sb3]' "
                          f"({e})") from e


RESERVED_HYPERPARAMS = {"policy": "--sb3.algo", "env": "the run's env", "seed": "--run.seed", "verbose": "nothing",
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
    """ValueError naming the key and what to use for an override the SB3 class of ``algo`` (or its policy) does not
    take, a wrong kind of value, or one the trainer sets itself."""
    cls = algo_class(algo)
    params = inspect.signature(cls.__init__).parameters
    for key, value in hyperparams.items():
        need(key not in RESERVED_HYPERPARAMS,
             f"hyperparameter {key!r} is set by the trainer; use {RESERVED_HYPERPARAMS.get(key)}")
        if key not in params:
            raise ValueError(f"{cls.__name__} (--sb3.algo {algo}) has no argument {key!r} (--sb3.hp {key}=...); "
                             f"it takes {_arguments(params)}")
        # SB3 takes a value of the wrong kind without a word and fails in the middle of training
        default = params[key].default
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        need(number or callable(value) or isinstance(default, bool) or not isinstance(default, (int, float))
             or key == "train_freq" and isinstance(value, (tuple, list)),
             f"hyperparameter {key}={value!r}: {cls.__name__} takes a number there (its default: {default!r})")
        need(not isinstance(value, float) or math.isfinite(value),
             f"hyperparameter {key}={value!r} must be a finite number")
        need(key not in _COUNTS or number and isinstance(value, int) and value >= _COUNTS[key],
             f"hyperparameter {key}={value!r} must be a whole number >= {_COUNTS.get(key)}")
    pk = hyperparams.get("policy_kwargs") or {}
    need(isinstance(pk, Mapping),
         f"hyperparameter policy_kwargs={pk!r} must be a dict (or --sb3.hp policy_kwargs.KEY=VALUE)")
    policy = cls.policy_aliases[POLICIES[algo]]
    policy_params = inspect.signature(policy.__init__).parameters
    for key in pk:
        if key in ("observation_space", "action_space", "lr_schedule") or key not in policy_params:
            raise ValueError(f"the {POLICIES[algo]} of {cls.__name__} (--sb3.algo {algo}) has no argument {key!r} "
                             f"(--sb3.hp policy_kwargs.{key}=...); it takes "
                             f"{_arguments(policy_params, ('observation_space', 'action_space', 'lr_schedule'))}")
    hp_device = hyperparams.get("device") or device
    need(device in ("auto", hp_device), f"device given twice: device={device!r} and hyperparameter "
                                        f"device={hp_device!r}; give one")
    check_device(hp_device)


#: Hyperparameters that count (steps, transitions, epochs) and their least value.
_COUNTS = {"buffer_size": 1, "batch_size": 1, "learning_starts": 0, "n_steps": 1, "n_epochs": 1,
           "target_update_interval": 1}


def _arguments(params: Mapping[str, Any], skip: tuple[str, ...] = ()) -> str:
    """The keyword arguments of a signature that an override may set."""
    names = [n for n in params if n not in ("self", "_init_setup_model", *skip, *RESERVED_HYPERPARAMS)
             and params[n].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    return ", ".join(names)


@dataclass
class SB3RunConfig:
    """What to run and for how long."""

    method: SB3Method = "oir"
    """gt / cosine: ground-truth / cosine reward on the 22 achievements; oir: OIR relabeling"""
    total_timesteps: int = 30_000
    """Env steps (the run's one seed)."""
    seed: int = 0
    """The run's seed (model, envs, instruction buffer)."""
    checkpoint_every: int = 5
    """Updates between checkpoints (an update: sb3.steps_per_update env steps)."""


@dataclass
class SB3Settings:
    """What only the SB3 trainer has."""

    algo: Algo = "qrdqn"
    """recurrent_ppo (curriculum only), qrdqn or dqn (these two also train on the relabeled transitions)."""
    num_envs: int = 8
    """Envs stepped side by side."""
    steps_per_update: int = 2_000
    """Env steps of one update (a metrics row; the unit of eval.every, run.checkpoint_every, --max-updates)."""
    device: str = "auto"
    """Torch device of the networks: auto (CUDA when available), cpu, cuda, cuda:N."""
    segment_length: int = 128
    """Steps of one relabeled trajectory segment."""
    asynchronous: Optional[bool] = None
    """Relabel in a background worker (None: yes for an LLM relabeler, no for rules)."""
    threads: int = 0
    """Torch threads (0: automatic, 1 on machines with <= 4 cores)."""
    defaults: HyperparamDefaults = "craftax"
    """Starting hyperparameters: craftax, or tiny (small networks: the smoke preset); --sb3.hp overrides"""
    hp: tuple[str, ...] = ()
    """Overrides of SB3 constructor arguments, KEY=VALUE (a Python literal; policy_kwargs.KEY for the network)."""
    hyperparams: Annotated[dict, tyro.conf.Suppress] = field(default_factory=dict)
    """Overrides of the algorithm's defaults (sb3.defaults); on the command line: --sb3.hp KEY=VALUE."""


@dataclass
class SB3TrainConfig(NestedConfig):
    """Every setting of an SB3 training run."""

    run: SB3RunConfig = field(default_factory=SB3RunConfig)
    env: EnvSettings = field(default_factory=EnvSettings)
    oir: RelabelSettings = field(default_factory=RelabelSettings)
    llm: LLMConfig = field(default_factory=LLMConfig)
    eval: EvalSettings = field(default_factory=EvalSettings)
    sb3: SB3Settings = field(default_factory=SB3Settings)

    @property
    def num_updates(self) -> int:
        """Updates of the whole run (the last one may hold fewer env steps)."""
        return max(1, math.ceil(self.run.total_timesteps / self.sb3.steps_per_update))

    @property
    def relabeler(self) -> str:
        """What relabels: ``oir.relabeler`` for method oir, else ``"none"``."""
        return self.oir.relabeler if self.run.method == "oir" else "none"

    @property
    def reward(self) -> str:
        """The env's reward: ``gt`` for method gt, else ``cosine``."""
        return "gt" if self.run.method == "gt" else "cosine"

    @property
    def resolved_device(self) -> str:
        """The device, whether given as ``sb3.device`` or as the ``device`` hyperparameter."""
        return self.sb3.hyperparams.get("device", self.sb3.device)

    def with_hp(self) -> "SB3TrainConfig":
        """``sb3.hp``'s KEY=VALUE overrides folded into ``sb3.hyperparams`` (``sb3.hp`` then empty)."""
        hp = json.loads(json.dumps(self.sb3.hyperparams))
        for item in self.sb3.hp:
            key, val = parse_hp(item)
            if key.startswith("policy_kwargs."):
                hp.setdefault("policy_kwargs", {})[key.split(".", 1)[1]] = val
            else:
                hp[key] = val
        return dataclasses.replace(self, sb3=dataclasses.replace(self.sb3, hp=(), hyperparams=hp))

    def validate(self) -> "SB3TrainConfig":
        """Check every field; raise one ValueError naming the field at the first bad one. Returns self."""
        r, ev, s = self.run, self.eval, self.sb3
        self.check_parts(
            (("run", "method", ("oir", "cosine", "gt")), ("sb3", "algo", ALGOS),
             ("sb3", "defaults", HYPERPARAM_DEFAULTS)),
            (("run", ("total_timesteps", "checkpoint_every")), ("eval", ("final_episodes",)),
             ("sb3", ("num_envs", "steps_per_update", "segment_length"))))
        need(r.seed >= 0, f"run.seed={r.seed!r} must be an integer >= 0")
        need(s.steps_per_update >= s.num_envs, f"sb3.steps_per_update={s.steps_per_update} must be >= sb3.num_envs "
                                               f"({s.num_envs}): the envs step together")
        need(s.threads >= 0, f"sb3.threads={s.threads} must be >= 0 (0: automatic)")
        need(ev.epsilon == 0, f"eval.epsilon={ev.epsilon}: the SB3 trainer evaluates greedily only (0)")
        check_hyperparams(s.algo, s.hyperparams, s.device)
        return self


def parse_hp(item: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(KEY, VALUE)``, the value read as a Python literal (else kept as text)."""
    if "=" not in item:
        raise ValueError(f"--sb3.hp expects KEY=VALUE, got {item!r}")
    k, v = item.split("=", 1)
    try:
        val = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        val = v
    return k.strip(), val


#: Flat key of an old SB3 ``config.json`` -> its nested field (units converted by :func:`load_sb3_config`).
FLAT_SB3_KEYS: dict[str, str] = {
    "algo": "sb3.algo", "total_timesteps": "run.total_timesteps", "num_envs": "sb3.num_envs", "seed": "run.seed",
    "device": "sb3.device", "obs_mode": "env.obs_mode", "delta": "env.delta",
    "max_episode_steps": "env.max_episode_steps", "buffer_size": "oir.instruction_buffer_size",
    "tau_low": "oir.tau_low", "tau_high": "oir.tau_high", "k": "oir.k", "segment_length": "sb3.segment_length",
    "asynchronous": "sb3.asynchronous", "grounding": "oir.grounding", "bind_threshold": "oir.bind_threshold",
    "oracle": "oir.oracle", "hyperparams": "sb3.hyperparams", "log_every": "sb3.steps_per_update",
    "eval_episodes": "eval.episodes", "eval_horizon": "eval.horizon", "eval_instructions": "eval.instruction_files",
    "threads": "sb3.threads",
}

#: The old flag spellings of the SB3 script -> the flag that replaced them (a usage error names it).
OLD_SB3_FLAGS: dict[str, str] = {
    **{"--" + old.replace("_", "-"): "--" + new.replace("_", "-") for old, new in FLAT_SB3_KEYS.items()
       if old not in ("hyperparams", "log_every")},  # --log-every is the driver's (updates between lines)
    "--relabeler": "--oir.relabeler (with --run.method oir, the default; none: --run.method cosine, or gt)",
    "--reward": "--run.method gt (ground-truth reward) or cosine",
    "--eval-every": "--eval.every (in updates of sb3.steps-per-update env steps)",
    "--checkpoint-every": "--run.checkpoint-every (in updates of sb3.steps-per-update env steps)",
    "--eval-sets": "--eval.sets (names separated by spaces)",
    "--hp": "--sb3.hp",
    "--progress-bar": "--progress / --no-progress",
    "--llm-backend": "--llm.backend", "--llm-model": "--llm.model", "--llm-base-url": "--llm.base-url",
    "--llm-template": "--llm.template",
}


#: Flags that took a boolean value in the old SB3 script and are plain flags now.
OLD_BOOLEAN_SYNTAX: tuple[str, ...] = ("--wandb", "--progress", "--overwrite", "--resume")
_BOOL_WORDS = ("1", "true", "yes", "on", "0", "false", "no", "off")


def old_flag_error(argv: list[str]) -> str | None:
    """The usage error of the first old SB3 flag spelling in ``argv`` (None: there is none)."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        name, eq, val = a.partition("=")
        if name in OLD_SB3_FLAGS:
            return f"{name} is no longer a flag of examples/train_sb3.py; use {OLD_SB3_FLAGS[name]} (see --help)"
        nxt = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if name in OLD_BOOLEAN_SYNTAX and nxt.lower() in _BOOL_WORDS:
            flag = name[2:]
            return (f"{name} takes no value now (as in examples/train_pqn.py): use {name} or --no-{flag} "
                    f"(got {name} {nxt})")
    return None


def load_sb3_config(d: Mapping[str, Any]) -> SB3TrainConfig:
    """A config from an SB3 ``config.json``: nested, or flat (older runs; env-step intervals become updates)."""
    d = {k: v for k, v in d.items() if k not in ("provenance", "resumed", "resolved_hyperparams")}
    if "algo" not in d:
        return SB3TrainConfig.from_dict(d)
    d = dict(d)
    llm = dict(d.pop("llm", None) or {})
    for old in ("llm_backend", "llm_model", "llm_base_url", "llm_template"):
        if old in d:
            llm.setdefault(old[len("llm_"):], d.pop(old))
    nested: dict[str, dict[str, Any]] = {"llm": llm}
    per_update = int(d.get("log_every", 2_000))
    relabeler, reward = d.pop("relabeler", "rules"), d.pop("reward", "cosine")
    nested["run"] = {"method": "oir" if relabeler != "none" else ("gt" if reward == "gt" else "cosine")}
    if relabeler != "none":
        nested.setdefault("oir", {})["relabeler"] = relabeler
    ev = {"final_episodes": int(d.get("eval_episodes", 1)), "final_sets": ()}
    if "eval_sets" in d:
        ev["sets"] = tuple(s for s in str(d.pop("eval_sets")).split(",") if s)
    every = int(d.pop("eval_every", 0) or 0)
    ev["every"] = max(1, math.ceil(every / per_update)) if every else max(
        1, math.ceil(int(d.get("total_timesteps", 30_000)) / per_update))
    nested["eval"] = ev
    nested["run"]["checkpoint_every"] = max(1, math.ceil(int(d.pop("checkpoint_every", 10_000)) / per_update))
    for gone in ("progress_bar", "wandb"):
        d.pop(gone, None)
    if d.get("buffer_size") == 0:  # 0 kept the 22 originals: the baselines' buffer
        d["buffer_size"] = 22
    for key, value in d.items():
        if key not in FLAT_SB3_KEYS:
            raise ValueError(f"unknown config key {key!r} in a flat (pre-nested) SB3 config")
        part, name = FLAT_SB3_KEYS[key].split(".")
        nested.setdefault(part, {})[name] = value
    return SB3TrainConfig.from_dict(nested)


def _sb3_cpu() -> SB3TrainConfig:
    # QR-DQN with the rule relabeler, 30k env steps in 15 updates, evaluated at the end only
    return SB3TrainConfig().replace(**{"eval.every": 15, "eval.episodes": 1, "eval.final_episodes": 1,
                                       "eval.final_sets": ()})


def _sb3_smoke() -> SB3TrainConfig:
    # The smallest run through every part: 2 updates of 200 env steps, the algorithm's tiny hyperparameters
    return SB3TrainConfig().replace(**{
        "run.total_timesteps": 400, "run.checkpoint_every": 1, "env.max_episode_steps": 40,
        "sb3.num_envs": 4, "sb3.steps_per_update": 200, "sb3.segment_length": 32, "sb3.defaults": "tiny",
        "eval.every": 2, "eval.episodes": 1, "eval.horizon": 10, "eval.sets": ("original",), "eval.final_episodes": 1,
        "eval.final_sets": (), "eval.control": False,
    })


#: Name -> (description, factory) of the named SB3 configurations.
SB3_PRESETS: dict[str, tuple[str, Any]] = {
    "cpu": ("CPU default: QR-DQN with the rule relabeler, 30,000 env steps (minutes on 2 cores)", _sb3_cpu),
    "smoke": ("The smallest run through every part, for any --sb3.algo (2 updates of 200 env steps, the algorithm's "
              "tiny hyperparameters; under a minute on a 2-core CPU)", _sb3_smoke),
}
