"""HindsightRelabeler refuses constructor values that it used to accept silently (issue 17, point 8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oir_gym.relabel import HindsightRelabeler
from relabel_config import relabel_config


@pytest.mark.parametrize("kwargs, match", [
    (dict(delta=1.5), r"delta=1.5 .*\(-1, 1\]"),
    (dict(delta=-1.0), r"delta=-1.0 .*\(-1, 1\]"),
    (dict(delta=math.nan), r"delta=nan"),
    (dict(delta="0.9"), r"delta='0.9'"),
    (dict(samples=0), r"samples=0 must be an integer >= 1"),
    (dict(samples=2.5), r"samples=2.5"),
    (dict(cache_size=-1), r"cache_size=-1 must be an integer >= 0"),
    (dict(cache_size=1.5), r"cache_size=1.5"),
    (dict(dedup_threshold=0.0), r"dedup_threshold=0.0 must be a cosine in \(0, 1\]"),
    (dict(dedup_threshold=1.2), r"dedup_threshold=1.2"),
    (dict(dedup_threshold=math.nan), r"dedup_threshold=nan"),
    (dict(llm_timeout=0), r"llm_timeout=0 must be a number of seconds > 0"),
    (dict(llm_timeout=-3.0), r"llm_timeout=-3.0"),
    (dict(llm_timeout=math.inf), r"llm_timeout=inf"),
])
def test_bad_values_are_refused_with_the_value_and_the_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HindsightRelabeler(relabel_config("rules", **kwargs))


@pytest.mark.parametrize("kwargs", [
    dict(delta=1.0), dict(delta=-0.99), dict(delta=np.float32(0.9)), dict(samples=3), dict(cache_size=0),
    dict(dedup_threshold=1.0), dict(llm_timeout=None), dict(llm_timeout=2),
])
def test_values_inside_the_ranges_are_accepted(kwargs):
    rl = HindsightRelabeler(relabel_config("rules", **kwargs))
    rl.close()


def test_public_encode_matches_the_encoder(encoder):
    rl = HindsightRelabeler(relabel_config("rules"), encoder=encoder)
    try:
        v = rl.encode(["collect wood", "place table"])
        assert v.shape == (2, encoder.dim) and v.dtype == np.float32
        np.testing.assert_allclose(v, encoder.encode(["collect wood", "place table"]), atol=1e-6)
        assert rl.encode([]).shape == (0, encoder.dim)
    finally:
        rl.close()


def test_the_config_form_validates_once_and_names_the_field():
    from oir_gym.relabel import RelabelerConfig

    cfg = RelabelerConfig()
    cfg.grounding.delta = 1.5
    with pytest.raises(ValueError, match=r"delta=1.5 .*grounding\.delta"):
        HindsightRelabeler(cfg)
    with pytest.raises(TypeError, match="k"):
        HindsightRelabeler(cfg, k=4)


def test_the_keyword_form_is_refused_with_what_replaces_it():
    with pytest.raises(TypeError, match=r"config='rules' must be a RelabelerConfig \(or use HindsightRelabeler.rules"):
        HindsightRelabeler("rules")
    with pytest.raises(TypeError, match="unexpected setting 'cache_size'"):
        HindsightRelabeler.rules(k=3, cache_size=5)
