"""The old import paths of modules that moved into ``agents.run``, ``agents.pqn``, ``agents.sb3`` and
``agents.tools`` (docs/architecture.md, "Where the modules moved"): each old module is a thin shim
that warns once, naming the new path, and re-exports the new modules' names. They go in the next
release."""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def moved(old: str, *new: str) -> dict[str, Any]:
    """The names of the modules ``new`` (later ones win), for the shim module ``old`` to re-export,
    after a :class:`DeprecationWarning` that names where to import from now."""
    warnings.warn(f"{old} moved to {' and '.join(new)}; import from there ({old} goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    names: dict[str, Any] = {}
    for module in new:
        names.update({k: v for k, v in vars(importlib.import_module(module)).items() if not k.startswith("__")})
    return names
