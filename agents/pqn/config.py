"""The PQN run's configuration: :class:`TrainConfig`, its validation and :data:`PRESETS`; :func:`load_config`
also reads the flat ``config.json`` of old runs (:data:`FLAT_KEYS`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, Mapping, Sequence, get_args

from agents.run.config import (
    MAX_EVAL_EPISODES, EnvSettings, EvalSettings, LLMConfig, NestedConfig, RelabelSettings, did_you_mean, need,
)
from agents.run.config import cli as shared_cli

Method = Literal["gt", "cosine", "oir", "ellm"]
ProposerKind = Literal["rules", "llm"]
EllmReward = Literal["any", "pinned"]

METHODS: tuple[str, ...] = get_args(Method)
ELLM_PROPOSERS: tuple[str, ...] = get_args(ProposerKind)


@dataclass
class RunConfig:
    """What to run and for how long."""

    method: Method = "oir"
    """gt / cosine: ground-truth / cosine reward on the 22 achievements; oir: OIR relabeling; ellm: ELLM"""
    total_timesteps: int = 200_000
    """Env steps per seed."""
    num_seeds: int = 1
    """Seeds trained side by side in one program."""
    num_devices: int = 0
    """Local devices (0: all) seeds are spread over; fewer seeds: each seed's envs (pqn.num_envs divides by it)"""
    seed: int = 0
    """The first seed (seeds run.seed to run.seed + run.num_seeds - 1: networks, envs, instruction buffers)."""
    checkpoint_every: int = 25
    """Updates between checkpoints."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (the newest ones)."""


@dataclass
class PQNConfig:
    """The PQN-RNN agent (Gallici et al. 2024)."""

    num_envs: int = 16
    """Envs per seed."""
    num_steps: int = 64
    """Rollout length per update."""
    eps_start: float = 1.0
    """Epsilon-greedy exploration at the start."""
    eps_finish: float = 0.1
    """Epsilon-greedy exploration after the decay."""
    eps_decay: float = 0.1
    """Fraction of training over which epsilon decays linearly."""
    lr: float = 3e-4
    """Adam's learning rate."""
    lr_linear_decay: bool = True
    """Decay the learning rate linearly to 0 over the run."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip (> 0)."""
    num_epochs: int = 2
    """Passes over each update's batch."""
    num_minibatches: int = 4
    """Minibatches per pass (they must divide the update's trajectories)."""
    skip_padding: bool = False
    """Leave out the batch's padding (relabel slots no instruction filled): each pass puts the rows that train
    first and stops after the last minibatch holding one (the learning-rate schedule still advances by
    ``num_minibatches`` per pass); off: every minibatch runs, its padding weighted 0."""
    gamma: float = 0.99
    """Discount factor."""
    lam: float = 0.5
    """Q(lambda)'s lambda."""
    hidden_size: int = 128
    """Width of the hidden layer and the LSTM."""
    num_layers: int = 1
    """Dense + LayerNorm + ReLU layers before the LSTM."""
    norm_input: bool = True
    """Normalise the observation input (layer norm)."""
    scan_unroll: int = 1
    """LSTM time steps per loop iteration (GPU: fewer loop round trips; same maths)."""
    lstm_kernel: Literal["auto", "scan", "pallas"] = "auto"
    """The LSTM recurrence of the update: ``scan`` of XLA ops, ``pallas`` (one fused kernel per step; same maths),
    or ``auto``: ``pallas`` on one GPU, the scan otherwise (on a CPU, or with the seeds spread over devices).
    Acting and evaluation step the network one step at a time, always with the scan's step."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Input type of the hidden layer's and the LSTM's matmuls, and of the LSTM's stored input projection, gates
    and gate gradients (float32 accumulation, parameters, cell state and Q-values)."""


@dataclass
class EnvConfig(EnvSettings):
    """The instruction-conditioned Craftax-Classic env."""

    table_capacity: int = 512
    """Rows of the device instruction table: evaluation (about 250 packaged), buffer and running instructions."""


@dataclass
class OIRConfig(RelabelSettings):
    """Hindsight instruction relabeling and the instruction buffer (method ``oir``)."""

    keep_ungrounded: bool = False
    """Keep relabeled instructions that paid no reward on their own trajectory (as the paper's Alg. 1)."""
    relabel_every_match: bool = False
    """A relabeled copy pays every match, not only the first per original episode."""
    relabel_balance: bool = False
    """Spread the K slots over instructions (rare events kept); an extension, not in the paper."""
    llm_lag: int = 16
    """Rollouts kept for late LLM answers (older answers are dropped)."""
    relabel_lag: int = 0
    """0: relabeled copies train in their own update (the paper); 1: one update later, off the critical path"""
    oracle_pool: str = ""
    """Wording pool file of oir.oracle diverse, noisy and mixed (empty: oir_gym/data/oracle_pool.json)"""
    relabel_workers: int = -1
    """Rule relabeler worker processes for 64+ trajectories (-1: by the machine's cores, 0: none)"""


