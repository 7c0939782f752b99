"""What the cosine reward pays for at each threshold delta, before any training.

For every evaluation instruction (original, simple and complex sets) the reward fires on each
caption event whose similarity to the instruction exceeds delta. This prints, per set and delta,
how many instructions get their own event rewarded and how many other events are rewarded too,
then lists the wrongly rewarded events of the original set at the lower thresholds. It uses the
packaged sentence encoder and caption vocabulary; nothing is trained.

    python examples/delta_sensitivity.py --out results/reference/delta_sensitivity.json --plot docs/img/delta_sensitivity.png
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.delta_sensitivity import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
