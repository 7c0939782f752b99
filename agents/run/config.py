"""The config parts, base class and CLI both trainers share. :func:`cli`: the preset comes first, then
overrides of its values, and ``--help`` after a preset shows that preset's values::

    python examples/train_pqn.py paper --pqn.num-envs 64 --run.num-seeds 3 --help
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Annotated, Any, Iterator, Literal, Mapping, Sequence, get_args

import tyro

Relabeler = Literal["rules", "llm", "both"]
Grounding = Literal["cosine", "bound"]
Oracle = Literal["canonical", "diverse", "tasks", "compound", "noisy", "mixed", "progress"]
#: oir_gym.relabel.backends.BACKEND_NAMES less "rules" (written out: no oir_gym import; tests/test_config.py checks)
LLMBackend = Literal["transformers", "llama_cpp", "openai", "vllm"]
ObsMode = Literal["paper", "symbolic"]

RELABELERS: tuple[str, ...] = get_args(Relabeler)
ORACLES: tuple[str, ...] = get_args(Oracle)
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

#: ``eval.episodes`` above this is refused (one evaluation batch holds every episode of every instruction).
MAX_EVAL_EPISODES = 32


@dataclass
class RelabelSettings:
    """Hindsight instruction relabeling and the instruction buffer (method ``oir``; shared by both trainers)."""

    relabeler: Relabeler = "rules"
    """rules: rule instructions from the events; llm: the LLM backend (llm.*); both: the rules', then the LLM's"""
    k: int = 4
    """Relabeled instructions per trajectory (SB3: per segment of ``sb3.segment_length`` steps)."""
    instruction_buffer_size: int = 10
    """B_max: instructions new episodes draw from (the PLR-style buffer; not a replay buffer)."""
    tau_low: float = 0.1
    """Buffer priority: an instruction whose mean return is at or below it counts as failing."""
    tau_high: float = 0.9
    """Buffer priority: an instruction whose mean return is above it counts as mastered (ranked last)."""
    grounding: Grounding = "cosine"
    """cosine: pays where a caption matches above env.delta (the paper); bound: at the relabeled event(s)"""
    bind_threshold: float = 0.5
    """grounding=bound: loosest cosine between an instruction and an event of its trajectory that binds it."""
    oracle: Oracle = "canonical"
    """The rule relabeler's labels (docs/relabeling.md, "Oracle relabelers"); diverse/noisy/mixed need bound"""

    def validate(self, method: str) -> None:
        """ValueError naming the ``oir.*`` field at the first bad one (``method``: the run's ``run.method``)."""
        need(self.relabeler in RELABELERS, f"oir.relabeler={self.relabeler!r}; expected one of {RELABELERS}")
        need(self.grounding in get_args(Grounding),
             f"oir.grounding={self.grounding!r}; expected one of {get_args(Grounding)}")
        need(-1 <= self.bind_threshold <= 1, f"oir.bind_threshold={self.bind_threshold} must be a cosine in [-1, 1]")
        need(0 <= self.tau_low < self.tau_high <= 1,
             f"need 0 <= oir.tau_low ({self.tau_low}) < oir.tau_high ({self.tau_high}) <= 1")
        need(self.oracle in ORACLES, f"oir.oracle={self.oracle!r}; expected one of {ORACLES}")
        from oir_gym.relabel.oracle import check_oracle

        try:
            check_oracle(self.oracle, self.grounding)
        except ValueError as err:
            raise ValueError(f"oir.oracle={self.oracle!r}: {err}") from None
        need(self.oracle == "canonical" or method == "oir" and self.relabeler != "llm",
             f"oir.oracle={self.oracle!r} picks the rule relabeler's labels: it needs run.method oir and "
             "oir.relabeler rules or both")


@dataclass
class EnvSettings:
    """The instruction-conditioned Craftax-Classic env."""

    obs_mode: ObsMode = "paper"
    """paper: the paper's observation; symbolic: Craftax's symbolic one."""
    delta: float = 0.9
    """Cosine threshold of the reward: an instruction pays when a caption of the step's events exceeds it."""
    max_episode_steps: int = 10_000
    """Steps before an episode is truncated."""


