"""One metric schema for both trainers (docs/api.md, "Metric schema"): PQN's smoke run writes it;
the SB3 side is checked on its trained run in ``tests/test_sb3_train.py``
(``test_sb3_metrics_rows_use_the_shared_schema``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from oir_gym.curriculum import OFFER_METRICS

ROOT = Path(__file__).resolve().parents[1]
#: the schema's keys every training row of an OIR run holds
SCHEMA = ("loss", "sps", *OFFER_METRICS)


def documented_keys() -> list[str]:
    text = (ROOT / "docs/api.md").read_text()
    table = text[text.index("## Metric schema"):].split("\n## ")[0]
    return re.findall(r"^\| `([^`]+)` \|", table, re.M)


def test_the_schema_table_documents_every_key():
    assert sorted(documented_keys()) == sorted(SCHEMA)


def test_pqn_metrics_rows_use_the_schema(smoke_run):
    rows = [json.loads(x) for x in (smoke_run / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        assert set(SCHEMA) <= set(row), sorted(set(SCHEMA) - set(row))
        assert not {"relabel/rows_added", "relabel/grounded_fraction", "run/loss", "run/sps"} & set(row)
