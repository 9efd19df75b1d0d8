"""Bandwidth profiles as functions of time: static, steps, fluctuating, trace.

A profile is a list of change points ``(t_seconds, rate_bps)`` starting at t=0,
optionally periodic (a looped trace), plus netem impairments. The same object
drives the emulated cluster, the Kubernetes sidecar, and the link-rate column of a
run's timeline, so all three agree on what the network was at any moment.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field

from netsense import units

# Fluctuating profiles are generated up to this horizon (a day); longer runs hold
# the last rate. A day at one change per second is 86k points: cheap.
HORIZON_S = 86400.0


@dataclass(frozen=True)
class Impairments:
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0  # fraction

    @property
    def any(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss)


@dataclass
class Profile:
    points: list[tuple[float, float]]  # (t, bps), sorted, first t == 0
    period: float | None = None  # set for looped traces
    impairments: Impairments = field(default_factory=Impairments)
    _times: list[float] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._times = [t for t, _ in self.points]

    def _local(self, t: float) -> float:
        t = max(0.0, t)
        return t % self.period if self.period else t

    def index_at(self, t: float) -> int:
        """Which change point is in force at time t (counted across loops)."""
        i = bisect.bisect_right(self._times, self._local(t)) - 1
        return i + (int(t // self.period) * len(self.points) if self.period and t > 0 else 0)

    def rate_at(self, t: float) -> float:
        return self.points[bisect.bisect_right(self._times, self._local(t)) - 1][1]

    def next_change(self, t: float) -> float | None:
        """Time of the first change strictly after t, or None if the rate holds forever."""
        if len(self.points) == 1:
            return None
        local = self._local(t)
        i = bisect.bisect_right(self._times, local)
        if i < len(self._times):
            return t + (self._times[i] - local)
        return t + (self.period - local) if self.period else None

    def mean_rate(self, t0: float, t1: float) -> float:
        """Time-averaged rate over [t0, t1] (bits/s)."""
        if t1 <= t0:
            return self.rate_at(t0)
        total, t = 0.0, t0
        while t < t1:
            nxt = self.next_change(t)
            end = t1 if nxt is None else min(nxt, t1)
            total += self.rate_at(t) * (end - t)
            t = end
        return total / (t1 - t0)


def build_profile(p: dict | None) -> Profile | None:
    """From a validated profile mapping (spec.network.profile) to a Profile; None = unshaped."""
    if not p:
        return None
    imp = Impairments(
        delay_s=units.parse_duration(p.get("delay", 0)),
        jitter_s=units.parse_duration(p.get("jitter", 0)),
        loss=units.parse_fraction_or_percent(p.get("loss", 0)),
    )
    kind = p["type"]
    period = None
    if kind == "static":
        points = [(0.0, units.parse_rate(p["rate"]))]
    elif kind == "steps" and "steps" in p:
        points = _listed(p["steps"])
    elif kind == "steps":
        points = _generated_steps(p)
    elif kind == "fluctuating":
        points = _fluctuating(p)
    elif kind == "trace":
        points = _listed(p["points"])
        if p.get("loop") and len(points) > 1:
            # The last point lasts as long as the interval before it, then the trace restarts.
            period = 2 * points[-1][0] - points[-2][0]
    else:
        raise ValueError(f"unknown profile type {kind!r}")
    return Profile(points=points, period=period, impairments=imp)


def _listed(steps: list[dict]) -> list[tuple[float, float]]:
    return [(units.parse_duration(s["at"]), units.parse_rate(s["rate"])) for s in steps]


def _generated_steps(p: dict) -> list[tuple[float, float]]:
    start, end = units.parse_rate(p["from"]), units.parse_rate(p["to"])
    by, every = units.parse_rate(p["by"]), units.parse_duration(p["every"])
    sign = -1 if end < start else 1
    n = int(math.floor(abs(end - start) / by + 1e-9))
    rates = [start + sign * by * i for i in range(n + 1)]
    if abs(rates[-1] - end) > 1e-6:
        rates.append(end)
    return [(i * every, r) for i, r in enumerate(rates)]


def _fluctuating(p: dict) -> list[tuple[float, float]]:
    lo, hi = units.parse_rate(p["min"]), units.parse_rate(p["max"])
    period = units.parse_duration(p["period"])
    rng = random.Random(p.get("seed", 0))
    points: list[tuple[float, float]] = []
    if p.get("shape") == "sine":
        # Sampled every period/8: smooth enough, and each sample is one tc change.
        dt = period / 8
        n = int(min(HORIZON_S / dt, 200_000))
        mid, amp = (hi + lo) / 2, (hi - lo) / 2
        points = [(i * dt, mid + amp * math.sin(2 * math.pi * i * dt / period)) for i in range(n)]
    else:
        # A seeded random walk: every period the rate moves by up to half the range.
        rate = rng.uniform(lo, hi)
        n = int(min(HORIZON_S / period, 200_000))
        for i in range(n):
            points.append((i * period, rate))
            rate = min(hi, max(lo, rate + rng.uniform(-0.5, 0.5) * (hi - lo)))
    # tc takes whole bits per second.
    return [(t, float(round(r))) for t, r in points]


def unseen_changes(profile: Profile | None, seconds: float) -> list[float]:
    """The profile's changes (their times) that come after ``seconds`` of training: a run that trains no longer
    never meets them (none for a looped trace, which comes round again)."""
    if profile is None or profile.period:
        return []
    return [t for t, _ in profile.points[1:] if t > seconds]


def unseen_message(changes: list[float], seconds: float, what: str) -> str:
    when = ", ".join(f"{t:g} s" for t in changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3 else "")
    return (f"spec.network.profile: the link's change{'s' if len(changes) > 1 else ''} at {when} "
            f"come{'' if len(changes) > 1 else 's'} after {what} of {seconds:.3g} s: never seen")
