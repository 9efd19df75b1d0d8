"""The family pilot: how much more TopK with error feedback suffers on this task than PowerSGD does, read
before training from a few steps of local compute (no communication).

Which compressor family trains faster is the task's own: on the tuning MLP and the CNNs TopK at 1% with
error feedback needed 1.30-1.40x the steps of PowerSGD at rank 4 to the target, on the MLPs on digits32
1.75-2.21x (testbed/results/learnability.md, sections 5 and 6). A prior fitted on one task cannot tell them
apart; the pilot reads it. From the model's initial weights each worker trains a copy of the model alone,
as SGD with the job's lr and momentum, nothing sent: even ranks with TopK at ``DENSITY`` and error feedback,
odd ranks with PowerSGD at rank ``RANK`` (its own residual), side by side, so the pilot takes one fork's
time. The two ranks of a pair train on the same batches and read the same probe samples (the even rank's:
common random numbers), so their forks differ by family, not by batches: on set 2's MLP32 (30 seeds, the
trainer's inputs; testbed/EVALUATION.md) that narrowed h's 10-90% range from 1.07-1.49 to 1.19-1.43, and
the seeds read under 1.2 (where tta keeps TopK) from 7 to 4 of 30. Each fork step takes the job's whole
batch (every worker's samples, as a dense DDP step averages), not one worker's: that narrowed it again to
1.33-1.46, none under 1.2, for 9% more time a fork (learnability.md, section 5). The probe samples are held
out from the forks' batches. Each fork runs until its loss on its pair's share of a fixed probe batch first falls to
``HALT_LEVEL`` (0.8) of the loss it started from, at most ``MAX_STEPS``; one all_reduce sums the forks, and the
reading is

    h = (TopK forks' mean steps to the level) / (PowerSGD forks')      (linear between steps)

The level is one the loss passes early, while it still falls steadily: after about ten steps a fixed batch's loss on
the MLP on digits32 swings by 2x from step to step, so a reading at a fixed step count depends on where it stops (16
and 24 steps did not separate the tasks, steps to a level did). It was half the first loss until 2026-12-05; at 0.8
the slower fork takes about a third fewer steps (set 2's MLP 7.2 against 10.7) and the three reading tasks are
ordered as before, further apart (learnability.md, section 8). Where no fork gets there within ``MAX_STEPS`` (the
CNNs need 14 steps or more) there is no reading and the priors stand; such a fork is seen early (``EARLY_STOPS``) and
stops there. h's scale is compressed (medians 1.22 on the tuning MLP, 1.45-1.52 on the MLPs on digits32), so the
controller maps it to the ratio of steps to the target as

    R = h ** exponent        (spec familyPilotExponent, fitted on the development tasks: learnability.md)

The forks are copies: the live model, the trainer's optimizer and the hook's state are not touched while they
run. The pilot's time is on the training clock: up to ``MAX_STEPS`` steps of a worker's compute. Most of it is then
made training (``adopt``): rank ``OWNER``'s PowerSGD fork took real steps of the job's SGD on the job's samples
(the job's batch a step, without the weight decay), so every rank replays them on the live model from the factors
that fork applied (each step's P^ and Q per matrix and its vectors whole: on set 2's MLP about 0.09 MB a step, one
broadcast, against the 6.4 MB of the weights), and the run goes on from the fork's weights, momentum, residual and
PowerSGD warm start. Sending k steps' factors costs about the wire of the k PowerSGD steps it replaces, which would
all-reduce as many values, and saves their compute. The PowerSGD fork usually reaches the level first (set 2's MLP:
5 steps against TopK's 8); until the TopK forks are done it trains on (no probe read), so the wait is training too.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from netsense.compression.lowrank import LowRank, layout
from netsense.compression.selection import Workspace, topk_indices

DENSITY = 0.01  # TopK's density in the pilot (the operating point of the measured ratios)
RANK = 4  # PowerSGD's rank in the pilot
HALT_LEVEL = 0.8  # a fork runs until its probe loss first falls to this fraction of the loss it started from
MAX_STEPS = 16  # a fork that has not got there by then stops there
# (steps, fraction): a fork whose loss after ``steps`` steps has come less than ``fraction`` of the way to the level
# stops there. On the development tasks (learnability.py section 7, seeds 0-9, every fork run on, on the trainer's own
# inputs) the MLPs' forks (all at the level in 4-8 steps) had come at least 27% of the way by step 4, the CNNs' (set 1
# none within 16 steps, sets 4-5 some at 14-16) at most 9%: the cut is their geometric middle. One stop, at step 4:
# the MLPs read every step from there until they get there, so a stop later would add a read; one at step 3 would
# have less room (16% against 6%).
EARLY_STOPS: tuple[tuple[int, float], ...] = ((4, 0.15),)
# The fixed probe batch over all workers (each reads its share). A read is a forward pass of it: 10 ms at 512 on
# set 2's MLP, a third of the pilot's time. At 256 h's range over seeds 0-9 is as at 512 (set 2 1.48-1.60 against
# 1.45-1.58, set 3 1.40-1.49 against 1.41-1.49, tuning 1.21-1.26 against 1.20-1.24), at 128 wider (set 3 1.39-1.57).
PROBE_SAMPLES = 256
OWNER = 1  # the rank whose PowerSGD fork every rank adopts (the first pair's odd rank)


@dataclass(frozen=True)
class Fork:
    """One fork's run: its steps to HALT_LEVEL x the first probe loss (fractional; the cap where it did not get
    there)."""

    family: str
    steps: float
    reached: bool
    spent: int  # compute steps taken
    reads: int  # probe losses read (each a forward pass of the probe batch)
    trained: _ForkedModel | None = field(default=None, compare=False, repr=False)  # the fork, as it ended

    def totals(self) -> list[float]:
        """This fork's share of the sums the workers add up (see reading)."""
        topk = self.family == "topk"
        return [self.steps if topk else 0.0, float(topk), 0.0 if topk else self.steps, float(not topk),
                float(self.reached)]


