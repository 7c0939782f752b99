"""oir-gym: LLM-guided hindsight instruction relabeling for instruction-following RL.

Quick use::

    import gymnasium as gym, oir_gym
    env = gym.make("OIR-CraftaxClassic-v0")                    # single env
    envs = gym.make_vec("OIR-CraftaxClassic-v0", num_envs=64)   # batched JAX-backed vector env

Importing the package registers the env id with Gymnasium and changes nothing else in the
process; scripts call :func:`enable_compilation_cache` to reuse compiled JAX programs.
"""

from __future__ import annotations

import os

from oir_gym.buffer import InstructionBuffer
from oir_gym.captions import ACHIEVEMENT_NAMES, EVENT_NAMES, NUM_EVENTS
from oir_gym.curriculum import CurriculumConfig, InstructionCurriculum, Offer
from oir_gym.encoder import InstructionEncoder, get_encoder
from oir_gym.instructions import ORIGINAL_INSTRUCTIONS, get_instruction_set, load_instruction_sets
from oir_gym.trajectory import Trajectory
from oir_gym.recorder import RecordTrajectories, TrajectoryRecorder, rollout
from oir_gym.vector_env import InstructionCraftax
from oir_gym.single_env import InstructionCraftaxEnv
from oir_gym.registration import ENV_ID, register_envs

__version__ = "0.1.0"


def enable_compilation_cache(path: str | None = None, min_compile_time_secs: float | None = None) -> str | None:
    """Switch on JAX's persistent compilation cache for this process; returns its folder (or None).

    Args:
        path: the cache folder (default ``$OIR_GYM_JAX_CACHE_DIR``, else ``~/.cache/oir_gym/jax``); without
            it, a folder already set in JAX's config is kept.
        min_compile_time_secs: programs compiling faster are not cached (default
            ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``, else 1 s; 0 caches every program).

    ``OIR_GYM_JAX_CACHE=0`` makes it a no-op (returns None).
    """
    if os.environ.get("OIR_GYM_JAX_CACHE", "1") == "0":
        return None
    import jax

    current = jax.config.jax_compilation_cache_dir
    if current and path is None:
        return str(current)
    folder = path or os.environ.get("OIR_GYM_JAX_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "oir_gym", "jax")
    jax.config.update("jax_compilation_cache_dir", folder)
    if min_compile_time_secs is None:
        min_compile_time_secs = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 1.0))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
    return folder


register_envs()


def __getattr__(name: str):
    # The relabeler pulls in optional LLM backends: import it lazily.
    if name == "HindsightRelabeler":
        from oir_gym.relabel import HindsightRelabeler

        return HindsightRelabeler
    raise AttributeError(f"module 'oir_gym' has no attribute {name!r}")


__all__ = [
    "ACHIEVEMENT_NAMES", "ENV_ID", "EVENT_NAMES", "NUM_EVENTS", "ORIGINAL_INSTRUCTIONS",
    "CurriculumConfig", "HindsightRelabeler", "InstructionBuffer", "InstructionCraftax", "InstructionCraftaxEnv",
    "InstructionCurriculum", "InstructionEncoder", "Offer", "RecordTrajectories", "Trajectory", "TrajectoryRecorder",
    "enable_compilation_cache", "get_encoder",
    "get_instruction_set", "load_instruction_sets", "rollout",
]
