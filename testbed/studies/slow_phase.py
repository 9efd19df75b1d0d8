"""Study (a reading of local cells). Question: did tta's link estimate follow a drop to the link's slowest phase?
Answer (testbed/EVALUATION.md, not a results file: the cells are not kept): "On set 2's step-wise link 1 of 9
runs that probed in the 30 Mbit/s phase ended it with an estimate over 1.5x the link ... against 2 of 9 in
dev-pilot-final-set2."
Run on: the cells of dev-sense-set2/4 (testbed/results/dev-sense-set2.md: commit 07a33c648402).

Did tta's link estimate follow a drop? Its estimate through each run's slowest phase, from a bench's cells.

    python testbed/studies/slow_phase.py runs/final/dev-sense-set2 [runs/final/dev-pilot-final-set2 ...] [--method tta]

For every cell of the method on a link that changes, its longest stretch of steps at the link's lowest rate:
the median estimate over the stretch's last 10 steps (x that rate: 1 is right; the small steps cannot lower an
estimate, only a probe can), and the probes sent in it (count, seconds on the wire); then the family pilot's
seconds and probe reads where it ran. A run counts as stuck where that median is over 1.5x the rate after a
probe was sent in the stretch (before the first probe there nothing could have lowered it: not judged). Reads
each cell's timeline.csv and result.json (the bench's output directories: kept locally under runs/, not
committed).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics

from netsense.train.results import read_timeline

STUCK = 1.5  # x the link: an estimate this far above it sizes every probe from a link that is gone
LAST = 10  # steps at the end of the slowest phase whose estimates are read


def slow_phase(cell: str) -> dict | None:
    """The longest stretch at the lowest rate of one cell; None where the link is static."""
    rows = [r for r in read_timeline(os.path.join(cell, "timeline.csv")) if r["link_rate_mbit"] is not None]
    rates = {r["link_rate_mbit"] for r in rows}
    if len(rates) < 2:
        return None
    low = min(rates)
    stretches = [list(g) for is_low, g in itertools.groupby(rows, key=lambda r: r["link_rate_mbit"] == low) if is_low]
    phase = max(stretches, key=len)
    estimates = [r["est_btlbw_mbit"] for r in phase[-LAST:] if r["est_btlbw_mbit"]]
    probes = [r["comm_s"] for r in phase if r["probe"] == 1]
    return {"rate": low, "steps": len(phase), "estimate": statistics.median(estimates) if estimates else None,
            "probes": len(probes), "probe_seconds": sum(probes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="bench output directories (runs/final/<grid>)")
    ap.add_argument("--method", default="tta", help="cells whose method name starts with this")
    a = ap.parse_args()
    for run in a.runs:
        print(f"\n## {run}\n")
        print("| cell | lowest rate | steps there | estimate (last 10) | x rate | probes there | probe s | pilot s "
              "| pilot reads |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        stuck = judged = 0
        pilots = []
        for cell in sorted(glob.glob(os.path.join(run, f"{a.method}*"))):
            with open(os.path.join(cell, "result.json")) as fh:
                pilot = json.load(fh).get("family_pilot") or {}
            if pilot.get("seconds") is not None:
                pilots.append(pilot["seconds"])
            s = slow_phase(cell)
            reads = pilot.get("probe_reads", "-")
            if s is None:
                print(f"| {os.path.basename(cell)} | static | | | | | | {pilot.get('seconds', '-')} | {reads} |")
                continue
            x = s["estimate"] / s["rate"] if s["estimate"] else None
            judged += s["probes"] > 0
            stuck += s["probes"] > 0 and x is not None and x > STUCK
            print(f"| {os.path.basename(cell)} | {s['rate']:g} | {s['steps']} | {s['estimate'] or 0:.0f} | "
                  f"{x or 0:.2f} | {s['probes']} | {s['probe_seconds']:.2f} | {pilot.get('seconds', '-')} | {reads} |")
        print(f"\nStuck over {STUCK}x the lowest rate after a probe at it: {stuck} of {judged} cells that probed there.")
        if pilots:
            print(f"Pilot seconds: median {statistics.median(pilots):.2f}, range {min(pilots):.2f}-{max(pilots):.2f} "
                  f"({len(pilots)} cells).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
