"""A modeled clock: every rank runs the real training, compression, error feedback and controller over
unshaped loopback collectives, and what each step *costs* comes from a model. Nothing sleeps: a
communication-bound step takes the wall time of its compute, and the training clock advances by the model.

The model of one step (every input is the same on every rank, so the ranks' clocks agree to the bit):

- compute ``C``: the forward and backward pass, one number for the job (``computeSeconds``, or measured once
  before training as the median of warm steps on rank 0 and broadcast: netsense.train.trainer);
- the compressor's own work ``S``, by the path each bucket took: ``compressionSecondsPerMelement`` x the
  elements TopK's path took (error feedback, selection, packing, decoding every rank's chunk) plus
  ``lowRankSecondsPerMelement`` x those PowerSGD's took (error feedback, the projections, orthogonalization,
  the casts for the wire, applying the factors), 0 on a dense step; each measured once like ``C``, by running
  the hook's own code for that path on the model's gradient (netsense.train.calibrate.path_seconds). Momentum
  correction's pass is not in ``S``: it replaces the optimizer's momentum, which ``C`` holds;
- each collective, in launch order, on the rank's link at the profile's rate at the step's start:
  ``hops x hop_latency + wire_bytes x FRAMING x 8 / rate``, where ``FRAMING`` is what Ethernet, IP and TCP
  add to each full segment (a link's rate counts frames, not payload), and ``wire_bytes`` is what this rank puts on the wire
  (the algorithm counted, as the hooks count it: a ring all_reduce sends 2(p-1)/p of the tensor in 2(p-1)
  hops, an all_gather (p-1) chunks in p-1 hops) and ``hop_latency`` the ``latency`` setting plus the
  profile's one-way ``delay``. Every rank sends and receives at the rate at once (a ring), which is what a
  per-host link of that rate carries both ways;
- overlap as DDP's buckets allow: the forward pass is ``FORWARD_SHARE`` of ``C``; bucket ``i`` of ``n`` is
  ready at ``C x (FORWARD_SHARE + (1 - FORWARD_SHARE) x (i+1)/n)`` plus its share of ``S``; the link serves the
  collectives one at a time in launch order; a collective the hook waits for (PowerSGD's first all_reduce)
  stalls the host until it completes. A controller that reads each step (tta, the paper's, dc2) has the ranks
  agree on the step's measurement with a small all_reduce launched when the step ends: it holds the link from
  the next step's start, and that step's first bucket waits for it (fixed methods send none). The step ends when both the host (``C + S`` + its stalls) and the link
  are done.

Not modeled: the shared topology and cross traffic (refused by validation), TCP's own dynamics (slow start
after an idle gap, loss recovery: the emulator has them), contention between a rank's collectives and its
compute for the CPU, stragglers (every rank's step costs the same), a controller's own per-step work (tta's
gradient statistics and decisions), and the pilot's forks (refused). ``jitter`` scales each collective's time by
``1 + jitter x N(0, 1)`` (clipped at 0), from a generator seeded by the job's seed, the step and the
collective, so every rank draws the same noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from netsense.clock import StepCost
from netsense.shaping.profiles import Profile

if TYPE_CHECKING:
    from netsense.compression.steps import StepCounts

FORWARD_SHARE = 1 / 3  # the forward pass's share of a step's compute (backward ~2x forward)
# A 1500-byte MTU's TCP segment carries 1448 bytes (20 IP + 32 TCP with timestamps); its frame is 1514 bytes as
# the qdisc (and a switch port's line rate) counts it: the bytes a link carries per byte of payload.
FRAMING = 1514 / 1448
UNSHAPED_BPS = 100e9  # an unshaped simulated link: fast enough that no model here waits on it


def hops(kind: str, world: int) -> int:
    """The sequential sends a collective's ring algorithm takes: 2(p-1) for all_reduce, p-1 for all_gather."""
    if world <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * (world - 1)
    if kind == "all_gather":
        return world - 1
    raise ValueError(f"no model for collective {kind!r}")


def collective_seconds(kind: str, wire_bytes: float, world: int, bps: float, hop_latency_s: float) -> float:
    """One collective's time on a link of ``bps``: its hops' latency and this rank's wire bytes at the rate."""
    if world <= 1:
        return 0.0
    return hops(kind, world) * hop_latency_s + wire_bytes * FRAMING * 8 / bps


@dataclass
class Collective:
    kind: str
    wire_bytes: float
    blocking: bool
    carried: bool = False  # launched when the last step ended (the measurement's agreement): on the link first