def reading(totals: Sequence[float]) -> float | None:
    """h, TopK's mean steps over PowerSGD's, from the summed Fork.totals of every worker; None where a family
    has no fork or no fork reached the level within the cap (no evidence: the priors stand)."""
    topk_steps, topk_forks, lowrank_steps, lowrank_forks, reached = totals
    if not topk_forks or not lowrank_forks or not reached:
        return None
    return (topk_steps / topk_forks) / (lowrank_steps / lowrank_forks)


def pair_leader(rank: int) -> int:
    """The rank whose batches and probe samples this rank's fork uses: its pair's even rank."""
    return rank - rank % 2


def fork_family(rank: int) -> str:
    """Even ranks run the TopK fork, odd ranks PowerSGD's: the forks run side by side, so the pilot takes one
    fork's time, not two."""
    return "topk" if rank % 2 == 0 else "powersgd"


def steps_to(curve: Sequence[float], level: float) -> float | None:
    """Steps (fractional, linear between readings) until the curve first reaches ``level``; None if never."""
    for i in range(1, len(curve)):
        if curve[i] <= level:
            a, b = curve[i - 1], curve[i]
            return i - 1 + ((a - level) / (a - b) if a > b else 1.0)
    return None


class _ForkedModel:
    """A copy of the model trained alone by one compressor with its own error feedback."""

    def __init__(self, model: torch.nn.Module, family: str, seed: int) -> None:
        self.net = copy.deepcopy(model)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        n = sum(p.numel() for p in self.params)
        self.family = family
        # Buffers of the model's size, made once: a fresh one each step costs its page faults (a TopK fork step's
        # x.abs() took 2.5 ms of its ~17 on set 2's MLP). ``flat`` (this step's gradient) and ``residual`` swap
        # roles each step: the gradient plus the residual becomes the next residual, in place.
        self.velocity = torch.zeros(n, device=self.params[0].device)
        self.residual = torch.zeros_like(self.velocity)
        self.flat = torch.zeros_like(self.velocity)
        self.update = torch.zeros_like(self.velocity)
        self.magnitude = torch.zeros_like(self.velocity) if family == "topk" else None
        self.workspace = Workspace()  # the selection's mask
        self.sizes = [p.numel() for p in self.params]
        self.lowrank = LowRank(seed)
        self.generator = torch.Generator().manual_seed(seed)  # TopK's sampled threshold (the exact k largest)
        self.pieces = (LowRank.pieces(self.flat, list(self.flat.split(self.sizes)), self.params, RANK)
                       if family == "powersgd" else [])  # offsets only: they apply to either buffer
        self.factors: list[torch.Tensor] = []  # PowerSGD: each step's update as factors (what ``adopt`` replays)

    def loss(self, x: torch.Tensor, y: torch.Tensor, weights: list[torch.Tensor] | None = None) -> float:
        """The probe's loss at the fork's weights now, or at ``weights`` (an earlier step's). In training mode,
        as the readings the exponent was fitted on: a batch norm normalizes by the probe's own statistics, so
        its running statistics (which a read updates) never change a loss, and reads in any order agree."""
        with torch.no_grad():
            if weights is None:
                return F.cross_entropy(self.net(x), y).item()
            named = dict(zip((n for n, p in self.net.named_parameters() if p.requires_grad), weights, strict=True))
            return F.cross_entropy(torch.func.functional_call(self.net, named, (x,)), y).item()

    def weights(self) -> list[torch.Tensor]:
        """A copy of the trained parameters (to read this step's probe loss later)."""
        return [p.detach().clone() for p in self.params]

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        """The update this step applies; the residual keeps the rest. In place where it can be: this is most of
        a fork step's time (TopK's selection, PowerSGD's products), and the pilot is on the training clock."""
        x = grad.add_(self.residual)
        update = self.update
        if self.family == "topk":
            magnitude = torch.abs(x, out=self.magnitude)
            top = topk_indices(magnitude, max(1, int(DENSITY * x.numel())), self.generator, self.workspace)
            update.zero_()
            update[top] = x[top]
            x[top] = 0.0  # sent: nothing held back
        else:
            first, mats = self.lowrank.first_pass(x, self.pieces, RANK)
            second, hats, vectors = self.lowrank.second_pass(first, mats, self.pieces, RANK)
            self.lowrank.apply(update, x, self.pieces, hats, second, vectors, 1, RANK)  # x <- what it did not send
            self.factors.append(torch.cat([*(h.reshape(-1) for h in hats), second, vectors]))
        self.flat, self.residual = self.residual, x
        return update

    def step(self, x: torch.Tensor, y: torch.Tensor, lr: float, momentum: float) -> None:
        """One step of SGD with momentum (as torch.optim.SGD: v <- momentum v + update, p <- p - lr v) on the
        compressed gradient."""
        self.net.zero_grad()
        F.cross_entropy(self.net(x), y).backward()
        grad = torch.cat([p.grad.flatten() for p in self.params], out=self.flat)
        sgd_step(self.params, self.velocity, self.compress(grad), lr, momentum)


