"""ELLM-style forward goal proposal (Du et al. 2023) for method ``ellm``: goals suggested from the CURRENT
observation by :func:`rule_goals` or an LLM with the few-shot prompt ``oir_gym/data/prompts/ellm.txt``; cache misses
go to the LLM in one batched call, and when it fails, answers nothing usable or misses ``timeout``, the rules answer.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import Counter
from concurrent.futures import TimeoutError as FutureTimeout
from importlib import resources
from typing import Any, Optional, Sequence, Union

from oir_gym.captions import ACHIEVEMENT_NAMES
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

#: The rule proposer's wording of each Craftax achievement.
GOALS: dict[str, str] = {a: a.replace("_", " ") for a in ACHIEVEMENT_NAMES} | {"collect_drink": "drink water"}
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


def rule_goals(obs: Union[Observation, str], k: Optional[int] = None) -> list[str]:
    """Achievable next goals for one observation, most immediate first, at most ``k`` (no LLM)."""
    o = obs if isinstance(obs, Observation) else parse_observation(obs)
    G = GOALS
    if o.sleeping:
        return [G["wake_up"]]

    def collectable(name: str) -> Optional[str]:
        achievement, tool = TARGETS.get(name, ("", None))
        return G[achievement] if achievement and (tool is None or o.has(tool)) else None

    out = [G["collect_sapling"] if o.facing == "grass" else collectable(o.facing)]
    out += [G[f"defeat_{mob}"] for mob in ("zombie", "skeleton") if mob in o.nearby]
    table = "crafting table" in o.nearby or o.facing == "crafting table"
    furnace = "furnace" in o.nearby or o.facing == "furnace"
    if table and o.has("wood"):
        tiers = {"wood": True, "stone": o.has("stone"), "iron": furnace and all(map(o.has, ("stone", "coal", "iron")))}
        out += [G[f"make_{m}_{tool}"] for m, ok in tiers.items() if ok for tool in ("pickaxe", "sword")
                if not o.has(f"{m} {tool}")]
    placing = {"place_table": o.has("wood") and not table, "place_furnace": o.has("stone") and table and not furnace,
               "place_plant": o.has("sapling"), "place_stone": o.has("stone")}
    out += [G[g] for g, ok in placing.items() if ok]
    out += [collectable(name) for name, _ in sorted(o.nearby.items(), key=lambda kv: (kv[1], kv[0]))]
    if o.status.get("energy", 9) <= LOW_ENERGY:
        out.append(G["wake_up"])
    out = [g for g in dict.fromkeys(out) if g] or list(FALLBACK_GOALS)
    return out[:k] if k else out


def signature(obs: Union[Observation, str], mode: str = "coarse") -> str:
    """Cache key of an observation: ``"text"`` (the exact text) or ``"coarse"`` (what :func:`rule_goals` reads)."""
    o = obs if isinstance(obs, Observation) else parse_observation(obs)
    if mode == "text":
        return o.text
    inv = ",".join(f"{k} {'2+' if v >= 2 else v}" for k, v in sorted(o.inventory.items()))
    near = ",".join(f"{k} {v}" for k, v in sorted(o.nearby.items()))
    vit = ",".join(f"{k} {'low' if v <= LOW_VITAL else 'ok'}" for k, v in sorted(o.status.items()))
    return f"{o.facing}|{near}|{inv}|{vit}|{int(o.sleeping)}"


def load_prompt() -> str:
    """The packaged few-shot prompt template ``oir_gym/data/prompts/ellm.txt`` (``#|`` comment lines removed)."""
    raw = resources.files("oir_gym.data").joinpath("prompts", "ellm.txt").read_text()
    return "\n".join(line for line in raw.splitlines() if not line.startswith("#|")).strip("\n")


class GoalProposer:
    """ELLM goal proposer: observations in, up to ``k`` goals per observation out. ``backend``: ``"rules"``,
    a relabeler backend (name, ``"package.module:ClassName"``, ``BackendSpec`` or object with ``generate``);
    ``timeout`` s and at most ``max_prompts`` signatures per batched call; ``child_config``: the LLM child
    process's restart settings."""

    def __init__(self, backend: Any = "rules", k: int = 4, cache_size: int = 4096, *, timeout: Optional[float] = None,
                 max_prompts: Optional[int] = None, backend_kwargs: Optional[dict] = None,
                 child_config: Optional[ChildConfig] = None) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if isinstance(backend, str) and backend not in BACKEND_NAMES and ":" not in backend:
            raise ValueError(f"unknown proposer backend {backend!r}: use one of {BACKEND_NAMES}, "
                             "'package.module:ClassName' or a backend object")
        self.k, self.timeout, self.max_prompts = int(k), timeout, max_prompts
        self.filter = CandidateFilter()
        self.cache = LRUCache(cache_size)
        self.backend_name = (backend if isinstance(backend, str) else backend.name if isinstance(backend, BackendSpec)
                             else type(backend).__name__)
        self.llm = build_llm(backend, backend_kwargs, config=child_config)
        self.health = LLMHealth("ELLM proposer", fallback="proposing rule goals meanwhile")
        self.template = load_prompt() if self.llm is not None else ""
        self.schema = output_schema(self.k)
        self._caller = OffThreadCaller("oir-ellm")
        self._lock = threading.Lock()
        self._s, self._dropped, self._errors = Counter(), Counter(), Counter()
        self._latency, self._warned = 0.0, False
        self.last_error: Optional[str] = None

    def __repr__(self) -> str:
        return f"GoalProposer(backend={self.backend_name!r}, k={self.k})"

    def render_prompt(self, obs: Union[Observation, str]) -> str:
        """The LLM prompt for one observation (its text)."""
        text = obs.text if isinstance(obs, Observation) else obs
        return self.template.replace("{{k}}", str(self.k)).replace("{{observation}}", text)

    def check_llm(self, timeout: float = 900.0) -> Optional[str]:
        """One tiny real LLM call before use (``None`` for the rules); raises ``LLMCheckError`` with the remedy."""
        return None if self.llm is None else probe(self.llm, timeout)

    def _llm_call(self, keys: list[str], prompts: list[str]) -> dict[str, list[str]]:
        """One batched LLM call; parses, filters, caches and reports every answer, late ones too."""
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
            self._s.update(llm_completed=1, llm_answers=len(out), llm_goals=sum(len(g) for g in out.values()))
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
            self._s.update(llm_calls=1, llm_prompts=len(prompts))
        try:
            return fut.result(timeout=self.timeout), "ok"
        except FutureTimeout:
            return None, "timeout"
        except Exception as e:  # noqa: BLE001 - recorded; the rules answer instead
            with self._lock:
                self._errors[type(e).__name__] += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return None, "error"

    def propose(self, observations: Sequence[Union[Observation, str]]) -> list[list[str]]:
        """Up to ``k`` goals (never none) for each observation or its text; never raises."""
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
        keys = [signature(t) for t in observations]
        uniq: dict[str, int] = {}  # key -> first index
        freq: Counter = Counter(keys)
        for i, key in enumerate(keys):
            uniq.setdefault(key, i)
        answers = {key: hit for key in uniq if self.cache.capacity > 0 and (hit := self.cache.get(key)) is not None}
        misses = [key for key in uniq if key not in answers]
        s = Counter(propose_calls=1, requests=len(observations), unique=len(uniq), cache_hits=len(answers),
                    cache_misses=len(misses))
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
                answers.update(got or {})
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
        with self._lock:
            self._s.update(s)
        return [list(by_key[key]) for key in keys]

    __call__ = propose

    def stats(self) -> dict[str, Any]:
        """Counters since construction (``requests``, ``cache_hit_rate``, ``llm_calls``, ``fallbacks``...)."""
        with self._lock:
            s = Counter(self._s)
            dropped, errors, latency = dict(self._dropped), dict(self._errors), self._latency
        out: dict[str, Any] = {
            "backend": self.backend_name, "k": self.k,
            **{n: s[n] for n in ("propose_calls", "requests", "unique", "cache_hits", "cache_misses")},
            "cache_hit_rate": s["cache_hits"] / max(s["cache_hits"] + s["cache_misses"], 1),
            "cache_size": len(self.cache), "fallbacks": s["fallbacks"],
        }
        if self.llm is None:
            return out
        health, child = self.health.stats(), llm_process_stats(self.llm)
        return {
            **out, **{n: s[n] for n in ("llm_calls", "llm_prompts", "llm_answers", "llm_ok", "llm_busy", "llm_empty",
                                         "not_asked", "from_llm")},
            "llm_timeouts": s["llm_timeout"], "llm_errors": s["llm_error"] + s["llm_unusable"],
            "llm_fraction": s["from_llm"] / max(s["requests"], 1),
            "latency_mean_s": latency / max(s["llm_completed"], 1), "errors_by_type": errors, "dropped": dropped,
            "llm_failed_calls": health["failures"], "llm_down": int(health["down"]),
            **{f"llm_{n}": health[n] for n in ("consecutive_failures", "down_seconds", "warnings")},
            **{f"llm_{n}": child[n] for n in ("restarts", "child_deaths")},
        }

    def close(self, wait: float = 30.0) -> None:
        """Stop the worker and free the backend (in-process: after up to ``wait`` s for a running call)."""
        idle = self._caller.close(0.0 if isinstance(self.llm, ChildProcessBackend) else wait)
        if self.llm is not None and (idle or isinstance(self.llm, ChildProcessBackend)):
            close_llm(self.llm)


def make_proposer(kind: str, llm: Optional[LLMConfig] = None, *, k: int = 4, timeout: Optional[float] = None,
                  max_prompts: Optional[int] = None):
    """The ELLM :class:`GoalProposer`: ``"rules"``, or ``"llm"`` (``llm``'s backend, checked with one real call)."""
    if kind == "rules":
        return GoalProposer("rules", k=k)
    if kind != "llm":
        raise ValueError(f"unknown proposer {kind!r}; expected 'rules' or 'llm'")
    llm = (llm or LLMConfig()).validate()
    proposer = GoalProposer(llm.backend, k=k, timeout=timeout, max_prompts=max_prompts,
                            backend_kwargs=backend_kwargs(llm))
    check_llm(proposer, True, "--ellm.proposer")
    return proposer
