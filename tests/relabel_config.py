"""The tests' shorthand for a :class:`~oir_gym.relabel.RelabelerConfig`: settings by their flat names."""

from __future__ import annotations

from typing import Any

from oir_gym.relabel import RelabelerConfig

#: flat name -> (part, field) of RelabelerConfig
FIELDS = {
    "template": ("prompt", "template"), "max_prompt_tokens": ("prompt", "max_prompt_tokens"),
    "skip_idle": ("prompt", "skip_idle"), "backend": ("llm", "backend"), "backend_kwargs": ("llm", "backend_kwargs"),
    "isolate": ("llm", "isolate"), "child_config": ("llm", "child_config"), "llm_timeout": ("llm", "timeout"),
    "samples": ("llm", "samples"), "fallback": ("llm", "fallback"), "warn_after": ("llm", "warn_after"),
    "queue_size": ("llm", "queue_size"), "on_full": ("llm", "on_full"), "cache_size": ("cache", "size"),
    "cache_path": ("cache", "path"), "cache_key": ("cache", "key"), "cache_save_every": ("cache", "save_every"),
    "grounding": ("grounding", "mode"), "delta": ("grounding", "delta"),
    "bind_threshold": ("grounding", "bind_threshold"), "k": ("selection", "k"), "use_rules": ("selection", "use_rules"),
    "keep_ungrounded": ("selection", "keep_ungrounded"), "dedup_threshold": ("selection", "dedup_threshold"),
    "candidate_filter": ("selection", "candidate_filter"),
}


def relabel_config(backend: Any = "transformers", **settings: Any) -> RelabelerConfig:
    """A RelabelerConfig with ``backend`` and ``settings`` (flat names, see :data:`FIELDS`) set; not validated."""
    cfg = RelabelerConfig()
    for name, value in {"backend": backend, **settings}.items():
        part, field = FIELDS[name]
        setattr(getattr(cfg, part), field, value)
    return cfg
