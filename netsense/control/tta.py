"""Ours: the density that minimizes the predicted time to accuracy.

Measured costs and a measured property of the task. A step at density d takes

    T(d) = C + F + L + d * N * (s + w)      (TopK; values fp16 by default, ``values``)
    T    = C + L + bytes / B                (dense allreduce, fp32 or fp16)

C is the compute seconds of a step (its time less exposed communication and
the compressor's own work); L a collective's fixed seconds (LinkEstimator.fixed:
the launch, the wait for the slower rank; 5-15 ms on two shared cores, as long as
a small MLP's compute, so a price without it undercharges the options that need
more steps); B the estimated bandwidth and w = (world-1) * (v + 4) / B the wire
seconds per element sent sparse (v: 2 bytes a value in fp16, 4 in fp32); F selection's fixed pass over the gradient
and s its per-element cost (both fitted online by SelectionCost: on CPUs
packing an element costs a fifth to all of its wire time).

Steps: TopK with error feedback delays the gradient rather than dropping it,
and how much a task suffers from that delay is its own. The controller
predicts ``1 + knee / d`` times the dense steps at density d (the knee: the
density needing twice the dense steps). By default the knee is a fixed
prior, ``knee`` (spec: kneeDensity, 0.003: on the digits MLP, the tuning
set, 29 steps dense, 31 at 10%, 38 at 1%, 60 at 0.3%). It does not
transfer: TopK at 1% took 1.4-1.5x the dense steps on a CNN and 2.2x on a
wider MLP on larger inputs, where the prior says 1.3x.

That law has the wrong shape, too: with momentum correction TopK's step
penalty grows slowly as the density falls (on the tuning MLP 1.3x the dense
steps at 10%, 1.9x at 1% and 1.7-2.2x at 0.1-0.5%), where ``1 + knee/d``
goes from 1.03x to 4x. ``step_law="power"`` (spec: stepLaw) predicts

    steps = d ** -q x the dense steps      (q: spec densityExponent)

q = 0.109 by least squares of log(steps / dense) on log(1/d) over the tuning
runs (testbed/grids/tune-families.yaml, testbed/fit_families.py). On the
fair grids' tasks, never fitted on, it predicts the steps at 0.1-10% within
0.89-1.08x on the CNNs and 0.84-1.16x on the MLP on digits32, where the
inverse law is off by 0.78-1.79x (each task's dense steps fitted as a scale).
Its optimum is linear in the link's rate, not its square root:

    d* = q / (1 - q) x (C + F + L) / (N * (s + w))

(the sparse payload's seconds are q / (1 - q), about an eighth, of the
step's fixed seconds). Asked three times on development data, it was adopted
by the rule registered with the third ask (dev-law3, testbed/EVALUATION.md) as
the third fresh set's candidate's law; the default stays inverse until a fresh
set judges it.

Time to accuracy is steps x step time, so the controller minimizes
``(1 + knee/d) * T(d)``, whose optimum is

    d* = sqrt(knee * (C + F + L) / (N * (s + w)))

and compares it with the dense collectives (factor 1: fp16 values train as
fp32 do). So: no compression when the dense gradient costs less than the
steps compression would add; heavier compression as the link slows, but only
as sqrt(bandwidth), never more than the network requires. Of the options
within 5% of the cheapest the one chosen last is kept (switching between
dense and sparse on noise flushes the residual and makes runs of the same
job differ), else the least compressed (fp32 over fp16 when neither costs
much); the density is clamped to [min_density, 1]; dense fp16 also wins when
a sparse all_gather of k would carry more bytes (many workers). In effect
the controller leaves dense when sparse is 5% cheaper and does not come back
on cost alone, only once d* is so high that the all_gather would carry more
bytes: by the model, dense never beats sparse at d* by more than about
1.5 x world x knee of the step (under 2% at 2 workers), so staying sparse
costs at most that. Likewise dense fp16, once chosen, is kept over fp32.

PowerSGD as an option (``low_ranks``; spec: lowRanks, 1-8 by default): at rank r a step costs

    T_r = C + a0 + a * r + bytes_r / B + 2 L      steps: (1 + lowrank_knee / r) x the dense steps

bytes_r the two all_reduces of its P's (with the parameters sent whole) and Q's (lowrank_allreduce_bytes,
fp32), one after the other (the first waited for inside the backward pass): two fixed times, a0 + a * r
PowerSGD's own seconds a step (error feedback, its matrix products, its decoding: a line through its steps'
(r, seconds), SelectionCost, all of it per unit of rank until two ranks have run), 0 until two of its steps
have run: the first low-rank steps are tried on the optimistic price and then priced as measured (a family's
first compressed step pays one-time costs and is not priced, as TopK's first selection is not). C is the same
whatever the family: the hooks time the first all_reduce's wait as exposed and each compressor's own work,
decoding too, as its own (on set 2's MLP a PowerSGD step's compute had read 21.6 ms against a TopK step's 11.1
ms, its wait counted as compute, and as everyone's C that made PowerSGD look cheap while TopK ran: tta stayed
on TopK for tens of steps). The step prior is one constant per family, fitted on the tuning task only
(spec: lowRankKnee; testbed/EVALUATION.md says on which runs), as kneeDensity is for TopK. PowerSGD and
TopK share the error-feedback residual (memory.ResidualMemory): what one did not send, the other's next
step sends or keeps, so a switch between the families loses no gradient mass (tests/test_feedback.py);
a dense step flushes it as before. A rank's warm start (its Q's) is kept across TopK steps, and drawn
afresh when the rank changes. With momentum correction a PowerSGD step takes the momentum after the
all-reduce instead (spec lowRankMomentumCorrection, default false; memory.SharedMomentum: PowerSGD as
published), and at a switch each rank's velocity moves through its residual, conserved as momentum SGD
would apply it.

Tried and removed for want of evidence (issue 62, item 4; git keeps them, the last commit with them is
netsense.spec.job.REMOVED_AT): the knee learned from each sparse update's progress (learnKnee), a family
pilot that trained a TopK and a PowerSGD fork before training to scale TopK's prior (familyPilot), and a
TopK prior for models with convolutions (convTopkPrior).

A penalties profile (spec: penalties; netsense.control.penalties, written by ``netsense calibrate``) replaces
every step prior above with this task's measurements: each option's steps to a loss milestone over dense fp16's,
raced on the user's own model, batch and lr. ``steps_factor(d)`` is then TopK's measured factors interpolated in
log factor against log density (below the measured ones with the lowest pair's slope, above them held; at least
1) and ``lowrank_steps_factor(r)`` PowerSGD's, the same in rank; kneeDensity, stepLaw, densityExponent and lowRankKnee
are unused. With no closed form for the optimum, d* is the least predicted cost on a log grid of densities
(``DENSITY_GRID``). Judged on three tasks (testbed/judged/RESULTS.md): its own time 0.57-1.72x the hindsight-best fixed option
where it reached the target, the target missed on 7 of mlp1d's 9 runs, its calibration misreading the penalties
early in training; with the calibration charged, within 1.1x in none of 9 scenarios.

Communication that overlaps the backward pass is not counted as free: on
CPUs the collectives' own work (TCP, decoding) takes cores from the compute.
Counting the overlapped time as free drove ResNet18 at 200 Mbit/s to 4.5%
and 0.59x the no-communication ceiling (at ~1.5%: 0.75x); the step got slower
while the model said the extra bytes hid.

B comes from the collectives' bytes and busy times (LinkEstimator: a drop
shows within 2 steps; payloads too small to measure the link cannot lower it).
Every ``probe_every`` steps a sparse step sends ``probe_gain`` times the
elements, or more where that payload is too small to measure the link
(LinkEstimator.probe_bytes), so that capacity freed after a drop is
measured, as BBR's ProbeBW does; while a probe raises the estimate by more
than a quarter, the next step probes again with twice the payload (BBR's
startup). Sized from the old estimate alone, probes stayed too small to
read past the collectives' fixed time: a 20 -> 200 Mbit rise took 29-37
steps with 5-25 ms of fixed time (66 on the testbed); doubling, 4-7.

The run's startup (its first probes) ends at the second probe in a row that
finds under a quarter more, not the first (BBR's startup waits three rounds),
or at a probe already as large as a dense fp16 step: the second goes out at
the first's size. One probe is not enough there: on a fresh connection TCP's
window has not opened yet, and a rank launching late adds 5-25 ms. On set 2's
step-wise link (dev-overlap-set2) the first 345 kB probe took 33 ms at
300 Mbit/s on four seeds of twenty (10 at the link's rate), read 85-92
Mbit/s, ended the startup, and the probes after it, sized from that
estimate, could not raise it: two of those runs held rank 4 for 17 and 81
steps where rank 8 was cheaper. With the rule no cell held rank 4 there
(dev-startup-set2, 30 seeds); the second probe cost 0.03 s a run at
500 Mbit/s (4.7 startup probes against 4.1). Sending it only where a link
twice the estimate would be run another way was tried and dropped: L is not
known yet during the startup, the prices it compares leave the fixed time
out, and a simulated cold start at 300 Mbit/s skipped the very probe.

Probes that cost what they may. A probe that reads the link must stand out of the fixed time (fill x L on
the wire), and where L is long that is megabytes: on a link swinging 20-300 Mbit/s at 4 workers (L 40-50 ms
on two cores) the probes were dense fp16 steps (5.5 MB), 0.3-1.3 s each when they went out in a trough, 14-30%
of the run, and the estimate they left (the swing's peak, a max filter) priced the density at 3-7%. On set 5's
3-worker link the startup's doubling sent 4.4 and 5.8 MB as the link fell (1.1 and 1.7 s, 17 and 25 steps).
What they buy is small: near its optimum the cost is flat (a bandwidth off by 2x costs about 2% a step). So:

- a probe's payload is at most ``PROBE_STEPS`` (2) ordinary steps of the chosen option on the wire at the
  slowest rate the link held lately (``probe_limit``, LinkEstimator.floor), never less than ``probe_gain``
  x the step's own payload: in a trough it costs about that many steps more, not a dense step. Where that
  is too small to read the link its sample is app-limited and can only raise the estimate; the next probe,
  sized from the raised floor, reads further (a rise is found in a few probes, not one);
- the decision prices every option at LinkEstimator.sustained, the harmonic mean of the rates the link held
  since it last rose (a payload's expected seconds are its bytes x the mean of 1/B), not at BtlBw, the peak.

A startup probe at the bound which finds nothing ends the startup, as one at a dense step's bytes does
(the second round at the same size is for a first, small probe on a cold connection). An earlier bound,
4 ordinary steps at BtlBw (spec probeCap, off by default), halved the probes' time on set 5's link but not
on set 4's, which moves 20x every half second (1.08 -> 1.41 s a run): at the peak 4 steps are still
megabytes, and a probe costs what the link does when it goes out; the floor is what this bound adds.

A probe costs a step's worth of time or more (its payload must stand out
of the fixed time: on evaluation set 4's CNN the probes took 2x a step and
10-12% of each run, and found nothing most of the time). With
``adaptive_probing`` (spec: adaptiveProbing) probes back off while the link
is quiet: each probe that finds nothing doubles the spacing to the next
(``probe_every``, 2x, 4x, ... up to ``MAX_PROBE_SPACING`` x), and a change
(a probe that found more, or a drop the steps themselves showed) brings it
back to ``probe_every``. A link that varies is probed as before; a quiet
one about once in 64 steps, so a rise after a long quiet spell is found up
to 64 steps late (then 4-7 steps of doubling probes). Weighing each probe's
cost against what it could find (the value of the information) was tried
first: re-optimizing for a link twice as fast saves a few % of a step
(the cost is flat near its optimum), never a probe's cost, so that rule
only ever probed at the cap; its worth depends on how large the rises are,
which a controller has not seen before they happen.
"""

