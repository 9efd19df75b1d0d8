"""Fit tta's step priors from the tuning runs (testbed/grids/tune-families.yaml), and print every number the
README quotes about them.

    python testbed/fit_families.py                           # testbed/results/tune-families.json
    python testbed/fit_families.py --table runs/tune-families/table.json

Per method, the steps to the target over allreduce's on the same seed (paired), their mean over seeds; then

- PowerSGD: ``steps = (1 + lowRankKnee / r) x dense``, lowRankKnee by least squares over every (rank, seed):
  lowRankKnee = sum((ratio - 1) / r) / sum(1 / r^2); and ``1 + c / r^p`` (c, p by least squares);
- TopK: the controller's law ``1 + kneeDensity / d`` fitted the same way (kneeDensity = sum((ratio - 1) / d) /
  sum(1 / d^2)), and a two-parameter law ``1 + (knee / d) ** p`` fitted by least squares on log(ratio - 1)
  against log d (mean ratios above 1 only), and the one-parameter power law ``d ** -q`` (tta's stepLaw power:
  q = sum(log ratio x log(1/d)) / sum(log(1/d)^2) over every (density, seed)), each law's prediction beside the
  measured mean.

With ``--check GRID...`` (results under testbed/results, e.g. fair3 fair4 fair5: tasks the laws were never fitted
on), per scenario of each grid and per law (the inverse law at kneeDensity 0.003, the power law at the fitted
q): the predicted steps over the measured at each density of the fixed TopK sweep, the task's dense steps
fitted as the law's scale (geometric mean: the grids have no dense run), and the density each law would choose
from the sweep's measured step times (the argmin of law x seconds a step) beside the hindsight-best one; and the
exponent q the task's own sweep fits (the slope of log steps on log 1/d), to set beside the tuning task's 0.109.

With ``--family-prior``: where the family pilot reads nothing (the development conv nets and two MLPs), TopK's steps
over PowerSGD rank 4's against what the priors give, per task; convTopkPrior (tta's, since removed: issue 62) was
the conv nets' geometric mean.

With ``--ranks GRID...``: PowerSGD's steps to the target at each rank over rank 4's, per grid, beside what the
low-rank law ``1 + lowRankKnee / r`` (lowRankKnee 2.3, fitted on the tuning set) gives for the same ratio.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from collections.abc import Callable

from netsense.bench import store

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def steps(row: dict) -> dict[int, int]:
    return {s["seed"]: s["steps_to_target"] for s in row["per_seed"] if s.get("steps_to_target") is not None}


def ratios(rows: list[dict], dense: str = "allreduce") -> dict[str, list[float]]:
    """Each method's steps to the target over the dense method's, per common seed."""
    base = steps(next(r for r in rows if r["method"] == dense))
    out = {}
    for r in rows:
        mine = steps(r)
        common = sorted(set(mine) & set(base))
        if r["method"] != dense and common:
            out[r["method"]] = [mine[s] / base[s] for s in common]
    return out


def parameter(method: str, prefix: str) -> float:
    return float(method[len(prefix):])


def fit_inverse(points: list[tuple[float, float]]) -> float:
    """c minimizing sum (ratio - 1 - c / x)^2 over (x, ratio)."""
    return sum((ratio - 1) / x for x, ratio in points) / sum(1 / x ** 2 for x, _ in points)


def fit_power(means: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(knee, p) of ratio = 1 + (knee / d) ** p: least squares of log(ratio - 1) on log d."""
    pts = [(math.log(d), math.log(r - 1)) for d, r in means if r > 1]
    if len(pts) < 2:
        return None
    slope, intercept = statistics.linear_regression([x for x, _ in pts], [y for _, y in pts])
    p = -slope
    return math.exp(intercept / p), p


