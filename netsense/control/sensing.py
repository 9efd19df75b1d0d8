"""Network sensing from the collectives themselves (BBR's model, per training step).

For each step we observe the bytes the step's collectives put on the wire, D,
and the time they were busy, t (the union of their [launch, completion]
intervals, so overlapping buckets are not double counted). A collective's busy
time is a fixed part L (per-message overhead, the wait for the slowest rank to
launch) plus the transfer::

    t = L + D / B

The paper takes every step's D/t as a sample of the bottleneck bandwidth B and
keeps the windowed max. On a faithful link that reads far below B whenever D/B
is not large against L: TopK at 1% on a 1 Gbit/s link read 100-250 Mbit/s. BBR
has the answer: a delivery-rate sample measures the link only when the sender
had enough data in flight to fill it; an *application-limited* sample may raise
the estimate, never lower it. Here (``LinkEstimator``):

- L is what the model leaves over, ``t - D/B``, over recent steps (those
  whose transfer is under half their time, where three are: of a step
  that was mostly transfer it leaves a small difference of large numbers):
  its median says how long a typical step's fixed part is, its lower quartile
  how short one can be (it varies 5-25 ms here: two workers on two shared
  cores launch their collectives milliseconds apart). Until three steps have
  told it, a sample can only raise the estimate;
- a step is app-limited when its payload would cross the estimated link in
  less than ``fill`` x the median L: its D/t says more about L than about B;
- a measuring step's sample is ``D / (t - L_low)``, the lower quartile taken
  off: at most ``1 + 1/fill`` above D/t, and above the link only for a step
  whose fixed part was shorter than three in four;
- BtlBw is the max of the last ``window`` measuring samples (app-limited ones
  join only when they read higher): a max filter that ages out;
- a drop must not wait for the filter to age: ``drop_after`` steps running
  whose busy time is over twice what the model predicts (L + D/B), app-limited
  or not, replace the estimate with the rate they imply, D / (t - L). One slow
  app-limited step (a rank held up) does not; one slow *measuring* step does.
  Until L has been read off a step that was mostly fixed time, the least busy
  time a collective (which L cannot exceed) stands in for it there: a
  startup's probes alone leave L near 0, and on set 2 that made the first
  small step after them a "measuring" drop from 335 to 101 Mbit/s (seed 447
  of dev-overlap-set2).
  Small steps see a drop only while L is shorter than their transfer at the new
  rate: where L had grown (two workers on two cores: 20-30 ms) 86 kB steps took
  30-40 ms at 30 Mbit/s, never twice the 25 ms predicted at 250, and L's median
  took the transfer in. Only a probe could tell, and one probe was not enough:
  on set 2's step-wise link two runs of nine (dev-pilot-final-set2) kept 78 and
  249 Mbit/s through the 30 Mbit/s phase, their probes sized from that (up to a
  dense step, 1.05 s) and each dropped as one slow step (testbed/EVALUATION.md);
- capacity freed after a drop shows as soon as a measuring sample reads higher;
  a controller whose payloads are all app-limited must probe with larger ones,
  ``probe_bytes`` (tta does).

A step whose collectives run one after another (PowerSGD: the P's all_reduce, waited for, then the Q's) pays L
once for each: ``observe(..., rounds=2)`` reads its left-over time as 2 L and predicts it as 2 L + D / B, so that
``fixed`` stays one collective's L whichever family ran (read as one, a PowerSGD step's L was twice a TopK step's).

What a controller plans with is not BtlBw. A max filter holds a link's last peak, and a link that swings
(20-300 Mbit/s, a new rate every second) spends most of its time below it: priced at the peak, tta ran at
3.5-10% density where 0.3% TopK or PowerSGD was fastest, and sized probes that took a second when they went
out in a trough. A payload's expected seconds over the next steps are its bytes times the mean of 1/B, so
``sustained`` is the harmonic mean of the rates the link was seen to hold since it last rose (measuring samples
and drops; a rise, an app-limited step that reads above BtlBw or a measuring one above it by more than a sample's
error, says the link holds at least that now and restarts them), never above BtlBw (after a drop BtlBw is the drop's rate at once); BtlBw itself until
``SUSTAINED_MIN`` are in. So a startup's probes, each a raise, plan at the latest, and on a swinging link the
troughs read since its last rise pull the plan down (a sample within its own error of BtlBw counts as BtlBw:
a steady link is planned at BtlBw). ``floor`` is the least of them: the slowest the link was
seen lately, what a probe's cost is bounded by (tta).

RTprop, the least busy time of a recent step, is the paper's; BDP = BtlBw x RTprop.
"""