from __future__ import annotations

import math

from netsense.control.cost import (
    INDEX_BYTES,
    VALUE_BYTES,
    SelectionCost,
    dense_allreduce_bytes,
    lowrank_allreduce_bytes,
    sparse_allgather_bytes,
)
from netsense.control.decision import Decision, Policy, StepMeasurement, smoothed
from netsense.control.penalties import Penalties
from netsense.control.sensing import LinkEstimator


class TimeToAccuracyController(Policy):
    """Ours: the density that minimizes the predicted time to accuracy (the model, every constant and why: the
    module's docstring)."""

    TOLERANCE = 0.05
    REPROBE_GAIN = 1.25
    # The first step's payload per rank: it knows neither the compute time nor the link (see decide). 64 kB is
    # 51 ms at 10 Mbit/s and well under a millisecond at 1 Gbit/s, so a slow link pays little for it and a fast
    # one reads it as app-limited and is found by the startup probes that follow.
    FIRST_BYTES = 64e3

    MAX_PROBE_SPACING = 8  # x probe_every: the longest a quiet link goes unprobed (64 steps by default)
    STARTUP_ROUNDS = 2  # probes in a row that find under REPROBE_GAIN x more before the startup ends
    # A probe's payload is at most this many ordinary steps on the wire at the slowest rate the link held lately
    # (probe_limit), never less than probe_gain x the step's own: where it goes out in a trough it costs at most
    # about this many steps more (module docstring, "Probes that cost what they may").
    PROBE_STEPS = 2

    def __init__(self, numel: int, world: int, knee: float = 0.003, window=10,
                 probe_every=8, probe_gain=2.0, min_density=0.001, adaptive_probing: bool = True, fp16: bool = True,
                 low_ranks: dict[int, tuple[list[tuple[int, int]], int]] | None = None, lowrank_knee: float = 2.3,
                 step_law: str = "inverse", density_exponent: float = 0.109, probe_padding: bool = False,
                 penalties: Penalties | None = None):
        self.numel, self.world = numel, world
        if step_law not in ("inverse", "power"):
            raise ValueError(f"step_law {step_law!r}: inverse or power")
        # This task's measured steps factors (netsense calibrate): where given, the priors below are unused.
        self.penalties = penalties
        self.step_law, self.density_exponent = step_law, density_exponent
        self.probe_padding = probe_padding
        # PowerSGD's options: rank -> (the matrices it compresses, the elements it sends whole), largest rank first
        # (of two options within the tolerance, the least compression wins); none: TopK and dense only.
        self.low_ranks = dict(sorted((low_ranks or {}).items(), reverse=True))
        self.lowrank_knee = lowrank_knee
        # PowerSGD's own seconds a step, fixed + per_rank x r, fitted on its steps (nothing: not yet measured); all
        # fixed until two ranks have run (SelectionCost: else the first rank run is never left)
        self.lowrank_cost = SelectionCost(unfitted="fixed")
        # A family's first compressed step pays one-time costs (CUDA loading its kernels, workspaces allocated):
        # on an H200 the first TopK selection took 0.13-0.24 s against ~5 ms after, and priced as every
        # step's cost it kept tta dense for a whole run (no later sparse step could correct it). Not priced.
        self.warmed: set[str] = set()
        self.fp16 = fp16  # the values' encoding (values: fp16 | fp32), sparse and dense alike
        self.knee = knee  # the density at which TopK needs twice the dense steps (stepLaw inverse)
        self.probe_every, self.probe_gain = probe_every, probe_gain
        self.min_density = min_density
        self.sensor = LinkEstimator(window)
        self.compute_s = 0.0
        self.selection = SelectionCost()
        self.last = Decision()
        self.kind = (True, False, 0)  # dense or not, fp16 or not, rank: what the last decision that was not a probe chose
        self.reprobe = False  # the last probe found more bandwidth: probe again at once, larger
        self.probing = False  # the last decision was a probe
        self.probe_scale = 1.0  # doubles with each probe that found more (BBR's startup), back to 1 after
        self.adaptive_probing = adaptive_probing
        self.since_probe = 0  # steps since the last probe
        self.quiet_probes = 0  # probes in a row that found nothing, with no drop between
        self.starting = True  # the run's startup: probes follow each other until STARTUP_ROUNDS find nothing
        self.startup_misses = 0  # the startup's probes in a row that found nothing
        self.probe_capped = False  # the last probe was as large as a dense fp16 step or probe_limit: no larger one

    def update(self, m: StepMeasurement) -> None:
        before = self.sensor.bandwidth
        lowrank = bool(self.last.rank) and not self.last.dense
        # PowerSGD: two collectives in a row; a probe's slowness is a drop at once (sensing's module docstring)
        self.sensor.observe(m.wire_bytes, m.comm_seconds, rounds=2 if lowrank else 1, probe=self.probing)
        # After the first step's small probe (first()) its sample "found more": the startup probes follow it,
        # doubling while they do.
        self.reprobe = (before > 0 or self.probing) and self.sensor.bandwidth > self.REPROBE_GAIN * before
        self.since_probe = 1 if self.probing else self.since_probe + 1  # a probe's own step counts
        if self.probing:
            if self.reprobe:
                self.probe_scale, self.quiet_probes, self.startup_misses = 2 * self.probe_scale, 0, 0
            elif self.starting and self.startup_misses + 1 < self.STARTUP_ROUNDS and not self.probe_capped:
                self.startup_misses += 1
                self.reprobe = True  # the startup probes once more, at the same size (probe_scale kept)
            else:
                self.starting, self.probe_scale, self.quiet_probes = False, 1.0, self.quiet_probes + 1
        if self.sensor.last_sample == "drop":  # the link changed: probe every probe_every steps from here
            self.quiet_probes, self.since_probe = 0, 1
        family = "lowrank" if lowrank else "topk"  # PowerSGD's cost is its own
        if m.selection_seconds > 0:
            if family not in self.warmed:  # its first compressed step: one-time costs, not priced
                self.warmed.add(family)
            elif family == "lowrank":
                self.lowrank_cost.add(self.last.rank, m.selection_seconds)
            elif not self.last.pad:  # a padded probe's selection time holds its padding's copy: not a price of k
                self.selection.add(m.elements_sent, m.selection_seconds)
        self.compute_s = smoothed(self.compute_s, m.compute_seconds)

    def _wire_per_element(self) -> float:
        return (self.world - 1) * (VALUE_BYTES[self.fp16] + INDEX_BYTES) / self.sensor.sustained

    def step_law_factor(self, density: float) -> float:
        """TopK's steps at this density over the dense steps, by the step law alone."""
        if self.step_law == "power":
            return density ** -self.density_exponent
        return 1 + self.knee / density

    def steps_factor(self, density: float) -> float:
        """TopK's steps at this density over the dense steps: measured (the penalties profile, interpolated),
        else the step law."""
        if self.penalties is not None:
            return self.penalties.topk_factor(density)
        return self.step_law_factor(density)

    def lowrank_steps_factor(self, rank: int) -> float:
        """PowerSGD's steps at this rank over the dense steps: measured (the penalties profile, interpolated),
        else the family's prior."""
        if self.penalties is not None:
            return self.penalties.powersgd_factor(rank)
        return 1 + self.lowrank_knee / rank

    def sparse_density(self) -> float:
        """d*, the density minimizing the predicted time to accuracy (before clamping and probing)."""
        if self.penalties is not None:
            return self._measured_optimum()
        fixed = self.compute_s + self.selection.intercept + self.sensor.fixed
        per_density = self.numel * (self._wire_per_element() + self.selection.per_element)
        if self.step_law == "power":
            q = self.density_exponent
            return q / (1 - q) * fixed / per_density
        return math.sqrt(self.knee * fixed / per_density)

    # With a penalties profile the steps factor is a measured curve, not a law with a closed-form optimum: d* is
    # searched on this many log-spaced densities from min_density to 1 (about 7% apart over three decades; near
    # its optimum the cost is flat, so a finer grid would not change the cost chosen).
    DENSITY_GRID = 97

    def _measured_optimum(self) -> float:
        """d* under the measured steps factors: the grid density with the least predicted cost."""
        low = math.log(self.min_density)
        grid = [math.exp(low - low * i / (self.DENSITY_GRID - 1)) for i in range(self.DENSITY_GRID)]
        return min(grid, key=lambda d: self.steps_factor(d) * self.step_seconds(Decision(density=d, dense=False)))

    def step_seconds(self, d: Decision) -> float:
        """Predicted seconds of one step under decision d (compute, the compressor's own work, the wire)."""
        bw = self.sensor.sustained
        if d.dense:
            return self.compute_s + self.sensor.fixed + dense_allreduce_bytes(self.numel, self.world, d.fp16) / bw
        if d.rank:
            matrices, whole = self.low_ranks[d.rank]
            wire = lowrank_allreduce_bytes(matrices, whole, d.rank, self.world, self.fp16)
            # Two collectives, one after the other (the first waited for inside the backward pass): two fixed times.
            own = self.lowrank_cost.intercept + self.lowrank_cost.per_element * d.rank
            return self.compute_s + own + wire / bw + 2 * self.sensor.fixed
        k = d.density * self.numel
        return (self.compute_s + self.selection.intercept + self.sensor.fixed + k * self.selection.per_element
                + sparse_allgather_bytes(math.ceil(k), self.world, fp16=self.fp16) / bw)

    def predicted_cost(self, d: Decision) -> float:
        """Seconds of training per dense step's worth of progress under decision d."""
        if d.dense:
            return self.step_seconds(d)
        if d.rank:
            return self.lowrank_steps_factor(d.rank) * self.step_seconds(d)
        return self.steps_factor(d.density) * self.step_seconds(d)

    def probe_limit(self, chosen: Decision) -> float:
        """The most bytes a probe may send: PROBE_STEPS ordinary steps of ``chosen`` on the wire at the slowest
        rate the link held lately (LinkEstimator.floor; the estimate before any was measured) or, if lower, what
        the last steps say it does now (LinkEstimator.recent)."""
        rate = self.sensor.floor or self.sensor.bandwidth
        recent = self.sensor.recent
        return self.PROBE_STEPS * self.step_seconds(chosen) * (min(rate, recent) if recent > 0 else rate)

    def decide(self) -> Decision:
        if self.world == 1:
            self.last, self.probing = Decision(), False  # nothing to send
            return self.last
        if self.sensor.bandwidth == 0 or self.compute_s == 0:
            return self.first()
        density = min(1.0, max(self.min_density, self.sparse_density()))
        options = [Decision(), Decision(fp16=True)] if self.fp16 else [Decision()]
        sparse = sparse_allgather_bytes(math.ceil(density * self.numel), self.world, fp16=self.fp16)
        if sparse < dense_allreduce_bytes(self.numel, self.world, fp16=self.fp16):
            options.append(Decision(density=density, fp16=self.fp16, dense=False))
        options += [Decision(dense=False, rank=r, fp16=self.fp16) for r in self.low_ranks]
        costs = [self.predicted_cost(o) for o in options]
        # Within the model's error of the cheapest: the kind chosen last (no flapping on noise), else
        # the least compression (the more faithful gradient; fp32 over fp16 when neither costs much).
        near = [o for o, c in zip(options, costs, strict=True) if c <= (1 + self.TOLERANCE) * min(costs)]
        kept = [o for o in near if (o.dense, o.fp16, o.rank) == self.kind]
        self.last = (kept or near)[0]
        self.kind = (self.last.dense, self.last.fp16, self.last.rank)  # a probe below does not change it
        self.probing = not self.last.dense and (self.reprobe or self.since_probe >= self.probe_spacing())
        self.starting = self.starting and self.probing  # a step that is not a probe ends the startup
        if self.probing:
            limit = self.probe_limit(self.last)
            self.last = self.lowrank_probe(self.last.rank, limit) if self.last.rank else self.probe(density, limit)
        return self.last

    def first(self) -> Decision:
        """Step 0, before anything is measured: a probe of ``FIRST_BYTES`` a rank (sparse fp16), or dense fp16
        where the whole model is smaller than that. It measures the compute time and a first, often
        app-limited, bandwidth; probes then double (BBR's startup) while the estimate keeps rising by more
        than a quarter. A dense first step would cost the whole model on the wire before anything is known:
        36 s for ResNet18 at 10 Mbit/s."""
        self.probing = True
        per_element = sparse_allgather_bytes(1, self.world, fp16=self.fp16)
        k = max(1, math.ceil(self.FIRST_BYTES / per_element))
        density = min(1.0, max(self.min_density, k / self.numel))
        if sparse_allgather_bytes(math.ceil(density * self.numel), self.world, self.fp16) >= dense_allreduce_bytes(
                self.numel, self.world, fp16=self.fp16):
            self.last = Decision(fp16=self.fp16)
        else:
            self.last = Decision(density=density, fp16=self.fp16, dense=False)
        self.probe_capped = self.last.dense  # the whole model is smaller than a first probe
        return self.last

    def probe_spacing(self) -> int:
        """Steps from one probe to the next: ``probe_every``, doubled by each probe in a row that found nothing
        (with adaptive probing), up to ``MAX_PROBE_SPACING`` times it."""
        if not self.adaptive_probing:
            return self.probe_every
        return self.probe_every * min(self.MAX_PROBE_SPACING, 2 ** self.quiet_probes)

    def doubled(self, wanted: float, least: float, limit: float) -> tuple[float, bool]:
        """A probe's size (in ``wanted``'s units): the startup's doubling (``probe_scale``) of what reading the
        link wants, stopped at ``limit`` (probe_limit) but never below ``least`` (probe_gain x the step's own
        payload); and whether the limit stopped it."""
        scaled = self.probe_scale * max(wanted, least)
        size = min(scaled, max(least, limit))
        return size, size < scaled

    def probe(self, density: float, limit: float = math.inf) -> Decision:
        """A step whose payload measures the link: ``probe_gain`` x the density, or more if that is too small
        to tell the link from the collectives' fixed time; dense fp16 where a sparse probe would carry more.

        With ``probe_padding`` (spec: probePadding) the probe sends this step's own selection at ``density``
        and zeros after it up to the probe's size, never more bytes than a dense fp16 step: the link is
        measured as before, and the training sees an ordinary step. Without it a probe sends that many more
        of the residual's largest entries, which after a stretch of low densities is a backlog of many
        steps released at once: on set 2's MLP a 15% probe after 17 steps at 0.36% dropped the test
        accuracy from 0.86 to 0.34, and a dense probe (which flushes the whole residual) diverged.

        The startup's doubling (``probe_scale``) stops at ``limit`` bytes (probe_limit), never below the probe
        at scale 1; a probe it bounded is capped (``probe_capped``), as one at a dense step's bytes is."""
        per_element = sparse_allgather_bytes(1, self.world, fp16=self.fp16)
        d, bounded = self.doubled(self.sensor.probe_bytes / per_element / self.numel, density * self.probe_gain,
                                  limit / per_element / self.numel)
        dense_bytes = dense_allreduce_bytes(self.numel, self.world, fp16=self.fp16)
        self.probe_capped = bounded or d * self.numel * per_element >= dense_bytes
        if self.probe_padding:
            d = min(d, dense_bytes / per_element / self.numel)
            return Decision(density=density, fp16=self.fp16, dense=False, pad=max(0.0, d - density))
        if d * self.numel * per_element >= dense_bytes:
            return Decision(fp16=self.fp16)
        return Decision(density=d, fp16=self.fp16, dense=False)

    def lowrank_probe(self, rank: int, limit: float = math.inf) -> Decision:
        """A probe while PowerSGD is chosen: the rank's own step with zeros all_reduced after its Q's, up to
        ``probe_gain`` x its bytes (or what the link needs to be read; never more than a dense fp16 step): the
        link is measured and the model receives an ordinary PowerSGD step. A TopK probe there would switch
        families for a step and send the largest entries of PowerSGD's residual at once (on set 2's MLP a
        19% TopK probe after 15 steps at rank 4 dropped the test accuracy from 0.67 to 0.56)."""
        matrices, whole = self.low_ranks[rank]
        own = lowrank_allreduce_bytes(matrices, whole, rank, self.world, self.fp16)
        wanted, bounded = self.doubled(self.sensor.probe_bytes, own * self.probe_gain, limit)
        cap = dense_allreduce_bytes(self.numel, self.world, fp16=True)
        target, self.probe_capped = min(wanted, cap), bounded or wanted >= cap
        pad = max(0.0, target - own) / dense_allreduce_bytes(1, self.world, self.fp16)
        return Decision(dense=False, rank=rank, pad=pad / self.numel, fp16=self.fp16)

    def estimates(self) -> dict:
        out = {"est_btlbw_bytes_per_s": self.sensor.bandwidth, "est_rtprop_s": self.sensor.rtt}
        if self.low_ranks:
            out["est_lowrank_s_per_rank"] = self.lowrank_cost.per_element
            out["est_lowrank_fixed_s"] = self.lowrank_cost.intercept
        return out
