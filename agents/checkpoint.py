"""Moved to :mod:`agents.run.checkpoint` (this old path warns and goes in the next release);
``python -m agents.checkpoint RUN_DIR`` still verifies a run's newest checkpoint."""

if __name__ == "__main__":
    import sys

    from agents.run.checkpoint import main

    sys.exit(main(prog="python -m agents.checkpoint"))
else:
    from agents.deprecated import moved

    globals().update(moved(__name__, "agents.run.checkpoint"))
