"""Rebuild the plots and tables of docs/results.md from run files; the tool is :mod:`agents.tools.analyze_runs`."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.tools.analyze_runs import main
    sys.exit(main())
