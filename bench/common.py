"""What the bench scripts share; importing it puts this checkout's code first on ``sys.path``."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from oir_gym.validation import int_arg, real_arg  # noqa: E402,F401  (for the scripts)


def interleaved(calls: dict, rounds: int) -> dict:
    """Each call's wall seconds in each of ``rounds`` rounds; a round makes every call in turn."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times
