"""The configuration of a training run: nested dataclasses, presets, validation and the CLI.

One :class:`TrainConfig` holds every setting of a PQN run, in parts:

* ``run``  (:class:`RunConfig`): method, seeds, length, checkpoints;
* ``pqn``  (:class:`PQNConfig`): the PQN-RNN agent (batch shape, exploration, optimiser, network);
* ``env``  (:class:`EnvConfig`): observation mode, reward threshold delta, episode length, table size;
* ``oir``  (:class:`OIRConfig`): hindsight relabeling and the instruction buffer (method ``oir``);
* ``llm``  (:class:`LLMConfig`): the LLM backend, shared by the relabeler, the ELLM proposer
  and the SB3 trainer;
* ``ellm`` (:class:`ELLMConfig`): the ELLM baseline's goal proposer (method ``ellm``);
* ``eval`` (:class:`EvalSettings`): periodic evaluation.

``PRESETS`` names whole configurations: ``cpu`` (the CLI's default, a few minutes on a small
CPU), ``paper`` (the paper's Craftax-Classic table, for a GPU), ``fast`` (purejaxql's 1,024-env
batch with the paper's agent: a strong agent in minutes on one GPU) and ``smoke`` (the smallest run
that goes through every part of the chosen method: on a 2-core CPU about 2 min the first time, compiling,
and about 30 s once JAX's compilation cache holds its programs; the tests use it).

:meth:`TrainConfig.validate` refuses every bad value with one error naming the field, so a
script validates before it writes anything. Old run directories wrote one flat dict of 42 to
46 keys; :meth:`TrainConfig.from_flat_dict` reads them (:func:`load_config` reads either form).

The CLI (:func:`cli`) is built by tyro from these dataclasses: the preset comes first, as a
subcommand, then overrides of its values, and ``--help`` after a preset shows that preset's
values::

    python examples/train_pqn.py paper --pqn.num-envs 64 --run.num-seeds 3 --help
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Annotated, Any, Literal, Mapping, Sequence, get_args

import tyro

Method = Literal["gt", "cosine", "oir", "ellm"]
Relabeler = Literal["rules", "llm", "both"]
Grounding = Literal["cosine", "bound"]
Oracle = Literal["canonical", "diverse", "tasks", "compound", "noisy", "mixed", "progress"]
ProposerKind = Literal["rules", "llm"]
LLMBackend = Literal["transformers", "llama_cpp", "openai", "vllm"]
ObsMode = Literal["paper", "symbolic"]
EllmReward = Literal["any", "pinned"]

METHODS: tuple[str, ...] = get_args(Method)
RELABELERS: tuple[str, ...] = get_args(Relabeler)
ORACLES: tuple[str, ...] = get_args(Oracle)
ELLM_PROPOSERS: tuple[str, ...] = get_args(ProposerKind)
LLM_BACKENDS: tuple[str, ...] = get_args(LLMBackend)


def is_module_path(value: str) -> bool:
    """Whether ``value`` is written ``package.module:ClassName`` (dotted identifiers, a colon, an identifier)."""
    module, colon, name = value.partition(":")
    return bool(colon) and all(p.isidentifier() for p in module.split(".")) and name.isidentifier()


def _backend_from_argv(args: list[str]) -> str:
    value = args[0]
    if value in LLM_BACKENDS or is_module_path(value):
        return value
    raise ValueError(f"{value!r} is neither one of {', '.join(LLM_BACKENDS)} nor package.module:ClassName")


#: ``llm.backend`` on the command line: a registered name or ``package.module:ClassName``
LLMBackendArg = Annotated[str, tyro.constructors.PrimitiveConstructorSpec(
    nargs=1, metavar="{" + ",".join(LLM_BACKENDS) + "}|MODULE:CLASS", instance_from_str=_backend_from_argv,
    is_instance=lambda x: isinstance(x, str), str_from_instance=lambda x: [x])]

#: ``eval.episodes`` above this is refused (the evaluation runs every episode of every
#: instruction in one batch).
MAX_EVAL_EPISODES = 32


# ----------------------------------------------------------------------------- the parts
@dataclass
class RunConfig:
    """What to run and for how long."""

    method: Method = "oir"
    """gt: ground-truth reward on the 22 achievements; cosine: the cosine reward on them; oir: hindsight
    relabeling with an instruction buffer; ellm: ELLM goal proposals on the same PQN backbone."""
    total_timesteps: int = 200_000
    """Env steps per seed."""
    num_seeds: int = 1
    """Seeds trained side by side in one program."""
    num_devices: int = 0
    """Local devices (GPUs) the seeds are spread over in one program (``jax.sharding``): 0 = every
    visible device, 1 = one device. Seeds must divide by it (each device runs whole seeds); with fewer
    seeds than devices, each seed's envs are split instead (``pqn.num_envs`` must divide by it)."""
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
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """Input type of the hidden layer's and the LSTM's matmuls (``bfloat16``: float32 accumulation,
    parameters, norms, gates and Q-values; half the bytes and twice the tensor-core rate)."""

    @property
    def batch_steps(self) -> int:
        """Env steps of one update (one seed)."""
        return self.num_envs * self.num_steps


