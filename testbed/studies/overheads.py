"""Study (a reading of local cells). Question: where does an adaptive method's time go against a fixed one's?
Answer (testbed/EVALUATION.md, not a results file: the cells are not kept), e.g. dev-law-set4 at 30 Mbit/s:
"the pilot 0.45 s for 5 adopted steps ...; the probes 6.3 a run, 0.48 s over ordinary steps ...; the density,
0.66% where 0.2% is fastest"; "On a run of 3-5 s the pilot and the probes are 15-20% of the time".
Run on: the cells of dev-law-set4 (testbed/results/dev-law-set4.md: commit 4be447a4a34e); other grids since.

Where an adaptive method's time goes against a fixed one's, paired by seed, from the cells kept locally.

    python testbed/studies/overheads.py dev-law-set4 cnn1024-static-30 --ours tta-lowranks-pilot --other topk-0.002

For each seed (runs/final/<grid>/<method>--<scenario>--s<seed>/: result.json and timeline.csv) and their means:
both methods' time to the target; our family pilot's seconds and the steps it returned (adopted); our probes, how
many and their communication over the run's ordinary steps' median (their extra cost); the median time of an
ordinary step (no probe, no evaluation) of each; the steps each ran (result.json's: to the end of the run,
the target's hold included). These are the terms the README and
testbed/EVALUATION.md name when they say what an adaptive method's time over a fixed method's is made of.
The cells are not in the repository (runs/ is not): the committed tables hold each seed's totals only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics


def load(runs: str, grid: str, method: str, scenario: str, seed: int) -> tuple[list[dict], dict] | None:
    cell = os.path.join(runs, grid, f"{method}--{scenario}--s{seed}")
    if not os.path.exists(os.path.join(cell, "timeline.csv")):
        return None
    with open(os.path.join(cell, "timeline.csv")) as fh:
        rows = list(csv.DictReader(fh))
    with open(os.path.join(cell, "result.json")) as fh:
        return rows, json.load(fh)


def ordinary_step(rows: list[dict]) -> float:
    """Median seconds between an ordinary step and the one before it (no probe, no evaluation; where every step
    is evaluated, evalEvery 1 as on set 1, with its evaluation: the same for both methods)."""
    times = [float(r["time"]) for r in rows]
    steps = list(zip(times, times[1:], rows[1:], strict=False))
    gaps = [b - a for a, b, r in steps if r["probe"] != "1" and not r["accuracy"]]
    gaps = gaps or [b - a for a, b, r in steps if r["probe"] != "1"]
    return statistics.median(gaps) if gaps else float("nan")


def probe_extra(rows: list[dict]) -> tuple[int, float]:
    """The probes and their communication seconds over the median of the ordinary steps on the same link rate."""
    probes = [r for r in rows if r["probe"] == "1"]
    by_rate: dict[str, list[float]] = {}
    for r in rows:
        if r["probe"] != "1":
            by_rate.setdefault(r["link_rate_mbit"], []).append(float(r["comm_s"]))
    ordinary = {rate: statistics.median(comm) for rate, comm in by_rate.items()}
    return len(probes), sum(float(p["comm_s"]) - ordinary.get(p["link_rate_mbit"], 0.0) for p in probes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grid")
    ap.add_argument("scenario")
    ap.add_argument("--ours", default="tta-lowranks-pilot")
    ap.add_argument("--other", required=True)
    ap.add_argument("--runs", default=os.path.join("runs", "final"))
    a = ap.parse_args()
    prefix = f"{a.ours}--{a.scenario}--s"
    seeds = sorted(int(d[len(prefix):]) for d in os.listdir(os.path.join(a.runs, a.grid)) if d.startswith(prefix))
    table = []
    for seed in seeds:
        ours, other = load(a.runs, a.grid, a.ours, a.scenario, seed), load(a.runs, a.grid, a.other, a.scenario, seed)
        if ours is None or other is None or not ours[1]["time_to_accuracy_s"] or not other[1]["time_to_accuracy_s"]:
            continue
        pilot = ours[1].get("family_pilot") or {}
        probes, extra = probe_extra(ours[0])
        row = (ours[1]["time_to_accuracy_s"], other[1]["time_to_accuracy_s"], pilot.get("seconds", 0.0),
               pilot.get("adopted_steps", 0), probes, extra, ordinary_step(ours[0]), ordinary_step(other[0]),
               ours[1]["steps"], other[1]["steps"])
        table.append(row)
        print(f"s{seed}: TTA {row[0]:.2f} / {row[1]:.2f} s; pilot {row[2]:.2f} s, {row[3]} steps adopted; "
              f"{row[4]} probes, {row[5]:.2f} s over ordinary steps; step {1e3 * row[6]:.1f} / {1e3 * row[7]:.1f} "
              f"ms; steps {row[8]} / {row[9]}")
    if not table:
        print("no seed with both cells here and both at the target")
        return 1

    def mean(i: int) -> float:
        return statistics.fmean(r[i] for r in table)

    print(f"mean over {len(table)} seeds ({a.ours} / {a.other}): TTA {mean(0):.2f} / {mean(1):.2f} s; pilot "
          f"{mean(2):.2f} s, {mean(3):.1f} steps adopted; {mean(4):.1f} probes, {mean(5):.2f} s over ordinary "
          f"steps; step {1e3 * mean(6):.1f} / {1e3 * mean(7):.1f} ms; steps {mean(8):.0f} / {mean(9):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
