"""How well do the adaptive methods sense the link? Real runs on the emulated testbed (root).

    python testbed/sensing.py [--out DIR] [--rates 20,50,200,1000] [--methods netsense,tta]

For each method and static rate, trains the quick job's task (digits, the
1.1M-parameter MLP, 2 workers) for --steps steps and reports the median
estimated bottleneck bandwidth over the second half of the run as a multiple of
the link rate (target 0.8-1.25x), with the goodput (wire bytes over the training
clock, never above the link) and the collectives' busy-time rate. Then a step
profile (200 -> 20 -> 200 Mbit) and the steps each change took to show, from
the first step that ran wholly at the new rate: within 1.25x of 20 Mbit after
the drop, at least 0.8x of 200 after the rise.
Writes DIR/sensing.md and DIR/sensing.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys

from netsense.emulation.runner import run_job
from netsense.spec import parse_spec


def job(method: str, profile: dict, steps: int) -> dict:
    return {"workers": 2,
            "training": {"model": "mlp", "hiddenSize": 1024, "dataset": "digits", "batchSize": 32, "lr": 0.05,
                         "maxSteps": steps, "evalEvery": 10, "seed": 0},
            "compression": {"method": method}, "network": {"profile": profile}}


def timeline(out: str) -> list[dict]:
    with open(os.path.join(out, "timeline.csv")) as fh:
        return list(csv.DictReader(fh))


def num(row: dict, key: str) -> float | None:
    return float(row[key]) if row.get(key) not in (None, "") else None


def steps_to(rows: list[dict], change: int, ok) -> int | None:
    """Steps until ok(estimate) holds, counted from the first step that ran wholly at the new rate.

    Row ``change`` is the step during which the rate changed (a row's rate is the one in force at its
    end); a row's estimate is the one its step was decided with, so a step's own sample shows one row on."""
    for i, row in enumerate(rows[change + 1:]):
        est = num(row, "est_btlbw_mbit")
        if est is not None and ok(est):
            return i + 1
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/sensing")
    ap.add_argument("--rates", default="20,50,200,1000", help="Mbit/s, comma separated")
    ap.add_argument("--methods", default="netsense,tta")
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args()
    rows, changes = [], []
    for method in args.methods.split(","):
        for rate in [float(r) for r in args.rates.split(",")]:
            out = os.path.join(args.out, f"{method}-{rate:g}")
            spec = job(method, {"type": "static", "rate": f"{rate:g}Mbit"}, args.steps)
            result = run_job(parse_spec(spec, f"sensing-{method}"), out, quiet=True)
            tl = timeline(out)
            est = [num(r, "est_btlbw_mbit") for r in tl[len(tl) // 2:]]
            median = statistics.median([e for e in est if e is not None])
            rows.append({"method": method, "rate_mbit": rate, "median_estimate_mbit": round(median, 1),
                         "ratio": round(median / rate, 3), "goodput_mbit": result["wire_goodput_mbit"],
                         "collective_rate_mbit": result["collective_rate_mbit"],
                         "mean_density": result["mean_density"]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        # A drop and a rise on the training clock, each held for 40 steps' worth of time.
        probe = os.path.join(args.out, f"{method}-steps")
        base = run_job(parse_spec(job(method, {"type": "static", "rate": "200Mbit"}, 40), "probe"), probe, quiet=True)
        hold = base["train_seconds"]
        profile = {"type": "steps", "steps": [{"at": "0s", "rate": "200Mbit"}, {"at": f"{hold:.3f}s", "rate": "20Mbit"},
                                              {"at": f"{3 * hold:.3f}s", "rate": "200Mbit"}]}
        run_job(parse_spec(job(method, profile, 400), "steps"), probe, quiet=True)
        tl = timeline(probe)
        drop = next(i for i, r in enumerate(tl) if num(r, "link_rate_mbit") == 20)
        rise = next(i for i, r in enumerate(tl) if i > drop and num(r, "link_rate_mbit") == 200)
        changes.append({"method": method, "drop_steps": steps_to(tl, drop, lambda e: e <= 1.25 * 20),
                        "rise_steps": steps_to(tl, rise, lambda e: e >= 0.8 * 200)})
        print(json.dumps(changes[-1]), file=sys.stderr, flush=True)
    with open(os.path.join(args.out, "sensing.json"), "w") as fh:
        json.dump({"static": rows, "changes": changes}, fh, indent=1)
    lines = ["# Sensing: the estimated bottleneck bandwidth on static links, and after a drop and a rise", "",
             f"Reproduce: `python testbed/sensing.py --out DIR` (root; {args.steps} steps per static run, digits MLP, "
             "2 workers). Goodput = wire bytes / training clock; collective rate = wire bytes / the collectives' "
             "busy time. Steps are counted from the first step that ran wholly at the new rate.", "",
             "| method | link (Mbit/s) | estimate, median of 2nd half | x link | goodput | collective rate "
             "| mean density |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['method']} | {r['rate_mbit']:g} | {r['median_estimate_mbit']} | {r['ratio']} | "
              f"{r['goodput_mbit']} | {r['collective_rate_mbit']} | {r['mean_density']} |" for r in rows]
    lines += ["", "| method | steps until a 200 -> 20 drop shows (<= 25 Mbit) | a 20 -> 200 rise (>= 160) |",
              "|---|---:|---:|"]
    lines += [f"| {c['method']} | {c['drop_steps']} | {c['rise_steps']} |" for c in changes]
    with open(os.path.join(args.out, "sensing.md"), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