@dataclass
class ELLMConfig:
    """The ELLM baseline (Du et al. 2023) on the PQN backbone (method ``ellm``)."""

    proposer: ProposerKind = "rules"
    """rules: rule goals; llm: the LLM backend (``llm.*``), falling back to rules."""
    k: int = 4
    """Goals proposed per env."""
    timeout: float = 10.0
    """Seconds an update waits for the LLM's goals before the rule goals answer."""
    reward: EllmReward = "any"
    """any: a caption matching any goal proposed for the env pays; pinned: only the env's own goal."""


@dataclass
class TrainConfig(NestedConfig):
    """Every setting of a PQN training run."""

    run: RunConfig = field(default_factory=RunConfig)
    pqn: PQNConfig = field(default_factory=PQNConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    oir: OIRConfig = field(default_factory=OIRConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    ellm: ELLMConfig = field(default_factory=ELLMConfig)
    eval: EvalSettings = field(default_factory=EvalSettings)

    @property
    def batch_steps(self) -> int:
        """Env steps of one update (one seed)."""
        return self.pqn.num_envs * self.pqn.num_steps

    @property
    def num_updates(self) -> int:
        return max(1, self.run.total_timesteps // self.batch_steps)

    def rows_per_update(self) -> int:
        """Trajectories of one update batch: the originals, plus K relabeled copies each for ``oir``."""
        return self.pqn.num_envs * (1 + (self.oir.k if self.run.method == "oir" else 0))

    @classmethod
    def from_flat_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """From the flat ``config.json`` of old runs (:data:`FLAT_KEYS`); keys they lacked keep their defaults,
        unknown keys are a ValueError naming them."""
        unknown = sorted(set(d) - set(FLAT_KEYS), key=str)
        if unknown:
            raise ValueError(f"unknown config key {unknown[0]!r} in a flat (pre-nested) config"
                             f"{did_you_mean(unknown[0], list(FLAT_KEYS))}")
        nested: dict[str, dict[str, Any]] = {}
        for key, value in d.items():
            for path in FLAT_KEYS[key]:
                part, name = path.split(".")
                nested.setdefault(part, {})[name] = value
        return cls.from_dict(nested)

    def validate(self) -> "TrainConfig":
        """Check every field; raise one ValueError naming the field (and what to use) at the first bad one."""
        r, p, e, o, el, ev = self.run, self.pqn, self.env, self.oir, self.ellm, self.eval
        self.check_parts(
            (("run", "method", METHODS), ("ellm", "proposer", ELLM_PROPOSERS), ("ellm", "reward", get_args(EllmReward)),
             ("pqn", "compute_dtype", ("float32", "bfloat16")), ("pqn", "lstm_kernel", ("auto", "scan", "pallas"))),
            (("run", ("total_timesteps", "num_seeds", "checkpoint_every", "keep_checkpoints")),
             ("pqn", ("num_envs", "num_steps", "num_epochs", "num_minibatches", "hidden_size", "num_layers",
                      "scan_unroll")),
             ("env", ("table_capacity",)), ("oir", ("llm_lag",)), ("ellm", ("k",))))
        from oir_gym.validation import MAX_SEED  # JAX keys hold 32 bits: seed 2**32 would meet seed 0's worlds

        need(0 <= r.seed and r.seed + r.num_seeds - 1 <= MAX_SEED,
             f"run.seed={r.seed} must be in [0, {MAX_SEED - r.num_seeds + 1}] (seeds run.seed to run.seed + "
             f"run.num_seeds - 1 must fit JAX's 32-bit keys)")
        need(e.max_episode_steps <= 2**31 - 1, f"env.max_episode_steps={e.max_episode_steps} must be < 2**31")
        need(r.num_devices >= 0, f"run.num_devices={r.num_devices} must be >= 0 (0: every visible device)")
        if r.num_devices > 0:  # arithmetic only: asking JAX for devices would start it before jax.distributed
            from agents.pqn.sharding import check_layout

            check_layout(r.num_seeds, p.num_envs, r.num_devices, visible=r.num_devices)
        need(0 < p.lr < 1, f"pqn.lr={p.lr} must be in (0, 1)")
        need(p.max_grad_norm > 0, f"pqn.max_grad_norm={p.max_grad_norm} must be > 0 (a negative clip flips the "
                                  "gradient's sign)")
        need(0 <= p.gamma <= 1, f"pqn.gamma={p.gamma} must be in [0, 1]")
        need(0 <= p.lam <= 1, f"pqn.lam={p.lam} must be in [0, 1]")
        need(0 <= p.eps_finish <= p.eps_start <= 1,
             f"need 0 <= pqn.eps_finish ({p.eps_finish}) <= pqn.eps_start ({p.eps_start}) <= 1")
        need(0 < p.eps_decay <= 1, f"pqn.eps_decay={p.eps_decay} must be in (0, 1]")
        need(o.relabel_lag in (0, 1), f"oir.relabel_lag={o.relabel_lag!r} must be 0 (relabel before the rollout's own "
                                      "update) or 1 (one update later, on a side thread)")
        from oir_gym.relabel.oracle import USES_POOL, check_pool, evaluation_texts, load_pool

        need(not o.oracle_pool or o.oracle in USES_POOL,
             f"oir.oracle_pool is read by oir.oracle {', '.join(USES_POOL)} only (oir.oracle={o.oracle!r})")
        if o.oracle in USES_POOL:
            try:  # the file and its verbatim collisions now; the cosine check when the relabeler is built
                check_pool(load_pool(o.oracle_pool or None), evaluation_texts(ev.instruction_files))
            except ValueError as err:
                raise ValueError(f"oir.oracle_pool: {err}") from None
        need(o.relabel_workers >= -1, f"oir.relabel_workers={o.relabel_workers} must be -1 (auto), 0 (in process) "
                                      "or a number of worker processes")
        need(not (o.relabel_balance and o.keep_ungrounded),
             "oir.relabel_balance spreads slots over grounded instructions only; it cannot be combined with "
             "oir.keep_ungrounded=True")
        need(el.timeout >= 0, f"ellm.timeout={el.timeout} must be >= 0")
        need(ev.episodes <= MAX_EVAL_EPISODES, f"eval.episodes={ev.episodes} must be <= {MAX_EVAL_EPISODES}")
        need(1 <= ev.final_episodes <= MAX_EVAL_EPISODES,
             f"eval.final_episodes={ev.final_episodes} must be in [1, {MAX_EVAL_EPISODES}]")
        need(0 <= ev.epsilon <= 1, f"eval.epsilon={ev.epsilon} must be in [0, 1]")
        rows = self.rows_per_update()
        need(rows % p.num_minibatches == 0,
             f"pqn.num_minibatches={p.num_minibatches} must divide the {rows} trajectories of an update "
             f"(pqn.num_envs x (1 + oir.k) for oir, pqn.num_envs otherwise)")
        need(r.total_timesteps >= self.batch_steps,
             f"run.total_timesteps={r.total_timesteps} is less than one update ({self.batch_steps} steps = "
             "pqn.num_envs x pqn.num_steps)")
        return self


FLAT_KEYS: dict[str, tuple[str, ...]] = {
    "method": ("run.method",), "total_timesteps": ("run.total_timesteps",), "num_seeds": ("run.num_seeds",),
    "seed": ("run.seed",), "checkpoint_every": ("run.checkpoint_every",),
    **{k: (f"pqn.{k}",) for k in ("num_envs", "num_steps", "eps_start", "eps_finish", "eps_decay", "lr",
                                  "lr_linear_decay", "max_grad_norm", "num_epochs", "num_minibatches", "gamma",
                                  "lam", "hidden_size", "num_layers", "norm_input", "scan_unroll")},
    **{k: (f"env.{k}",) for k in ("obs_mode", "delta", "max_episode_steps", "table_capacity")},
    "relabeler": ("oir.relabeler",), "buffer_size": ("oir.instruction_buffer_size",), "tau_low": ("oir.tau_low",),
    "tau_high": ("oir.tau_high",), "keep_ungrounded": ("oir.keep_ungrounded",),
    "relabel_every_match": ("oir.relabel_every_match",), "relabel_balance": ("oir.relabel_balance",),
    "llm_lag": ("oir.llm_lag",), "k": ("oir.k", "ellm.k"),
    "llm_backend": ("llm.backend",), "llm_base_url": ("llm.base_url",), "llm_model": ("llm.model",),
    "llm_template": ("llm.template",), "llm_per_update": ("llm.per_update",),
    "ellm_proposer": ("ellm.proposer",), "ellm_timeout": ("ellm.timeout",), "ellm_reward": ("ellm.reward",),
    "eval_every": ("eval.every",), "eval_episodes": ("eval.episodes",), "eval_horizon": ("eval.horizon",),
    "eval_epsilon": ("eval.epsilon",),
}
"""Old flat key -> the nested field(s) it becomes."""


def load_config(d: Mapping[str, Any]) -> TrainConfig:
    """A config from ``config.json``'s contents, nested or flat (old runs); provenance keys are ignored."""
    d = {k: v for k, v in d.items() if k not in ("provenance", "resumed")}
    parts = {f.name for f in fields(TrainConfig)}
    # a flat config (old runs) holds only values; a nested one names sections holding objects
    if d and (set(d) & parts or any(isinstance(v, Mapping) for v in d.values())):
        return TrainConfig.from_dict(d)
    return TrainConfig.from_flat_dict(d)


def _cpu() -> TrainConfig:
    # Sized for a 2-core CPU: a few minutes, rule relabeling (the offline LLM, one flag away, answered too late
    # to train on with 2 cores), event-bound grounding so that its wordings can reach the batch.
    return TrainConfig().replace(**{"oir.relabeler": "rules", "run.total_timesteps": 98_304, "eval.every": 48,
                                    "eval.episodes": 1, "run.checkpoint_every": 16, "oir.grounding": "bound",
                                    "eval.final_episodes": 4})


def _paper() -> TrainConfig:
    # Table "Hyperparameters used in Craftax-Classic" of the paper.
    return TrainConfig().replace(**{
        "run.total_timesteps": 10_000_000, "pqn.num_envs": 64, "pqn.num_steps": 128, "pqn.num_epochs": 8,
        "pqn.num_minibatches": 4, "pqn.lr": 1e-5, "pqn.gamma": 0.99, "pqn.lam": 0.5, "pqn.eps_start": 1.0,
        "pqn.eps_finish": 0.1, "pqn.eps_decay": 0.1, "pqn.hidden_size": 512, "pqn.num_layers": 1,
        "pqn.max_grad_norm": 0.5, "oir.instruction_buffer_size": 10, "env.delta": 0.9, "oir.k": 4, "ellm.k": 4,
        "eval.every": 50, "llm.per_update": 64, "eval.episodes": 4, "eval.horizon": 1000, "run.checkpoint_every": 20,
        "pqn.scan_unroll": 8,
    })


def _fast() -> TrainConfig:
    # Time-to-score on one GPU: purejaxql's PQN-RNN batch for Craftax (1,024 envs x 128 steps) with the paper's
    # agent and OIR settings; lr, epochs and length tuned on H100s (docs/results.md); the rule relabeling runs
    # beside the next rollout (oir.relabel_lag 1); bfloat16 matmuls (bench/update_cost.py).
    return _paper().replace(**{
        "run.total_timesteps": 64 * 1024 * 128, "run.num_seeds": 3, "pqn.num_envs": 1024, "pqn.num_steps": 128,
        "pqn.num_epochs": 4, "pqn.num_minibatches": 16, "pqn.lr": 5e-4, "eval.every": 8,
        "run.checkpoint_every": 16, "oir.relabel_lag": 1, "pqn.compute_dtype": "bfloat16",
    })


def _smoke() -> TrainConfig:
    # The smallest run through every part of a method: 4 updates of 4 envs x 16 steps.
    return TrainConfig().replace(**{
        "run.total_timesteps": 4 * 4 * 16, "pqn.num_envs": 4, "pqn.num_steps": 16, "pqn.hidden_size": 32,
        "pqn.num_epochs": 2, "pqn.num_minibatches": 2, "pqn.lr": 1e-3, "oir.k": 2, "ellm.k": 2,
        "eval.every": 2, "eval.episodes": 1, "eval.horizon": 8, "run.checkpoint_every": 2, "eval.final_episodes": 1,
    })


#: Name -> (description, factory) of the named configurations.
PRESETS: dict[str, tuple[str, Any]] = {
    "cpu": ("CPU default: OIR with rule relabeling (--oir.relabeler both adds the offline LLM), 98,304 env steps "
            "(a few minutes on 2 cores)", _cpu),
    "paper": ("The paper's Craftax-Classic hyperparameters (10M env steps; for a GPU)", _paper),
    "fast": ("A strong agent quickly on one GPU: 1,024 envs x 128 steps, 4 epochs, bfloat16 matmuls, 3 seeds, 8.4M "
             "env steps per seed (one H200, shipped encoder, cold compilation cache: 0.339-0.364 mean success with rule "
             "labels after 166-179 s in four runs, compile and evaluations included; docs/benchmarks.md)",
             _fast),
    "smoke": ("The smallest run through every part of the method (4 updates; 2-core CPU: about 2 min the first time, "
              "compiling, about 30 s once JAX's compilation cache holds its programs)", _smoke),
}
DEFAULT_PRESET = "cpu"


def preset(name: str) -> TrainConfig:
    """A fresh copy of preset ``name`` (not validated)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name][1]()


def cli(options_type: type, args: Sequence[str] | None = None, *, base: Any = None,
        description: str | None = None) -> Any:
    """The PQN command line: :func:`agents.run.config.cli` with :data:`PRESETS` and :class:`TrainConfig`."""
    return shared_cli(options_type, args, base=base, description=description, default_preset=DEFAULT_PRESET,
                      presets=PRESETS, config_type=TrainConfig)
