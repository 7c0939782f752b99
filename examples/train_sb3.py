"""Train a Stable-Baselines3 agent (RecurrentPPO, QR-DQN or DQN) on Craftax-Classic with OIR relabeling.

    python examples/train_sb3.py                                        # QR-DQN + rule relabeler, the cpu preset
    python examples/train_sb3.py smoke --run-dir runs/sb3_smoke         # the smallest run (under a minute)
    python examples/train_sb3.py --sb3.algo recurrent_ppo --oir.relabeler llm   # curriculum only (on-policy)
    python examples/train_sb3.py --sb3.hp learning_rate=3e-4 buffer_size=20000  # SB3 constructor overrides
    python examples/train_sb3.py --run.method cosine                    # no relabeling: the 22 original instructions
    python examples/train_sb3.py --run-dir runs/x --resume              # continue from the checkpoint

The first argument may name a preset (cpu, the default; smoke); flags after it override its
values. ``--sb3.hp`` overrides single keys of the algorithm's own hyperparameters (``--sb3.defaults``);
the other flags are those of examples/train_pqn.py. An update is ``--sb3.steps-per-update`` env
steps. QR-DQN and DQN get the relabeled transitions (``oir_gym.sb3.HindsightRelabelCallback``) in
their replay buffer, RecurrentPPO the instruction-buffer curriculum only (docs/sb3.md). The run
directory has the format of ``train_pqn.py``, with model.zip + state.json as the checkpoint.
"""

import sys
import time
from pathlib import Path

_STARTED = time.time()  # before the heavy imports: a run's wall clock counts them

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.sb3.trainer import SB3  # noqa: E402
from agents.run.train import script  # noqa: E402

if __name__ == "__main__":
    script(SB3, description=__doc__, started=_STARTED)