def sgd_step(params: list[torch.Tensor], velocity: torch.Tensor, update: torch.Tensor, lr: float,
             momentum: float) -> None:
    """v <- momentum v + update; p <- p - lr v (``velocity`` and ``update`` flat, in the parameters' order)."""
    velocity.mul_(momentum).add_(update)
    with torch.no_grad():
        torch._foreach_add_(params, [v.view_as(p) for p, v in zip(
            params, velocity.split([p.numel() for p in params]), strict=True)], alpha=-lr)


def run_fork(model: torch.nn.Module, family: str, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
             probe: tuple[torch.Tensor, torch.Tensor], lr: float, momentum: float, seed: int = 0,
             max_steps: int = MAX_STEPS, losses: dict[int, float] | None = None,
             early_stops: Sequence[tuple[int, float]] = EARLY_STOPS, level: float = HALT_LEVEL,
             keep: bool = False) -> Fork:
    """A copy of ``model`` trained by ``family`` on ``batches`` until its loss on ``probe`` first falls to
    ``level`` x the loss it started from (at most ``max_steps``; earlier where ``early_stops`` judges it too slow).

    Up to the last early stop the probe is read at the stops only; the steps between keep their weights and are
    read only where the loss has reached the level by the next stop, to find the first step there. So a fork that
    gets there reads as if every step were read, and one stopped at the first stop reads the probe twice, not five
    times (the probe's forward passes were half of the pilot's 0.45-0.58 s on set 4's CNN). ``losses`` (where
    given) gets every probe loss read, by step; with ``keep`` the Fork holds the trained copy (``trained``: what
    ``adopt`` sends), else it is dropped (a model's worth of memory a fork)."""
    fork = _ForkedModel(model, family, seed)
    read = {0: fork.loss(*probe)}
    goal = read[0] * level
    stops = dict(early_stops)
    last_stop = max(stops, default=0)
    unread: list[tuple[int, list[torch.Tensor]]] = []  # (step, weights) not read yet, since the last read
    spent, crossed = 0, None
    for step, (x, y) in enumerate(batches[:max_steps], 1):
        fork.step(x, y, lr, momentum)
        spent = step
        if step < last_stop and step not in stops:
            unread.append((step, fork.weights()))
            continue
        read[step] = fork.loss(*probe)
        if read[step] <= goal:
            for earlier, weights in unread:  # the first step at the level may be one not read yet
                read[earlier] = fork.loss(*probe, weights=weights)
                if read[earlier] <= goal:
                    crossed = earlier
                    break
            if crossed is None:
                crossed = step
            break
        unread.clear()
        fraction = stops.get(step)
        if fraction is not None and read[0] - read[step] < fraction * (read[0] - goal):
            break  # too slow to get there within max_steps: no reading, for a part of the cost
    if losses is not None:
        losses.update(read)
    if crossed is None:  # not there: at least the cap (a fork stopped early was judged unable to get there by then)
        return Fork(family, float(min(max_steps, len(batches))), False, spent, len(read), fork if keep else None)
    steps = steps_to([read[crossed - 1], read[crossed]], goal)
    return Fork(family, crossed - 1 + steps, True, spent, len(read), fork if keep else None)


