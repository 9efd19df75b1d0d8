"""Study. Question: can the controller tell, from a task's own training, which compressor it needs?
Answer: see testbed/results/learnability.md (its sections) and testbed/EVALUATION.md, "Reading the family from the
task itself": a short forked reading orders the tasks ("Forked, short ...: yes, every seed"; "Forked, longer
(16 or 24 steps): no"); section 6 fits the family pilot's exponent ("The exponent: **1.70**").
Run on: commit not recorded in the results file (its sections are dated, 2026-12-03 to 2026-12-05).

Can the controller tell, from a task's own training, which compressor it needs? The evidence.

    .venv/bin/python testbed/studies/learnability.py [--runs runs/final] [--sections 5,6] > testbed/results/learnability.md

tta chooses among TopK densities with error feedback (EF), priced by a steps model (``1 + knee/d`` times
the dense steps). Where it misses the 1.1x bar (set 2, set 3's fluctuating link) the winners send without
EF (the paper's netsense) or low-rank (PowerSGD), and need far fewer steps than TopK with EF on those
tasks, while on the CNNs TopK with EF needs as few or fewer. Choosing between them online needs a signal
from the task that ranks the tasks as their step counts do. Four readings, each printed as a table:

1. Step counts of the final run (testbed/results/<grid>.jsonl[.gz]): each family's steps to the target over
   dense allreduce's (where allreduce reached it) -- what a signal would have to predict.
2. The first-order progress readings that ``learnKnee`` uses (``<g_{t+1}, U_t>`` and ``<g_{t+1}, g_t>``,
   from the tta-learn runs' timelines under --runs): how often the dense reading, which must be positive
   for the ratio to mean anything, is negative, and how often the learned knee left its prior.
3. The captured energy e(d) = ||TopK_d(g)||^2 / ||g||^2 of each task's dense gradient (measured here:
   dense SGD as the grid's workers run it, steps 10-40, one process): first-order, a
   step without EF makes e(d) of a dense step's progress, so 1/e(d) would predict no-EF's step ratio;
   and the error-feedback residual's size against the gradient's under TopK 1% (steps 20-59), the delayed
   mass whose cost the knee prices.
4. A short pilot in one process, before any training: 30 steps dense and 30 compressed from the same
   start, the compressed run's loss on a fixed 512 samples read as the dense steps that reach it. A
   reading a controller could take offline (it costs 60 steps of compute), not online.

5. Which family, TopK with error feedback or PowerSGD, read early: both from the same start for a few
   steps before training (forked; what it spends is steps of compute), or alternating blocks of the two
   inside training (nothing spent but readings of the fixed batch's loss); each against the measured
   ratio of their steps to the target, 10 seeds, and how often one run's reading would fall on the
   measured side. Issue 36's gate for such a reading: it must order the known tasks as their step
   counts do.
6. tta's family pilot (netsense.control.pilot, as the grid's workers run it: one family's fork a worker, on
   its own batches, until the loss on its share of the fixed batch falls to pilot.HALT_LEVEL of its first, at
   most 16 steps): its reading h
   per task, and the exponent of R = h^exponent fitted on the tasks where it reads (the spec's
   familyPilotExponent), each task's prediction with and without itself in the fit.
7. When the pilot can tell a fork will not reach its level within its cap: how far each fork had come by steps
   2-12, and when it got there (the evidence for pilot.EARLY_STOPS).
8. Halting at other levels: h and the slower fork's steps if the forks stopped when the probe loss first fell
   to 0.5-0.8 of its first value (the pilot halts at 0.8 since 2026-12-05, at 0.5 before), from forks read at
   every step up to the cap.
9. Where the pilot reads nothing (the CNNs, the synthetic task's MLP, MNIST-1D's models): the same forks'
   curves read without a level, TopK's steps over PowerSGD's to the same probe loss after 4, 8 and 16 steps,
   against each task's measured ratio (the spent fresh sets' tasks beside the development ones).

Nothing here is tuned but section 6's exponent and section 7's checkpoints, fitted on these development tasks
(the fresh evaluation set judges them); the rest reads the final run and measures gradients.
"""

from __future__ import annotations

import argparse
import csv
import functools
import glob
import math
import os
import statistics
from dataclasses import dataclass, replace

import torch

from netsense.bench import store
from netsense.bench.grid import grid_path, load_grid
from netsense.compression.lowrank import LowRank
from netsense.control import pilot
from netsense.spec import parse_job
from netsense.train.data import load_dataset
from netsense.train.models import build_model
from netsense.train.trainer import pilot_inputs

# The tuning task and the evaluation sets' tasks, as their grids define them (sets 4 and 5 share one).
TASKS = {"ci (tuning)": "ci", "eval (set 1)": "eval", "eval2 (set 2)": "eval2", "eval3 (set 3)": "eval3",
         "eval4/5 (sets 4-5)": "eval4"}
