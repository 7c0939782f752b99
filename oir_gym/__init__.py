"""oir-gym: LLM-guided hindsight instruction relabeling for instruction-following RL.

Quick use::

    import gymnasium as gym, oir_gym
    env = gym.make("OIR-CraftaxClassic-v0")                    # single env
    envs = gym.make_vec("OIR-CraftaxClassic-v0", num_envs=64)   # batched JAX-backed vector env
"""

from __future__ import annotations

import os

__version__ = "0.1.0"


def _enable_compilation_cache() -> None:
    # Craftax programs take 10-40 s to compile on a small CPU; JAX's persistent cache makes
    # every later process start in seconds. Opt out with OIR_GYM_JAX_CACHE=0.
    if os.environ.get("OIR_GYM_JAX_CACHE", "1") == "0":
        return
    import jax

    if not jax.config.jax_compilation_cache_dir:
        path = os.environ.get("OIR_GYM_JAX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "oir_gym", "jax"))
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


_enable_compilation_cache()

from oir_gym.buffer import InstructionBuffer  # noqa: E402
from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, NUM_EVENTS  # noqa: E402
from oir_gym.encoder import InstructionEncoder, get_encoder  # noqa: E402
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS, get_instruction_set, load_instruction_sets  # noqa: E402
from oir_gym.trajectory import Trajectory  # noqa: E402
from oir_gym.recorder import TrajectoryRecorder, rollout  # noqa: E402
from oir_gym.vector_env import InstructionCraftax  # noqa: E402
from oir_gym.single_env import InstructionCraftaxEnv  # noqa: E402
from oir_gym.registration import ENV_ID, register_envs  # noqa: E402

register_envs()


def __getattr__(name: str):
    # The relabeler pulls in optional LLM backends: import it lazily.
    if name == "HindsightRelabeler":
        from oir_gym.relabel import HindsightRelabeler

        return HindsightRelabeler
    raise AttributeError(f"module 'oir_gym' has no attribute {name!r}")


__all__ = [
    "ACHIEVEMENT_NAMES", "ENV_ID", "EVENT_NAMES", "NUM_EVENTS", "ORIGINAL_INSTRUCTIONS",
    "HindsightRelabeler", "InstructionBuffer", "InstructionCraftax", "InstructionCraftaxEnv",
    "InstructionEncoder", "Trajectory", "TrajectoryRecorder", "get_encoder", "get_instruction_set",
    "load_instruction_sets", "rollout",
]
