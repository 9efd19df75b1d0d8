"""A clock the test sets: stands in for time.monotonic, time.perf_counter or time.time (no sleeping, nothing
to flake)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def at(self, t: float) -> FakeClock:
        self.t = t
        return self
