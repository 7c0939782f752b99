"""oir-gym: LLM-guided hindsight instruction relabeling for instruction-following RL.

Quick use::

    import gymnasium as gym, oir_gym
    env = gym.make("OIR-CraftaxClassic-v0")                    # single env
    envs = gym.make_vec("OIR-CraftaxClassic-v0", num_envs=64)   # batched JAX-backed vector env

Importing the package registers the env id with Gymnasium and changes nothing else in the
process; scripts call :func:`enable_compilation_cache` to reuse compiled JAX programs.
"""

from __future__ import annotations

import importlib
import os

from oir_gym.registration import ENV_ID, register_envs

#: Public name -> its module, imported on first use: Craftax's import starts JAX's backend, which
#: ``import oir_gym`` must not (a script may still have to set up ``jax.distributed``).
_LAZY = {
    "InstructionBuffer": "buffer", "ACHIEVEMENT_NAMES": "captions", "EVENT_NAMES": "captions",
    "NUM_EVENTS": "captions", "CurriculumConfig": "curriculum", "InstructionCurriculum": "curriculum",
    "Offer": "curriculum", "InstructionEncoder": "encoder", "get_encoder": "encoder",
    "ORIGINAL_INSTRUCTIONS": "instructions", "get_instruction_set": "instructions",
    "load_instruction_sets": "instructions", "Trajectory": "trajectory", "RecordTrajectories": "recorder",
    "TrajectoryRecorder": "recorder", "rollout": "recorder", "InstructionCraftax": "vector_env",
    "InstructionCraftaxEnv": "single_env", "HindsightRelabeler": "relabel",
}

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
    if name in _LAZY:
        return getattr(importlib.import_module(f"oir_gym.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'oir_gym' has no attribute {name!r}")


__all__ = sorted([*_LAZY, "ENV_ID", "enable_compilation_cache"])
