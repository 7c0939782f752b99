"""The relabeler's output stays as frozen in ``tests/data/relabel_golden.json``.

Rebuilds the snapshot of :mod:`relabel_golden` (rules, a scripted LLM with cosine and bound
grounding, keep-ungrounded on and off, the rules fallback, the near-dedup; ~200 synthetic
trajectories) and compares it exactly with the frozen file: a refactor of the relabeler that
changes any kept candidate, grounding row or counter fails here.
"""

from __future__ import annotations

import json

from relabel_golden import GOLDEN, dumps, snapshot


def test_relabeler_output_matches_the_golden_file(encoder):
    got = json.loads(dumps(snapshot(encoder)))
    want = json.loads(GOLDEN.read_text())
    assert got["trajectories"] >= 200
    for name in want:
        assert got[name] == want[name], f"scenario {name!r} differs from {GOLDEN.name}"
    assert got.keys() == want.keys()


def test_the_golden_file_covers_every_path():
    """The frozen file exercises what it claims to (so an empty scenario cannot pass silently)."""
    want = json.loads(GOLDEN.read_text())
    cands = [c for v in want.values() if isinstance(v, dict) for r in v["results"] for c in r["candidates"]]
    assert {c["source"] for c in cands} == {"llm", "rules"}
    assert any(c["binding"] for c in cands) and any(c["binding"] is None for c in cands)
    assert any(not c["grounded"] for c in cands) and any(c["grounded"] for c in cands)
    stats = {k: v["stats"] for k, v in want.items() if isinstance(v, dict)}
    assert stats["llm_cosine_keep"]["fallbacks"] > 0 and stats["llm_failing_fallback"]["fallbacks"] > 0
    assert stats["llm_cosine_keep"]["cache_hits"] > 0
    assert any(s["dropped"].get("near_duplicate", 0) > 0 for s in stats.values())
    assert stats["llm_bound_keep"]["dropped"].get("unbound", 0) > 0
