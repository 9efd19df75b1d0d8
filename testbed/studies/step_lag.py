"""Study. Question: how many more steps than a fixed method does ours take to the target, and from when?
Answer (testbed/EVALUATION.md, not a results file): "over both grids' 80 pairs the candidate took **1.10 [1.04,
1.17]** of fixed rank 8's steps to the target" (dev-halt-set2, dev-rankcost-set2); "It is behind from the first
evaluations".
Run on: those grids' tables (testbed/results/dev-halt-set2.md: commit f1c8807aafeb; dev-rankcost-set2.md: f0f4125dc269).

How many more steps one method took than another to the target, paired by seed, and where it fell behind.

    python testbed/studies/step_lag.py dev-halt-set2 dev-rankcost-set2 --ours tta-lowranks-pilot --other powersgd-r8

From the committed tables (testbed/results/<grid>.jsonl[.gz], every seed's steps and accuracy curve): the paired
geometric mean of the steps ratio (ours / other) over every scenario and seed of the grids given, with a 95% t
interval (Student's t on the log ratios, as fair.py's), and per grid the two methods' mean test accuracy at a few
steps (evaluations are every other step): a ratio above 1 with the gap open from the first evaluations on is a
slower start, not a slower rate. With
``--runs`` (the cells kept locally: runs/final/<grid>/<cell>/timeline.csv) the pairs are also split by the rank
that ran most of our cells' steps (80% or more; "mixed" otherwise).
"""

from __future__ import annotations

import argparse
import collections
import csv
import math
import os
import statistics

from netsense.bench import store
from netsense.bench.stats import t_interval

STEPS = (2, 4, 6, 10, 16, 24, 32)


def per_seed(grid: str, method: str) -> dict[tuple[str, int], dict]:
    """(scenario, seed) -> that cell's run, from the grid's committed table."""
    rows = store.load(os.path.join("testbed", "results", f"{grid}.json"))
    return {(r["scenario"], s["seed"]): s for r in rows if r["method"] == method for s in r["per_seed"]}


def main_rank(runs: str, grid: str, method: str, scenario: str, seed: int) -> str:
    """The rank that ran 80% or more of a cell's steps ("mixed" otherwise; "-" where the cell is not here)."""
    path = os.path.join(runs, grid, f"{method}--{scenario}--s{seed}", "timeline.csv")
    if not os.path.exists(path):
        return "-"
    ranks = collections.Counter(row.get("lowrank_rank", row.get("rank")) for row in csv.DictReader(open(path)))
    rank, count = ranks.most_common(1)[0]
    return f"rank {rank}" if rank and count >= 0.8 * sum(ranks.values()) else "mixed"


def interval(logs: list[float]) -> str:
    """The paired geometric mean of exp(logs) with its 95% t interval (netsense.bench.stats.t_interval, as
    fair.py's time ratios: a percentile bootstrap under-covers at these seed counts)."""
    low, high, _ = t_interval([math.exp(x) for x in logs])
    if low is None:
        return f"{math.exp(statistics.mean(logs)):.3f} (too few pairs for an interval)"
    return f"{math.exp(statistics.mean(logs)):.3f} [{low:.3f}, {high:.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("grids", nargs="+", help="grid names (testbed/results/<grid>.jsonl[.gz])")
    ap.add_argument("--ours", default="tta-lowranks-pilot")
    ap.add_argument("--other", default="powersgd-r8")
    ap.add_argument("--runs", help="split the pairs by our cells' main rank, from the cells kept here (runs/final)")
    a = ap.parse_args()
    logs, by_rank = [], collections.defaultdict(list)
    for grid in a.grids:
        ours, other = per_seed(grid, a.ours), per_seed(grid, a.other)
        pairs = [(ours[k], other[k]) for k in sorted(ours.keys() & other.keys())]
        for key in sorted(ours.keys() & other.keys()):
            x, y = ours[key], other[key]
            if x["steps_to_target"] and y["steps_to_target"]:
                logs.append(math.log(x["steps_to_target"] / y["steps_to_target"]))
                if a.runs:
                    by_rank[main_rank(a.runs, grid, a.ours, *key)].append(logs[-1])
        means = []
        for step in STEPS:
            got = [(dict((s, acc) for s, _, acc in x["accuracy_curve"]).get(step),
                    dict((s, acc) for s, _, acc in y["accuracy_curve"]).get(step)) for x, y in pairs]
            got = [(p, q) for p, q in got if p is not None and q is not None]
            if got:
                means.append(f"step {step}: {statistics.mean(p for p, _ in got):.3f} / "
                             f"{statistics.mean(q for _, q in got):.3f}")
        print(f"{grid} ({len(pairs)} pairs), mean accuracy {a.ours} / {a.other}: " + "; ".join(means))
    print(f"steps {a.ours} / {a.other} (paired geometric mean, {len(logs)} pairs): {interval(logs)}")
    for rank, group in sorted(by_rank.items()):
        print(f"  our cells on {rank}: {interval(group)} ({len(group)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