from __future__ import annotations

import statistics
from collections import deque


def transfer_rate(wire_bytes: float, busy: float, rounds: int, fixed: float) -> float:
    """The rate a step's transfer ran at: its bytes over its busy time less ``rounds`` fixed parts (never less than
    half the busy time: a fixed part read too long must not make a step look faster than twice its plain rate)."""
    return wire_bytes / max(busy - rounds * fixed, busy / 2)


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


class LinkEstimator:
    """Bottleneck bandwidth (bytes/s) and the collectives' fixed time from per-step samples.

    See the module docstring for the model. ``last_sample`` says what the latest
    step was taken for: "measure", "app-limited", "raise" (app-limited, read
    higher), "slow" (over twice the prediction) or "drop" (the estimate fell).
    """

    LEARN_FIXED = 3  # steps of residuals before L is trusted
    SUSTAINED_MIN = 2  # measured rates before ``sustained`` is their harmonic mean rather than BtlBw

    def __init__(self, window: int = 10, fill: float = 4.0, drop_after: int = 2, memory: int = 16):
        self.fill, self.drop_after = fill, drop_after
        self.btlbw = WindowedExtreme(window, use_max=True)
        self.rtprop = WindowedExtreme(window, use_max=False)
        # (D, t, rounds) of recent steps: the fixed part of each is (t - D/B) / rounds at the *current* estimate B,
        # so a step taken while B was still underestimated (a small first payload, the startup's) is not read as a
        # short L.
        self.steps: deque[tuple[float, float, int]] = deque(maxlen=memory)
        self.slow: list[float] = []  # implied rates of the slow steps running
        self.measured: deque[float] = deque(maxlen=window)  # rates the link held since it last rose
        self.last_sample = ""

    @property
    def bandwidth(self) -> float:
        """Estimated bottleneck bandwidth, bytes/s (0 before any sample)."""
        return self.btlbw.value()

    @property
    def residuals(self) -> list[float]:
        """(t - D/B) / rounds of the recent steps, at the current estimate: what the model leaves over, the fixed
        part of one collective. Only the steps whose transfer at B is under half their busy time, where there are
        three or more: a step that was mostly transfer leaves the small difference of two large numbers, near 0 for the
        probe whose own sample set B (and a startup holds little else: on set 2 a 3.1 MB probe left 0.5 ms where
        the small steps left 2-7 ms, and two small steps after it read as twice the prediction, a false drop
        from 366 to 102 Mbit/s, seed 431 of dev-overlap-set2)."""
        return self._fixed_parts()[0]

    def _fixed_parts(self) -> tuple[list[float], bool]:
        """The residuals, and whether they come from steps that were mostly fixed time."""
        b = self.bandwidth
        if b <= 0:
            return [], False
        left = [(max(0.0, t - d / b) / n, d / b < t / 2) for d, t, n in self.steps]
        mostly_fixed = [r for r, fixed in left if fixed]
        if len(mostly_fixed) >= self.LEARN_FIXED:  # fewer: one of them a rank held up, or the drop itself
            return mostly_fixed, True
        return [r for r, _ in left], False

    @property
    def fixed(self) -> float:
        """L: one collective's fixed seconds in a typical step (median of what the model leaves over)."""
        return statistics.median(self.residuals) if self.steps else 0.0

    @property
    def fixed_low(self) -> float:
        """The lower quartile of L: how short the fixed part of a step can be."""
        residuals = self.residuals
        if len(residuals) < 2:
            return 0.0
        return statistics.quantiles(residuals, n=4)[0]

    @property
    def probe_bytes(self) -> float:
        """A payload large enough to measure the link: ``fill`` x L on the wire at the estimated rate."""
        return self.fill * self.fixed * self.bandwidth

    @property
    def sample_error(self) -> float:
        """How far under the link a measuring sample may read (its payload at least ``fill`` fixed parts): 1 + 1/fill."""
        return 1 + 1 / self.fill

    @property
    def sustained(self) -> float:
        """A rate the link will hold over the next steps (bytes/s): the harmonic mean of the rates it held since
        it last rose, never above BtlBw; BtlBw until SUSTAINED_MIN are in."""
        b = self.bandwidth
        if len(self.measured) < self.SUSTAINED_MIN:
            return b
        # A measuring sample reads the link low by up to its unmeasured fixed part, at most 1 / (1 + 1/fill) of it
        # (0.8 at fill 4): one within that of BtlBw read the same link, and counts as BtlBw. Only slower ones (a
        # trough, a drop) pull the plan down; a steady link is planned at BtlBw.
        same = b / self.sample_error
        return min(b, len(self.measured) / sum(1 / (b if r >= same else r) for r in self.measured))

    @property
    def floor(self) -> float:
        """The least rate the link held since it last rose, bytes/s (0 before any)."""
        return min(self.measured, default=0.0)

    RECENT_STEPS = 3  # steps whose rates say what the link does now (``recent``)

    @property
    def recent(self) -> float:
        """What the last steps say the link does now, bytes/s: the median of their bytes over their busy time less
        the fixed part's lower quartile. Conservative: an app-limited step reads under the link (its fixed part
        longer than the quartile), so it is a rate the link surely has; after a fall that the small steps cannot
        prove (twice their prediction), it is the fall's. 0 before any step."""
        steps = list(self.steps)[-self.RECENT_STEPS:]
        if not steps:
            return 0.0
        low = self.fixed_low
        return statistics.median(transfer_rate(d, t, n, low) for d, t, n in steps)

    @property
    def rtt(self) -> float:
        """RTprop: the least busy time of a recent step, seconds."""
        return self.rtprop.value()

    @property
    def bdp(self) -> float:
        return self.bandwidth * self.rtt

    def observe(self, wire_bytes: float, busy_seconds: float, rounds: int = 1, probe: bool = False) -> None:
        """One step: the bytes its collectives put on the wire, the time they were busy, how many ran one after
        another (each pays L), and whether it was a probe (sent to read the link: slow, it is the drop itself)."""
        if wire_bytes <= 0 or busy_seconds <= 0:
            return
        d, t = wire_bytes, busy_seconds
        self.rtprop.add(t)
        b = self.bandwidth
        rate = d / t
        if b == 0:
            self.btlbw.add(rate)
            self.last_sample = "measure"
            return
        residuals, measured = self._fixed_parts()
        fixed = statistics.median(residuals) if residuals else 0.0  # self.fixed, its parts read once
        known = len(self.steps) >= self.LEARN_FIXED  # until L is known, a sample can only raise
        # L read off transfers alone (a startup's probes) is too short to judge a step by: there the least busy
        # time a collective, which L cannot exceed, stands in for it.
        limit = fixed if measured or not self.steps else max(fixed, min(s / n for _, s, n in self.steps))
        self.steps.append((d, t, rounds))
        if known and t > 2 * (rounds * limit + d / b):
            self.slow.append(transfer_rate(d, t, rounds, fixed))
            self.last_sample = "slow"
            # A probe (or a measuring payload) twice as slow as predicted is the drop itself, not a rank held up: it
            # was sent because the small steps cannot lower the estimate, and the next one is steps away. A probe
            # bounded to a few steps' time (tta) may be too small to be a measuring payload at the old estimate.
            if len(self.slow) >= self.drop_after or probe or d / b >= self.fill * limit:
                self.btlbw.clear()
                self.btlbw.add(max(self.slow))
                self.measured.append(max(self.slow))
                self.steps.clear()
                self.slow.clear()
                self.last_sample = "drop"
            return
        self.slow.clear()
        if known and d / b >= self.fill * fixed:
            sample = transfer_rate(d, t, rounds, self.fixed_low)
            if sample > self.sample_error * b:  # above BtlBw by more than a sample's error: the link rose
                self.measured.clear()
            self.btlbw.add(sample)
            self.measured.append(sample)
            self.last_sample = "measure"
        elif rate > b:
            self.btlbw.add(rate)
            self.measured.clear()  # the link holds at least this now: the slower rates read before are history
            self.measured.append(rate)
            self.last_sample = "raise"
        else:
            self.last_sample = "app-limited"