DENSITIES = (0.01, 0.03, 0.1)


@dataclass(frozen=True)
class Task:
    model: str
    hidden: int
    dataset: str
    batch: int  # samples a step over all workers
    lr: float
    momentum: float
    workers: int = 1
    dataset_settings: tuple[tuple[str, object], ...] = ()  # the dataset's own fields (syntheticSamples, ...)

    @property
    def label(self) -> str:
        return f"{self.model} {self.hidden} on {self.dataset}"


def grid_task(grid: str) -> Task:
    """The task of testbed/grids/<grid>.yaml (its base training, defaults filled)."""
    _, cells, _ = load_grid(grid_path(grid) or f"testbed/grids/{grid}.yaml")
    job = parse_job(cells[0].job)
    t = job.training
    own = tuple(sorted((k, v) for k, v in t.items() if k.startswith(t["dataset"]) and k != "dataset"))
    return Task(t["model"], t["hiddenSize"], t["dataset"], job.workers * t["batchSize"], t["lr"], t["momentum"],
                job.workers, own)


def _steps(r: dict | None, dense: float | None, density: bool) -> str:
    """One method's steps to the target, over dense allreduce's where it reached it."""
    if not r or r.get("steps_to_target") is None:
        return "-"
    s = f"{r['steps_to_target']:.0f}" + (f" ({r['steps_to_target'] / dense:.2f}x)" if dense else "")
    return s + (f" at {100 * r['mean_density']:.1f}%" if density else "")


