"""Shared by the benchmark scripts."""

import time


def best_of(repeats: int, fn, clock=time.perf_counter) -> float:
    """The fastest of `repeats` timings of fn() by `clock` (wall clock unless told), in seconds: the least
    disturbed by other load."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)
