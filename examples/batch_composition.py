"""What each update trains on, per instruction; the tool is :mod:`agents.tools.batch_composition`."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.tools.batch_composition import main
    sys.exit(main())
