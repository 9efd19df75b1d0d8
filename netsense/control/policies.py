"""Ratio policies: how much of the gradient to send in the next step.

Pure Python, no torch. Every policy sees only inputs that all ranks agree on
(the hook averages each rank's measurements with a tiny all_reduce before they
reach the policy), so every rank makes the same decision: the same density, the
same k, the same collective.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from netsense.control.sensing import BottleneckEstimator

VALUE_BYTES = {False: 4, True: 2}  # fp32 / fp16
INDEX_BYTES = 4  # int32


@dataclass(frozen=True)
class Decision:
    density: float = 1.0  # fraction of elements sent
    fp16: bool = False  # values as 16-bit
    dense: bool = True  # dense allreduce (else sparse all_gather of values+indices)
    prune: float = 0.0  # fraction of smallest-|weight| entries zeroed first


@dataclass(frozen=True)
class StepMeasurement:
    """One step, as agreed by all ranks."""

    wire_bytes: float  # per rank
    payload_bytes: float  # compressed payload per rank (values+indices, or dense)
    comm_seconds: float  # busy time of the step's collectives
    compute_seconds: float  # step time minus exposed communication
    grad_norm: float  # L2 norm of the (uncompressed) gradient
    selection_seconds: float = 0.0  # time spent selecting/packing sparse values
    elements_sent: float = 0.0  # gradient elements selected (sparse path)


def dense_allreduce_bytes(n: int, world: int, fp16: bool = False) -> float:
    """Ring allreduce: each rank sends 2(N-1)/N of the buffer."""
    return 2 * (world - 1) / world * n * VALUE_BYTES[fp16] if world > 1 else 0.0


def sparse_allgather_bytes(k: int, world: int, fp16: bool = False) -> float:
    """Ring all_gather of k values + k int32 indices: each rank sends (N-1) chunks."""
    return (world - 1) * k * (VALUE_BYTES[fp16] + INDEX_BYTES)


class Policy:
    def update(self, m: StepMeasurement) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def decide(self) -> Decision:  # pragma: no cover - interface
        raise NotImplementedError

    def telemetry(self) -> dict:
        return {}


class FixedDensity(Policy):
    """topk: always the same density."""

    def __init__(self, density: float):
        self.decision = Decision(density=density, dense=False)

    def update(self, m: StepMeasurement) -> None:
        pass

    def decide(self) -> Decision:
        return self.decision


class PaperAIMD(Policy):
    """NetSenseML as published (Algorithms 1 and 2), every constant a parameter.

    Sensing: BtlBw = windowed max of payload/RTT, RTprop = windowed min of RTT,
    BDP = BtlBw*RTprop, with payload = the compressed bytes of a step and RTT its
    collective time. Update::

        payload > fraction * BDP  ->  ratio *= alpha      (multiplicative decrease)
        otherwise                 ->  ratio += beta       (additive increase)

    Start-up (the paper mentions one without detail): the ratio doubles each step
    until the first decrease, like BBR's/TCP's slow start.
    Reduction: fp16 values when ratio < trq and the gradient's L2 norm > trd,
    which halves the bytes per value and so doubles the ratio; pruning of the
    smallest-|weight| entries at prune_factor * (1 - ratio); TopK at the ratio.

    trq = 0.1: below 10% density an element costs 4 bytes of index plus its
    value, so fp16 values cut the payload by a third where compression is
    heavy, and above it the precision is worth more than the bytes.
    trd = 1e-3: below that norm many entries would flush to zero in fp16.
    """

    def __init__(self, alpha=0.5, beta=0.01, fraction=0.9, initial=0.01, min_ratio=0.001,
                 max_ratio=1.0, startup=True, window=10, quantize=True, trq=0.1, trd=1e-3,
                 prune_factor=0.5):
        self.alpha, self.beta, self.fraction = alpha, beta, fraction
        self.min_ratio, self.max_ratio = min_ratio, max_ratio
        self.ratio = initial
        self.in_startup = startup
        self.quantize, self.trq, self.trd = quantize, trq, trd
        self.prune_factor = prune_factor
        self.sensor = BottleneckEstimator(window)
        self.grad_norm = 0.0

    def update(self, m: StepMeasurement) -> None:
        self.grad_norm = m.grad_norm
        self.sensor.observe(m.payload_bytes, m.comm_seconds)
        if m.payload_bytes <= 0:
            return
        if m.payload_bytes > self.fraction * self.sensor.bdp:
            self.ratio *= self.alpha
            self.in_startup = False
        elif self.in_startup:
            self.ratio *= 2
        else:
            self.ratio += self.beta
        self.ratio = min(self.max_ratio, max(self.min_ratio, self.ratio))

    def decide(self) -> Decision:
        fp16 = self.quantize and self.ratio < self.trq and self.grad_norm > self.trd
        density = min(1.0, self.ratio * 2 if fp16 else self.ratio)
        return Decision(density=density, fp16=fp16, dense=False,
                        prune=self.prune_factor * (1 - self.ratio))

    def telemetry(self) -> dict:
        return {"ratio": self.ratio, "est_btlbw": self.sensor.bandwidth, "est_rtprop": self.sensor.rtt}


class SelectionCost:
    """Selection time per step as ``fixed + per_element * k``, fitted online.

    Selecting TopK costs a pass over the whole gradient whatever k is (sampling,
    thresholds, the scan: the fixed part) plus packing and decoding the k chosen
    entries (the per-element part). Only the per-element part is a price of
    sending more, so only it is weighed against the wire. It is the slope of a
    least-squares line through the last ``window`` (k, seconds) points; while k
    has barely varied the slope cannot be told apart from the intercept, and the
    whole cost is charged per element (an over-estimate: it compresses more).
    """

    def __init__(self, window: int = 16, min_spread: float = 0.1):
        self.points: deque[tuple[float, float]] = deque(maxlen=window)
        self.min_spread = min_spread
        self.slope: float | None = None

    def add(self, elements: float, seconds: float) -> None:
        if elements > 0 and seconds > 0:
            self.points.append((elements, seconds))
            self._fit()

    def _fit(self) -> None:
        n = len(self.points)
        km = sum(k for k, _ in self.points) / n
        sm = sum(t for _, t in self.points) / n
        var = sum((k - km) ** 2 for k, _ in self.points) / n
        if n >= 3 and math.sqrt(var) >= self.min_spread * km:
            cov = sum((k - km) * (t - sm) for k, t in self.points) / n
            self.slope = min(max(0.0, cov / var), sm / km)
        elif self.slope is None:
            self.slope = sm / km

    @property
    def per_element(self) -> float:
        return self.slope or 0.0


class OverlapController(Policy):
    """Ours: compress only as much as the network requires, sized by compute time.

    With B = the estimated bandwidth (bytes/s) and C = the measured compute
    seconds of a step (its time less exposed communication and selection), the
    step's communication may add ``budget * C`` seconds, and we send the most
    gradient that fits:

    1. dense fp32 allreduce if its wire time fits (no compression at all);
    2. else dense fp16 if that fits;
    3. else TopK with fp16 values at the largest k with
       ``k * ((N-1) * 6 / B + s) <= budget * C``, s the per-element selection
       cost (SelectionCost: on CPUs packing an element costs a fifth to all of
       its wire time, so ignoring it trades network time for CPU time), but
       never below ``min_density``; or dense fp16 if the sparse all_gather of
       that k would put more bytes on the wire.

    Why: if a step at density d makes d^a of a dense step's progress, progress
    per second d^a / (C + cost(d)) peaks where cost = a/(1-a) * C, so the budget
    is a/(1-a). With error feedback a is small above a knee and large below it:
    on the digits grid TopK needs 29 steps dense, 38 at 1% (a = 0.06 between
    them) and 60 at 0.3% (a = 0.38 below 1%). Hence a small budget (0.25: a step
    may cost a quarter more than its computation) and a floor at the knee,
    ``min_density`` = 1%, below which the steps saved no longer pay for the
    accuracy lost. Both are priors about the task; a task that keeps its accuracy
    per step at 0.1% can lower the floor (spec: minDensity).

    B is a max filter over a short window (3 steps: a drop shows within 3 steps)
    of bytes/busy-seconds. A small payload under-measures the link (latency
    dominates), so every ``probe_every`` steps the budget is raised by
    ``probe_gain`` to discover freed capacity, as BBR's ProbeBW does.
    """

    def __init__(self, numel: int, world: int, budget=0.25, window=3, probe_every=8, probe_gain=1.25,
                 min_density=0.01):
        self.numel, self.world = numel, world
        self.budget, self.probe_every, self.probe_gain = budget, probe_every, probe_gain
        self.min_density = min_density
        self.sensor = BottleneckEstimator(window)
        self.compute_s = 0.0
        self.selection = SelectionCost()
        self.steps = 0
        self.last = Decision()

    def update(self, m: StepMeasurement) -> None:
        self.steps += 1
        self.sensor.observe(m.wire_bytes, m.comm_seconds)
        self.selection.add(m.elements_sent, m.selection_seconds)
        # Smooth compute time: it is noisy on shared CPUs, and it only sets a budget.
        self.compute_s = m.compute_seconds if self.compute_s == 0 else 0.7 * self.compute_s + 0.3 * m.compute_seconds

    def decide(self) -> Decision:
        if self.world == 1 or self.sensor.bandwidth == 0 or self.compute_s == 0:
            self.last = Decision()  # dense until measured: also the most accurate bandwidth probe
            return self.last
        gain = self.probe_gain if self.steps % self.probe_every == 0 else 1.0
        seconds = self.budget * self.compute_s * gain
        bw = self.sensor.bandwidth
        allowed = seconds * bw
        if dense_allreduce_bytes(self.numel, self.world) <= allowed:
            self.last = Decision()
        elif dense_allreduce_bytes(self.numel, self.world, fp16=True) <= allowed:
            self.last = Decision(fp16=True)
        else:
            per_element = (self.world - 1) * (VALUE_BYTES[True] + INDEX_BYTES) / bw + self.selection.per_element
            k = seconds / per_element
            density = min(1.0, max(self.min_density, k / self.numel))
            sparse = sparse_allgather_bytes(math.ceil(density * self.numel), self.world, fp16=True)
            if sparse >= dense_allreduce_bytes(self.numel, self.world, fp16=True):
                self.last = Decision(fp16=True)
            else:
                self.last = Decision(density=density, fp16=True, dense=False)
        return self.last

    def telemetry(self) -> dict:
        return {"est_btlbw": self.sensor.bandwidth, "est_rtprop": self.sensor.rtt}
