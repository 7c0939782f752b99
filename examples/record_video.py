"""Record a trained policy following an instruction, as a GIF or MP4; the tool is :mod:`agents.tools.record_video`."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agents.tools.record_video import main
    sys.exit(main())
