"""Moved to :mod:`agents.run.train` and :mod:`agents.pqn.recipe` (this old path warns and goes in the
next release); ``python -m agents.train`` is still the PQN command line."""

if __name__ == "__main__":
    from agents.run.train import run_module

    run_module("python -m agents.train")
else:
    from agents.deprecated import moved

    globals().update(moved(__name__, "agents.run.train", "agents.pqn.recipe"))
