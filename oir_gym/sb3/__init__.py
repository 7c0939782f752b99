"""Stable-Baselines3 integration: a ``VecEnv`` adapter, a replay buffer for relabeled rows and the
hindsight relabeling callback.

Quick use::

    from stable_baselines3 import DQN
    from oir_gym import InstructionCraftax, HindsightRelabeler
    from oir_gym.sb3 import SB3VecEnv, HindsightRelabelCallback, RelabelReplayBuffer

    venv = SB3VecEnv(InstructionCraftax(num_envs=16, seed=0))
    model = DQN("MultiInputPolicy", venv, seed=0, replay_buffer_class=RelabelReplayBuffer)
    model.learn(100_000, callback=HindsightRelabelCallback(HindsightRelabeler.rules(k=4)))

See docs/sb3.md.
"""

from oir_gym.sb3.callback import HindsightRelabelCallback, RelabelConfig
from oir_gym.sb3.replay import INSTRUCTION_KEY, RelabelReplayBuffer
from oir_gym.sb3.vec_env import PER_ENV_ATTRS, SB3VecEnv, find_instruction_env, make_sb3_env

__all__ = [
    "HindsightRelabelCallback", "INSTRUCTION_KEY", "PER_ENV_ATTRS", "RelabelConfig", "RelabelReplayBuffer",
    "SB3VecEnv", "find_instruction_env", "make_sb3_env",
]
