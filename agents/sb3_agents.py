"""Moved to :mod:`agents.sb3.models` (this old path warns and goes in the next release)."""

from agents.deprecated import moved

globals().update(moved(__name__, "agents.sb3.models"))