@dataclass
class LLMConfig:
    """The LLM backend, shared by the OIR relabeler, the ELLM proposer and the SB3 trainer."""

    backend: LLMBackendArg = "transformers"
    """transformers, llama_cpp, vllm (a local model), openai (base_url) or package.module:ClassName"""
    base_url: str = "http://127.0.0.1:8000/v1"
    """The OpenAI-compatible server (backend openai); the API key goes in OPENAI_API_KEY, not the URL"""
    model: str = ""
    """Model path or name (empty: the backend's packaged default)."""
    template: str = "segments"
    """Relabeling prompt template."""
    per_update: int = 2
    """Trajectories (oir) or envs (ellm) per seed sent to the LLM each update, most eventful first (PQN only)."""
    call_timeout: float | None = None
    """Seconds one relabeling LLM call may take (None: the backend's own limit)."""
    max_prompt_tokens: int = 768
    """Token budget of one relabeling prompt: longer trajectories are compacted to fit (0: never compact)."""

    def validate(self) -> "LLMConfig":
        """Raise ``ValueError`` naming the field for a setting the LLM part cannot use; returns self."""
        need(isinstance(self.backend, str) and (self.backend in LLM_BACKENDS or is_module_path(self.backend)),
             f"llm.backend={self.backend!r}; expected one of {LLM_BACKENDS} or package.module:ClassName")
        need(isinstance(self.per_update, int) and self.per_update >= 1,
             f"llm.per_update={self.per_update!r} must be >= 1")
        need(isinstance(self.max_prompt_tokens, int) and self.max_prompt_tokens >= 0,
             f"llm.max_prompt_tokens={self.max_prompt_tokens!r} must be a number of tokens >= 1, or 0 (never compact)")
        need(self.call_timeout is None or self.call_timeout > 0,
             f"llm.call_timeout={self.call_timeout} must be > 0 (or None)")
        need(self.base_url.startswith(("http://", "https://")),
             f"llm.base_url={redact_url(self.base_url)!r} must be an http(s) URL")
        from oir_gym.relabel.prompts import load_template

        try:  # a template that does not exist or does not parse stops the run now, whichever relabeler it uses
            load_template(self.template)
        except (ValueError, OSError) as e:
            raise ValueError(f"llm.template={self.template!r}: {e}") from None
        return self


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
    """JSON files of named instruction sets evaluated beside the built-in ones (schema: docs/evaluation.md)."""
    sets: tuple[str, ...] = ("original", "simple", "complex")
    """Built-in sets to evaluate (original, simple, complex); with no name only the files' sets."""
    control: bool = True
    """Also evaluate each achievement under a mismatched and a neutral instruction (instruction-following gain)."""
    final_episodes: int = 16
    """Episodes per instruction of the final evaluation (the end of a run, and --eval-only; at most 32)."""
    final_sets: tuple[str, ...] = ("heldout", "ordered", "ordered_reverse")
    """Packaged sets the final evaluation adds: held-out paraphrases, ordered compounds and their reverse."""

    def eval_config(self, final: bool = False) -> Any:
        """The :class:`oir_gym.evaluation.EvalConfig` of a periodic evaluation (``final``: of the final one)."""
        from oir_gym.evaluation import eval_config

        return eval_config(self.instruction_files, sets=(*self.sets, *(self.final_sets if final else ())),
                           episodes=self.final_episodes if final else self.episodes, horizon=self.horizon,
                           control=self.control)

    def check_sets(self) -> None:
        """ValueError naming the set or file unless every set named exists, none twice, and something is evaluated."""
        from oir_gym.instructions import EXTRA_SET_NAMES, SET_NAMES, load_instruction_files

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


def need(cond: bool, msg: str) -> None:
    """Raise ``ValueError(msg)`` unless ``cond`` (a config check)."""
    if not cond:
        raise ValueError(msg)


