"""The old import paths' shims (docs/architecture.md, "Where the modules moved"); they go in the next release."""

from __future__ import annotations

import importlib
import warnings
from typing import Any


def moved(old: str, *new: str) -> dict[str, Any]:
    """The names of the modules ``new`` (later ones win) for the shim ``old``, after a DeprecationWarning."""
    warnings.warn(f"{old} moved to {' and '.join(new)}; import from there ({old} goes in the next release)",
                  DeprecationWarning, stacklevel=3)
    names: dict[str, Any] = {}
    for module in new:
        names.update({k: v for k, v in vars(importlib.import_module(module)).items() if not k.startswith("__")})
    return names
