"""Prompt templates (kept as data in ``oir_gym/data/prompts``), the answer's JSON schema and its GBNF twin.

A template file is plain text with ``{{trajectory}}`` and optionally ``{{k}}``; ``#|`` lines are never sent:
``#| view: timesteps`` (one line per step, paper section 4.1) or ``segments`` (:mod:`oir_gym.relabel.segments`),
``#| analysis: true`` (the answer has the paper's ``"Analysis"`` wrapper, :func:`output_schema`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Optional

from oir_gym.relabel.segments import ACTION_NAMES, compact_text, segments_text
from oir_gym.trajectory import Trajectory

TEMPLATE_NAMES = ("paper", "segments")
DEFAULT_TEMPLATE = "segments"
#: Longest instruction the schema/grammar lets a model emit (characters).
MAX_INSTRUCTION_CHARS = 80
MAX_ANALYSIS_CHARS = 200


@dataclass(frozen=True)
class PromptTemplate:
    """A prompt template: ``name``, ``text`` (with ``{{trajectory}}``, optionally ``{{k}}``), ``view``
    (``"timesteps"`` or ``"segments"``) and ``analysis`` (the answer has the paper's wrapper)."""

    name: str
    text: str
    view: str = "segments"
    analysis: bool = False

    def render(self, traj: Trajectory, k: int = 4, max_tokens: Optional[int] = None,
               count: Optional[Callable[[str], int]] = None) -> str:
        """The full prompt for one trajectory (compacted to ``max_tokens``: see :meth:`render_fit`)."""
        return self.render_fit(traj, k, max_tokens, count)[0]

    def render_fit(self, traj: Trajectory, k: int = 4, max_tokens: Optional[int] = None,
                   count: Optional[Callable[[str], int]] = None) -> tuple[str, int]:
        """The prompt and its compaction level: a ``segments`` view is compacted until ``count`` (default
        :func:`~oir_gym.relabel.tokens.approx_token_count`) gives at most ``max_tokens``."""
        head = self.text.replace("{{k}}", str(k))
        # str.replace, not str.format: the templates are full of JSON braces.
        if self.view == "timesteps":
            return head.replace("{{trajectory}}", timestep_lines(traj)), 0
        if max_tokens is None:
            return head.replace("{{trajectory}}", segments_text(traj)), 0
        if count is None:
            from oir_gym.relabel.tokens import approx_token_count as count
        block, level = compact_text(traj, lambda b: count(head.replace("{{trajectory}}", b)) <= max_tokens)
        return head.replace("{{trajectory}}", block), level

    def render_counted(self, traj: Trajectory, k: int, max_tokens: Optional[int],
                       count: Callable[[str], int]) -> tuple[str, int, int]:
        """``(prompt, compaction level, tokens)``, each text counted by ``count`` once."""
        once = lru_cache(maxsize=None)(count)
        prompt, level = self.render_fit(traj, k, max_tokens, once)
        return prompt, level, once(prompt)

    def examples(self) -> list[str]:
        """The instructions of the template's few-shot answers (the JSON after each ``Answer:``)."""
        out: list[str] = []
        for m in re.finditer(r"^Answer:\s*(\{.*\})\s*$", self.text, re.M):
            try:
                answer = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            for v in answer.values() if isinstance(answer, dict) else ():
                out += [x for x in v if isinstance(x, str)] if isinstance(v, list) else []
        return list(dict.fromkeys(out))

    def schema(self, k: int = 4) -> dict[str, Any]:
        """JSON schema of the expected answer."""
        return output_schema(k, analysis=self.analysis)


def parse_template(text: str, name: str = "custom") -> PromptTemplate:
    """Build a template from text with optional ``#| key: value`` metadata lines."""
    lines = text.splitlines()
    meta = {m.group(1).lower(): m.group(2).lower()
            for m in (re.match(r"#\|\s*(\w+)\s*:\s*(\S+)\s*$", line) for line in lines) if m}
    body_text = "\n".join(line for line in lines if not line.startswith("#|")).strip("\n")
    if "{{trajectory}}" not in body_text:
        raise ValueError(f"prompt template {name!r} has no {{{{trajectory}}}} placeholder")
    view = meta.get("view", "segments")
    if view not in ("timesteps", "segments"):
        raise ValueError(f"prompt template {name!r}: view must be 'timesteps' or 'segments', got {view!r}")
    return PromptTemplate(name, body_text, view, meta.get("analysis", "false") in ("true", "yes", "1"))


@lru_cache(maxsize=None)
def load_template(name_or_path: str = DEFAULT_TEMPLATE) -> PromptTemplate:
    """Load a packaged template by name (``"paper"``, ``"segments"``) or a custom one from a file."""
    if name_or_path in TEMPLATE_NAMES:
        text = resources.files("oir_gym.data").joinpath("prompts", f"{name_or_path}.txt").read_text()
        return parse_template(text, name_or_path)
    p = Path(name_or_path)
    if not p.is_file():
        raise ValueError(
            f"unknown prompt template {name_or_path!r}: use one of {TEMPLATE_NAMES} or a path to a .txt file"
        )
    return parse_template(p.read_text(), p.stem)


def _step_observation(traj: Trajectory, t: int) -> str:
    if traj.texts is not None:
        return traj.texts[t]
    return "events: " + (", ".join(traj.captions_at(t)) or "none")


def _step_action(traj: Trajectory, t: int) -> str:
    if traj.action_texts is not None:
        return traj.action_texts[t]
    a = int(traj.actions[t])
    return ACTION_NAMES[a] if 0 <= a < len(ACTION_NAMES) else f"action {a}"


def timestep_lines(traj: Trajectory) -> str:
    """The paper's per-timestep trajectory rendering (section 4.1)."""
    return "\n".join(f"timestep {t}: {_step_observation(traj, t)}, agent takes action {_step_action(traj, t)}"
                     for t in range(len(traj)))


def output_schema(k: int = 4, analysis: bool = False) -> dict[str, Any]:
    """JSON schema of the answer ``{"Mid-Level": [...], "High-Level": [...]}`` (``analysis``: wrapped as the paper's
    ``{"Analysis": str, "Completed Instructions": {...}}``), ``maxItems=k`` per list so small models cannot loop."""
    item = {"type": "string", "minLength": 1, "maxLength": MAX_INSTRUCTION_CHARS}
    lists = {"type": "object", "properties": {
        "Mid-Level": {"type": "array", "items": item, "minItems": 1, "maxItems": int(k)},
        "High-Level": {"type": "array", "items": item, "minItems": 0, "maxItems": int(k)},
    }, "required": ["Mid-Level", "High-Level"], "additionalProperties": False}
    if not analysis:
        return lists
    return {"type": "object", "properties": {"Analysis": {"type": "string", "maxLength": MAX_ANALYSIS_CHARS},
                                             "Completed Instructions": lists},
            "required": ["Analysis", "Completed Instructions"], "additionalProperties": False}


def instruction_gbnf(k: int = 4, analysis: bool = False, max_chars: int = MAX_INSTRUCTION_CHARS) -> str:
    """GBNF grammar of the answer JSON (:func:`output_schema`), hand-written so that instructions are
    plain words and every repetition is bounded (a 270M base model otherwise loops)."""
    k = max(1, int(k))
    rules = [
        f'item ::= "\\"" [a-zA-Z] [a-zA-Z0-9 ,\'-]{{0,{max_chars - 1}}} "\\""',
        f'list ::= "[" item ("," ws item){{0,{k - 1}}} "]"',
        'list0 ::= "[]" | list',
        'ws ::= [ ]?',
        'lists ::= "{" ws "\\"Mid-Level\\":" ws list "," ws "\\"High-Level\\":" ws list0 ws "}"',
    ]
    if analysis:
        rules.append(f'analysis ::= "\\"" [^"\\\\\\x00-\\x1f]{{0,{MAX_ANALYSIS_CHARS}}} "\\""')
        rules.insert(0, 'root ::= "{" ws "\\"Analysis\\":" ws analysis "," ws "\\"Completed Instructions\\":" ws lists ws "}"')
    else:
        rules.insert(0, "root ::= lists")
    return "\n".join(rules) + "\n"