class NestedConfig:
    """Base of a trainer's config: a dataclass of part dataclasses, kept as a nested dict in ``config.json``."""

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (what ``config.json`` and checkpoints hold), ``llm.base_url`` redacted."""
        d = asdict(self)  # type: ignore[call-overload]
        d["llm"]["base_url"] = redact_url(d["llm"]["base_url"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Any:
        """From :meth:`to_dict`'s form; unknown parts or keys are a ValueError naming them (with the closest
        name); missing keys keep their defaults."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a config must be a JSON object, got {type(d).__name__}")
        parts = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - set(parts), key=str)
        if unknown:
            raise ValueError(f"unknown config section {unknown[0]!r}{did_you_mean(unknown[0], parts)} (the "
                             f"sections are {', '.join(parts)})")
        return cls(**{name: _part_from_dict(parts[name].default_factory, name, value)  # type: ignore[misc]
                      for name, value in d.items()})

    def replace(self, **changes: Any) -> Any:
        """A copy with dotted-path changes, e.g. ``cfg.replace(**{"pqn.lr": 1e-3, "run.method": "gt"})``."""
        part_names = [f.name for f in fields(self)]  # type: ignore[arg-type]
        by_part: dict[str, dict[str, Any]] = {}
        for path, value in changes.items():
            part, _, name = path.partition(".")
            if not name or part not in part_names:
                example = f"{part_names[0]}.{fields(getattr(self, part_names[0]))[0].name}"
                raise ValueError(f"unknown config field {path!r}; use part.field, e.g. {example!r}")
            by_part.setdefault(part, {})[name] = value
        out = self
        for part, vals in by_part.items():
            cur = getattr(out, part)
            bad = sorted(set(vals) - {f.name for f in fields(cur)})
            if bad:
                raise ValueError(f"unknown config field(s) {[f'{part}.{b}' for b in bad]}")
            out = dataclasses.replace(out, **{part: dataclasses.replace(cur, **vals)})  # type: ignore[type-var]
        return out

    def check_types(self) -> None:
        """ValueError naming the field unless every field holds its declared type and every number is finite."""
        for part in fields(self):  # type: ignore[arg-type]
            obj = getattr(self, part.name)
            need(dataclasses.is_dataclass(obj),
                 f"config part {part.name!r} is a {type(obj).__name__}, not a {part.type}")
            default = type(obj)()
            for f in fields(obj):
                v, d = getattr(obj, f.name), getattr(default, f.name)
                if d is None:  # an Optional field (e.g. llm.call_timeout): its part's validate() checks it
                    continue
                if isinstance(d, float) and isinstance(v, float) and not math.isfinite(v):
                    raise ValueError(f"{part.name}.{f.name}={v!r} must be a finite number")
                if isinstance(d, bool):
                    ok = isinstance(v, bool)
                elif isinstance(d, tuple):
                    ok = isinstance(v, tuple) and all(isinstance(x, str) for x in v)
                else:  # a float field takes an int too; no other field takes a bool
                    ok = not isinstance(v, bool) and isinstance(v, (int, float) if isinstance(d, float) else type(d))
                need(ok, f"{part.name}.{f.name}={v!r} has type {type(v).__name__}; expected {type(d).__name__}")

    def check_parts(self, choices: Sequence[tuple[str, str, Sequence[Any]]],
                    counts: Sequence[tuple[str, Sequence[str]]]) -> None:
        """The checks both trainers share (ValueError naming the field): :meth:`check_types`, each ``(part, name,
        allowed)`` of ``choices`` and each ``(part, names)`` of ``counts`` (integers >= 1), the shared parts' own."""
        self.check_types()
        for part, name, allowed in (("env", "obs_mode", get_args(ObsMode)), *choices):
            v = getattr(getattr(self, part), name)
            need(v in allowed, f"{part}.{name}={v!r}; expected one of {tuple(allowed)}")
        for part, names in (("env", ("max_episode_steps",)), ("oir", ("k", "instruction_buffer_size")),
                            ("eval", ("every", "episodes", "horizon")), *counts):
            for name in names:
                v = getattr(getattr(self, part), name)
                need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, f"{part}.{name}={v!r} must be >= 1")
        delta = self.env.delta  # type: ignore[attr-defined]
        need(-1 < delta <= 1, f"env.delta={delta} is outside (-1, 1]")
        self.oir.validate(self.run.method)  # type: ignore[attr-defined]
        self.llm.validate()  # type: ignore[attr-defined]
        self.eval.check_sets()  # type: ignore[attr-defined]


def _part_from_dict(factory: Any, part: str, value: Any) -> Any:
    default = factory()
    if not isinstance(value, Mapping):
        raise ValueError(f"config part {part!r} must be an object, got {type(value).__name__}")
    names = [f.name for f in fields(default)]
    unknown = sorted(set(value) - set(names), key=str)
    if unknown:
        raise ValueError(f"unknown config key {f'{part}.{unknown[0]}'!r} in section {part!r}"
                         f"{did_you_mean(unknown[0], names, prefix=part + '.')}")
    # JSON has lists only: a tuple field's list becomes a tuple
    return replace(default, **{k: tuple(v) if isinstance(v, list) and isinstance(getattr(default, k), tuple) else v
                               for k, v in value.items()})


def did_you_mean(name: Any, choices: Sequence[str], prefix: str = "") -> str:
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


