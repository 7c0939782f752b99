"""Turn raw LLM text into candidate instructions, whatever the model emitted.

Real models wrap their JSON in ``<think>`` blocks (Qwen3), code fences and prose, use trailing
commas or single quotes, get cut off by ``max_tokens``, or loop until the output is huge. The
parser tries, in order: strict JSON on the first balanced ``{...}``/``[...]``, the same after
light repairs (trailing commas, single quotes, Python literals), ``ast.literal_eval``, a tolerant
scanner that salvages every *complete* string item of a truncated answer, and finally a bullet or
numbered list. It never raises: problems are counted in a :class:`collections.Counter` of reasons.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from oir_gym.relabel.filters import CandidateFilter

#: Raw completions longer than this are cut before parsing (a looping model can emit megabytes).
MAX_INPUT_CHARS = 20_000
#: At most this many items are taken from one completion (before filtering).
MAX_ITEMS = 64

#: Reasons in the returned Counter that are notes about the input, not dropped candidates.
NOTE_REASONS = frozenset({
    "binary_input", "non_string_input", "input_capped", "nul_bytes", "think_block", "unclosed_think",
    "salvaged_json", "bullet_fallback",
})

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S | re.I)
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)(?:```|\Z)", re.S)
_BULLET = re.compile(r"^\s*(?:[-*\u2022+]|\d{1,2}[.)])\s+(.+?)\s*$")
_ITEM_KEYS = ("instruction", "text", "task", "goal", "description")


@dataclass
class ParsedOutput:
    """Instructions found in one completion, before filtering: the ``Mid-Level`` list, the
    ``High-Level`` list, strings from any other list (``flat``), and counted problems (``reasons``)."""

    mid: list[str] = field(default_factory=list)
    high: list[str] = field(default_factory=list)
    flat: list[str] = field(default_factory=list)
    reasons: Counter = field(default_factory=Counter)

    @property
    def all(self) -> list[str]:
        """Mid-level first (most often grounded), then high-level, then the rest."""
        return self.mid + self.high + self.flat


def _to_text(raw: Any, reasons: Counter) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, (bytes, bytearray)):
        reasons["binary_input"] += 1
        return bytes(raw).decode("utf-8", errors="replace")
    if raw is None:
        return ""
    reasons["non_string_input"] += 1
    try:
        return str(raw)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return ""


def _strip_reasoning(text: str, reasons: Counter) -> str:
    if "<think>" in text.lower() or "</think>" in text.lower():
        reasons["think_block"] += 1
        text = _THINK_BLOCK.sub(" ", text)
        low = text.lower()
        if "</think>" in low:  # template opened <think> for the model: keep what follows
            text = text[low.rindex("</think>") + len("</think>"):]
            low = text.lower()
        if "<think>" in low:  # never closed (truncated while thinking): the rest is reasoning
            reasons["unclosed_think"] += 1
            text = text[: low.index("<think>")]
    return text


def _unfence(text: str) -> str:
    blocks = [b for b in _FENCE.findall(text) if "{" in b or "[" in b]
    return blocks[0] if blocks else text.replace("```", " ")


def _balanced_span(text: str, start: int) -> tuple[int, bool]:
    """End index (exclusive) of the bracket group opened at ``start`` and whether it closed."""
    stack, quote, i, n = [], None, start, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c == '"' or (c == "'" and (i == 0 or text[i - 1] in "[{,: \n\t")):
            quote = c  # a single quote only opens a string where a value can start
        elif c in "[{":
            stack.append("]" if c == "[" else "}")
        elif c in "]}":
            if stack and stack[-1] == c:
                stack.pop()
                if not stack:
                    return i + 1, True
            else:
                return i, False
        i += 1
    return n, False


_TRAILING_COMMA = re.compile(r",\s*([\]}])")
_SINGLE_QUOTED = re.compile(r"(?<=[\[{,:\s])'((?:[^'\\\n]|\\.)*)'(?=\s*[\]}:,])")


def _repair(s: str) -> str:
    s = _TRAILING_COMMA.sub(r"\1", s)
    s = _SINGLE_QUOTED.sub(lambda m: json.dumps(m.group(1).replace("\\'", "'")), s)
    s = re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", re.sub(r"\bNone\b", "null", s)))
    return _TRAILING_COMMA.sub(r"\1", s)


def _loads(s: str) -> Any:
    for attempt in (s, _repair(s)):
        with contextlib.suppress(ValueError, RecursionError):
            return json.loads(attempt)
    with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        if len(s) < 8000:  # literal_eval is recursive; keep it away from huge inputs
            return ast.literal_eval(s)
    raise ValueError("not JSON")


def _key_kind(key: str) -> str:
    k = re.sub(r"[^a-z]", "", key.lower())
    if k.startswith("mid") or k in ("atomic", "lowlevel", "low"):
        return "mid"
    if k.startswith("high") or k in ("multistep", "compound"):
        return "high"
    if k in ("analysis", "reasoning", "thought", "thoughts", "explanation"):
        return "skip"
    return "flat"


def _add(out: ParsedOutput, kind: str, text: str) -> None:
    if len(out.mid) + len(out.high) + len(out.flat) >= MAX_ITEMS:
        out.reasons["items_capped"] += 1
        return
    getattr(out, kind if kind in ("mid", "high") else "flat").append(text)


def _collect(obj: Any, kind: str, out: ParsedOutput, depth: int = 0) -> None:
    if depth > 8 or len(out.all) >= MAX_ITEMS:
        return
    if isinstance(obj, dict):
        for key, val in obj.items():
            k = _key_kind(str(key))
            if k == "skip":
                continue
            _collect(val, k if k != "flat" else kind, out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            if isinstance(v, str):
                _add(out, kind, v)
            elif isinstance(v, dict):
                texts = [v[k] for k in _ITEM_KEYS if isinstance(v.get(k), str)]
                if texts:
                    _add(out, kind, texts[0])
                else:
                    _collect(v, kind, out, depth + 1)
            elif isinstance(v, (list, tuple)):
                _collect(v, kind, out, depth + 1)
    # bare strings outside lists (e.g. "Analysis") are not instructions


_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\')((?:[^\'\\\n]|\\.)*)\'|([\[\]{}:,])', re.S)


def _salvage(text: str, out: ParsedOutput) -> None:
    """Tolerant scan of (possibly truncated) JSON: every complete string inside a list is kept,
    attributed to the nearest enclosing key; an unterminated last string is dropped."""
    # frames: [container ("[" or "{"), kind of the list items, pending key in an object]
    frames: list[list] = []
    last_str: str | None = None
    for m in _TOKEN.finditer(text):
        if len(out.all) >= MAX_ITEMS:
            break
        s = m.group(1) if m.group(1) is not None else m.group(3)
        p = m.group(4)
        if s is not None:
            if m.group(1) is not None:
                with contextlib.suppress(ValueError):
                    s = json.loads(f'"{s}"')
            if frames and frames[-1][0] == "[" and frames[-1][1] != "skip":
                _add(out, frames[-1][1], s)
            last_str = s
            continue
        if p == ":" and frames and frames[-1][0] == "{" and last_str is not None:
            frames[-1][2] = last_str
        elif p in "[{":
            parent_kind = frames[-1][1] if frames else "flat"
            if frames and frames[-1][0] == "{" and frames[-1][2] is not None:
                k = _key_kind(frames[-1][2])
                parent_kind = parent_kind if k == "flat" else k
            frames.append([p, parent_kind, None])
        elif p in "]}":
            if frames:
                frames.pop()
        elif p == "," and frames and frames[-1][0] == "{":
            frames[-1][2] = None
        last_str = None


def parse_completion(raw: Any, max_chars: int = MAX_INPUT_CHARS) -> ParsedOutput:
    """Extract instruction lists from one raw completion (never raises)."""
    out = ParsedOutput()
    try:
        _parse_into(raw, max_chars, out)
    except Exception as e:  # noqa: BLE001 - the parser must never break the training loop
        out.reasons[f"parser_error:{type(e).__name__}"] += 1
    return out


def _parse_into(raw: Any, max_chars: int, out: ParsedOutput) -> None:
    reasons = out.reasons
    text = _to_text(raw, reasons)
    if len(text) > max_chars:
        reasons["input_capped"] += 1
        text = text[:max_chars]
    if "\x00" in text:
        reasons["nul_bytes"] += 1
        text = text.replace("\x00", " ")
    text = _strip_reasoning(text, reasons)
    text = _unfence(text)
    if not text.strip():
        reasons["empty_output"] += 1
        return
    starts = [i for i, c in enumerate(text) if c in "{["][:20]
    for start in starts:
        end, closed = _balanced_span(text, start)
        if not closed:
            break
        try:
            obj = _loads(text[start:end])
        except ValueError:
            continue
        before = len(out.all)
        _collect(obj, "flat", out)
        if len(out.all) > before or isinstance(obj, dict):
            return
    # truncated or broken JSON: salvage the complete strings
    if starts:
        before = len(out.all)
        _salvage(text[starts[0]:], out)
        if len(out.all) > before:
            reasons["salvaged_json"] += 1
            return
    for line in text.splitlines()[:MAX_ITEMS * 4]:
        m = _BULLET.match(line)
        if m:
            _add(out, "flat", m.group(1).strip().strip('"\''))
    if out.flat:
        reasons["bullet_fallback"] += 1
    else:
        reasons["no_instructions_found"] += 1


def parse_candidates(
    raw: Any, candidate_filter: CandidateFilter | None = None, max_chars: int = MAX_INPUT_CHARS
) -> tuple[list[str], Counter]:
    """Raw completion -> ``(candidates, reasons)``: filtered (default :class:`CandidateFilter()`),
    normalised, de-duplicated strings, and counts of parse problems and dropped items (never raises)."""
    parsed = parse_completion(raw, max_chars)
    kept, dropped = (candidate_filter or CandidateFilter()).filter(parsed.all)
    return kept, parsed.reasons + dropped
