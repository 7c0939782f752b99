"""Timing shared by the bench scripts."""

import time


def interleaved(calls: dict, rounds: int) -> dict:
    """Each call's wall seconds in each of ``rounds`` rounds; a round makes every call in turn."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return times
