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
- on the shared topology (netsense.emulation.cluster: worker ``w`` on rack A when even, B when odd; a rank on
  its worker), the ring's steps run on every hop at once and each direction of the one shaped link carries the
  hops of that direction that cross racks (a ring crosses back as often as it crosses; one process a worker:
  p/2 each way for even p, (p-1)/2 for odd p, whose hop (p-1) -> 0 joins two even ranks), plus, A -> B, the
  cross-traffic flows active at the step's start (``spec.network.crossTraffic`` on the training clock: bulk
  from start to stop, onoff in its on-periods). TCP's fair share gives each flow ``rate / flows`` of its
  direction, and the collective runs at its slowest hop: ``rate`` above becomes ``rate / max(flows per
  direction)`` = ``rate / (crossing hops + active cross flows)``; the hop latency is unchanged. A per-host
  link is one flow (the formula above, exactly); a ring that never crosses (one worker) leaves the link alone;
- overlap as DDP's buckets allow: the forward pass is ``FORWARD_SHARE`` of ``C``; bucket ``i`` of ``n`` is
  ready at ``C x (FORWARD_SHARE + (1 - FORWARD_SHARE) x (i+1)/n)`` plus its share of ``S``; the link serves the
  collectives one at a time in launch order; a collective the hook waits for (PowerSGD's first all_reduce)
  stalls the host until it completes. A controller that reads each step (tta, the paper's, dc2) has the ranks
  agree on the step's measurement with a small all_reduce launched when the step ends: it holds the link from
  the next step's start, and that step's first bucket waits for it (fixed methods send none). The step ends when both the host (``C + S`` + its stalls) and the link
  are done.

Not modeled: TCP's own dynamics (slow start after an idle gap, loss recovery, how a flow that starts shares
with flows already running, unfair congestion controls: the emulator has them; a cross flow's own
congestionControl is refused by validation), a rate change or a cross flow's start within a step, contention
between a rank's collectives and its compute for the CPU, stragglers (every rank's step costs the same), a
controller's own per-step work (tta's gradient statistics and decisions).
``jitter`` scales each collective's time by ``1 + jitter x N(0, 1)`` (clipped at 0), from a generator seeded by
the job's seed, the step and the collective, so every rank draws the same noise.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from netsense.clock import StepCost
from netsense.shaping.profiles import Profile

if TYPE_CHECKING:
    from collections.abc import Sequence

    from netsense.compression.steps import StepCounts
    from netsense.emulation.cross import Flow

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


def collective_seconds(kind: str, wire_bytes: float, world: int, bps: float, hop_latency_s: float,
                       flows: int = 1) -> float:
    """One collective's time on a link of ``bps``: its hops' latency and this rank's wire bytes at the rate, or at
    its fair share ``bps / flows`` where ``flows`` TCP flows share the busiest direction of the link."""
    if world <= 1:
        return 0.0
    return hops(kind, world) * hop_latency_s + wire_bytes * FRAMING * 8 * flows / bps


def ring_crossings(world: int, procs_per_worker: int = 1) -> int:
    """The ring's hops r -> r+1 (mod p) from rack A to rack B on the shared topology, rank r on worker
    r // procs_per_worker and worker w on rack A when even: as many as cross back from B to A."""
    rack = [(r // procs_per_worker) % 2 for r in range(world)]
    return sum(1 for r in range(world) if rack[r] == 0 and rack[(r + 1) % world] == 1)


def shared_flows(world: int, procs_per_worker: int, cross_active: int) -> int:
    """The flows in the busier direction of the shared link (A -> B: the ring's crossing hops and the active
    cross flows), or 0 where the ring never crosses (one worker: its collectives stay off the link)."""
    ring = ring_crossings(world, procs_per_worker)
    return ring + cross_active if ring else 0


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
                 latency_s: float, jitter: float = 0.0, seed: int = 0, lowrank_s_per_melement: float | None = None,
                 topology: str = "per-host", cross: Sequence[Flow] = (), procs_per_worker: int = 1):
        """``topology``: per-host or shared; ``cross``: the shared link's cross-traffic flows, one a connection
        (netsense.emulation.cross.flows_from_spec); ``procs_per_worker``: ranks a worker (which rack a rank is on)."""
        if topology not in ("per-host", "shared"):
            raise ValueError(f"no model for topology {topology!r}")
        if cross and topology != "shared":
            raise ValueError("cross traffic needs the shared topology")
        self.profile, self.world = profile, world
        self.topology, self.cross, self.procs_per_worker = topology, tuple(cross), procs_per_worker
        self.compute_s, self.compression_s_per_element = compute_s, compression_s_per_melement / 1e6
        # a figure for TopK's path alone (a device profile's) prices PowerSGD's at the same rate
        lowrank = compression_s_per_melement if lowrank_s_per_melement is None else lowrank_s_per_melement
        self.lowrank_s_per_element = lowrank / 1e6
        self.hop_latency_s = latency_s + (profile.impairments.delay_s if profile else 0.0)
        self.jitter, self.seed = jitter, seed
        self.t = 0.0
        self.steps = 0
        # each step's work as settle priced it, run-length coded: [steps, sparse elements, low-rank elements,
        # [[kind, wire bytes, blocking, carried], ...]] (netsense.clock.replay prices them on another link); None:
        # not kept (a controller's steps follow the link, so nothing could replay them)
        self.shapes: list[list] | None = []

    def now(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t  # the profile's epoch on this clock: training starts at 0

    def bps_at(self, t: float) -> float:
        return self.profile.rate_at(t) if self.profile is not None else UNSHAPED_BPS

    def flows_at(self, t: float) -> int:
        """The flows sharing the busiest direction of a collective's link at ``t``: 1 on a per-host link; on the
        shared one the ring's crossing hops and the cross flows active then (0: the ring stays off the link)."""
        if self.topology == "per-host":
            return 1
        return shared_flows(self.world, self.procs_per_worker, sum(1 for f in self.cross if f.active(t)))

    def timer(self, device: torch.device) -> ModeledTimer:
        return ModeledTimer()

    def durations(self, collectives: list[Collective], bps: float, flows: int = 1) -> list[float]:
        if flows == 0:  # the ring never crosses the shared link
            bps, flows = UNSHAPED_BPS, 1
        out = []
        for i, c in enumerate(collectives):
            seconds = collective_seconds(c.kind, c.wire_bytes, self.world, bps, self.hop_latency_s, flows)
            if self.jitter:
                noise = random.Random(hash((self.seed, self.steps, i))).gauss(0.0, 1.0)
                seconds *= max(0.0, 1 + self.jitter * noise)
            out.append(seconds)
        return out

    def settle(self, step_start: float, timer: ModeledTimer, selection_timer: ModeledTimer,
               counts: StepCounts) -> StepCost:
        self._record(counts, timer.collectives)
        selection = (self.compression_s_per_element * counts.sparse_elements
                     + self.lowrank_s_per_element * counts.lowrank_elements)
        step = schedule(timer.collectives, self.compute_s, selection,
                        self.durations(timer.collectives, self.bps_at(self.t), self.flows_at(self.t)))
        self.t += step.seconds
        self.steps += 1
        return StepCost(step.busy, self.compute_s, selection)

    def _record(self, counts: StepCounts, collectives: list[Collective]) -> None:
        if self.shapes is None:
            return
        shape = [counts.sparse_elements, counts.lowrank_elements,
                 [[c.kind, c.wire_bytes, c.blocking, c.carried] for c in collectives]]
        if self.shapes and self.shapes[-1][1:] == shape:
            self.shapes[-1][0] += 1
        else:
            self.shapes.append([1, *shape])
