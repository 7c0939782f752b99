"""Moved to :mod:`agents.pqn.trainer` (this old path warns and goes in the next release)."""

from agents.deprecated import moved

globals().update(moved(__name__, "agents.pqn.trainer"))
