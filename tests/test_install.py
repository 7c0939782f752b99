"""What pyproject.toml promises: a Python the pinned libraries run on, and extras for every optional part."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _lowest_python(spec: str) -> Version:
    """The lowest 3.x release (to 3.30) that ``spec`` allows."""
    allowed = SpecifierSet(spec)
    return next(v for v in (Version(f"3.{m}") for m in range(30)) if v in allowed)


@pytest.mark.parametrize("dist", ["jax", "jaxlib", "flax"])
def test_requires_python_is_no_lower_than_what_the_installed_core_libraries_need(dist):
    """requires-python said >=3.10 while the JAX (and flax) releases the code runs on need 3.11."""
    need = metadata.metadata(dist).get("Requires-Python")
    if not need:
        pytest.skip(f"{dist} declares no Requires-Python")
    assert _lowest_python(PROJECT["requires-python"]) >= _lowest_python(need), (
        f"requires-python {PROJECT['requires-python']!r} allows a Python that {dist} {metadata.version(dist)} "
        f"({need}) does not run on")


def test_the_optional_parts_have_extras_and_ci_installs_them():
    extras = PROJECT["optional-dependencies"]
    names = {k: {Requirement(r).name for r in v} for k, v in extras.items()}
    assert {"imageio", "imageio-ffmpeg"} <= names["video"]  # examples/record_video.py's MP4 writer
    assert "wandb" in names["wandb"]
    (everything,) = extras["all"]
    inside = set(re.fullmatch(r"oir-gym\[(.*)\]", everything).group(1).split(","))
    assert {"llm", "sb3", "analysis", "test", "wandb", "video"} <= inside  # what .ci/run installs and tests
    assert "hypothesis" in names["test"]
