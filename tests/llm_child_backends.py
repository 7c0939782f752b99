"""Small backend classes that the LLM child process builds from a ``"llm_child_backends:Class"`` spec.

Not a test module (no ``test_`` prefix): the spawned child imports it by name (pytest puts this
folder on ``sys.path``, and a spawned child inherits the parent's ``sys.path``).

:class:`SegmentsBackend` is a real (if tiny) backend: it answers the relabeler's segments prompt
from the segments it reads, so a child running it does real work that can be killed mid-run. The
other classes inject faults a real model cannot produce on demand: an illegal instruction at
start-up (the AVX-512/AMX llama.cpp crash), a hang, a real segmentation fault.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import time
from typing import Optional

_LINE = re.compile(r"^\d+(?:-\d+)?: (.+?)(?: \(x\d+\))?$")


class SegmentsBackend:
    """Answers a segments prompt with the events of its last ``Segments:`` block (movement dropped).

    Args:
        delay: seconds each ``generate`` call takes (so that a kill can land mid-call).
        pid_file: where the child writes its process id when built (for tests that kill it).
    """

    token_method = "words"

    def __init__(self, delay: float = 0.0, pid_file: Optional[str] = None) -> None:
        self.delay = float(delay)
        self.model = "segments-echo"
        if pid_file:
            with open(pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def answer(self, prompt: str) -> str:
        if "Segments:" not in prompt:  # the ELLM prompt: a goal for what the agent faces
            facing = re.findall(r"Facing: ([a-z ]+)", prompt)
            goal = {"tree": "collect wood", "water": "drink water", "cow": "eat cow"}.get(facing[-1] if facing else "")
            return json.dumps({"Mid-Level": [goal or "collect sapling"], "High-Level": []})
        block = prompt.rsplit("Segments:", 1)[-1]
        events = []
        for line in block.splitlines():
            m = _LINE.match(line.strip())
            if m and m.group(1) not in ("move", "wait", "noop") and m.group(1) not in events:
                events.append(m.group(1))
        return json.dumps({"Mid-Level": events[:4], "High-Level": []})

    def generate(self, prompts, n=1, *, schema=None):
        if self.delay:
            time.sleep(self.delay)
        return [[self.answer(p)] * n for p in prompts]


class SigillAtStart:
    """Fault injection: the process gets SIGILL while the backend is built, as a natively built
    llama.cpp does on a CPU without the instructions it was compiled for (a real library cannot
    be made to do this on demand on every machine)."""

    def __init__(self, **_: object) -> None:
        os.kill(os.getpid(), signal.SIGILL)

    def generate(self, prompts, n=1, *, schema=None):  # pragma: no cover - never reached
        return [[""] * n for _ in prompts]


class HangsInGenerate:
    """Fault injection: ``generate`` never returns (a deadlocked native library)."""

    def __init__(self, **_: object) -> None:
        pass

    def generate(self, prompts, n=1, *, schema=None):
        time.sleep(3600)
        return [[""] * n for _ in prompts]


class SegfaultsInGenerate:
    """A real native fault: ``generate`` reads address 0 through ctypes (SIGSEGV in the child)."""

    def __init__(self, **_: object) -> None:
        pass

    def generate(self, prompts, n=1, *, schema=None):
        ctypes.string_at(0)
        return [[""] * n for _ in prompts]
