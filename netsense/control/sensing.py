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