def step_counts(results: str) -> list[str]:
    rows = ["| grid: scenario | dense steps (-: allreduce not in the grid, or not within the budget) | TopK+EF 1% | TopK+EF 3% | paper netsense, no EF (density) | "
            "PowerSGD r4 |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for grid in ("eval", "eval2", "eval3", "eval4", "eval5"):
        path = os.path.join(results, f"{grid}.json")
        if not store.exists(path):
            continue
        by: dict[str, dict[str, dict]] = {}
        for r in store.load(path):
            by.setdefault(r["scenario"], {})[r["method"]] = r
        for scenario, m in sorted(by.items()):
            dense = (m.get("allreduce") or {}).get("steps_to_target")
            cells = [_steps(m.get(k), dense, k == "netsense") for k in ("topk-0.01", "topk-0.03", "netsense",
                                                                          "powersgd-r4")]
            rows.append(f"| {grid}: {scenario} | {dense or '-'} | " + " | ".join(cells) + " |")
    return rows


def progress_readings(runs: str) -> list[str]:
    rows = ["| grid: scenario | runs | readings | dense reading < 0 | update's reading < 0 | "
            "steps with the knee off its prior (median) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    groups: dict[str, list[str]] = {}
    for d in sorted(glob.glob(os.path.join(runs, "*", "tta-learn*--*"))):
        groups.setdefault(f"{d.split(os.sep)[-2]}: {d.split('--')[1]}", []).append(d)
    for name, dirs in groups.items():
        n = dense_neg = made_neg = 0
        off: list[float] = []
        for d in dirs:
            timeline = list(csv.DictReader(open(os.path.join(d, "timeline.csv"))))
            prior = float(timeline[0]["est_knee"])
            knees = [float(r["est_knee"]) for r in timeline if r["est_knee"]]
            off.append(sum(abs(k - prior) > 1e-12 for k in knees) / len(knees))
            for r in timeline:
                if r["progress_dense"]:
                    n += 1
                    dense_neg += float(r["progress_dense"]) < 0
                    made_neg += float(r["progress_made"]) < 0
        rows.append(f"| {name} | {len(dirs)} | {n} | {dense_neg / n:.0%} | {made_neg / n:.0%} | "
                    f"{statistics.median(off):.0%} |")
    return rows


Step = tuple  # ("dense",) | ("topk", density, error_feedback) | ("powersgd", rank): one step's compressor


def _setup(task: Task, seed: int):
    torch.manual_seed(seed)
    data = load_dataset({"dataset": task.dataset, "seed": seed, **dict(task.dataset_settings)})
    net = build_model(task.model, data.input_shape, data.classes, task.hidden)
    fixed = torch.randperm(len(data.train_y), generator=torch.Generator().manual_seed(99))[:512]
    return data, net, fixed


def _compress(step: Step, grad: torch.Tensor, residuals: dict, lowrank: LowRank, pieces: dict) -> torch.Tensor:
    """The update one step's compressor applies (world 1), each compressor with its own residual (the
    error feedback of one family is held while another runs)."""
    if step[0] == "dense":
        return grad
    key = step[:2]
    feedback = step[0] == "powersgd" or step[2]
    x = grad + residuals.get(key, 0) if feedback else grad.clone()
    if step[0] == "topk":
        update = torch.zeros_like(x)
        top = x.abs().topk(max(1, int(step[1] * x.numel()))).indices
        update[top] = x[top]
    else:
        update, signal = torch.empty_like(x), x.clone()
        first, mats = lowrank.first_pass(signal, pieces[step[1]], step[1])
        second, hats, vectors = lowrank.second_pass(first, mats, pieces[step[1]], step[1])
        lowrank.apply(update, signal, pieces[step[1]], hats, second, vectors, 1, step[1])
    if feedback:
        residuals[key] = x - update
    return update


def _train(task: Task, seed: int, steps: int | list[Step], read=None, density: float = 0.0,
           error_feedback: bool = True, losses: list[float] | None = None) -> int:
    """SGD as the grid's workers run it (its lr and momentum, all workers' samples in one step; without
    the weight decay, momentum applied after compression), one process: ``steps`` dense steps (or TopK at
    ``density``, with or without error feedback), or a plan of one compressor a step. ``read(step,
    gradient, residual)`` after each backward; ``losses`` gets the loss on a fixed 512 training samples
    before the first update and after each."""
    plan = steps if isinstance(steps, list) else [("topk", density, error_feedback) if density else ("dense",)] * steps
    data, net, fixed = _setup(task, seed)
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    velocity, residuals, lowrank = torch.zeros(n), {}, LowRank(seed)
    flat = torch.zeros(n)
    views, offset = [], 0
    for p in params:
        views.append(flat[offset:offset + p.numel()])
        offset += p.numel()
    pieces = {s[1]: LowRank.pieces(flat, views, params, s[1]) for s in plan if s[0] == "powersgd"}

    def probe_loss() -> float:
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(net(data.train_x[fixed]), data.train_y[fixed]).item()

    if losses is not None:
        losses.append(probe_loss())
    g = torch.Generator().manual_seed(seed)
    for i, step in enumerate(plan):
        batch = torch.randint(0, len(data.train_y), (task.batch,), generator=g)
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(data.train_x[batch]), data.train_y[batch]).backward()
        grad = torch.cat([p.grad.flatten() for p in params])
        update = _compress(step, grad, residuals, lowrank, pieces)
        if read:
            read(i, grad, residuals.get(step[:2], torch.zeros(n)))
        velocity = task.momentum * velocity + update
        with torch.no_grad():
            offset = 0
            for p in params:
                p -= task.lr * velocity[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        if losses is not None:
            losses.append(probe_loss())
    return n


def captured_energy(task: Task, seed: int) -> tuple[int, list[float]]:
    """Mean e(d) of the dense gradient over steps 10-39 of dense training."""
    readings: list[list[float]] = []

    def read(step: int, grad: torch.Tensor, _residual: torch.Tensor) -> None:
        if step >= 10:
            cumulative = grad.square().sort(descending=True).values.cumsum(0)
            readings.append([(cumulative[max(0, int(d * grad.numel()) - 1)] / cumulative[-1]).item()
                             for d in DENSITIES])

    n = _train(task, seed, 40, read)
    return n, [statistics.mean(r[i] for r in readings) for i in range(len(DENSITIES))]


def residual_ratio(task: Task, seed: int) -> float:
    """Mean ||residual|| / ||gradient|| over steps 20-59 of TopK 1% with error feedback."""
    readings: list[float] = []
    _train(task, seed, 60,
           lambda step, grad, residual: readings.append((residual.norm() / grad.norm()).item()) if step >= 20
           else None, density=0.01)
    return statistics.mean(readings)


def structure() -> list[str]:
    head = " | ".join(f"e({100 * d:g}%) (1/e)" for d in DENSITIES)
    rows = [f"| task | parameters | {head} | residual / gradient at 1% with EF |",
            "| --- | ---: |" + " ---: |" * len(DENSITIES) + " ---: |"]
    for name, grid in TASKS.items():
        task = grid_task(grid)
        seeds = [captured_energy(task, seed) for seed in (0, 1)]
        e = [statistics.mean(x) for x in zip(*(s[1] for s in seeds), strict=True)]
        ratios = [residual_ratio(task, seed) for seed in (0, 1)]
        rows.append(f"| {name}: {task.label} | {seeds[0][0] / 1e6:.2f}M | "
                    + " | ".join(f"{x:.2f} ({1 / x:.2f}x)" for x in e)
                    + f" | {statistics.mean(ratios):.1f} ({min(ratios):.1f}-{max(ratios):.1f}) |")
    return rows


PILOT_STEPS = 30
PILOTS = {"TopK+EF 1%": (0.01, True), "TopK+EF 3%": (0.03, True), "TopK 3%, no EF": (0.03, False)}


def pilot_ratio(dense: list[float], compressed: list[float]) -> float:
    """Dense steps per step of a short pilot: the compressed run's last loss (on the fixed batch) was
    reached by dense training in s steps; the ratio len(compressed) / s (0: dense never got there, the
    compressed run was ahead)."""
    s = next((i for i, x in enumerate(dense) if x <= compressed[-1]), None)
    return (len(compressed) - 1) / s if s else 0.0


def pilots() -> list[str]:
    rows = [f"| task | {' | '.join(PILOTS)} |", "| --- |" + " ---: |" * len(PILOTS)]
    for name, grid in TASKS.items():
        task = grid_task(grid)
        ratios: dict[str, list[float]] = {kind: [] for kind in PILOTS}
        for seed in (0, 1, 2):
            dense: list[float] = []
            _train(task, seed, PILOT_STEPS, losses=dense)  # once per seed: every pilot is read against it
            for kind, (density, ef) in PILOTS.items():
                compressed: list[float] = []
                _train(task, seed, PILOT_STEPS, density=density, error_feedback=ef, losses=compressed)
                ratios[kind].append(pilot_ratio(dense, compressed))
        rows.append(f"| {name} | " + " | ".join(" ".join(f"{x:.2f}" if x else "<1" for x in r)
                                               for r in ratios.values()) + " |")
    return rows


# The family choice: TopK with error feedback at 1% against PowerSGD at rank 4 (both in tta's options).
FAMILY_TOPK, FAMILY_LOWRANK = ("topk", 0.01, True), ("powersgd", 4)
FAMILY_SEEDS = tuple(range(10))
MEASURED_GRIDS = {"ci": "tune-families", "eval": "eval", "eval2": "eval2", "eval3": "eval3", "eval4": "eval4"}


def table_family_ratio(results: str, grid: str) -> str:
    """TopK+EF 1%'s steps to the target over PowerSGD r4's, per scenario of a grid's committed table (- where
    either did not reach it)."""
    path = os.path.join(results, f"{MEASURED_GRIDS.get(grid, grid)}.json")
    by: dict[str, dict[str, float]] = {}
    for r in store.load(path):
        by.setdefault(r["scenario"], {})[r["method"]] = r.get("steps_to_target")
    return " ".join(f"{m['topk-0.01'] / m['powersgd-r4']:.2f}" if m.get("topk-0.01") and m.get("powersgd-r4")
                    else "-" for m in by.values())


def measured_family_ratio(results: str, grid: str) -> str:
    """table_family_ratio over the scenarios where both reached the target."""
    return " ".join(x for x in table_family_ratio(results, grid).split() if x != "-")


def forked_family_reading(task: Task, seed: int, steps: int) -> float:
    """Both families from the same start for ``steps`` steps (2 x steps of compute spent before training):
    TopK's steps over PowerSGD's to the same loss on the fixed batch (>1: TopK needs more)."""
    topk: list[float] = []
    lowrank: list[float] = []
    _train(task, seed, [FAMILY_TOPK] * steps, losses=topk)
    _train(task, seed, [FAMILY_LOWRANK] * steps, losses=lowrank)
    if topk[-1] >= lowrank[-1]:
        return steps / (pilot.steps_to(lowrank, topk[-1]) or steps)
    return (pilot.steps_to(topk, lowrank[-1]) or steps) / steps


def _batches(data, size: int, seed: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        batch = torch.randint(0, len(data.train_y), (size,), generator=g)
        out.append((data.train_x[batch], data.train_y[batch]))
    return out


def halving_family_reading(task: Task, seed: int, steps: int = 24) -> float:
    """Both families from the same start on the same batches, each until its loss on the fixed batch first
    falls to half the starting loss (at most ``steps``): TopK's steps over PowerSGD's. A level every task
    passes early, where the loss still falls steadily (on the MLP32 it swings by 2x from step to step after
    about ten)."""
    data, net, fixed = _setup(task, seed)
    batches, probe = _batches(data, task.batch, seed, steps), (data.train_x[fixed], data.train_y[fixed])
    topk = pilot.run_fork(net, "topk", batches, probe, task.lr, task.momentum, seed, steps)
    lowrank = pilot.run_fork(net, "powersgd", batches, probe, task.lr, task.momentum, seed, steps)
    return topk.steps / lowrank.steps


@functools.cache
def split_pilot_reading(task: Task, seed: int, max_steps: int = pilot.MAX_STEPS, paired: bool = True) -> float | None:
    """tta's pilot as the grid's workers run it (netsense.control.pilot): each rank forks the model and trains
    its family's fork (TopK on even ranks, PowerSGD on odd); ``paired``, on exactly the batches and held-out
    probe samples the trainer gives it (trainer.pilot_inputs: its pair's), else as the pilot ran until
    2026-12-04 here (its own random batches and share of a fixed batch); h from the summed forks, None where
    no fork halved its loss (the priors stand)."""
    data, net, fixed = _setup(task, seed)
    share = pilot.PROBE_SAMPLES // task.workers
    totals = [0.0] * 5
    for rank in range(task.workers):
        if paired:
            batches, probe = pilot_inputs(data, task.batch // task.workers, rank, task.workers, seed)
        else:
            batches = _batches(data, task.batch // task.workers, seed * 1000 + rank, max_steps)
            mine = fixed[rank * share:(rank + 1) * share]
            probe = data.train_x[mine], data.train_y[mine]
        fork = pilot.run_fork(net, pilot.fork_family(rank), batches, probe, task.lr, task.momentum, seed, max_steps)
        totals = [a + b for a, b in zip(totals, fork.totals(), strict=True)]
    return pilot.reading(totals)


def block_family_reading(task: Task, seed: int, block: int, rounds: int) -> float:
    """Online, nothing spent but the fixed batch's losses: training itself runs blocks of ``block`` steps in
    the order TopK, PowerSGD, PowerSGD, TopK (``rounds`` times; each family keeps its own residual, so a
    linear trend in the progress per step cancels), and the loss each block removed on the fixed batch is
    summed per family: PowerSGD's progress over TopK's (>1: TopK would need more steps)."""
    order = [FAMILY_TOPK, FAMILY_LOWRANK, FAMILY_LOWRANK, FAMILY_TOPK] * rounds
    losses: list[float] = []
    _train(task, seed, [f for f in order for _ in range(block)], losses=losses)
    made = {FAMILY_TOPK: 0.0, FAMILY_LOWRANK: 0.0}
    for i, family in enumerate(order):
        made[family] += losses[i * block] - losses[(i + 1) * block]
    return made[FAMILY_LOWRANK] / made[FAMILY_TOPK] if made[FAMILY_TOPK] > 0 else float("inf")


# The readings, each with the steps of compute it spends before training (forked) or in it (blocks). A
# worker's pilot runs at its own batch (the grid's batchSize, not all workers' samples): "per worker".
PILOT_READING = ("tta's familyPilot: steps to the pilot's level, one family a worker, each on its own batches "
                 "(no reading counts as 1)")
PAIRED_PILOT_READING = ("tta's familyPilot as it runs now: the same, each pair of workers (TopK, PowerSGD) on the "
                        "same batches of the sampler's shard, each the job's whole batch, and held-out probe samples "
                        "(no reading counts as 1)")
FAMILY_READINGS = {
    "forked 2 x 8": (lambda t, s: forked_family_reading(t, s, 8), 16),
    "forked 2 x 16": (lambda t, s: forked_family_reading(t, s, 16), 32),
    "forked 2 x 24": (lambda t, s: forked_family_reading(t, s, 24), 48),
    "forked 2 x 24, per worker": (lambda t, s: forked_family_reading(replace(t, batch=t.batch // t.workers), s, 24),
                                  48),
    "forked 2 x 8, per worker": (lambda t, s: forked_family_reading(replace(t, batch=t.batch // t.workers), s, 8),
                                 16),
    "forked, steps to half the first loss (at most 2 x 24)": (halving_family_reading, 48),
    PILOT_READING: (lambda t, s: split_pilot_reading(t, s, paired=False) or 1.0, pilot.MAX_STEPS),
    PAIRED_PILOT_READING: (lambda t, s: split_pilot_reading(t, s) or 1.0, pilot.MAX_STEPS),
    "blocks of 3, 2 rounds (in training)": (lambda t, s: block_family_reading(t, s, 3, 2), 0),
    "blocks of 6, 1 round (in training)": (lambda t, s: block_family_reading(t, s, 6, 1), 0),
}
# Where a one-run reading would put the task: the geometric middle of the gap between the measured ratios
# of the tasks where TopK 1% needs 1.30-1.40x PowerSGD r4's steps and those where it needs 1.75-2.21x. Not
# fitted: any boundary in the gap orders them, and these tasks are development data.
FAMILY_BOUNDARY = math.sqrt(1.40 * 1.75)


def family_readings(results: str, readings: list[str] | None = None) -> list[str]:
    """Rows: the measured ratios, then each reading's median [min, max] over the seeds and how often one
    run's reading (and the mean of two workers' readings) falls on the measured side of the boundary."""
    rows = ["| reading | compute steps spent | " + " | ".join(TASKS) + " |", "| --- | ---: |" + " ---: |" * len(TASKS),
            "| measured: final runs, per scenario | | "
            + " | ".join(measured_family_ratio(results, grid) for grid in TASKS.values()) + " |"]
    tasks = {grid: grid_task(grid) for grid in TASKS.values()}
    for reading, (read, cost) in FAMILY_READINGS.items():
        if readings is not None and reading not in readings:
            continue
        cells = []
        for grid, task in tasks.items():
            x = [read(task, seed) for seed in FAMILY_SEEDS]
            above = statistics.mean(float(r) for r in measured_family_ratio(results, grid).split()) > FAMILY_BOUNDARY
            one = sum((r > FAMILY_BOUNDARY) == above for r in x) / len(x)
            pairs = [(a + b) / 2 for a, b in zip(x[::2], x[1::2], strict=True)]  # two workers' readings
            two = sum((r > FAMILY_BOUNDARY) == above for r in pairs) / len(pairs)
            cells.append(f"{statistics.median(x):.2f} [{min(x):.2f}, {max(x):.2f}]; {one:.0%} / {two:.0%}")
        rows.append(f"| {reading} | {cost} | " + " | ".join(cells) + " |")
    return rows


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """g minimizing sum (log measured - g log reading)^2: R = h^g passes through (1, 1), where a pilot that
    sees no difference predicts none."""
    return sum(math.log(h) * math.log(r) for h, r in points) / sum(math.log(h) ** 2 for h, _ in points)


def pilot_calibration(results: str) -> list[str]:
    """The exponent of tta's pilot (R = h^exponent) fitted on the tasks where it reads (all development data:
    the fresh evaluation set judges it), and each task's prediction by the fit without it (leave one out)."""
    points, rows = {}, []
    for name, grid in TASKS.items():
        task = grid_task(grid)
        readings = [split_pilot_reading(task, seed) for seed in FAMILY_SEEDS]
        got = [h for h in readings if h is not None]
        measured = statistics.mean(float(r) for r in measured_family_ratio(results, grid).split())
        if len(got) * 2 > len(readings):
            points[name] = (statistics.median(got), measured)
        rows.append((name, got, measured))
    exponent = fit_exponent(list(points.values()))
    out = [f"The exponent: **{exponent:.2f}**, least squares of log R on log h through the origin, over the tasks "
           f"where most seeds read (medians; seeds {FAMILY_SEEDS[0]}-{FAMILY_SEEDS[-1]}; a fork stops at "
           f"{pilot.MAX_STEPS} steps, the level {pilot.HALT_LEVEL} x the first probe loss, {pilot.PROBE_SAMPLES} probe "
           f"samples). Where no fork gets there there is no reading and tta keeps its priors.\n",
           "| task | seeds with a reading | h: median [min, max] | measured R | h^exponent (x measured) | "
           "fitted without it: h^exponent' (x measured) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, got, measured in rows:
        if name not in points:
            out.append(f"| {name} | {len(got)}/{len(FAMILY_SEEDS)} | "
                       + (f"{statistics.median(got):.2f} [{min(got):.2f}, {max(got):.2f}]" if got else "-")
                       + f" | {measured:.2f} | priors | priors |")
            continue
        h = points[name][0]
        loo = fit_exponent([p for other, p in points.items() if other != name])
        out.append(f"| {name} | {len(got)}/{len(FAMILY_SEEDS)} | {h:.2f} [{min(got):.2f}, {max(got):.2f}] | "
                   f"{measured:.2f} | {h ** exponent:.2f} ({h ** exponent / measured:.2f}) | "
                   f"{h ** loo:.2f} ({h ** loo / measured:.2f}; exponent {loo:.2f}) |")
    return out


CHECKPOINTS = (2, 3, 4, 5, 6, 8, 10, 12)
HALT_LEVELS = (0.5, 0.6, 0.7, 0.8)  # section 8: fractions of the first probe loss at which the forks could stop


def unstopped_forks(task: Task, seed: int) -> list[tuple[pilot.Fork, dict[int, float]]]:
    """Each rank's pilot fork as the workers run it (trainer.pilot_inputs) but never stopped early, with its probe
    loss at every step (without early stops the pilot reads every step) until it reaches the lowest of HALT_LEVELS
    (so every level above is crossed too) or the cap."""
    data, net, _ = _setup(task, seed)
    out = []
    for rank in range(task.workers):
        batches, probe = pilot_inputs(data, task.batch // task.workers, rank, task.workers, seed)
        curve: dict[int, float] = {}
        fork = pilot.run_fork(net, pilot.fork_family(rank), batches, probe, task.lr, task.momentum, seed,
                              losses=curve, early_stops=(), level=min(HALT_LEVELS))
        out.append((fork, curve))
    return out


def fork_progress(task: Task, seed: int) -> list[tuple[str, float | None, list[float]]]:
    """Each rank's pilot fork as the workers run it (trainer.pilot_inputs), but never stopped early: its family,
    the step its loss reached the pilot's level (pilot.HALT_LEVEL of the first; None: not within the cap) and how
    far it had come toward that level (0: not at all, 1: there) after each of CHECKPOINTS steps."""
    out = []
    for fork, curve in unstopped_forks(task, seed):
        first, way_to = curve[0], curve[0] * (1 - pilot.HALT_LEVEL)
        reached = pilot.steps_to([curve[k] for k in sorted(curve)], first * pilot.HALT_LEVEL)
        # At a checkpoint the pilot reads the loss there (not the least since: it skips the steps between); a
        # checkpoint past the curve's end lies past the lowest level, so past the pilot's.
        way = [min(1.0, (first - curve[k]) / way_to) if k in curve else 1.0 for k in CHECKPOINTS]
        out.append((fork.family, reached, way))
    return out


def early_stop_evidence() -> list[str]:
    """How far each development task's pilot forks had come toward the pilot's level at each checkpoint (the
    least and the most of the task's forks), and when they got there: a checkpoint's cut must lie above every fork
    that would not read in time (the CNNs': none of set 1's got there within the cap, some of set 4's at its end)
    and below every fork that reads early (the MLPs')."""
    out = [f"| task | forks at {pilot.HALT_LEVEL} x within {pilot.MAX_STEPS} steps (at steps) | "
           + " | ".join(f"step {k}: min-max" for k in CHECKPOINTS) + " |", "| --- | --- |" + " ---: |" * len(CHECKPOINTS)]
    for name, grid in TASKS.items():
        forks = [f for seed in FAMILY_SEEDS for f in fork_progress(grid_task(grid), seed)]
        steps = [s for _, s, _ in forks if s is not None]
        reached = f"{len(steps)}/{len(forks)}" + (f" ({min(steps):.1f}-{max(steps):.1f})" if steps else "")
        out.append(f"| {name} | {reached} | " + " | ".join(
            f"{min(w[i] for _, _, w in forks):.0%}-{max(w[i] for _, _, w in forks):.0%}"
            for i in range(len(CHECKPOINTS))) + " |")
    return out


def halting_levels() -> list[str]:
    """Per task and level: h from the summed forks (as pilot.reading: None where a family's forks do not all get
    there within the cap) and the slower family's mean steps to the level, the pilot's cost in fork steps."""
    out = ["| task | level | seeds read | h median [min, max] | slower fork's steps (median) |",
           "| --- | ---: | ---: | --- | ---: |"]
    for name, grid in TASKS.items():
        task = grid_task(grid)
        readings: dict[float, list[tuple[float, float]]] = {level: [] for level in HALT_LEVELS}
        for seed in FAMILY_SEEDS:
            curves: dict[str, list[list[float]]] = {}
            for fork, losses in unstopped_forks(task, seed):  # read up to halving: every level above it is crossed
                curves.setdefault(fork.family, []).append([losses[k] for k in sorted(losses)])
            for level in HALT_LEVELS:
                steps = {f: [pilot.steps_to(c, level * c[0]) for c in cs] for f, cs in curves.items()}
                if all(s is not None for ss in steps.values() for s in ss):
                    mean = {f: sum(ss) / len(ss) for f, ss in steps.items()}
                    readings[level].append((mean["topk"] / mean["powersgd"], max(mean.values())))
        for level in HALT_LEVELS:
            got = readings[level]
            h = [r for r, _ in got]
            cells = (f"{statistics.median(h):.2f} [{min(h):.2f}, {max(h):.2f}] | "
                     f"{statistics.median(c for _, c in got):.1f}") if got else "- | -"
            out.append(f"| {name} | {level} | {len(got)}/{len(FAMILY_SEEDS)} | {cells} |")
    return out


# Section 9: the spent fresh sets' tasks (development data since they were judged) beside the development tasks.
EARLY_TASKS = {**TASKS, "syn4 (fresh2-syn4)": "fresh2-syn4", "cnn32 (fresh2-cnn32)": "fresh2-cnn32",
               "cnn1d (fresh-cnn1d)": "fresh-cnn1d", "mlp1d (fresh-mlp)": "fresh-mlp"}
SAME_LOSS_STEPS = (4, 8, 16)


def same_loss_reading(topk: list[float], lowrank: list[float], steps: int) -> float | None:
    """TopK's steps over PowerSGD's to the same probe loss after ``steps`` steps of each (the slower one's loss
    there, reached by the faster one at a fractional step); None where either fork's loss there is not below its
    first (nothing learned yet to compare) or a curve is shorter."""
    if min(len(topk), len(lowrank)) <= steps or topk[steps] >= topk[0] or lowrank[steps] >= lowrank[0]:
        return None
    if topk[steps] >= lowrank[steps]:
        return steps / pilot.steps_to(lowrank[:steps + 1], topk[steps])
    return pilot.steps_to(topk[:steps + 1], lowrank[steps]) / steps


def early_readings(results: str) -> list[str]:
    """Where the pilot reads nothing (its forks do not get to its level in time), could the forks' curves say
    more without a level? Per task: the measured ratio, and the same-loss reading after SAME_LOSS_STEPS steps of
    the pilot's forks (as the workers run them, never stopped early), over FAMILY_SEEDS."""
    rows = ["| task | the pilot reads (seeds) | measured: TopK+EF 1% / PowerSGD r4 steps, per scenario | "
            + " | ".join(f"read after {n} steps: median [min, max] (seeds read)" for n in SAME_LOSS_STEPS) + " |",
            "| --- | ---: | ---: |" + " ---: |" * len(SAME_LOSS_STEPS)]
    for name, grid in EARLY_TASKS.items():
        task = grid_task(grid)
        read: dict[int, list[float]] = {n: [] for n in SAME_LOSS_STEPS}
        for seed in FAMILY_SEEDS:
            curves: dict[str, list[list[float]]] = {}
            for fork, losses in unstopped_forks(task, seed):
                curves.setdefault(fork.family, []).append([losses[k] for k in sorted(losses)])
            mean = {f: [sum(c[i] for c in cs) / len(cs) for i in range(min(map(len, cs)))] for f, cs in curves.items()}
            for n in SAME_LOSS_STEPS:
                r = same_loss_reading(mean["topk"], mean["powersgd"], n)
                if r is not None:
                    read[n].append(r)
        cells = [f"{statistics.median(x):.2f} [{min(x):.2f}, {max(x):.2f}] ({len(x)})" if x else "- (0)"
                 for x in read.values()]
        reads = sum(split_pilot_reading(task, seed) is not None for seed in FAMILY_SEEDS)
        rows.append(f"| {name} | {reads}/{len(FAMILY_SEEDS)} | {table_family_ratio(results, grid)} | "
                    + " | ".join(cells) + " |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="runs/final", help="the final run's cells (tta-learn timelines)")
    p.add_argument("--results", default="testbed/results", help="the final run's tables (<grid>.jsonl[.gz])")
    p.add_argument("--sections", default="1,2,3,4,5,6,7,8,9", help="which sections to print (comma-separated)")
    p.add_argument("--pilot-rows", action="store_true", help="section 5: only the pilot's two rows (the rest "
                                                                "takes most of the time)")
    a = p.parse_args()
    want = {int(x) for x in a.sections.split(",")}
    torch.set_num_threads(1)
    print("# Can the controller tell which compressor a task needs? (`python testbed/studies/learnability.py`)\n")
    sections = [
        (1, "Steps to the target in the final run (x dense allreduce's steps, where it reached it)",
         lambda: step_counts(a.results)),
        (2, "learnKnee's first-order progress readings (tta-learn runs)", lambda: progress_readings(a.runs)),
        (3, "Two properties of each task's gradient (2 seeds each)", structure),
        (4, f"A short pilot: {PILOT_STEPS} steps, x the dense steps to the same loss (seeds 0, 1, 2)", pilots),
        (5, f"Which family: TopK+EF 1%'s steps over PowerSGD r4's, measured and read early (seeds "
            f"{FAMILY_SEEDS[0]}-{FAMILY_SEEDS[-1]}; median [min, max]; share of one run's / two workers' readings "
            f"on the measured side of {FAMILY_BOUNDARY:.2f})",
         lambda: family_readings(a.results, [PILOT_READING, PAIRED_PILOT_READING] if a.pilot_rows else None)),
        (6, "tta's family pilot: its reading h mapped to the step ratio R = h^exponent",
         lambda: pilot_calibration(a.results)),
        (7, f"When a pilot fork will not reach {pilot.HALT_LEVEL} x its first loss: how far it had come by steps "
            f"{CHECKPOINTS} (seeds {FAMILY_SEEDS[0]}-{FAMILY_SEEDS[-1]}, every fork run to {pilot.MAX_STEPS} steps "
            f"or {min(HALT_LEVELS)} x)",
         early_stop_evidence),
        (8, f"Halting at other levels: the pilot's reading h if the forks stopped at {HALT_LEVELS} x the first probe "
            f"loss (seeds {FAMILY_SEEDS[0]}-{FAMILY_SEEDS[-1]}, every fork read at every step to {pilot.MAX_STEPS})",
         halting_levels),
        (9, f"Where the pilot reads nothing: TopK's steps over PowerSGD's to the same probe loss after "
            f"{SAME_LOSS_STEPS} steps of the forks, no level (seeds {FAMILY_SEEDS[0]}-{FAMILY_SEEDS[-1]})",
         lambda: early_readings(a.results)),
    ]
    for number, title, rows in sections:
        if number in want:
            print(f"\n## {number}. {title}\n")
            print("\n".join(rows()))

if __name__ == "__main__":
    main()