def check_saved_backend(llm: LLMConfig, file: Any, *, on_command_line: bool) -> None:
    """ValueError naming ``file`` when its ``llm.backend`` is a module path (code, which anyone who can write the
    run folder may have changed) and this command line does not pass ``--llm.backend`` (``on_command_line``)."""
    if on_command_line or ":" not in llm.backend:
        return
    raise ValueError(f"{file}: llm.backend={llm.backend!r} is a Python module path, and a resumed run never imports "
                     "code named by its files; pass --llm.backend on the command line to choose the backend for "
                     f"this run: one of {', '.join(LLM_BACKENDS)}, or that module path if you trust the code it names")


def cli(options_type: type, args: Sequence[str] | None = None, *, base: Any = None,
        description: str | None = None, default_preset: str, presets: Mapping[str, tuple[str, Any]],
        config_type: type) -> Any:
    """Parse a command line into ``options_type`` (whose ``config`` field, of ``config_type``, takes flags such as
    ``--pqn.lr``; a bad value: exit status 2). The flags override ``base`` (a resumed run's config; no preset
    then) or the preset named first (default ``default_preset``)."""
    import sys

    argv = merge_repeated_flags(list(sys.argv[1:] if args is None else args), config_type)
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


def plain_help(text: Any) -> Any:
    """``text`` without reStructuredText markup, for a terminal: ````x```` -> x, ``:class:`~a.B``` -> B (not a str:
    as it is)."""
    import re

    if not isinstance(text, str):
        return text

    def role(m: "re.Match[str]") -> str:
        target = m.group(1).strip()
        return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target

    text = re.sub(r":[a-z]+(?::[a-z]+)?:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"\1", text)


def preset_help(prog: str, description: str | None, presets: Mapping[str, tuple[str, Any]],
                default_preset: str) -> str:
    """The bare ``--help`` of a training script: its description and the presets, the default marked."""
    width = max(len(n) for n in presets)
    lines = [f"usage: {prog} [PRESET] [OPTIONS...]", ""]
    if description:
        lines += [plain_help(description).strip("\n"), ""]
    lines.append(f"PRESET (the first argument; default: {default_preset}):")
    lines += [f"  {name:<{width}}  {desc}{' (the default)' if name == default_preset else ''}"
              for name, (desc, _) in presets.items()]
    lines += ["", f"Every option, with a preset's values: {prog} PRESET --help (e.g. {prog} {default_preset} --help)"]
    return "\n".join(lines)


@contextlib.contextmanager
def _plain_docstrings() -> Iterator[None]:
    """While a command line is parsed, tyro's help text from docstrings without RST markup (:func:`plain_help`)."""
    from tyro import _docstrings

    saved = {n: getattr(_docstrings, n) for n in ("get_field_docstring", "get_callable_description")
             if callable(getattr(_docstrings, n, None))}  # tyro's internals differ: the help keeps the markup
    for name, fn in saved.items():
        setattr(_docstrings, name, functools.partial(lambda f, *a, **kw: plain_help(f(*a, **kw)), fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(_docstrings, name, fn)


def merge_repeated_flags(argv: Sequence[str], config_type: type) -> list[str]:
    """``--eval.sets a --eval.sets b`` -> ``--eval.sets a b``: every value of every occurrence of a tuple field's
    flag (of ``config_type``), in order, at its first occurrence (``--flag=value`` is one value)."""
    multi: dict[str, str] = {}  # every spelling of a tuple field's flag -> one spelling
    for part in fields(config_type):
        default = part.default_factory()  # type: ignore[misc]
        for f in fields(default):
            if isinstance(getattr(default, f.name), tuple):
                multi[f"--{part.name}.{f.name}"] = multi[f"--{part.name}.{f.name.replace('_', '-')}"] = (
                    f"--{part.name}.{f.name.replace('_', '-')}")
    values: dict[str, list[str]] = {}
    out: list[Any] = []  # every occurrence's values gather at the first
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            out.extend(argv[i:])
            break
        name, eq, val = argv[i].partition("=")
        flag = multi.get(name)
        i += 1
        if flag is None:
            out.append(argv[i - 1])
            continue
        if flag not in values:
            out.append(values.setdefault(flag, [flag]))
        if eq:
            values[flag].append(val)
            continue
        while i < len(argv) and not argv[i].startswith("-"):
            values[flag].append(argv[i])
            i += 1
    return [a for item in out for a in (item if isinstance(item, list) else [item])]
