"""Train an instruction-following PQN agent on Craftax-Classic with OIR (or a baseline).

    python examples/train_pqn.py                                    # OIR, the cpu preset (rules; the LLM too: --oir.relabeler both)
    python examples/train_pqn.py smoke --run-dir runs/smoke         # the smallest run (2-core CPU: ~2 min, then ~30 s)
    python examples/train_pqn.py --run.method cosine                # PQN + cosine reward on the 22 achievements
    python examples/train_pqn.py --run.method ellm --ellm.proposer rules   # ELLM baseline, rule goal proposer
    python examples/train_pqn.py paper --run.num-seeds 3 --run-dir runs/paper_oir   # the paper's settings (GPU)
    python examples/train_pqn.py paper --help                       # every option, with the paper preset's values
    python examples/train_pqn.py --run-dir runs/x --resume          # continue a run from its newest checkpoint

The first argument may name a preset (cpu, the default; paper; fast; smoke); flags after it override
its values. ``--resume`` continues with the run's saved config (flags override single fields).

Writes ``--run-dir`` (:mod:`agents.run.run_dir`). SIGINT and SIGTERM stop after the current update
with a checkpoint; a second signal ends the process at once. The run driver is :mod:`agents.run.train`.
"""

import sys
import time
from pathlib import Path

_STARTED = time.time()  # before the heavy imports: a run's wall clock counts them

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.pqn.recipe import PQN  # noqa: E402
from agents.run.train import script

if __name__ == "__main__":
    script(PQN, description=__doc__, started=_STARTED)
