"""Validation of the simulated clock, layers (b) and (c): the same grid on both clocks, cell by cell (issue 61).

    sudo .venv/bin/python testbed/simulation/training.py GRID --out runs/DIR [--results testbed/results/NAME]
    .venv/bin/python testbed/simulation/training.py GRID --results testbed/results/NAME --print  # nothing run

Runs GRID as written (clock: real, the emulated link) into DIR/real and with every cell on the simulated clock
into DIR/simulated (two cells at once: its times do not depend on the load), each resumable. Fixed methods
train the same on both clocks (one thread, the same seed: only the clock differs), so each pair must reach the
target at the same step; the time to reach it is then the time model's alone. For each (method, scenario):
whether the steps agreed on every seed, and the ratio simulated / emulated time to accuracy as a 95% t
interval over the seeds (netsense.bench.stats.t_interval). Adaptive methods (layer c) decide on what each clock
tells them: for each seed pair, the share of the steps both took on which they chose the same family (dense,
TopK, low-rank) at a level within BUCKET (1.5x); the issue's bar is AGREE (90%) of the steps. Writes NAME.jsonl
(the results store: a record per seed pair) and NAME.md (the table), and rewrites the store's index.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from netsense.bench import run_bench, store  # noqa: E402
from netsense.bench.grid import FIXED_DECISIONS  # noqa: E402
from netsense.bench.stats import reached_at, t_interval  # noqa: E402
from netsense.train.results import read_timeline  # noqa: E402

BUCKET = 1.5  # layer (c): two choices of one family agree when their densities (or ranks) are within this factor
AGREE = 0.9  # ... on at least this share of the steps both runs took


def choice(row: dict) -> tuple[str, float]:
    """A step's compression choice as (family, level): low-rank at its rank, TopK at its density, or dense."""
    rank = row.get("lowrank_rank", row.get("rank"))  # "rank" in timelines before 2026-12-06
    if rank:
        return "lowrank", rank
    density = row.get("density")
    return ("dense", 1.0) if density is None or density >= 1 else ("topk", density)


def agreement(real: list[dict], simulated: list[dict]) -> float | None:
    """The share of the steps both runs took on which they chose the same family at a level within BUCKET."""
    steps = list(zip(real, simulated, strict=False))  # the steps both took
    if not steps:
        return None
    same = 0
    for a, b in steps:
        (fa, la), (fb, lb) = choice(a), choice(b)
        same += fa == fb and max(la, lb) / min(la, lb) <= BUCKET
    return same / len(steps)


def timeline(result: dict) -> list[dict]:
    path = result.get("timeline")
    return read_timeline(path) if path and os.path.exists(path) else []


