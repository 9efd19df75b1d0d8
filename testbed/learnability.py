"""Can the controller tell, from a task's own training, which compressor it needs? The evidence.

    .venv/bin/python testbed/learnability.py [--runs runs/final] > testbed/results/learnability.md

tta chooses among TopK densities with error feedback (EF), priced by a steps model (``1 + knee/d`` times
the dense steps). Where it misses the 1.1x bar (set 2, set 3's fluctuating link) the winners send without
EF (the paper's netsense) or low-rank (PowerSGD), and need far fewer steps than TopK with EF on those
tasks, while on the CNNs TopK with EF needs as few or fewer. Choosing between them online needs a signal
from the task that ranks the tasks as their step counts do. Four readings, each printed as a table:

1. Step counts of the final run (testbed/results/<grid>.json): each family's steps to the target over
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

Nothing here is fitted or tuned; it reads the final run and measures gradients.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import statistics
from dataclasses import dataclass

import torch

from netsense.bench.grid import load_grid
from netsense.spec import parse_job
from netsense.train.data import load_dataset
from netsense.train.models import build_model

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

    @property
    def label(self) -> str:
        return f"{self.model} {self.hidden} on {self.dataset}"


def grid_task(grid: str) -> Task:
    """The task of testbed/grids/<grid>.yaml (its base training, defaults filled)."""
    _, cells, _ = load_grid(os.path.join("testbed", "grids", f"{grid}.yaml"))
    job = parse_job(cells[0].job)
    t = job.training
    return Task(t["model"], t["hiddenSize"], t["dataset"], job.workers * t["batchSize"], t["lr"], t["momentum"])


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
        if not os.path.exists(path):
            continue
        by: dict[str, dict[str, dict]] = {}
        for r in json.load(open(path)):
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


def _train(task: Task, seed: int, steps: int, read=None, density: float = 0.0, error_feedback: bool = True,
           losses: list[float] | None = None) -> int:
    """SGD as the grid's workers run it (its lr and momentum, all workers' samples in one step; without
    the weight decay), one process: dense, or TopK at ``density`` with or without error feedback.
    ``read(step, gradient, residual)`` after each backward; ``losses`` gets the loss on a fixed 512
    training samples after each update."""
    torch.manual_seed(seed)
    data = load_dataset({"dataset": task.dataset, "seed": seed})
    net = build_model(task.model, data.input_shape, data.classes, task.hidden)
    fixed = torch.randperm(len(data.train_y), generator=torch.Generator().manual_seed(99))[:512]
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    residual, velocity = torch.zeros(n), torch.zeros(n)
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        batch = torch.randint(0, len(data.train_y), (task.batch,), generator=g)
        net.zero_grad()
        torch.nn.functional.cross_entropy(net(data.train_x[batch]), data.train_y[batch]).backward()
        grad = torch.cat([p.grad.flatten() for p in params])
        update = grad
        if density:
            x = grad + residual if error_feedback else grad
            update = torch.zeros(n)
            top = x.abs().topk(max(1, int(density * n))).indices
            update[top] = x[top]
            residual = x - update if error_feedback else residual
        if read:
            read(step, grad, residual)
        velocity = task.momentum * velocity + update
        with torch.no_grad():
            offset = 0
            for p in params:
                p -= task.lr * velocity[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            if losses is not None:
                losses.append(torch.nn.functional.cross_entropy(net(data.train_x[fixed]), data.train_y[fixed]).item())
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
    s = next((i for i, x in enumerate(dense, 1) if x <= compressed[-1]), None)
    return len(compressed) / s if s else 0.0


def pilots() -> list[str]:
    rows = [f"| task | {' | '.join(PILOTS)} |", "| --- |" + " ---: |" * len(PILOTS)]
    for name, grid in TASKS.items():
        task = grid_task(grid)
        ratios: dict[str, list[float]] = {pilot: [] for pilot in PILOTS}
        for seed in (0, 1, 2):
            dense: list[float] = []
            _train(task, seed, PILOT_STEPS, losses=dense)  # once per seed: every pilot is read against it
            for pilot, (density, ef) in PILOTS.items():
                compressed: list[float] = []
                _train(task, seed, PILOT_STEPS, density=density, error_feedback=ef, losses=compressed)
                ratios[pilot].append(pilot_ratio(dense, compressed))
        rows.append(f"| {name} | " + " | ".join(" ".join(f"{x:.2f}" if x else "<1" for x in r)
                                               for r in ratios.values()) + " |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="runs/final", help="the final run's cells (tta-learn timelines)")
    p.add_argument("--results", default="testbed/results", help="the final run's tables (<grid>.json)")
    a = p.parse_args()
    torch.set_num_threads(1)
    print("# Can the controller tell which compressor a task needs? (`python testbed/learnability.py`)\n")
    print("## 1. Steps to the target in the final run (x dense allreduce's steps, where it reached it)\n")
    print("\n".join(step_counts(a.results)))
    print("\n## 2. learnKnee's first-order progress readings (tta-learn runs)\n")
    print("\n".join(progress_readings(a.runs)))
    print("\n## 3. Two properties of each task's gradient (2 seeds each)\n")
    print("\n".join(structure()))
    print(f"\n## 4. A short pilot: {PILOT_STEPS} steps, x the dense steps to the same loss (seeds 0, 1, 2)\n")
    print("\n".join(pilots()))


if __name__ == "__main__":
    main()