@dataclass
class EnvConfig:
    """The instruction-conditioned Craftax-Classic env."""

    obs_mode: ObsMode = "paper"
    """paper: the paper's observation; symbolic: Craftax's symbolic one."""
    delta: float = 0.9
    """Cosine threshold of the reward: an instruction pays when a caption of the step's events exceeds it."""
    max_episode_steps: int = 10_000
    """Steps before an episode is truncated."""
    table_capacity: int = 512
    """Rows of the device instruction table: every evaluation instruction (periodic and final, about 250
    with the packaged sets), the buffers' instructions and those the envs run."""


@dataclass
class RelabelSettings:
    """What both trainers' relabeling shares (the ``oir`` part of the PQN and the SB3 config)."""

    relabeler: Relabeler = "rules"
    """rules: rule instructions from the events; llm: the LLM backend (``llm.*``); both: the rules'
    instructions at once and the LLM's when they arrive (``oir_gym.relabel.BackgroundRelabeler``)."""
    k: int = 4
    """Relabeled instructions per trajectory (an SB3 run's trajectories are segments of
    ``sb3.segment_length`` steps)."""
    instruction_buffer_size: int = 10
    """B_max: instructions new episodes draw from (the PLR-style buffer; not a replay buffer)."""
    tau_low: float = 0.1
    """Buffer priority: an instruction whose mean return is at or below it counts as failing (ranked after
    those at the learning boundary)."""
    tau_high: float = 0.9
    """Buffer priority: an instruction whose mean return is above it counts as mastered (ranked last)."""
    grounding: Grounding = "cosine"
    """cosine: the paper's rule (an instruction pays where a caption matches it above ``env.delta``);
    bound: event-bound, a relabeled instruction pays exactly at the event(s) it was accomplished with
    on its trajectory, whatever its wording (:mod:`oir_gym.grounding`; an extension)."""
    bind_threshold: float = 0.5
    """grounding=bound: loosest cosine between an instruction and an event of its trajectory that binds it."""
    oracle: Oracle = "canonical"
    """The rule relabeler's labels (oir_gym.relabel.oracle; docs/relabeling.md, "Oracle relabelers"):
    canonical: each event's caption; diverse: each event named by a wording drawn per trajectory from a
    pool kept away from the evaluation sets; tasks: canonical plus the events outside the 22 achievements;
    compound: canonical plus "A then B" for unrelated events in their order; noisy: diverse with the
    measured errors of the 270M LLM relabeler; mixed: each canonical achievement label or a pool wording,
    0.5 each; progress: canonical plus the stone tier's progress events (stone in view, facing stone with a
    wooden pickaxe...). diverse, noisy and mixed need oir.grounding bound."""


@dataclass
class OIRConfig(RelabelSettings):
    """Hindsight instruction relabeling and the instruction buffer (method ``oir``)."""

    keep_ungrounded: bool = False
    """Keep relabeled instructions that paid no reward on their own trajectory (the paper's Alg. 1 keeps
    them; by default they are neither training rows nor buffer entries)."""
    relabel_every_match: bool = False
    """A relabeled copy pays every match, not only the first per original episode."""
    relabel_balance: bool = False
    """Spread the K slots over instructions (rare events kept); an extension, not in the paper."""
    llm_lag: int = 16
    """Rollouts kept for late LLM answers (older answers are dropped)."""
    relabel_lag: int = 0
    """0: the paper's order, a rollout's relabeled copies train in its own update. 1: the rule relabeler
    reads a rollout on a side thread while the device runs that update and the next rollout, and the
    copies (and buffer offers) enter one update later: the relabeling leaves the update's critical
    path. The first update then has no relabeled rows, and a resume loses one rollout's relabels."""
    oracle_pool: str = ""
    """Wording pool file of oir.oracle diverse, noisy and mixed (schema: oir_gym/data/oracle_pool.json; empty: that
    packaged pool). A wording equal or too close (cosine >= 0.85) to an evaluation string stops the run."""
    relabel_workers: int = -1
    """Worker processes for the rule relabeler (:class:`oir_gym.relabel.parallel.ParallelRelabeler`):
    -1 chooses from the machine (none below 4 cores, else up to 8), 0 relabels in the training process.
    Used when a rollout holds at least 64 trajectories (seeds x envs): the same candidates, their
    embeddings equal to float rounding (each process batches its encoder calls its own way). The
    workers start beside the first updates, which relabel in the training process until they are up."""


