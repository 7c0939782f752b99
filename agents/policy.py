"""Moved to :mod:`agents.tools.policy` (this old path warns and goes in the next release)."""

from agents.deprecated import moved

globals().update(moved(__name__, "agents.tools.policy"))
