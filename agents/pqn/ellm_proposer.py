"""ELLM-style forward goal proposal (Du et al. 2023): goals suggested from the CURRENT observation.

The proposer of method ``ellm`` (:mod:`agents.pqn.ellm`).

Where OIR's relabeler (:mod:`oir_gym.relabel`) looks back at a finished trajectory and names what
the agent did, ELLM looks at the state the agent is in and suggests what it could do next; the
agent is then asked to do one of those goals and is rewarded when a transition's caption matches
it, or by default any of the goals proposed for it (the env's usual cosine reward; see
``PQNConfig.ellm_reward``).

:class:`GoalProposer` takes a batch of observations (:class:`oir_gym.text.Observation`, read
from the env's state arrays by :func:`oir_gym.text.batch_observations`; a text observation is
read back with :func:`oir_gym.text.parse_observation`) and returns up to ``k`` goals for each::

    proposer = GoalProposer("rules", k=4)
    goals = proposer.propose(batch_observations(env_state.craftax))
    proposer.propose(["Facing: tree; Nearby: [1] tree [2] water; Inventory: empty; Status: ..."])
    # [["collect wood", "drink water"]]

Backends:

* ``"rules"``: no LLM, deterministic: :func:`rule_goals` reads the observation's values and suggests
  achievable next steps (facing a tree -> ``"collect wood"``, wood in the inventory and no table
  nearby -> ``"place table"``, ...), worded as the 22 Craftax achievements (:data:`GOALS`).
* ``"transformers"`` or ``"llama_cpp"`` (offline Gemma 3 270M), ``"openai"`` (any OpenAI-compatible server),
  ``"vllm"``, or any object with the relabeler's backend protocol
  ``generate(prompts, n, *, schema) -> list[list[str]]``: the few-shot prompt of
  ``oir_gym/data/prompts/ellm.txt``, JSON-constrained with the relabeler's answer schema
  (:func:`oir_gym.relabel.prompts.output_schema`; the goals are its ``"Mid-Level"`` list), parsed
  and filtered with :mod:`oir_gym.relabel.parse` / :mod:`oir_gym.relabel.filters`.

Batching and caching: observations are reduced to a signature (``"coarse"``: facing, nearby
names and distances, inventory counts capped at 2, vitals bucketed to ``low``/``ok``, sleeping:
every input the rules read; ``"text"``: the exact text); each distinct signature is looked up once in an LRU
cache, and the misses go to the LLM in ONE batched ``generate`` call.

Failure policy (an LLM backend): nothing is ever raised into the caller. When the LLM raises,
answers nothing usable, or does not answer within ``timeout`` seconds, those observations get
the rule goals (counted as ``fallbacks``). A timed-out call keeps running on the worker thread
and its answers still land in the cache (so a slow LLM is used asynchronously, through the
cache); while it runs, new misses are answered by the rules (``llm_busy``). At most
``max_prompts`` signatures go to the LLM per call (the most frequent first); the others get rules.
Native backends run in a child process (:mod:`oir_gym.relabel.llm.child`: a crash or hang of the LLM
library ends only the child, which restarts with backoff); after ``warn_after`` failed calls in a
row (errors, deadlines, nothing usable) one console warning names the cause and the remedy.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import Counter
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from oir_gym.relabel.backends import BACKEND_NAMES
from agents.run.config import LLMConfig
from agents.run.llm import backend_kwargs, check_llm
from oir_gym.relabel.cache import LRUCache
from oir_gym.relabel.filters import CandidateFilter
from oir_gym.relabel.parse import NOTE_REASONS, parse_candidates
from oir_gym.relabel.prompts import output_schema
from oir_gym.text import Observation, parse_observation
from oir_gym.relabel.llm.spec import BackendSpec, LLMBusy, close_llm
from oir_gym.relabel.llm.child import ChildConfig, ChildProcessBackend, llm_process_stats
from oir_gym.relabel.llm.health import LLMHealth
from oir_gym.relabel.llm.caller import OffThreadCaller
from oir_gym.relabel.llm.build import build_llm, probe

#: The rule proposer's wording of each goal (one per Craftax achievement; natural variants of the
#: 22 original instructions that the caption vocabulary grounds at cosine 1.0).
GOALS: dict[str, str] = {
    "collect_wood": "collect wood",
    "place_table": "place table",
    "eat_cow": "eat cow",
    "collect_sapling": "collect sapling",
    "collect_drink": "drink water",
    "make_wood_pickaxe": "make wood pickaxe",
    "make_wood_sword": "make wood sword",
    "place_plant": "place plant",
    "defeat_zombie": "defeat zombie",
    "collect_stone": "collect stone",
    "place_stone": "place stone",
    "eat_plant": "eat plant",
    "defeat_skeleton": "defeat skeleton",
    "make_stone_pickaxe": "make stone pickaxe",
    "make_stone_sword": "make stone sword",
    "wake_up": "wake up",
    "place_furnace": "place furnace",
    "collect_coal": "collect coal",
    "collect_iron": "collect iron",
    "collect_diamond": "collect diamond",
    "make_iron_pickaxe": "make iron pickaxe",
    "make_iron_sword": "make iron sword",
}
#: Goals when nothing in the observation suggests anything (grass is almost always at hand).
FALLBACK_GOALS: tuple[str, ...] = ("collect wood", "collect sapling")
#: Energy at or below which the rules suggest sleeping (the goal is the achievement "wake up").
LOW_ENERGY = 3
#: Vitals at or below this are "low" in the coarse cache signature.
LOW_VITAL = 3

#: What facing or seeing a thing suggests: name -> (achievement, the tool it needs or ``None``).
TARGETS: dict[str, tuple[str, Optional[str]]] = {
    "tree": ("collect_wood", None), "water": ("collect_drink", None), "cow": ("eat_cow", None),
    "zombie": ("defeat_zombie", None), "skeleton": ("defeat_skeleton", None),
    "ripe plant": ("eat_plant", None), "stone": ("collect_stone", "wood pickaxe"),
    "coal": ("collect_coal", "wood pickaxe"), "iron": ("collect_iron", "stone pickaxe"),
    "diamond": ("collect_diamond", "iron pickaxe"),
}

BACKENDS = BACKEND_NAMES
SIGNATURES = ("coarse", "text")
DEFAULT_PROMPT = "ellm"


# --------------------------------------------------------------------------------------------- rules
def rule_goals(obs: Union[Observation, str], k: Optional[int] = None) -> list[str]:
    """Achievable next goals for one observation, most immediate first (deterministic, no LLM).

    Order: (1) asleep -> only ``"wake up"``; (2) what the agent faces (tree -> collect wood,
    water -> drink water, grass -> collect sapling, cow -> eat cow, zombie/skeleton -> defeat it,
    ripe plant -> eat plant, stone/coal with a wood pickaxe, iron with a stone pickaxe, diamond
    with an iron pickaxe -> collect it); (3) a zombie or skeleton nearby -> defeat it;
    (4) crafting when a crafting table is nearby (wood -> wood pickaxe/sword; wood and stone ->
    stone pickaxe/sword; furnace too and wood, stone, coal, iron -> iron pickaxe/sword; each only
    when the tool is not yet owned); (5) placing (wood and no table nearby -> place table; stone
    with a table but no furnace nearby -> place furnace; sapling -> place plant; stone -> place
    stone); (6) resources nearby (same conditions as facing); (7) energy <= 3 -> ``"wake up"``
    (sleep); (8) nothing -> :data:`FALLBACK_GOALS`. Duplicates are dropped; at most ``k``.
    """
    o = obs if isinstance(obs, Observation) else parse_observation(obs)
    G = GOALS
    out: list[str] = []
    if o.sleeping:
        return [G["wake_up"]]

    def collectable(name: str) -> Optional[str]:
        achievement, tool = TARGETS.get(name, ("", None))
        return G[achievement] if achievement and (tool is None or o.has(tool)) else None

    # (2) facing
    if o.facing == "grass":
        out.append(G["collect_sapling"])
    elif o.facing:
        g = collectable(o.facing)
        if g:
            out.append(g)
    # (3) threats
    for mob in ("zombie", "skeleton"):
        if mob in o.nearby:
            out.append(G[f"defeat_{mob}"])
    # (4) crafting
    table = "crafting table" in o.nearby or o.facing == "crafting table"
    furnace = "furnace" in o.nearby or o.facing == "furnace"
    if table and o.has("wood"):
        for tool in ("pickaxe", "sword"):
            if not o.has(f"wood {tool}"):
                out.append(G[f"make_wood_{tool}"])
        if o.has("stone"):
            for tool in ("pickaxe", "sword"):
                if not o.has(f"stone {tool}"):
                    out.append(G[f"make_stone_{tool}"])
        if furnace and o.has("stone") and o.has("coal") and o.has("iron"):
            for tool in ("pickaxe", "sword"):
                if not o.has(f"iron {tool}"):
                    out.append(G[f"make_iron_{tool}"])
    # (5) placing
    if o.has("wood") and not table:
        out.append(G["place_table"])
    if o.has("stone") and table and not furnace:
        out.append(G["place_furnace"])
    if o.has("sapling"):
        out.append(G["place_plant"])
    if o.has("stone"):
        out.append(G["place_stone"])
    # (6) resources nearby, nearest first (name order within a distance)
    for name, _ in sorted(o.nearby.items(), key=lambda kv: (kv[1], kv[0])):
        g = collectable(name)
        if g:
            out.append(g)
    # (7) tired
    if o.status.get("energy", 9) <= LOW_ENERGY:
        out.append(G["wake_up"])
    out = list(dict.fromkeys(out)) or list(FALLBACK_GOALS)
    return out[:k] if k else out


# --------------------------------------------------------------------------------------------- signature
def signature(obs: Union[Observation, str], mode: str = "coarse") -> str:
    """Cache key of an observation: ``"text"`` (the exact text) or ``"coarse"`` (facing, nearby
    names with their distances, inventory counts capped at ``2+``, vitals as ``low``/``ok``,
    sleeping: everything :func:`rule_goals` reads)."""
    o = obs if isinstance(obs, Observation) else parse_observation(obs)
    if mode == "text":
        return o.text
    inv = ",".join(f"{k} {'2+' if v >= 2 else v}" for k, v in sorted(o.inventory.items()))
    near = ",".join(f"{k} {v}" for k, v in sorted(o.nearby.items()))
    vit = ",".join(f"{k} {'low' if v <= LOW_VITAL else 'ok'}" for k, v in sorted(o.status.items()))
    return f"{o.facing}|{near}|{inv}|{vit}|{int(o.sleeping)}"


# --------------------------------------------------------------------------------------------- prompt
def load_prompt(name_or_path: str = DEFAULT_PROMPT) -> str:
    """The few-shot prompt template (``#|`` comment lines removed): packaged ``"ellm"`` or a file."""
    if name_or_path == DEFAULT_PROMPT:
        raw = resources.files("oir_gym.data").joinpath("prompts", "ellm.txt").read_text()
    else:
        p = Path(name_or_path)
        if not p.is_file():
            raise ValueError(f"unknown ELLM prompt {name_or_path!r}: use 'ellm' or a path to a .txt file")
        raw = p.read_text()
    body = "\n".join(line for line in raw.splitlines() if not line.startswith("#|")).strip("\n")
    if "{{observation}}" not in body:
        raise ValueError(f"ELLM prompt {name_or_path!r} has no {{{{observation}}}} placeholder")
    return body


# --------------------------------------------------------------------------------------------- proposer
class GoalProposer:
    """ELLM goal proposer: observations in, up to ``k`` goals per observation out.

    Args:
        backend: ``"rules"``, ``"transformers"``, ``"llama_cpp"``, ``"openai"``, ``"vllm"``, ``"package.module:ClassName"``,
            a :class:`~oir_gym.relabel.llm.spec.BackendSpec`, or an object with
            ``generate(prompts, n=1, *, schema=None) -> list[list[str]]`` (used as is, in this process).
        k: goals per observation.
        cache_size: LRU entries (0 disables the cache).
        signature: cache key mode, ``"coarse"`` (default) or ``"text"`` (see :func:`signature`).
        timeout: seconds to wait for one batched LLM call (``None``: wait); on timeout the rules
            answer and the late answers still fill the cache.
        max_prompts: most signatures sent to the LLM per :meth:`propose` (``None``: all misses).
        prompt: ``"ellm"`` (packaged) or a path to a template with ``{{observation}}``/``{{k}}``.
        candidate_filter: text filter of LLM goals (default :class:`CandidateFilter()`).
        backend_kwargs: passed to :func:`oir_gym.relabel.make_backend` when ``backend`` is a name.
        isolate: run a named backend in a child process (default: all but ``openai``; ``False``:
            in this process, for debugging).
        child_config: the child's deadlines and restart backoff.
        warn_after: failed LLM calls in a row before the one console warning of an outage.
    """

    def __init__(
        self,
        backend: Any = "rules",
        k: int = 4,
        cache_size: int = 4096,
        *,
        signature: str = "coarse",
        timeout: Optional[float] = None,
        max_prompts: Optional[int] = None,
        prompt: str = DEFAULT_PROMPT,
        candidate_filter: Optional[CandidateFilter] = None,
        backend_kwargs: Optional[dict] = None,
        isolate: Optional[bool] = None,
        child_config: Optional[ChildConfig] = None,
        warn_after: int = 3,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if signature not in SIGNATURES:
            raise ValueError(f"signature must be one of {SIGNATURES}, got {signature!r}")
        if isinstance(backend, str) and backend not in BACKENDS and ":" not in backend:
            raise ValueError(f"unknown proposer backend {backend!r}: use one of {BACKENDS}, "
                             "'package.module:ClassName' or a backend object")
        self.k = int(k)
        self.signature_mode = signature
        self.timeout = timeout
        self.max_prompts = max_prompts
        self.filter = candidate_filter or CandidateFilter()
        self.cache = LRUCache(cache_size)
        self.backend_name = (backend if isinstance(backend, str) else backend.name if isinstance(backend, BackendSpec)
                             else type(backend).__name__)
        self.llm = build_llm(backend, backend_kwargs, isolate=isolate, config=child_config)
        self.health = LLMHealth("ELLM proposer", warn_after, fallback="proposing rule goals meanwhile")
        self.template = load_prompt(prompt) if self.llm is not None else ""
        self.schema = output_schema(self.k)
        self._caller = OffThreadCaller("oir-ellm")
        self._lock = threading.Lock()
        self._s: Counter = Counter()
        self._dropped: Counter = Counter()
        self._errors: Counter = Counter()
        self._latency = 0.0
        self._warned = False
        self.last_error: Optional[str] = None

    def __repr__(self) -> str:
        return f"GoalProposer(backend={self.backend_name!r}, k={self.k}, signature={self.signature_mode!r})"

    # ------------------------------------------------------------------ helpers
    def render_prompt(self, obs: Union[Observation, str]) -> str:
        """The LLM prompt for one observation (its text)."""
        text = obs.text if isinstance(obs, Observation) else obs
        return self.template.replace("{{k}}", str(self.k)).replace("{{observation}}", text)

    def signature(self, obs: Union[Observation, str]) -> str:
        return signature(obs, self.signature_mode)

    @property
    def _inflight(self) -> Optional[Future]:
        """The future of the last LLM call (its answers fill the cache even when late)."""
        return self._caller.inflight

    def check_llm(self, timeout: float = 900.0) -> Optional[str]:
        """One tiny real LLM call before use (``None`` for the rule proposer); raises
        :class:`~oir_gym.relabel.llm.spec.LLMCheckError` with the cause and the remedy."""
        return None if self.llm is None else probe(self.llm, timeout)

    def _llm_call(self, keys: list[str], prompts: list[str]) -> dict[str, list[str]]:
        """One batched LLM call; parses, filters and caches every answer (also when it is late).
        Reports the outcome to :attr:`health` (here, so that a late answer counts too)."""
        t0 = time.perf_counter()
        try:
            raw = self.llm.generate(prompts, 1, schema=self.schema)
            if not isinstance(raw, (list, tuple)) or len(raw) != len(prompts):
                raise RuntimeError(f"backend returned {len(raw) if hasattr(raw, '__len__') else raw!r} "
                                   f"results for {len(prompts)} prompts")
        except Exception as e:
            self.health.failed(f"{type(e).__name__}: {e}", permanent=getattr(self.llm, "fatal", None) is not None)
            raise
        out: dict[str, list[str]] = {}
        dropped: Counter = Counter()
        for key, samples in zip(keys, raw):
            goals: list[str] = []
            for r in (samples if isinstance(samples, (list, tuple)) else [samples]):
                c, reasons = parse_candidates(r, self.filter)
                goals += c
                dropped += Counter({k: v for k, v in reasons.items() if k not in NOTE_REASONS})
            goals = list(dict.fromkeys(goals))[: self.k]
            out[key] = goals
            self.cache.put(key, goals)
        usable = any(out.values())
        with self._lock:
            self._latency += time.perf_counter() - t0
            self._s["llm_completed"] += 1
            self._s["llm_answers"] += len(out)
            self._s["llm_goals"] += sum(len(g) for g in out.values())
            self._dropped.update(dropped)
            if not usable:  # an answer with nothing usable is a failed call
                self._s["llm_unusable"] += 1
                self._errors["UnusableAnswer"] += 1
        if usable:
            self.health.ok()
        else:
            why = ", ".join(f"{k} {v}" for k, v in dropped.most_common(3)) or "empty"
            self.health.failed(f"UnusableAnswer: nothing usable in the LLM's answers ({why})")
        return out

    def _ask_llm(self, keys: list[str], prompts: list[str]) -> tuple[Optional[dict[str, list[str]]], str]:
        """``(answers or None, outcome)`` with outcome ``ok``/``timeout``/``error``/``busy``."""
        try:
            fut = self._caller.submit(self._llm_call, keys, prompts)
        except LLMBusy:
            return None, "busy"
        with self._lock:
            self._s["llm_calls"] += 1
            self._s["llm_prompts"] += len(prompts)
        try:
            return fut.result(timeout=self.timeout), "ok"
        except FutureTimeout:
            return None, "timeout"
        except Exception as e:  # noqa: BLE001 - recorded; the rules answer instead
            with self._lock:
                self._errors[type(e).__name__] += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return None, "error"

    # ------------------------------------------------------------------ API
    def propose(self, observations: Sequence[Union[Observation, str]]) -> list[list[str]]:
        """Up to ``k`` goals for each observation (never raises; never an empty list).

        Args:
            observations: :class:`~oir_gym.text.Observation` values (e.g.
                :func:`oir_gym.text.batch_observations` of the envs' states: the rules read their
                values, the LLM gets their text), or text observations, which are read back with
                :func:`oir_gym.text.parse_observation`.
        """
        obs = [o if isinstance(o, Observation) else parse_observation(o) for o in observations]
        try:
            return self._propose(obs)
        except Exception as e:  # noqa: BLE001 - the training loop must go on
            if not self._warned:
                warnings.warn(f"GoalProposer: proposal failed ({type(e).__name__}: {e}); using the rule goals",
                              RuntimeWarning, stacklevel=2)
                self._warned = True
            with self._lock:
                self._errors[type(e).__name__] += 1
                self._s["fallbacks"] += len(obs)
            return [rule_goals(o, self.k) for o in obs]

    def _propose(self, observations: list[Observation]) -> list[list[str]]:
        keys = [self.signature(t) for t in observations]
        uniq: dict[str, int] = {}  # key -> first index
        freq: Counter = Counter(keys)
        for i, key in enumerate(keys):
            uniq.setdefault(key, i)
        answers: dict[str, list[str]] = {}
        s: Counter = Counter(propose_calls=1, requests=len(observations), unique=len(uniq))
        misses = []
        for key in uniq:
            hit = self.cache.get(key) if self.cache.capacity > 0 else None
            if hit is not None:
                answers[key] = hit
                s["cache_hits"] += 1
            else:
                misses.append(key)
                s["cache_misses"] += 1
        if self.llm is None:
            for key in misses:
                answers[key] = rule_goals(observations[uniq[key]], self.k)
                self.cache.put(key, answers[key])
        elif misses:
            order = sorted(misses, key=lambda kk: (-freq[kk], uniq[kk]))
            ask = order if self.max_prompts is None else order[: max(0, int(self.max_prompts))]
            s["not_asked"] += len(misses) - len(ask)
            if ask:
                got, outcome = self._ask_llm(ask, [self.render_prompt(observations[uniq[kk]]) for kk in ask])
                s[f"llm_{outcome}"] += 1
                if got:
                    answers.update(got)
        out: list[list[str]] = []
        by_key: dict[str, list[str]] = {}
        for key in uniq:
            goals = [g for g in answers.get(key, []) if g][: self.k]
            if not goals:
                if self.llm is not None:
                    s["fallbacks"] += freq[key]
                    s["llm_empty"] += key in answers  # the LLM answered, nothing usable survived
                goals = rule_goals(observations[uniq[key]], self.k)
            else:
                s["from_llm" if self.llm is not None else "from_rules"] += freq[key]
            by_key[key] = goals
        out = [list(by_key[key]) for key in keys]
        with self._lock:
            self._s.update(s)
        return out

    __call__ = propose

    def stats(self) -> dict[str, Any]:
        """Counters since construction (``requests``, ``cache_hit_rate``, ``llm_calls``, ``fallbacks``...)."""
        with self._lock:
            s = dict(self._s)
            dropped, errors, latency = dict(self._dropped), dict(self._errors), self._latency
        lookups = s.get("cache_hits", 0) + s.get("cache_misses", 0)
        out: dict[str, Any] = {
            "backend": self.backend_name, "k": self.k,
            "propose_calls": s.get("propose_calls", 0), "requests": s.get("requests", 0),
            "unique": s.get("unique", 0), "cache_hits": s.get("cache_hits", 0),
            "cache_misses": s.get("cache_misses", 0), "cache_hit_rate": s.get("cache_hits", 0) / max(lookups, 1),
            "cache_size": len(self.cache), "fallbacks": s.get("fallbacks", 0),
        }
        if self.llm is not None:
            calls = s.get("llm_calls", 0)
            out.update({
                "llm_calls": calls, "llm_prompts": s.get("llm_prompts", 0), "llm_answers": s.get("llm_answers", 0),
                "llm_ok": s.get("llm_ok", 0), "llm_timeouts": s.get("llm_timeout", 0),
                "llm_errors": s.get("llm_error", 0) + s.get("llm_unusable", 0), "llm_busy": s.get("llm_busy", 0),
                "llm_empty": s.get("llm_empty", 0), "not_asked": s.get("not_asked", 0),
                "from_llm": s.get("from_llm", 0),
                "llm_fraction": s.get("from_llm", 0) / max(s.get("requests", 0), 1),
                "latency_mean_s": latency / max(s.get("llm_completed", 0), 1),
                "errors_by_type": errors, "dropped": dropped,
            })
            health, child = self.health.stats(), llm_process_stats(self.llm)
            out.update({
                "llm_failed_calls": health["failures"], "llm_consecutive_failures": health["consecutive_failures"],
                "llm_down": int(health["down"]), "llm_down_seconds": health["down_seconds"],
                "llm_warnings": health["warnings"], "llm_restarts": child["restarts"],
                "llm_child_deaths": child["child_deaths"],
            })
        return out

    def close(self, wait: float = 30.0) -> None:
        """Stop the worker thread and free the backend: an LLM child process at once (bounded by its
        grace, even while it generates); an in-process backend after up to ``wait`` s for a running
        call (one still generating after that is left to free itself at exit)."""
        idle = self._caller.close(0.0 if isinstance(self.llm, ChildProcessBackend) else wait)
        if self.llm is not None and (idle or isinstance(self.llm, ChildProcessBackend)):
            close_llm(self.llm)


def make_proposer(kind: str, llm: Optional[LLMConfig] = None, *, k: int = 4, timeout: Optional[float] = None,
                  max_prompts: Optional[int] = None, flag: Optional[str] = "--ellm.proposer"):
    """The ELLM goal proposer (:class:`~agents.pqn.ellm_proposer.GoalProposer`): ``"rules"``, or
    ``"llm"``, the backend of ``llm`` (falling back to rules), checked with one real call."""
    if kind == "rules":
        return GoalProposer("rules", k=k)
    if kind != "llm":
        raise ValueError(f"unknown proposer {kind!r}; expected 'rules' or 'llm'")
    llm = (llm or LLMConfig()).validate()
    proposer = GoalProposer(llm.backend, k=k, timeout=timeout, max_prompts=max_prompts,
                            backend_kwargs=backend_kwargs(llm))
    if flag is not None:
        check_llm(proposer, True, flag)
    return proposer