@dataclass
class LLMConfig:
    """The LLM backend, shared by the OIR relabeler, the ELLM proposer and the SB3 trainer."""

    backend: LLMBackendArg = "transformers"
    """transformers (the offline default) / llama_cpp: a local model, run in a child process;
    openai: an OpenAI-compatible server at ``base_url``; vllm: vLLM in a child process; or
    ``package.module:ClassName`` of any class with the backend protocol (run in a child process; a
    resumed run imports one only when this command line names it)."""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The OpenAI-compatible server (backend openai). The API key goes in the environment
    (``OPENAI_API_KEY``), never in the URL: a ``user:key@`` part or a query string is not sent to
    the server, and is replaced by ``REDACTED`` in ``config.json`` and checkpoints."""
    model: str = ""
    """Model path or name (empty: the backend's packaged default)."""
    template: str = "segments"
    """Relabeling prompt template."""
    per_update: int = 2
    """Trajectories (oir) or envs (ellm) per seed sent to the LLM each update (most eventful first; the PQN
    trainer: the SB3 trainer sends every segment)."""
    call_timeout: float | None = None
    """Seconds one relabeling LLM call may take (None: the backend's own limit)."""
    max_prompt_tokens: int = 768
    """Token budget of one relabeling prompt: longer trajectories are compacted to fit (past about
    900 tokens Gemma 3 270M copies the prompt's examples; docs/relabeling.md). 0: never compact."""

    def validate(self) -> "LLMConfig":
        """Raise ``ValueError`` naming the field for a setting the LLM part cannot use; returns self."""
        if not (isinstance(self.backend, str) and (self.backend in LLM_BACKENDS or is_module_path(self.backend))):
            raise ValueError(f"llm.backend={self.backend!r}; expected one of {LLM_BACKENDS} or package.module:ClassName")
        if not (isinstance(self.per_update, int) and self.per_update >= 1):
            raise ValueError(f"llm.per_update={self.per_update!r} must be >= 1")
        if not (isinstance(self.max_prompt_tokens, int) and self.max_prompt_tokens >= 0):
            raise ValueError(f"llm.max_prompt_tokens={self.max_prompt_tokens!r} must be a number of tokens >= 1, "
                             "or 0 (never compact)")
        if not (self.call_timeout is None or self.call_timeout > 0):
            raise ValueError(f"llm.call_timeout={self.call_timeout} must be > 0 (or None)")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"llm.base_url={redact_url(self.base_url)!r} must be an http(s) URL")
        from oir_gym.relabel.prompts import load_template

        try:  # a template that does not exist or does not parse stops the run now, whichever relabeler it uses
            load_template(self.template)
        except (ValueError, OSError) as e:
            raise ValueError(f"llm.template={self.template!r}: {e}") from None
        return self


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
class EvalSettings:
    """Periodic evaluation on the instruction sets."""

    every: int = 25
    """Updates between evaluations (and at the end)."""
    episodes: int = 2
    """Episodes per instruction (at most 32)."""
    horizon: int = 300
    """Steps per evaluation episode."""
    epsilon: float = 0.0
    """0: greedy evaluation."""
    instruction_files: tuple[str, ...] = ()
    """JSON files of named instruction sets evaluated beside the built-in ones (schema:
    docs/evaluation.md); several after one flag or the flag repeated."""
    sets: tuple[str, ...] = ("original", "simple", "complex")
    """Built-in sets to evaluate (any of original, simple, complex); the files' sets are always
    evaluated. ``--eval.sets`` with no name evaluates only the files' sets."""
    control: bool = True
    """Also evaluate each achievement under a mismatched and a neutral instruction (instruction-following gain)."""
    final_episodes: int = 16
    """Episodes per instruction of the final evaluation (the end of a run, and --eval-only; at most 32)."""
    final_sets: tuple[str, ...] = ("heldout", "ordered", "ordered_reverse")
    """Packaged sets the final evaluation adds to the periodic ones: the held-out paraphrases and the
    ordered compounds with their reverse-order control (docs/evaluation.md)."""

    def check_sets(self) -> None:
        """ValueError naming the set or file unless every set named is a packaged one, none twice, and
        something is evaluated (a user file's sets are read here, so a bad file is named too)."""
        from oir_gym.instructions import EXTRA_SET_NAMES, SET_NAMES, load_instruction_files

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        for name in self.final_sets:
            need(name in EXTRA_SET_NAMES, f"eval.final_sets: unknown set {name!r}; expected some of {EXTRA_SET_NAMES} "
                                          f"(the periodic evaluations already hold {SET_NAMES})")
        need(len(set(self.final_sets)) == len(self.final_sets),
             f"eval.final_sets={self.final_sets}: a set is listed twice")
        user_sets = load_instruction_files(self.instruction_files)  # ValueError naming the file, the entry and the field
        for s in self.sets:
            need(s in SET_NAMES, f"eval.sets: unknown built-in set {s!r}; expected some of {SET_NAMES} (the sets of "
                                 "eval.instruction_files are always evaluated)")
        need(len(set(self.sets)) == len(self.sets), f"eval.sets={self.sets} names a set twice")
        need(bool(self.sets or user_sets), "eval.sets is empty and eval.instruction_files gives no set: nothing to "
                                           "evaluate")


