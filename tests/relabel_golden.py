"""The relabeler's golden snapshot: candidates and stats over ~200 synthetic trajectories.

A frozen record of what :class:`~oir_gym.relabel.HindsightRelabeler` produces (kept
candidates with text, source, first step, grounded, binding and grounding rows; per-result
bookkeeping; and the run's stats without timings) for scenarios that cover rule instructions,
a scripted LLM with cosine and bound grounding, keep-ungrounded on and off, the rules fallback
(unusable answers and a failing backend) and the embedding near-dedup. Any refactor of the
relabeler must leave it identical (``tests/test_relabel_golden.py``).

Rewrite the file (only for an intended behaviour change, and say so in the commit)::

    PYTHONPATH=$PWD python tests/relabel_golden.py --write
"""

from __future__ import annotations

import json
import sys
import warnings
import zlib
from pathlib import Path
from typing import Any, Callable

from oir_gym.relabel.synthetic import random_trajectories, training_run
from relabel_config import relabel_config

GOLDEN = Path(__file__).resolve().parent / "data" / "relabel_golden.json"

#: stats that measure time, not behaviour
TIMING_KEYS = ("latency_mean_s", "latency_per_prompt_s", "down_seconds")

# The scripted LLM's answer pool: grounded wordings, near-duplicates of each other and of the
# rule instructions, an instruction that never happens, and a filtered one.
_POOL = (
    "collect wood", "collect the wood", "gather wood from a tree", "place a table", "place the table",
    "make a wood pickaxe", "craft a wooden pickaxe", "drink water", "collect a sapling", "plant a sapling",
    "eat a cow", "sleep", "wake up", "make iron sword", "collect diamond", "walk to the tree",
    "collect wood then place a table", "place a table then make a wood pickaxe",
)


class ScriptedLLM:
    """A deterministic stand-in for an LLM (the golden file needs answers a real model cannot
    promise): each prompt's answer is chosen by a checksum of the prompt, so it depends only on
    what the relabeler sends. One prompt in seven gets an answer with nothing usable (the
    relabeler's rules fallback), the others a few pool entries in JSON."""

    def generate(self, prompts: list[str], n: int = 1, *, schema: Any = None) -> list[list[str]]:
        out = []
        for p in prompts:
            h = zlib.crc32(p.encode())
            if h % 7 == 0:
                out.append(["I cannot answer that."] * n)
                continue
            picks = [_POOL[(h >> (4 * j)) % len(_POOL)] for j in range(5)]
            mid, high = picks[:3], picks[3:]
            out.append([json.dumps({"Mid-Level": mid, "High-Level": high})] * n)
        return out


class FailingLLM:
    """Fault injection: every call raises (a dead server), so the rules fallback answers."""

    def generate(self, prompts: list[str], n: int = 1, *, schema: Any = None) -> list[list[str]]:
        raise ConnectionError("LLM server down")


def _row(row: Any) -> str:
    """A grounding row as one line of 4-decimal numbers (readable diffs, a small file)."""
    return " ".join(f"{float(x):.4f}" for x in row)


def _candidate(c: Any) -> dict:
    return {
        "text": c.text, "source": c.source, "first_step": int(c.first_step), "grounded": bool(c.grounded),
        "similarity": round(float(c.similarity), 4),
        "binding": None if c.binding is None else c.binding.to_list(),
        "final_row": _row(c.final_row),
        "pre_row": _row(c.pre_row),
    }


def _result(r: Any) -> dict:
    return {
        "request_id": r.request_id, "num_scored": r.num_scored, "num_grounded": r.num_grounded,
        "dropped": dict(sorted(r.dropped.items())), "cache_hit": r.cache_hit, "error": r.error,
        "fallback": r.fallback, "prompt_tokens": r.prompt_tokens,
        "candidates": [_candidate(c) for c in r.candidates],
    }


def _stats(s: dict) -> dict:
    out = {}
    for k, v in sorted(s.items()):
        if k in TIMING_KEYS:
            continue
        out[k] = round(v, 6) if isinstance(v, float) else (dict(sorted(v.items())) if isinstance(v, dict) else v)
    return out


def scenarios() -> dict[str, tuple[Callable[..., Any], list]]:
    """name -> (make relabeler from an encoder, batches of trajectories)."""
    mixed = random_trajectories(40, seed=3)
    run = training_run(8, 10, seed=5)  # 80 trajectories, competence rising: repeats hit the cache
    from oir_gym.relabel import HindsightRelabeler

    def make(backend: Any, **kw: Any) -> Callable[[Any], Any]:
        if isinstance(backend, str):
            return lambda encoder: HindsightRelabeler(relabel_config(backend, **kw), encoder=encoder)
        return lambda encoder: HindsightRelabeler(relabel_config(None, **kw), llm=backend, encoder=encoder)

    return {
        "rules_cosine": (make(backend="rules", k=4), [mixed[:20], mixed[20:]]),
        "rules_bound_k8": (make(backend="rules", k=8, grounding="bound"), [mixed[:20]]),
        "llm_cosine_keep": (make(backend=ScriptedLLM(), k=4, keep_ungrounded=True),
                            [run[0], run[1], run[2], run[3]]),
        "llm_cosine_nokeep_norules": (make(backend=ScriptedLLM(), k=4, keep_ungrounded=False, use_rules=False,
                                           fallback="none", dedup_threshold=0.85), [run[4], run[5]]),
        "llm_bound_keep": (make(backend=ScriptedLLM(), k=6, grounding="bound", keep_ungrounded=True,
                                cache_key="events"), [run[6], run[7], run[0]]),
        "llm_bound_nokeep": (make(backend=ScriptedLLM(), k=3, grounding="bound", keep_ungrounded=False,
                                  skip_idle=False, cache_size=0), [mixed[:20]]),
        "llm_failing_fallback": (make(backend=FailingLLM(), k=4, warn_after=1000), [mixed[20:30], run[2]]),
        "llm_failing_nofallback": (make(backend=FailingLLM(), k=4, fallback="none", warn_after=1000),
                                   [mixed[30:40]]),
    }


def snapshot(encoder: Any) -> dict:
    """Run every scenario and return the golden record (JSON-ready)."""
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (factory, batches) in scenarios().items():
            rl = factory(encoder)
            try:
                results = [_result(r) for b in batches for r in rl.relabel(b)]
                out[name] = {"results": results, "stats": _stats(rl.stats())}
            finally:
                rl.close()
    out["trajectories"] = sum(len(v["results"]) for v in out.values())
    return out


def dumps(snap: dict) -> str:
    return json.dumps(snap, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    from oir_gym.encoder import get_encoder

    text = dumps(snapshot(get_encoder()))
    if "--write" in sys.argv:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
        print(f"wrote {GOLDEN} ({len(text)} bytes)")
    else:
        sys.stdout.write(text)
