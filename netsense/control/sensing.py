"""Network sensing from the collectives themselves (BBR's model, per training step).

For each step we observe the bytes the step's collectives put on the wire and
the time they were busy (the union of their [launch, completion] intervals, so
overlapping buckets are not double counted):

    EBB    = bytes / busy_seconds          effective bandwidth of that step
    BtlBw  = max(EBB)  over the last W steps
    RTprop = min(busy_seconds) over the last W steps
    BDP    = BtlBw * RTprop

The paper defines these per "gradient transmission"; a step is the unit on
which every rank can agree (see compression.hooks), so we sense per step.
"""

from __future__ import annotations

import statistics
from collections import deque


class WindowedExtreme:
    """max (or min) of the last ``window`` samples."""

    def __init__(self, window: int, use_max: bool = True):
        self.samples: deque[float] = deque(maxlen=window)
        self.pick = max if use_max else min

    def add(self, x: float) -> None:
        self.samples.append(x)

    def value(self, default: float = 0.0) -> float:
        return self.pick(self.samples) if self.samples else default

    def clear(self) -> None:
        self.samples.clear()


class BottleneckEstimator:
    def __init__(self, window: int = 10):
        self.btlbw = WindowedExtreme(window, use_max=True)  # bytes/s
        self.rtprop = WindowedExtreme(window, use_max=False)  # seconds

    def observe(self, wire_bytes: float, busy_seconds: float) -> None:
        if wire_bytes <= 0 or busy_seconds <= 0:
            return
        self.btlbw.add(wire_bytes / busy_seconds)
        self.rtprop.add(busy_seconds)

    @property
    def bandwidth(self) -> float:
        """Estimated bottleneck bandwidth, bytes/s (0 before any sample)."""
        return self.btlbw.value()

    @property
    def rtt(self) -> float:
        return self.rtprop.value()

    @property
    def bdp(self) -> float:
        return self.bandwidth * self.rtt


class LinkEstimator:
    """Bandwidth from steps whose payloads may be too small to fill the link.

    A collective's busy time is a fixed part (per-message overhead, and the wait
    for the slowest rank) plus the transfer. Where the payload is small the
    fixed part dominates and bytes/busy reads far below the link: TopK at 1% on
    a 1 Gbit/s link read 100-250 Mbit/s, and a controller that believes that
    compresses more, which shrinks the payload further. So every step's
    bytes/busy is taken for what it is, a lower bound on the bandwidth:

    - the estimate is the largest lower bound so far (a dense step, or a probe,
      measures the link; small payloads after it cannot lower it however long
      they last);
    - but ``window`` steps in a row whose busy time is at least twice the usual
      (the median of the last ``memory``) and whose rate is under half the
      estimate replace it at once: a drop that matters shows within ``window``
      steps, while one slow step (a rank held up) does not;
    - capacity freed after a drop is found by probing with larger payloads (the
      controller's job).

    Subtracting the fixed part from the busy time instead over-estimates the
    link (the least busy time includes some transfer, and a shaper's burst
    makes small payloads look fast): 200 Mbit/s read as 500-1000.
    """

    def __init__(self, window: int = 3, memory: int = 32):
        self.window = window
        self.busy: deque[float] = deque(maxlen=memory)
        self.recent: deque[float] = deque(maxlen=window)
        self.best = 0.0

    def observe(self, wire_bytes: float, busy_seconds: float) -> None:
        if wire_bytes <= 0 or busy_seconds <= 0:
            return
        rate = wire_bytes / busy_seconds
        if self.busy and busy_seconds >= 2 * statistics.median(self.busy):
            self.recent.append(rate)
        else:
            self.recent.clear()
        self.busy.append(busy_seconds)
        self.best = max(self.best, rate)
        if len(self.recent) == self.window and max(self.recent) < self.best / 2:
            self.best = max(self.recent)
            self.recent.clear()

    @property
    def bandwidth(self) -> float:
        """Estimated bottleneck bandwidth, bytes/s (0 before any sample)."""
        return self.best

    @property
    def latency(self) -> float:
        """The least busy time of a step lately, seconds (the collectives' fixed part, and some transfer)."""
        return min(self.busy) if self.busy else 0.0
