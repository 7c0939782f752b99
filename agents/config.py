"""Moved to :mod:`agents.run.config` and :mod:`agents.pqn.config` (this old path warns and goes in the next release)."""

from agents.deprecated import moved

globals().update(moved(__name__, "agents.run.config", "agents.pqn.config"))
