"""What does each update train on? Per instruction: rollout share, relabeled rows, rewards, cut steps.

The tool is :mod:`agents.tools.batch_composition` (its docstring has the usage); ``python examples/batch_composition.py --help``
lists its options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.tools.batch_composition import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