def fit_rank_power(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(c, p) of ratio = 1 + c / r^p by least squares: for each p on a grid of 0.05 from 0.25 to 3, c in closed
    form; the p with the least squared error."""
    best = None
    for p in (i / 20 for i in range(5, 61)):
        c = sum((x - 1) / r ** p for r, x in points) / sum(1 / r ** (2 * p) for r, _ in points)
        err = sum((x - 1 - c / r ** p) ** 2 for r, x in points)
        if best is None or err < best[0]:
            best = (err, c, p)
    return best[1], best[2]


def fit_exponent(points: list[tuple[float, float]]) -> float:
    """q minimizing sum (log ratio - q log(1/d))^2 over (d, ratio): ratio = d ** -q."""
    return (sum(math.log(x) * math.log(1 / d) for d, x in points)
            / sum(math.log(1 / d) ** 2 for d, _ in points))


def own_exponent(sweep: dict[float, float]) -> float | None:
    """The slope of log steps on log(1/d) over a task's sweep (least squares, its scale free): the q of
    ``steps = c d^-q`` that this task alone would fit, to set beside the tuning task's. None for a sweep of
    one density (a development grid's single fixed reference)."""
    if len(sweep) < 2:
        return None
    return statistics.linear_regression([math.log(1 / d) for d in sweep], [math.log(st) for st in sweep.values()]).slope


def complete(row: dict) -> list[dict] | None:
    """A row's per-seed records, if every seed reached the target."""
    seeds = row.get("per_seed", [])
    ok = all(s.get("steps_to_target") and s.get("time_to_accuracy_s") for s in seeds)
    return seeds if seeds and ok else None


def check(grid: str, laws: dict[str, Callable[[float], float]]) -> None:
    rows = store.load(os.path.join(RESULTS, f"{grid}.json"))
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        sweep = {}  # density -> (mean steps, mean seconds a step, mean TTA)
        for r in rows:
            seeds = complete(r) if r["scenario"] == scenario and r["method"].startswith("topk-") else None
            if seeds:
                sweep[parameter(r["method"], "topk-")] = (
                    statistics.fmean(s["steps_to_target"] for s in seeds),
                    statistics.fmean(s["time_to_accuracy_s"] / s["steps_to_target"] for s in seeds),
                    statistics.fmean(s["time_to_accuracy_s"] for s in seeds))
        best = min(sweep, key=lambda d: sweep[d][2])
        q = own_exponent({d: st for d, (st, _, _) in sweep.items()})
        print(f"{grid} {scenario}: hindsight-best fixed {best:g} ({sweep[best][2]:.2f} s); the task's own "
              f"exponent q = " + (f"{q:.3f}" if q is not None else "- (one density)"))
        for name, law in laws.items():
            scale = math.exp(statistics.fmean(math.log(st / law(d)) for d, (st, _, _) in sweep.items()))
            off = " ".join(f"{d:g}: {law(d) * scale / st:.2f}" for d, (st, _, _) in sorted(sweep.items()))
            pick = min(sweep, key=lambda d: law(d) * sweep[d][1])
            print(f"  {name}: predicted / measured steps {off}; would choose {pick:g} "
                  f"({sweep[pick][2]:.2f} s, {sweep[pick][2] / sweep[best][2]:.2f}x the best)")


# Where the family pilot reads nothing (testbed/results/learnability.md, sections 7 and 9: the conv nets and the MLPs
# whose loss falls too slowly at first; on fresh-mlp's it reads on 7 of 10 seeds). Development data only (dev-rerun-*, and
# the spent fresh sets' tasks).
NO_READING = {"dev-rerun-set1": "conv", "dev-rerun-set4": "conv", "dev-rerun-set5": "conv", "fresh2-cnn32": "conv",
              "fresh-cnn1d": "conv", "fresh2-syn4": "mlp", "fresh-mlp": "mlp"}
DENSITY_EXPONENT, LOWRANK_KNEE = 0.109, 2.3  # the candidate's priors: TopK d^-q, PowerSGD 1 + knee/r


def family_prior() -> None:
    """TopK's steps to the target over PowerSGD rank 4's, measured, over what the priors give (d^-q against
    1 + knee/4), at every density and link of each task where the pilot reads nothing; per task the median,
    and the geometric mean of the conv nets' medians (tta's convTopkPrior in the candidate; since removed)."""
    medians: dict[str, list[float]] = {}
    for grid, kind in NO_READING.items():
        off = []
        rows = store.load(os.path.join(RESULTS, f"{grid}.json"))
        for scenario in dict.fromkeys(r["scenario"] for r in rows):
            by = {r["method"]: r for r in rows if r["scenario"] == scenario}
            rank4 = by.get("powersgd-r4", {}).get("steps_to_target")
            for m, r in by.items():
                if rank4 and m.startswith("topk-") and r.get("steps_to_target") and r.get("tta_mean_s"):
                    d = parameter(m, "topk-")
                    priced = d ** -DENSITY_EXPONENT / (1 + LOWRANK_KNEE / 4)
                    off.append(r["steps_to_target"] / rank4 / priced)
        medians.setdefault(kind, []).append(statistics.median(off))
        print(f"{grid} ({kind}): measured / priced TopK-over-rank-4 steps, median {statistics.median(off):.2f} "
              f"(range {min(off):.2f}-{max(off):.2f}, {len(off)} density x link cells)")
    conv = medians["conv"]
    print(f"conv nets: geometric mean of the medians {math.exp(statistics.fmean(map(math.log, conv))):.2f}; "
          f"MLPs: {', '.join(f'{x:.2f}' for x in medians['mlp'])}")


def rank_check(grids: list[str]) -> None:
    """Per grid, PowerSGD's steps to the target at each rank over rank 4's (geometric mean over the seeds both
    reached) against the law's (1 + knee/r) / (1 + knee/4). A fixed method's steps do not depend on the link
    (one seed trains the same on every link), so each seed counts once: the table's first scenario."""
    law = lambda r: (1 + LOWRANK_KNEE / r) / (1 + LOWRANK_KNEE / 4)  # noqa: E731
    for grid in grids:
        rows = store.load(os.path.join(RESULTS, f"{grid}.json"))
        low = [r for r in rows if r["scenario"] == rows[0]["scenario"] and r["method"].startswith("powersgd-r")]
        per = ratios(low, dense="powersgd-r4") if any(r["method"] == "powersgd-r4" for r in low) else {}
        cells = []
        for rank, xs in sorted((parameter(m, "powersgd-r"), xs) for m, xs in per.items()):
            g = math.exp(statistics.fmean(map(math.log, xs)))
            cells.append(f"rank {rank:g} {g:.2f} (law {law(rank):.2f}, {len(xs)} seeds)")
        print(f"{grid}: steps over rank 4's: " + ("; ".join(cells) if cells else "- (no rank 4 and another rank)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default=os.path.join(RESULTS, "tune-families.json"))
    ap.add_argument("--check", nargs="*", default=[], metavar="GRID",
                    help="evaluation grids (testbed/results/GRID.jsonl[.gz]) to check the fitted laws on")
    ap.add_argument("--family-prior", action="store_true",
                    help="the evidence for convTopkPrior (since removed): TopK's steps over PowerSGD rank 4's against the priors, on "
                         "the development tasks where the family pilot reads nothing")
    ap.add_argument("--ranks", nargs="*", default=None, metavar="GRID",
                    help="PowerSGD's steps at each rank over rank 4's on these grids, against the low-rank law")
    args = ap.parse_args()
    if args.ranks is not None:
        rank_check(args.ranks)
        return
    if args.family_prior:
        family_prior()
        return
    rows = store.load(args.table)
    dense = statistics.fmean(steps(next(r for r in rows if r["method"] == "allreduce")).values())
    per = ratios(rows)
    print(f"# {os.path.basename(args.table)}: steps to the target over allreduce's (mean {dense:.1f} steps), "
          f"paired by seed\n")

    low = {parameter(m, "powersgd-r"): v for m, v in per.items() if m.startswith("powersgd-r")}
    if low:
        points = [(r, x) for r, xs in low.items() for x in xs]
        knee = fit_inverse(points)
        c, p = fit_rank_power(points)
        print(f"PowerSGD: lowRankKnee = {knee:.3f}; 1 + c / r^p fits c = {c:.2f}, p = {p:.2f}\n")
        print("| rank | seeds | steps / dense (mean, min-max) | 1 + lowRankKnee/r |\n|---:|---:|---:|---:|")
        for r in sorted(low):
            xs = low[r]
            print(f"| {r:g} | {len(xs)} | {statistics.fmean(xs):.2f} ({min(xs):.2f}-{max(xs):.2f}) | {1 + knee / r:.2f} |")
        print()

    top = {parameter(m, "topk-"): v for m, v in per.items() if m.startswith("topk-")}
    if top:
        knee = fit_inverse([(d, x) for d, xs in top.items() for x in xs])
        means = [(d, statistics.fmean(xs)) for d, xs in sorted(top.items())]
        power = fit_power(means)
        q = fit_exponent([(d, x) for d, xs in top.items() for x in xs])
        print(f"TopK: 1 + kneeDensity/d fits kneeDensity = {knee:.4f} (the default is 0.003)"
              + (f"; 1 + (knee/d)^p fits knee = {power[0]:.4f}, p = {power[1]:.2f}" if power else "")
              + f"; d^-q fits q = {q:.3f} (stepLaw power's densityExponent)")
        print()
        print("| density | seeds | steps / dense (mean, min-max) | 1 + 0.003/d | 1 + kneeDensity/d (fit) | d^-q |"
              + (" 1 + (knee/d)^p |" if power else "") + "\n|---:|---:|---:|---:|---:|---:|" + ("---:|" if power else ""))
        for d, mean in means:
            xs = top[d]
            cells = [f"{d:g}", str(len(xs)), f"{mean:.2f} ({min(xs):.2f}-{max(xs):.2f})", f"{1 + 0.003 / d:.2f}",
                     f"{1 + knee / d:.2f}", f"{d ** -q:.2f}"] + ([f"{1 + (power[0] / d) ** power[1]:.2f}"] if power else [])
            print("| " + " | ".join(cells) + " |")
        if args.check:
            print()
        for grid in args.check:
            check(grid, {"inverse (1 + 0.003/d)": lambda d: 1 + 0.003 / d, f"power (d^-{q:.3f})": lambda d, q=q: d ** -q})


if __name__ == "__main__":
    main()
