"""What does each update train on? Per instruction: rollout share, relabeled rows, rewards, cut steps.

Runs the PQN/OIR trainer for ``--updates`` iterations and, after the first ``--skip``, counts per
instruction text (all seeds pooled):

- ``rollout steps``: the share of the rollout's steps run under the instruction, and the episodes
  that ended under it, and how many of them succeeded;
- ``relabeled rows``: relabeled copies in the update batch that carry the instruction (OIR);
- ``rewarded steps``: steps with reward 1 in the update batch (original rows count for the
  instruction the env ran at that step, relabeled rows for their relabeled instruction), and that
  count's share of all rewarded steps: how much of the learning signal the instruction gets;
- ``cut steps``: steps of its relabeled copies left without a target (``relabel/cut_steps``).

Compare ``--method oir`` with ``--method cosine`` to see how relabeling redistributes the signal:

    python examples/batch_composition.py --method oir --updates 40 --skip 30 --out /tmp/oir_batch.json
    python examples/batch_composition.py --method cosine --updates 40 --skip 30

``--set PART.FIELD=VALUE`` overrides any field of :class:`agents.config.TrainConfig` (values are read
as JSON when they parse, e.g. ``--set pqn.hidden_size=64 pqn.lr=3e-4``). The defaults make early-training competence
reachable on a CPU: the paper preset's envs and steps, a smaller network, lr 3e-4, faster epsilon.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.batch_composition import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