def run(policy, model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        probe: tuple[torch.Tensor, torch.Tensor], lr: float, momentum: float, exponent: float, seed: int = 0,
        group=None, lowrank: LowRank | None = None) -> tuple[dict, Adoption | None]:
    """The pilot on every rank of ``group`` (each calls it with its own batches and its share of the probe
    samples; ``model`` the DDP model's module): this rank's family's fork, one all_reduce of the forks' totals,
    and, where there is a reading, ``policy.read_family_pilot`` (tta's controller: the hook's ``policy``). With
    ``lowrank`` (the hook's compressor) rank OWNER's fork trains on until that all_reduce is done and is adopted
    (``adopt``): ``model`` moves to its weights, ``lowrank`` gets its warm start, the policy starts from its rank
    (``adopted``), and the Adoption says what the optimizer state takes over. Returns what it read and spent,
    for the run's result, and the Adoption."""
    start = time.perf_counter()
    me = dist.get_rank(group)
    adopting = lowrank is not None and dist.get_world_size(group) > OWNER
    fork = run_fork(model, fork_family(me), batches, probe, lr, momentum, seed, keep=adopting and me == OWNER)
    totals = torch.tensor(fork.totals(), dtype=torch.float64, device=probe[0].device)
    if adopting and me == OWNER:
        # The PowerSGD fork is usually there first (set 2: 5 steps against TopK's 8): while the other forks run
        # it trains on, and each step it takes is one the run does not (on this rank's idle time; a step here
        # takes about half a live step's time on set 2 at 500 Mbit/s, 14 against 28 ms: no collective in it).
        pending = dist.all_reduce(totals, group=group, async_op=True)
        for x, y in batches[fork.spent:]:
            if pending.is_completed():
                break
            fork.trained.step(x, y, lr, momentum)
        pending.wait()
    else:
        dist.all_reduce(totals, group=group)
    h = reading(totals.tolist())
    out: dict = {"reading": None, "topk_over_lowrank_steps": None, "topk_scale": round(policy.topk_scale, 4)}
    if h is not None:
        ratio = calibrated_ratio(h, exponent)
        policy.read_family_pilot(ratio, DENSITY, RANK)
        out = {"reading": round(h, 4), "topk_over_lowrank_steps": round(ratio, 4),
               "topk_scale": round(policy.topk_scale, 4)}
    adoption = adopt(model, fork.trained if me == OWNER else None, lowrank, lr, momentum, group) if adopting else None
    if adoption is not None:
        policy.adopted(RANK)
    return {**out, "steps": fork.spent, "probe_reads": fork.reads,
            "adopted_steps": adoption.steps if adoption else 0,
            "seconds": round(time.perf_counter() - start, 3)}, adoption


