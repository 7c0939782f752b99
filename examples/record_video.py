"""Record a trained policy following your instruction, as a GIF (or MP4) of the env's rgb_array frames.

The tool is :mod:`agents.tools.record_video` (its docstring has the usage); ``python examples/record_video.py --help``
lists its options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.tools.record_video import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
