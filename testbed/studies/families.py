"""Study (a reading of local cells). Question: once tta's family pilot reads PowerSGD right, does tta still run TopK?
Answer (testbed/EVALUATION.md, not a results file: the cells are not kept): "**2 of 40** read-right cells ran
TopK on more than a tenth of their steps" (dev-price-set2/4 and dev-batch-set2/4).
Run on: the cells of those grids (testbed/results/dev-price-set2.md: commit b92ee04d509e; dev-batch-set2.md: 329b9faaf72a).

Which compressor tta ran, step by step, from a bench's cells: the family pilot's reading against what followed.

    python testbed/studies/families.py runs/final/dev-price-set2 [runs/final/dev-batch-set2 ...] [--method tta]

For every cell of the method: the pilot's reading h (none: no fork halved its loss), the share of its steps
(probes left out) that ran each family (dense, TopK, PowerSGD), its longest stretch of TopK steps and the median
density of its TopK steps. A cell *read right* for PowerSGD where h >= ``CUT`` (the pilot then priced TopK at
over 1.46x PowerSGD rank 4's steps); the summary counts those that still ran TopK on more than ``STRETCH`` of
their steps, the measure issue 36's dev-batch, dev-compute and dev-price grids registered; and each family's median
compute a step over all the cells (the same whatever the family where compute is measured right), the median
seconds a step takes (from one timeline row to the next) at each rank and family, and when the first step ended
(the family pilot runs before it), and the probes a cell sent. Reads each cell's
timeline.csv and result.json (the bench's output directories: kept locally under runs/, not committed).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics

from netsense.train.results import read_timeline

CUT = 1.2  # the pilot's reading at which set 2's grids count a cell as read right for PowerSGD
STRETCH = 0.1  # share of a cell's steps on TopK that counts as tta leaving PowerSGD
FAMILIES = ("dense", "topk", "lowrank")


def _rank(row: dict) -> float | None:
    """The step's PowerSGD rank ("rank" in timelines before 2026-12-06, "lowrank_rank" since)."""
    return row.get("lowrank_rank", row.get("rank"))


def family(row: dict) -> str:
    """dense, topk or lowrank: what one timeline row's step ran."""
    if _rank(row):
        return "lowrank"
    return "dense" if row["density"] >= 1 else "topk"


def cell_families(cell: str) -> dict:
    """One cell's pilot reading and the families its steps ran (probes left out)."""
    with open(os.path.join(cell, "result.json")) as fh:
        pilot = json.load(fh).get("family_pilot") or {}
    every = read_timeline(os.path.join(cell, "timeline.csv"))
    rows = [r for r in every if r["probe"] != 1]
    kinds = [family(r) for r in rows]
    runs = [len(list(g)) for k, g in itertools.groupby(kinds) if k == "topk"]
    densities = [r["density"] for r, k in zip(rows, kinds, strict=True) if k == "topk"]
    compute = {f: [r["compute_s"] for r, k in zip(rows, kinds, strict=True) if k == f and r["compute_s"]]
               for f in FAMILIES}
    seconds: dict[str, list[float]] = {}
    for before, row in zip(every, every[1:], strict=False):
        if row["probe"] != 1:
            key = f"rank {_rank(row):g}" if _rank(row) else family(row)
            seconds.setdefault(key, []).append(row["time"] - before["time"])
    return {"reading": pilot.get("reading"), "steps": len(kinds), "compute": compute, "seconds": seconds,
            "first": every[0]["time"] if every else None, "probes": sum(r["probe"] == 1 for r in every),
            "share": {k: kinds.count(k) / max(1, len(kinds)) for k in FAMILIES},
            "topk_stretch": max(runs, default=0),
            "topk_density": statistics.median(densities) if densities else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench output directories (runs/final/<grid>)")
    ap.add_argument("--method", default="tta", help="cells whose name starts with this (a method, or method--profile)")
    a = ap.parse_args()
    for run in a.runs:
        print(f"\n## {run}\n")
        print("| cell | pilot h | steps | dense | TopK | PowerSGD | longest TopK stretch | TopK median density |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        right = left = 0
        densities = []
        compute: dict[str, list[float]] = {k: [] for k in FAMILIES}
        seconds: dict[str, list[float]] = {}
        firsts, probes = [], []
        for cell in sorted(glob.glob(os.path.join(run, f"{a.method}*--*"))):  # cells: method--profile--seed
            f = cell_families(cell)
            for k in FAMILIES:
                compute[k] += f["compute"][k]
            for k, v in f["seconds"].items():
                seconds.setdefault(k, []).extend(v)
            if f["first"] is not None:
                firsts.append(f["first"])
            probes.append(f["probes"])
            h, share, d = f["reading"], f["share"], f["topk_density"]
            if d is not None:
                densities.append(d)
            if h is not None and h >= CUT:
                right += 1
                left += share["topk"] > STRETCH
            print(f"| {os.path.basename(cell)} | {'-' if h is None else f'{h:.2f}'} | {f['steps']} | "
                  f"{share['dense']:.0%} | {share['topk']:.0%} | {share['lowrank']:.0%} | {f['topk_stretch']} | "
                  f"{'-' if d is None else f'{d:.2%}'} |")
        print(f"\nRead right (h >= {CUT}): {right} cells; of them on TopK for more than {STRETCH:.0%} of their "
              f"steps: {left}.")
        if not firsts:
            print("No cells of this method.")
            continue
        print("Compute a step, median over the cells' steps (probes left out): " + ", ".join(
            f"{k} {1e3 * statistics.median(v):.1f} ms ({len(v)})" for k, v in compute.items() if v) + ".")
        print("Seconds a step, median (share of the steps): " + ", ".join(
            f"{k} {1e3 * statistics.median(v):.1f} ms ({len(v) / sum(map(len, seconds.values())):.0%})"
            for k, v in sorted(seconds.items())) + ".")
        print(f"First step ended at {statistics.median(firsts):.2f} s; probes a cell {statistics.median(probes):g} "
              f"(medians over cells).")
        if densities:
            print(f"TopK steps' median density, the median over cells: {statistics.median(densities):.2%} "
                  f"({len(densities)} cells).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