@dataclass(frozen=True)
class Adoption:
    """What a run takes over from an adopted fork besides its weights (``adopt``): its steps, and the state its
    optimizer held (CompressionState.adopt puts it where the live run keeps it)."""

    steps: int
    velocity: torch.Tensor  # flat, in the parameters' order: the fork's momentum, every rank's the same
    residual: torch.Tensor | None  # flat: what the fork has not applied yet, in units of the mean gradient
    # (on rank OWNER; None elsewhere: it is the size of the model, and one rank holding it loses none of it)


def factor_size(params: list[torch.Tensor]) -> int:
    """Values one PowerSGD step's factors hold for these parameters (as _ForkedModel records them): P^ (n x r)
    and Q (m x r) of each matrix, then the vectors whole."""
    matrices, whole = layout([tuple(p.shape) for p in params], RANK)
    return sum((n + m) * min(RANK, n, m) for n, m in matrices) + whole


def replay(params: list[torch.Tensor], factors: torch.Tensor, lowrank: LowRank, lr: float,
           momentum: float) -> torch.Tensor:
    """Take the PowerSGD steps whose factors are the rows of ``factors`` on ``params`` (sgd_step from zero
    momentum, the updates rebuilt by LowRank.apply as the fork applied them); returns the velocity.
    ``lowrank`` keeps the last step's Q of each matrix: the live run's warm start."""
    sizes = [p.numel() for p in params]
    velocity = torch.zeros(sum(sizes), device=factors.device)
    update = torch.zeros_like(velocity)
    pieces = LowRank.pieces(update, list(update.split(sizes)), params, RANK)
    matrices = [p for p in pieces if p.shape is not None]
    widths = [p.shape[0] * min(RANK, *p.shape) for p in matrices]  # each P^'s values
    q_values = sum(p.shape[1] * min(RANK, *p.shape) for p in matrices)
    for row in factors:
        hats = [h.view(p.shape[0], -1) for p, h in zip(matrices, row[:sum(widths)].split(widths), strict=True)]
        q_sum, vectors = row[sum(widths):sum(widths) + q_values], row[sum(widths) + q_values:]
        lowrank.apply(update, None, pieces, hats, q_sum, vectors, 1, RANK)
        sgd_step(params, velocity, update, lr, momentum)
    return velocity


def adopt(model: torch.nn.Module, fork: _ForkedModel | None, lowrank: LowRank, lr: float, momentum: float,
          group=None) -> Adoption | None:
    """Every rank of ``group`` takes rank OWNER's PowerSGD fork (``fork`` there, None elsewhere) as the first
    steps of training: one broadcast of how many steps it took, one of their factors (and of its floating
    buffers, batch norm's running statistics, which factors do not carry), replayed on ``model`` (``replay``).
    The ranks end with the same weights, bit for bit: each replays the same values by the same code, the owner
    too. None where the fork took no step."""
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b for b in model.buffers() if b.is_floating_point()]
    device = params[0].device
    source = OWNER if group is None else dist.get_global_rank(group, OWNER)
    count = torch.tensor([len(fork.factors) if fork is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(count, source, group=group)
    steps = int(count.item())
    if not steps:
        return None
    width = factor_size(params)
    values = steps * width + sum(b.numel() for b in buffers)
    if fork is not None:
        sent = torch.cat([*fork.factors, *(b.detach().reshape(-1) for b in fork.net.buffers()
                                          if b.is_floating_point())]).to(device)
        if sent.numel() != values:
            raise RuntimeError(f"the pilot's fork sends {sent.numel()} values, the ranks expect {values}")
    else:
        sent = torch.empty(values, device=device)
    dist.broadcast(sent, source, group=group)
    with torch.no_grad():
        for b, value in zip(buffers, sent[steps * width:].split([b.numel() for b in buffers]), strict=True):
            b.copy_(value.view_as(b))
    velocity = replay(params, sent[:steps * width].view(steps, width), lowrank, lr, momentum)
    return Adoption(steps, velocity, fork.residual.clone() if fork is not None else None)


def calibrated_ratio(reading: float, exponent: float) -> float:
    """TopK at DENSITY's steps to the target over PowerSGD at RANK's, from the pilot's reading."""
    return math.exp(exponent * math.log(reading))
