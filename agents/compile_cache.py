"""JAX's persistent compilation cache, switched on by the scripts (never by importing the library).

Craftax programs take 10-40 s to compile on a small CPU; with the cache every later process that
builds the same programs starts in seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "oir_gym" / "jax"


def enable_compile_cache(path: str | os.PathLike | None = None, min_compile_seconds: float = 1.0) -> Path | None:
    """Point JAX's persistent compilation cache at ``path`` (default ``$OIR_GYM_JAX_CACHE_DIR`` or
    ``~/.cache/oir_gym/jax``), unless ``OIR_GYM_JAX_CACHE=0`` or a cache directory is already set.

    Returns:
        The cache directory in use, or None when it stays off.
    """
    import jax

    if os.environ.get("OIR_GYM_JAX_CACHE", "1") == "0":
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    path = Path(path or os.environ.get("OIR_GYM_JAX_CACHE_DIR", DEFAULT_DIR))
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_seconds))
    return path
