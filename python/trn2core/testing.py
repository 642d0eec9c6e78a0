"""Helpers shared by the demo, the benchmarks and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["best_of"]


def best_of(fn: Callable[[], object], repeat: int = 5, *, warmup: bool = False) -> float:
    """The fastest of ``repeat`` wall-clock timings of ``fn()``, in seconds (these machines are
    small and shared: the minimum is the least noisy estimate). ``warmup`` runs ``fn`` once
    first, untimed (thread pool start, first-touch page faults)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