@dataclass
class TrainConfig:
    """Every setting of a PQN training run."""

    run: RunConfig = field(default_factory=RunConfig)
    pqn: PQNConfig = field(default_factory=PQNConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    oir: OIRConfig = field(default_factory=OIRConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    ellm: ELLMConfig = field(default_factory=ELLMConfig)
    eval: EvalSettings = field(default_factory=EvalSettings)

    # ------------------------------------------------------------ derived
    @property
    def method(self) -> str:
        return self.run.method

    @property
    def batch_steps(self) -> int:
        """Env steps of one update (one seed)."""
        return self.pqn.batch_steps

    @property
    def num_updates(self) -> int:
        return max(1, self.run.total_timesteps // self.batch_steps)

    def rows_per_update(self) -> int:
        """Trajectories of one update batch: the originals, plus K relabeled copies each for ``oir``."""
        return self.pqn.num_envs * (1 + (self.oir.k if self.run.method == "oir" else 0))

    # ------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (what ``config.json`` and checkpoints hold), credentials in
        ``llm.base_url`` redacted (:func:`redact_url`)."""
        return nested_to_dict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """From :meth:`to_dict`'s form; unknown parts or keys and wrong types are a ValueError naming them.

        Missing keys keep their defaults.
        """
        return nested_from_dict(cls, d)

    @classmethod
    def from_flat_dict(cls, d: Mapping[str, Any]) -> "TrainConfig":
        """From the flat ``config.json`` of runs written before the nested config (``agents.pqn.PQNConfig``).

        Every old key maps to one new field (``k`` to both ``oir.k`` and ``ellm.k``); keys those
        runs did not have yet keep their defaults, which are the old defaults. Unknown keys are a
        ValueError naming them.
        """
        unknown = sorted(set(d) - set(FLAT_KEYS), key=str)
        if unknown:
            raise ValueError(f"unknown config key {unknown[0]!r} in a flat (pre-nested) config"
                             f"{_did_you_mean(unknown[0], list(FLAT_KEYS))}")
        nested: dict[str, dict[str, Any]] = {}
        for key, value in d.items():
            for path in FLAT_KEYS[key]:
                part, name = path.split(".")
                nested.setdefault(part, {})[name] = value
        return cls.from_dict(nested)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with dotted-path changes, e.g. ``cfg.replace(**{"pqn.lr": 1e-3, "run.method": "gt"})``."""
        return nested_replace(self, changes)

    # ------------------------------------------------------------ validation
    def validate(self) -> "TrainConfig":
        """Check every field; raise one ValueError naming the field (and what to use) at the first bad one."""
        _check_types(self)
        r, p, e, o, l, el, ev = self.run, self.pqn, self.env, self.oir, self.llm, self.ellm, self.eval

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        for part, name, allowed in (("run", "method", METHODS), ("oir", "relabeler", RELABELERS),
                                    ("ellm", "proposer", ELLM_PROPOSERS),
                                    ("env", "obs_mode", get_args(ObsMode)), ("ellm", "reward", get_args(EllmReward)),
                                    ("pqn", "compute_dtype", ("float32", "bfloat16"))):
            v = getattr(getattr(self, part), name)
            need(v in allowed, f"{part}.{name}={v!r}; expected one of {allowed}")
        l.validate()
        for part, names in (("run", ("total_timesteps", "num_seeds", "checkpoint_every", "keep_checkpoints")),
                            ("pqn", ("num_envs", "num_steps", "num_epochs", "num_minibatches", "hidden_size",
                                     "num_layers", "scan_unroll")),
                            ("env", ("max_episode_steps", "table_capacity")),
                            ("oir", ("k", "instruction_buffer_size", "llm_lag")),
                            ("ellm", ("k",)),
                            ("eval", ("every", "episodes", "horizon"))):
            for name in names:
                v = getattr(getattr(self, part), name)
                need(v >= 1, f"{part}.{name}={v!r} must be >= 1")
        from oir_gym.validation import MAX_SEED  # JAX keys hold 32 bits: seed 2**32 would meet seed 0's worlds

        need(0 <= r.seed and r.seed + r.num_seeds - 1 <= MAX_SEED,
             f"run.seed={r.seed} must be in [0, {MAX_SEED - r.num_seeds + 1}] (seeds run.seed to run.seed + "
             f"run.num_seeds - 1 must fit JAX's 32-bit keys)")
        need(e.max_episode_steps <= 2**31 - 1, f"env.max_episode_steps={e.max_episode_steps} must be < 2**31")
        need(r.num_devices >= 0, f"run.num_devices={r.num_devices} must be >= 0 (0: every visible device)")
        if r.num_devices > 0:
            # the layout's arithmetic only; the Trainer checks against the visible devices (asking JAX
            # for them here would start its backend before a multi-host jax.distributed.initialize)
            from agents.sharding import check_layout

            check_layout(r.num_seeds, p.num_envs, r.num_devices, visible=r.num_devices)
        need(0 < p.lr < 1, f"pqn.lr={p.lr} must be in (0, 1)")
        need(p.max_grad_norm > 0, f"pqn.max_grad_norm={p.max_grad_norm} must be > 0 (a negative clip flips the "
                                  "gradient's sign)")
        need(0 <= p.gamma <= 1, f"pqn.gamma={p.gamma} must be in [0, 1]")
        need(0 <= p.lam <= 1, f"pqn.lam={p.lam} must be in [0, 1]")
        need(0 <= p.eps_finish <= p.eps_start <= 1,
             f"need 0 <= pqn.eps_finish ({p.eps_finish}) <= pqn.eps_start ({p.eps_start}) <= 1")
        need(0 < p.eps_decay <= 1, f"pqn.eps_decay={p.eps_decay} must be in (0, 1]")
        need(-1 < e.delta <= 1, f"env.delta={e.delta} is outside (-1, 1]")
        need(o.grounding in get_args(Grounding), f"oir.grounding={o.grounding!r}; expected one of {get_args(Grounding)}")
        need(-1 <= o.bind_threshold <= 1, f"oir.bind_threshold={o.bind_threshold} must be a cosine in [-1, 1]")
        need(o.relabel_lag in (0, 1), f"oir.relabel_lag={o.relabel_lag!r} must be 0 (relabel before the rollout's own "
                                      "update) or 1 (one update later, on a side thread)")
        need(o.oracle in ORACLES, f"oir.oracle={o.oracle!r}; expected one of {ORACLES}")
        from oir_gym.relabel.oracle import USES_POOL, check_oracle, check_pool, evaluation_texts, load_pool

        try:
            check_oracle(o.oracle, o.grounding)
        except ValueError as err:
            raise ValueError(f"oir.oracle={o.oracle!r}: {err}") from None
        need(o.oracle == "canonical" or r.method == "oir" and o.relabeler != "llm",
             f"oir.oracle={o.oracle!r} picks the rule relabeler's labels: it needs run.method oir and oir.relabeler "
             "rules or both")
        need(not o.oracle_pool or o.oracle in USES_POOL,
             f"oir.oracle_pool is read by oir.oracle {', '.join(USES_POOL)} only (oir.oracle={o.oracle!r})")
        if o.oracle in USES_POOL:
            try:  # the file and its verbatim collisions now; the cosine check when the relabeler is built
                check_pool(load_pool(o.oracle_pool or None), evaluation_texts(ev.instruction_files))
            except ValueError as err:
                raise ValueError(f"oir.oracle_pool: {err}") from None
        need(o.relabel_workers >= -1, f"oir.relabel_workers={o.relabel_workers} must be -1 (auto), 0 (in process) "
                                      "or a number of worker processes")
        need(0 <= o.tau_low < o.tau_high <= 1,
             f"need 0 <= oir.tau_low ({o.tau_low}) < oir.tau_high ({o.tau_high}) <= 1")
        need(not (o.relabel_balance and o.keep_ungrounded),
             "oir.relabel_balance spreads slots over grounded instructions only; it cannot be combined with "
             "oir.keep_ungrounded=True")
        need(el.timeout >= 0, f"ellm.timeout={el.timeout} must be >= 0")
        need(ev.episodes <= MAX_EVAL_EPISODES, f"eval.episodes={ev.episodes} must be <= {MAX_EVAL_EPISODES}")
        need(1 <= ev.final_episodes <= MAX_EVAL_EPISODES,
             f"eval.final_episodes={ev.final_episodes} must be in [1, {MAX_EVAL_EPISODES}]")
        need(0 <= ev.epsilon <= 1, f"eval.epsilon={ev.epsilon} must be in [0, 1]")
        ev.check_sets()
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


# ----------------------------------------------------------------------------- nested configs
# A run config is a dataclass of part dataclasses (TrainConfig here, agents.sb3_config.SB3TrainConfig):
# one way to write, read and change them for both trainers.
def nested_to_dict(cfg: Any) -> dict[str, Any]:
    """``cfg`` as a nested plain dict (what ``config.json`` and checkpoints hold), credentials in
    ``llm.base_url`` redacted (:func:`redact_url`)."""
    d = asdict(cfg)
    d["llm"]["base_url"] = redact_url(d["llm"]["base_url"])
    return d


def nested_from_dict(cls: Any, d: Mapping[str, Any]) -> Any:
    """``cls`` from :func:`nested_to_dict`'s form; unknown parts or keys are a ValueError naming them
    (with the closest name); missing keys keep their defaults."""
    if not isinstance(d, Mapping):
        raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
    parts = {f.name: f for f in fields(cls)}
    unknown = sorted(set(d) - set(parts), key=str)
    if unknown:
        raise ValueError(f"unknown config section {unknown[0]!r}{_did_you_mean(unknown[0], parts)} (the "
                         f"sections are {', '.join(parts)})")
    return cls(**{name: _part_from_dict(parts[name].default_factory, name, value)  # type: ignore[misc]
                  for name, value in d.items()})


def nested_replace(cfg: Any, changes: Mapping[str, Any]) -> Any:
    """A copy of ``cfg`` with dotted-path ``changes`` (``{"part.field": value}``)."""
    part_names = [f.name for f in fields(cfg)]
    by_part: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        part, _, name = path.partition(".")
        if not name or part not in part_names:
            example = f"{part_names[0]}.{fields(getattr(cfg, part_names[0]))[0].name}"
            raise ValueError(f"unknown config field {path!r}; use part.field, e.g. {example!r}")
        by_part.setdefault(part, {})[name] = value
    out = cfg
    for part, vals in by_part.items():
        cur = getattr(out, part)
        bad = sorted(set(vals) - {f.name for f in fields(cur)})
        if bad:
            raise ValueError(f"unknown config field(s) {[f'{part}.{b}' for b in bad]}")
        out = dataclasses.replace(out, **{part: dataclasses.replace(cur, **vals)})
    return out


# ----------------------------------------------------------------------------- helpers
def _part_from_dict(factory: Any, part: str, value: Any) -> Any:
    default = factory()
    if not isinstance(value, Mapping):
        raise ValueError(f"config part {part!r} must be an object, got {type(value).__name__}")
    names = [f.name for f in fields(default)]
    unknown = sorted(set(value) - set(names), key=str)
    if unknown:
        raise ValueError(f"unknown config key {f'{part}.{unknown[0]}'!r} in section {part!r}"
                         f"{_did_you_mean(unknown[0], names, prefix=part + '.')}")
    vals = dict(value)
    for f in fields(default):
        if f.name in vals and isinstance(getattr(default, f.name), tuple) and isinstance(vals[f.name], list):
            vals[f.name] = tuple(vals[f.name])  # JSON has lists only
    return replace(default, **vals)


def _did_you_mean(name: Any, choices: Sequence[str], prefix: str = "") -> str:
    """``"; did you mean 'pqn.lr'?"`` for the closest of ``choices`` (or ``""``)."""
    import difflib

    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else ""


#: Query-string names whose values :func:`redact_url` hides.
_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "auth", "sig", "credential")


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part and every query value that names a key, token,
    secret, password or signature replaced by ``REDACTED`` (what a file may keep of a server URL)."""
    import urllib.parse

    try:
        p = urllib.parse.urlsplit(url)
        netloc = p.netloc
        if "@" in netloc:
            netloc = "REDACTED@" + netloc.rpartition("@")[2]
        query = p.query
        if query:
            pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
            query = "&".join(f"{k}={'REDACTED' if any(w in k.lower() for w in _SECRET_WORDS) else v}"
                             for k, v in pairs)
        return urllib.parse.urlunsplit((p.scheme, netloc, p.path, query, p.fragment))
    except ValueError:  # not a URL at all: keep nothing that could be a secret
        return "REDACTED"


def _check_types(cfg: TrainConfig) -> None:
    """Every field holds its declared type; every number is finite (NaN and inf are refused)."""
    for part in fields(cfg):
        obj = getattr(cfg, part.name)
        if not is_dataclass(obj):
            raise ValueError(f"config part {part.name!r} is a {type(obj).__name__}, not a {part.type}")
        default = type(obj)()
        for f in fields(obj):
            v, d = getattr(obj, f.name), getattr(default, f.name)
            path = f"{part.name}.{f.name}"
            if f.name == "call_timeout":  # float | None
                if v is None:
                    continue
                d = 1.0
            if isinstance(d, bool):
                ok = isinstance(v, bool)
            elif isinstance(d, int):
                ok = isinstance(v, int) and not isinstance(v, bool)
            elif isinstance(d, float):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                if ok and not math.isfinite(v):
                    raise ValueError(f"{path}={v!r} must be a finite number")
            elif isinstance(d, tuple):
                ok = isinstance(v, tuple) and all(isinstance(x, str) for x in v)
            else:
                ok = isinstance(v, type(d))
            if not ok:
                raise ValueError(f"{path}={v!r} has type {type(v).__name__}; expected {type(d).__name__}")


def is_module_backend(backend: str) -> bool:
    """Whether an ``llm.backend`` value names code to import (``package.module:ClassName``) rather
    than one of the registered backends (:data:`LLM_BACKENDS`)."""
    return ":" in backend


def check_saved_backend(llm: LLMConfig, file: Any, *, on_command_line: bool) -> None:
    """Refuse an LLM backend that a run's file names as code, unless this command line names it.

    A resumed run takes ``llm.backend`` from its ``config.json``. A registered backend's name is
    data, but ``package.module:ClassName`` is code, imported when the LLM starts; and anyone who
    can write the run folder can change the file (a run folder under the working directory is
    even importable itself). So a module path is used only when the command line of this
    invocation passes ``--llm.backend`` (the value given there wins over the file).

    Args:
        llm: the LLM part read from ``file``.
        file: the file it was read from (named in the message).
        on_command_line: whether this invocation's command line passes ``--llm.backend``.

    Raises:
        ValueError: naming the file, the value and what to pass instead.
    """
    if on_command_line or not is_module_backend(llm.backend):
        return
    raise ValueError(f"{file}: llm.backend={llm.backend!r} is a Python module path, and a resumed run never imports "
                     "code named by its files; pass --llm.backend on the command line to choose the backend for "
                     f"this run: one of {', '.join(LLM_BACKENDS)}, or that module path if you trust the code it names")


def load_config(d: Mapping[str, Any]) -> TrainConfig:
    """A config from ``config.json``'s contents, nested or flat (old runs); provenance keys are ignored."""
    d = {k: v for k, v in d.items() if k not in ("provenance", "resumed")}
    parts = {f.name for f in fields(TrainConfig)}
    # a flat config (old runs) holds only values; a nested one names sections holding objects
    if d and (set(d) & parts or any(isinstance(v, Mapping) for v in d.values())):
        return TrainConfig.from_dict(d)
    return TrainConfig.from_flat_dict(d)


# ----------------------------------------------------------------------------- presets
def _cpu() -> TrainConfig:
    # Sized for a 2-core CPU: compile + train + evaluation in a few minutes, relabeling with rules.
    # The offline LLM is one flag away (--oir.relabeler both, named in the run's first line): on 2
    # cores its start-up check took 156 s and none of its answers arrived within oir.llm_lag
    # updates (0 batch rows, 0 buffer entries in 96 updates; issue 37), while it held a core.
    # Event-bound grounding, so that the LLM's own wordings can reach the batch when it is added.
    # The final evaluation at 4 episodes per instruction (about 40 s here, docs/benchmarks.md), not 16.
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
    # Time-to-score on one GPU (issue 15): purejaxql's own PQN-RNN batch for Craftax (1,024 envs x
    # 128 steps, 4 epochs) with the paper's agent and OIR settings (LSTM 512, buffer 10, delta 0.9,
    # K 4). The batch of OIR is 1,024 x (1 + K) = 5,120 trajectories: 16 minibatches of 320.
    # Tuned on H100s (docs/results.md): lr 5e-4 learned faster than 2.5e-4 and than 7e-4; 2 epochs
    # cost less per update but learned less per step; 64 updates (8.4M steps per seed) with an
    # evaluation every 8 (about 3 s each). The rule relabeling of 3,072 trajectories (about 0.5 s on
    # the host) runs beside the next rollout and update (oir.relabel_lag 1; its copies train one
    # update later). bfloat16 matmuls (forward and backward) and the written-out LSTM gradient cut
    # the update program from 2.25 s (float32, H100) to 0.93 s (H200) (bench/update_cost.py).
    return _paper().replace(**{
        "run.total_timesteps": 64 * 1024 * 128, "run.num_seeds": 3, "pqn.num_envs": 1024, "pqn.num_steps": 128,
        "pqn.num_epochs": 4, "pqn.num_minibatches": 16, "pqn.lr": 5e-4, "eval.every": 8,
        "run.checkpoint_every": 16, "oir.relabel_lag": 1, "pqn.compute_dtype": "bfloat16",
    })


def _smoke() -> TrainConfig:
    # The smallest run through every part of a method: 4 updates of 4 envs x 16 steps, relabeling
    # (rules), buffer, an evaluation and a checkpoint every 2 updates, the final evaluation.
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
             "env steps per seed (measured on one H200 each: 0.34-0.37 mean success with rule labels after about 3 min, "
             "compile and evaluations included; docs/benchmarks.md)",
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


# ----------------------------------------------------------------------------- CLI
def cli(options_type: type, args: Sequence[str] | None = None, *, base: Any = None,
        description: str | None = None, default_preset: str = DEFAULT_PRESET,
        presets: Mapping[str, tuple[str, Any]] | None = None, config_type: type | None = None) -> Any:
    """Parse a command line into ``options_type``, a dataclass with a ``config: TrainConfig`` field
    (its flags appear without a prefix: ``--pqn.lr``) beside the script's own options.

    Without ``base``, the first argument may name a preset (``cpu``, ``paper``, ``smoke``; default
    ``default_preset``); the flags after it override that preset's values, and ``--help`` there
    shows them. With ``base`` (a resumed run's saved config) the flags override ``base`` and no
    preset may be named. A flag of several values (``--eval.instruction-files a.json b.json``) may
    also be repeated: its values add up (:func:`merge_repeated_flags`). Booleans are flags (``--oir.keep-ungrounded`` /
    ``--oir.no-keep-ungrounded``), enums take only their choices, numbers only numbers: anything
    else is a usage error (exit status 2) before the script does anything. ``presets`` and
    ``config_type``: another trainer's named configurations and config class (default
    :data:`PRESETS`, :class:`TrainConfig`).
    """
    import sys

    import tyro

    presets = PRESETS if presets is None else presets
    argv = merge_repeated_flags(list(sys.argv[1:] if args is None else args), config_type or TrainConfig)
    description = plain_help(description) if description else description
    if base is not None:
        if argv and argv[0] in presets:
            print(f"error: a resumed run keeps its saved config; preset {argv[0]!r} cannot be applied to it "
                  "(override single fields instead, e.g. --eval.epsilon 0.05)", file=sys.stderr)
            raise SystemExit(2)
        with _plain_docstrings():
            return tyro.cli(options_type, default=options_type(config=base), args=argv, description=description)
    if argv and argv[0] in ("-h", "--help"):  # bare --help: the presets, the default one marked
        print(preset_help(sys.argv[0], description, presets, default_preset))
        raise SystemExit(0)
    named = bool(argv) and argv[0] in presets
    if not named:
        argv = [default_preset] + argv
    configs = {name: (desc, options_type(config=factory())) for name, (desc, factory) in presets.items()}
    try:
        with _plain_docstrings():
            return tyro.extras.overridable_config_cli(configs, args=argv, description=description)
    except SystemExit as e:
        late = [a for a in argv[1:] if a in presets]
        if e.code and not named and late:  # a preset named after a flag reads as an unknown option
            print(f"error: a preset ({late[0]}) must be the first argument, before every flag: "
                  f"{sys.argv[0]} {late[0]} {' '.join(a for a in argv[1:] if a != late[0])}", file=sys.stderr)
        raise


def plain_help(text: str) -> str:
    """``text`` without reStructuredText markup, for a terminal: ````x```` -> x, ``:class:`~a.B``` -> B,
    ``:mod:`a.b``` -> a.b (docstrings are written for the API reference, help lines are read as printed)."""
    import re

    def role(m: "re.Match[str]") -> str:
        target = m.group(1).strip()
        return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target

    text = re.sub(r":[a-z]+(?::[a-z]+)?:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def preset_help(prog: str, description: str | None, presets: Mapping[str, tuple[str, Any]],
                default_preset: str) -> str:
    """The bare ``--help`` of a training script: its description and the presets, the default marked."""
    import os
    import textwrap

    cols = max(60, min(120, int(os.environ.get("COLUMNS", "100") or 100)))
    width = max(len(n) for n in presets)
    lines = [f"usage: {prog} [PRESET] [OPTIONS...]", ""]
    if description:
        lines += [plain_help(description).strip("\n"), ""]
    lines.append(f"PRESET (the first argument; default: {default_preset}):")
    for name, (desc, _) in presets.items():
        text = f"{desc}{' (the default)' if name == default_preset else ''}"
        body = textwrap.wrap(text, width=cols - width - 4) or [""]
        lines.append(f"  {name:<{width}}  {body[0]}")
        lines += [f"  {'':<{width}}  {b}" for b in body[1:]]
    lines += ["", f"Every option, with a preset's values: {prog} PRESET --help (e.g. {prog} {default_preset} --help)"]
    return "\n".join(lines)


class _plain_docstrings:
    """While a command line is parsed, the help text tyro takes from docstrings without RST markup
    (:func:`plain_help`). Where tyro's internals differ from the ones known here, the help keeps it."""

    _NAMES = ("get_field_docstring", "get_callable_description")

    def __enter__(self) -> "_plain_docstrings":
        try:
            from tyro import _docstrings
        except ImportError:
            self._module, self._saved = None, {}
            return self
        self._module = _docstrings
        self._saved = {n: getattr(_docstrings, n) for n in self._NAMES if callable(getattr(_docstrings, n, None))}
        for name, fn in self._saved.items():
            setattr(_docstrings, name, self._plain(fn))
        return self

    @staticmethod
    def _plain(fn: Any) -> Any:
        def plain(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            return plain_help(out) if isinstance(out, str) else out

        return plain

    def __exit__(self, *exc: Any) -> None:
        for name, fn in self._saved.items():
            setattr(self._module, name, fn)


def _multi_value_flags(config_type: type) -> dict[str, str]:
    """Every spelling of the flags of tuple fields (``--eval.instruction-files``...) -> one spelling."""
    out: dict[str, str] = {}
    for part in fields(config_type):
        for f in fields(part.default_factory()):  # type: ignore[misc]
            if isinstance(getattr(part.default_factory(), f.name), tuple):  # type: ignore[misc]
                canonical = f"--{part.name}.{f.name.replace('_', '-')}"
                out[canonical] = out[f"--{part.name}.{f.name}"] = canonical
    return out


def merge_repeated_flags(argv: Sequence[str], config_type: type | None = None) -> list[str]:
    """``--eval.instruction-files a.json --eval.instruction-files b.json`` -> ``--eval.instruction-files
    a.json b.json``: a flag of several values keeps every value of every occurrence (the parser alone
    would keep the last occurrence's), in order, at its first occurrence. ``--flag=value`` counts as one
    value; a bare ``--eval.sets`` adds none (alone, it gives the empty tuple). ``config_type``: the
    config class whose tuple fields are meant (default :class:`TrainConfig`)."""
    multi = _multi_value_flags(config_type or TrainConfig)
    argv = list(argv)
    values: dict[str, list[str]] = {}
    out: list[Any] = []
    i = 0
    while i < len(argv):
        name, eq, val = argv[i].partition("=")
        flag = multi.get(name)
        if flag is None or argv[i] == "--":
            if argv[i] == "--":
                out.extend(argv[i:])
                break
            out.append(argv[i])
            i += 1
            continue
        if flag not in values:
            values[flag] = []
            out.append((flag,))  # where its values go
        i += 1
        if eq:
            values[flag].append(val)
            continue
        while i < len(argv) and not argv[i].startswith("-"):
            values[flag].append(argv[i])
            i += 1
    merged: list[str] = []
    for item in out:
        if isinstance(item, tuple):
            merged += [item[0], *values[item[0]]]
        else:
            merged.append(item)
    return merged