def simulated_grid(grid_path: str, out: str) -> str:
    with open(grid_path) as fh:
        grid = yaml.safe_load(fh)
    grid["name"] = grid["name"] + "-simulated"
    network = grid["base"].setdefault("network", {})
    network["clock"] = "simulated"
    path = os.path.join(out, "simulated-grid.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(grid, fh)
    return path


def results(directory: str) -> dict[str, dict]:
    with open(os.path.join(directory, "summary.json")) as fh:
        return {r["job"]: r for r in json.load(fh)}


def pairs(out: str) -> list[dict]:
    real, sim = results(os.path.join(out, "real")), results(os.path.join(out, "simulated"))
    records = []
    for job, r in sorted(real.items()):
        s = sim.get(job)
        if s is None:
            continue
        a, b = reached_at(r), reached_at(s)
        adaptive = r["method"] not in FIXED_DECISIONS
        tr, ts = timeline(r), timeline(s)
        agree = agreement(tr, ts) if adaptive else None
        records.append({"job": job, "method": r["method"], "steps_real": a and a[0], "steps_simulated": b and b[0],
                         "tta_real": a and a[1], "tta_simulated": b and b[1],
                         "step_seconds_real": r["train_seconds"] / max(1, r["steps"]),
                         "step_seconds_simulated": s["train_seconds"] / max(1, s["steps"]),
                         "train_seconds_simulated": s["train_seconds"], "wall_seconds_simulated": s["wall_seconds"],
                         "decisions_agree": agree, "simulation": s.get("simulation"),
                         **{f"{part}_ms_{clock}": _mean_ms(tl, column) for clock, tl in (("real", tr), ("simulated", ts))
                            for part, column in (("compute", "compute_s"), ("compressor", "selection_s"))}})
    return records


def _mean_ms(rows: list[dict], column: str) -> float | None:
    """A timeline column's mean over the steps, in ms (None: no timeline, or the column never set)."""
    values = [r[column] for r in rows if r.get(column) is not None]
    return 1e3 * sum(values) / len(values) if values else None


def decomposition(records: list[dict]) -> str:
    """Where a step's time goes on each clock, per cell (means over its seeds' steps): the compute (the step less
    its wait for the network and less the compressor's work), the compressor's own work, and the rest (the wait
    for the network: the step's mean time less those two). On the simulated clock the first two are the model's
    inputs; on the emulated one they are measured per step, so a difference says which part the model misses."""
    lines = ["| cell | compute ms: emulated, simulated | compressor ms: emulated, simulated | "
             "network wait ms: emulated, simulated |", "| --- | ---: | ---: | ---: |"]
    by_cell: dict[str, list[dict]] = {}
    for r in records:
        by_cell.setdefault(cell_key(r["job"]), []).append(r)

    def mean(rs: list[dict], key: str) -> float | None:
        values = [r.get(key) for r in rs]
        return None if None in values or not values else sum(values) / len(values)

    for cell, rs in sorted(by_cell.items()):
        parts = []
        for part in ("compute", "compressor"):
            a, b = mean(rs, f"{part}_ms_real"), mean(rs, f"{part}_ms_simulated")
            parts.append("-" if a is None or b is None else f"{a:.1f}, {b:.1f}")
        waits = []
        for clock in ("real", "simulated"):
            step, compute, work = (mean(rs, f"step_seconds_{clock}"), mean(rs, f"compute_ms_{clock}"),
                                   mean(rs, f"compressor_ms_{clock}"))
            waits.append(None if None in (step, compute, work) else 1e3 * step - compute - work)
        parts.append("-" if None in waits else f"{waits[0]:.1f}, {waits[1]:.1f}")
        lines.append(f"| {cell} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def cell_key(job: str) -> str:
    return job.rsplit("-s", 1)[0]


def _cv(values: list[float]) -> float | None:
    """The spread between seeds: standard deviation over mean."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 / mean


def table(records: list[dict]) -> str:
    """Layer (b) for fixed methods (the same step to target, the ratio of times), layer (c) for adaptive ones
    (the share of steps on which both clocks chose alike: mean and the lowest seed's); for each cell the spread
    of time to target between seeds on each clock (what the clock's removing the step time's noise buys) and
    how much faster than real time the simulated runs were (simulated training seconds over wall seconds, the
    start-up included)."""
    lines = ["| cell (method, scenario) | seeds | same step to target | sim / emulated time to target [95% CI] | "
             "sim / emulated s a step (mean) | same choice, share of steps: mean (lowest seed) | "
             "spread between seeds (CV): emulated, simulated | simulated s / wall s |",
             "| --- | ---: | :---: | ---: | ---: | ---: | ---: | ---: |"]
    by_cell: dict[str, list[dict]] = {}
    for r in records:
        by_cell.setdefault(cell_key(r["job"]), []).append(r)
    for cell, rs in sorted(by_cell.items()):
        same = all(r["steps_real"] == r["steps_simulated"] for r in rs)
        ratios = [r["tta_simulated"] / r["tta_real"] for r in rs if r["tta_real"] and r["tta_simulated"]]
        low, high, _ = t_interval(ratios) if ratios else (None, None, None)
        mean = sum(ratios) / len(ratios) if ratios else None
        interval = "-" if mean is None else (f"{mean:.2f}" + (f" [{low:.2f}, {high:.2f}]" if low else " (no interval)"))
        per_step = sum(r["step_seconds_simulated"] / r["step_seconds_real"] for r in rs) / len(rs)
        agree = [r["decisions_agree"] for r in rs if r.get("decisions_agree") is not None]
        choices = f"{sum(agree) / len(agree):.0%} ({min(agree):.0%})" if agree else "-"
        cvs = [_cv([r[k] for r in rs if r[k]]) if all(r[k] for r in rs) else None
               for k in ("tta_real", "tta_simulated")]
        spread = "-" if None in cvs else f"{cvs[0]:.0%}, {cvs[1]:.0%}"
        speeds = [r["train_seconds_simulated"] / r["wall_seconds_simulated"] for r in rs
                  if r.get("wall_seconds_simulated")]
        speed = f"{sum(speeds) / len(speeds):.1f}x" if speeds else "-"
        lines.append(f"| {cell} | {len(rs)} | {'yes' if same else 'no'} | {interval} | {per_step:.2f} | {choices} | "
                     f"{spread} | {speed} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid")
    ap.add_argument("--out", default="runs/sim-training", help="the two benches' run directories (resumable)")
    ap.add_argument("--results", default="testbed/results/sim-training", help="the committed records and table")
    ap.add_argument("--seeds", help="S,S,...: only these of the grid's seeds")
    ap.add_argument("--clock", choices=("both", "simulated", "real"), default="both",
                    help="run one half only (the simulated half's times do not depend on the load; the real one's "
                         "do): no table until a run with both")
    ap.add_argument("--print", action="store_true", help="the table from --results's records; nothing is run")
    args = ap.parse_args()
    if not args.print:
        os.makedirs(args.out, exist_ok=True)
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        if args.clock in ("both", "simulated"):
            run_bench(simulated_grid(args.grid, args.out), os.path.join(args.out, "simulated"), seeds=seeds,
                      parallel=2)
        if args.clock in ("both", "real"):
            run_bench(args.grid, os.path.join(args.out, "real"), seeds=seeds)
        if args.clock != "both":
            return 0  # the table pairs the two: written when both have run
        store.save(args.results + ".jsonl", pairs(args.out))
    records = store.load(args.results + ".jsonl")
    md = table(records) + "\n\nWhere a step's time goes (means over the seeds):\n\n" + decomposition(records)
    if not args.print:
        with open(args.results + ".md", "w") as fh:
            fh.write(f"# The simulated clock against the emulator, training (grid {args.grid})\n\n"
                     "Produced by `testbed/simulation/training.py` (print it again: `--print`).\n\n" + md + "\n")
        store.write_index(os.path.dirname(args.results) or ".")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
