"""What the cosine reward pays for at each threshold delta; the tool is :mod:`agents.tools.delta_sensitivity`."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.tools.delta_sensitivity import main
    sys.exit(main())
