"""Record a trained policy following your instruction, as a GIF (or MP4) of the env's rgb_array frames.

    python examples/record_video.py runs/paper_oir "collect wood then place a table" --out table.gif
    python examples/record_video.py runs/sb3_qrdqn "drink water" --seed 0 --steps 300 --out drink.mp4

Works for PQN and SB3 run directories (:func:`agents.policy.load_policy`). Each episode starts
with the instruction; the video ends after ``--episodes`` episodes or ``--steps`` steps. MP4
needs imageio with its ffmpeg plugin (``pip install 'oir-gym[video]'``); GIFs are written with
Pillow. Every argument, the output folder (which must exist) and the MP4 writer are checked
before the policy is loaded or the rollout starts.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.record_video import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