@dataclass
class ModeledTimer:
    """A step's collectives as the hooks launch them (kind, wire bytes, whether the host waits): priced by the
    clock when the step ends. Stands in for netsense.compression.timing.IntervalTimer."""

    collectives: list[Collective] = field(default_factory=list)

    def start(self, kind: str = "all_reduce", wire_bytes: float = 0.0) -> int:
        self.collectives.append(Collective(kind, wire_bytes, blocking=False))
        return len(self.collectives) - 1

    def stop(self, token: int) -> None:
        pass

    def wait_for(self, run, kind: str = "all_reduce", wire_bytes: float = 0.0) -> None:
        run()
        self.collectives.append(Collective(kind, wire_bytes, blocking=True))

    def carried(self, kind: str, wire_bytes: float) -> None:
        self.collectives.append(Collective(kind, wire_bytes, blocking=False, carried=True))

    def busy(self) -> float:
        return 0.0  # the selection timer's: the clock prices the compressor's work itself

    def exposed(self) -> float:
        return 0.0


@dataclass(frozen=True)
class Schedule:
    """A step on the modeled clock: its length, the collectives' busy time (the union of their intervals) and
    how long the host waited for the network (the step less its compute and selection)."""

    seconds: float
    busy: float
    exposed: float


def schedule(collectives: list[Collective], compute_s: float, selection_s: float, durations: list[float]) -> Schedule:
    """Lay one step's collectives out on the link as DDP's buckets allow (module docstring). A carried collective
    (launched when the last step ended) holds the link from the step's start, beside the forward pass, and the
    first bucket's hook waits for it (the policy reads it there); its time is not the step's own ``busy``, as the
    real clock does not time it either."""
    n = sum(1 for c in collectives if not c.carried)
    link_free, stalled, busy, carried_end, i = 0.0, 0.0, 0.0, 0.0, 0
    for c, seconds in zip(collectives, durations, strict=True):
        if c.carried:
            link_free += seconds
            carried_end = link_free
            continue
        i += 1
        share = i / n
        ready = compute_s * (FORWARD_SHARE + (1 - FORWARD_SHARE) * share) + selection_s * share + stalled
        if i == 1 and carried_end > ready:
            stalled += carried_end - ready
            ready = carried_end
        start = max(ready, link_free)
        end = start + seconds
        busy += seconds  # one at a time on the link: the union is the sum
        link_free = end
        if c.blocking:
            stalled += end - ready
    host = compute_s + selection_s + stalled
    total = max(host, link_free)
    return Schedule(total, busy, total - compute_s - selection_s)


class SimulatedClock:
    """The training clock a model keeps (module docstring): ``now`` advances only when a step settles."""

    simulated = True

    def __init__(self, profile: Profile | None, world: int, compute_s: float, compression_s_per_melement: float,
                 latency_s: float, jitter: float = 0.0, seed: int = 0, lowrank_s_per_melement: float | None = None):
        self.profile, self.world = profile, world
        self.compute_s, self.compression_s_per_element = compute_s, compression_s_per_melement / 1e6
        # a figure for TopK's path alone (a device profile's) prices PowerSGD's at the same rate
        lowrank = compression_s_per_melement if lowrank_s_per_melement is None else lowrank_s_per_melement
        self.lowrank_s_per_element = lowrank / 1e6
        self.hop_latency_s = latency_s + (profile.impairments.delay_s if profile else 0.0)
        self.jitter, self.seed = jitter, seed
        self.t = 0.0
        self.steps = 0

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t  # the profile's epoch on this clock: training starts at 0

    def bps_at(self, t: float) -> float:
        return self.profile.rate_at(t) if self.profile is not None else UNSHAPED_BPS

    def timer(self, device: torch.device) -> ModeledTimer:
        return ModeledTimer()

    def durations(self, collectives: list[Collective], bps: float) -> list[float]:
        out = []
        for i, c in enumerate(collectives):
            seconds = collective_seconds(c.kind, c.wire_bytes, self.world, bps, self.hop_latency_s)
            if self.jitter:
                noise = random.Random(hash((self.seed, self.steps, i))).gauss(0.0, 1.0)
                seconds *= max(0.0, 1 + self.jitter * noise)
            out.append(seconds)
        return out

    def settle(self, step_start: float, timer: ModeledTimer, selection_timer: ModeledTimer,
               counts: StepCounts) -> StepCost:
        selection = (self.compression_s_per_element * counts.sparse_elements
                     + self.lowrank_s_per_element * counts.lowrank_elements)
        step = schedule(timer.collectives, self.compute_s, selection,
                        self.durations(timer.collectives, self.bps_at(self.t)))
        self.t += step.seconds
        self.steps += 1
        return StepCost(step.busy, self.compute_s, selection)
