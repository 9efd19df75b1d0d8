"""Where the candidate's time goes: its decision (the family and setting its step priors pick) or its running of
it (the bandwidth probes, the family pilot, the estimates, switching), recomputed from committed tables alone.

    python testbed/regret.py --grid fresh3-allconv-static,fresh3-allconv-fluctuating --ours tta-lowranks-pilot-power-conv

Per scenario, among the fixed options that reached the target on every seed (each fixed TopK density and PowerSGD
rank of the grid):

- the fastest fixed option (hindsight: the least mean time to accuracy);
- the priors' pick: the option ours's own step priors would choose if it knew each option's seconds a step as
  measured (the mean over the seeds of time to accuracy / steps): argmin of (steps over the dense steps, by the
  controller's own law: TimeToAccuracyController.steps_factor and lowrank_steps_factor, with each seed's TopK
  scale as its run set it: the family pilot's reading, or the conv prior, or 1) x (seconds a step). On a link
  that moves this prices one option for the whole run at its mean step time: a fixed choice, not the best
  adaptive one. Only options ours could run count (PowerSGD at a rank of its lowRanks, TopK at or above its
  minDensity), among those every seed took to the target; the next cheapest and its margin are printed, since a
  pick between two near-equal prices is the sweep's grain as much as the law. A run without a pilot record is
  priced at TopK scale 1 (a conv prior without the pilot is not seen);
- three paired ratios, seed by seed (geometric mean, Student's t 95% interval on the log ratios): the pick over
  the fastest (what the decision costs), ours over the pick (what running it costs, beside the option it would
  choose from the outside), ours over the fastest (their product, seed by seed).

So a scenario where the pick is the fastest option and ours is 1.3x behind it lost its time to the running, not
the priors; one where the pick is 1.3x behind the fastest and ours level with the pick lost it to the priors.

    python testbed/regret.py --across --grid fresh-cnn1d,fresh-mlp --ours tta-lowranks-pilot,tta-lowranks-pilot

With ``--across`` (``--ours`` one method per grid, or one for all): over every scenario of the grids, each method's
mean TTA over the fastest fixed option's, and in how many scenarios that is within 1.1x (a method that missed the
target on a seed is not), ours as OURS: how a single fixed setting, chosen in hindsight over all of them, compares
with the adaptive candidate.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Callable
from typing import NamedTuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # run from a checkout without installing netsense

from netsense.bench import store  # noqa: E402
from netsense.bench.grid import grid_path, load_grid  # noqa: E402
from netsense.bench.stats import mean_tta, paired_ratio, seed_times  # noqa: E402
from netsense.compression import validate_config  # noqa: E402
from netsense.control.tta import TimeToAccuracyController  # noqa: E402

RESULTS = os.path.join(REPO, "testbed", "results")


def option(method: str) -> tuple[str, float] | None:
    """("topk", density) or ("powersgd", rank) for a fixed method's name, else None."""
    for prefix, kind in (("topk-", "topk"), ("powersgd-r", "powersgd")):
        if method.startswith(prefix):
            try:
                return kind, float(method[len(prefix):])
            except ValueError:
                return None
    return None


def controller(config: dict) -> TimeToAccuracyController:
    """A controller with ours's step priors (its validated compression settings, defaults filled)."""
    c = validate_config(config)
    return TimeToAccuracyController(numel=1, world=2, knee=c["kneeDensity"], step_law=c["stepLaw"],
                                    density_exponent=c["densityExponent"], lowrank_knee=c["lowRankKnee"])


def choosable(config: dict) -> Callable[[tuple[str, float]], bool]:
    """Whether ours could run a fixed option: PowerSGD only at a rank in its lowRanks, TopK at or above its
    minDensity."""
    c = validate_config(config)
    return lambda opt: opt[1] in c["lowRanks"] if opt[0] == "powersgd" else opt[1] >= c["minDensity"]


def steps_factor(ctl: TimeToAccuracyController, opt: tuple[str, float], topk_scale: float) -> float:
    """An option's steps over the dense steps by ours's law, TopK's scaled as the run set it (a family pilot's
    reading in the committed records of the runs that had one: tta's familyPilot, since removed)."""
    kind, x = opt
    if kind == "powersgd":
        return ctl.lowrank_steps_factor(int(x))
    return topk_scale * ctl.steps_factor(x)


class Fixed(NamedTuple):
    """A fixed option's row, every seed of it at the target."""
    option: tuple[str, float]
    step_s: float  # mean seconds a step (over the seeds: time to accuracy / steps)
    times: dict[int, float | None]  # seed -> time to accuracy
    mean: float  # mean time to accuracy


def fixed_options(rows: list[dict]) -> dict[str, Fixed]:
    """method -> its Fixed, for each fixed option every seed of took to the target."""
    out = {}
    for r in rows:
        opt, seeds = option(r["method"]), r.get("per_seed", [])
        if opt and seeds and all(s.get("steps_to_target") and s.get("time_to_accuracy_s") for s in seeds):
            step_s = statistics.fmean(s["time_to_accuracy_s"] / s["steps_to_target"] for s in seeds)
            out[r["method"]] = Fixed(opt, step_s, seed_times(r), mean_tta(r))
    return out


def ratio_text(mine: dict, theirs: dict) -> str:
    ratio, lo, hi, n = paired_ratio(mine, theirs)
    if ratio is None:
        return "no common seed"
    return f"{ratio:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else f" ({n} seeds, no interval)")


def scenario_lines(grid: str, scenario: str, rows: list[dict], ours: str, ctl: TimeToAccuracyController,
                   allowed: Callable[[tuple[str, float]], bool] = lambda opt: True) -> list[str]:
    fixed = fixed_options(rows)
    mine = next((r for r in rows if r["method"] == ours), None)
    options = [m for m in fixed if allowed(fixed[m].option)]
    if mine is None or len(options) < 2:
        return [f"{grid} {scenario}: needs {ours} and two fixed options it could run that reached the target on "
                "every seed"]
    fastest = min(fixed, key=lambda m: fixed[m].mean)
    picks: dict[int, str] = {}  # seed -> the priors' pick with that seed's TopK scale
    prices: dict[int, list[tuple[float, str]]] = {}
    for s in mine["per_seed"]:
        scale = (s.get("family_pilot") or {}).get("topk_scale") or 1.0
        prices[s["seed"]] = sorted((steps_factor(ctl, fixed[m].option, scale) * fixed[m].step_s, m) for m in options)
        picks[s["seed"]] = prices[s["seed"]][0][1]
    pick_times = {seed: fixed[m].times.get(seed) for seed, m in picks.items()}
    chosen = statistics.multimode(picks.values())
    (best, pick), (second, runner) = next(p[:2] for seed, p in prices.items() if picks[seed] == chosen[0])
    named = ", ".join(f"{m} on {sum(p == m for p in picks.values())} seeds" for m in sorted(set(picks.values())))
    mine_times = seed_times(mine)
    missed = sum(t is None for t in mine_times.values())
    return [f"{grid} {scenario}: fastest fixed option {fastest} ({fixed[fastest].mean:.2f} s); the priors' pick, given each "
            f"option's measured seconds a step: {named} (next: {runner}, priced {100 * (second / best - 1):.1f}% "
            f"dearer than {pick})",
            f"  the pick over the fastest (the decision): {ratio_text(pick_times, fixed[fastest].times)}",
            f"  {ours} over its pick (the running): {ratio_text(mine_times, pick_times)}"
            + (f"; over {chosen[0]} alone: {ratio_text(mine_times, fixed[chosen[0]].times)}" if len(set(picks.values())) > 1 else ""),
            f"  {ours} over the fastest: {ratio_text(mine_times, fixed[fastest].times)}"] + (
            [f"  {ours} missed the target on {missed} seeds: left out of its two ratios, which flatters them"]
            if missed else [])


def scenarios_of(grid: str) -> dict[str, list[dict]]:
    """A committed table's rows (testbed/results/GRID.jsonl[.gz]), scenario -> its rows, in the table's order."""
    rows = store.load(os.path.join(RESULTS, f"{grid}.json"))
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["scenario"], []).append(r)
    return out


def report(grid: str, ours: str) -> list[str]:
    scenarios = scenarios_of(grid)
    _, cells, _ = load_grid(os.path.join(REPO, grid_path(grid) or f"testbed/grids/{grid}.yaml"))
    config = next((c.job["spec"]["compression"] for c in cells if c.method == ours), None)
    if config is None:
        raise SystemExit(f"--ours {ours}: not a method of testbed/grids/{grid}.yaml")
    ctl, allowed = controller(config), choosable(config)
    lines = []
    for scenario, rows in scenarios.items():
        lines += scenario_lines(grid, scenario, rows, ours, ctl, allowed)
    return lines


def across(grids: list[str], ours: list[str]) -> list[str]:
    """Per method (ours as OURS), its mean TTA over the fastest fixed option's in each scenario of the grids."""
    per: dict[str, list[float]] = {}
    scenarios = 0
    for grid, mine in zip(grids, ours, strict=True):
        tables = scenarios_of(grid)
        if not any(r["method"] == mine for rows in tables.values() for r in rows):
            raise SystemExit(f"--ours {mine}: not a method of testbed/results/{grid}.json")
        for here in tables.values():
            fixed = fixed_options(here)
            if not fixed:
                continue
            scenarios += 1
            fastest = min(f.mean for f in fixed.values())
            for r in here:
                mean = mean_tta(r)
                per.setdefault("OURS" if r["method"] == mine else r["method"], []).append(
                    math.inf if mean is None else mean / fastest)
    lines = [f"{scenarios} scenarios; each method's mean TTA over the fastest fixed option's (a missed seed: not within)"]
    for method, xs in sorted(per.items(), key=lambda kv: (-sum(x <= 1.1 for x in kv[1]), max(kv[1]))):
        finite = [x for x in xs if math.isfinite(x)]
        spread = f"{min(finite):.2f}-{max(finite):.2f}" if finite else "-"
        lines.append(f"  {method}: within 1.1x in {sum(x <= 1.1 for x in xs)} of {len(xs)} scenarios (ratios {spread}"
                     + (f", {len(xs) - len(finite)} missed" if len(finite) < len(xs) else "") + ")")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", required=True, help="comma-separated grids (testbed/results/GRID.jsonl[.gz] and "
                                                  "testbed/grids/GRID.yaml)")
    ap.add_argument("--ours", required=True, help="the tta method of those grids whose time is split (with --across: "
                                                  "comma-separated, one per grid, or one for all)")
    ap.add_argument("--across", action="store_true", help="every method's ratio to the fastest fixed option over "
                                                          "all the grids' scenarios")
    args = ap.parse_args()
    grids, ours = args.grid.split(","), args.ours.split(",")
    if args.across:
        if len(ours) not in (1, len(grids)):
            raise SystemExit(f"--ours: {len(ours)} methods for {len(grids)} grids (one per grid, or one for all)")
        print("\n".join(across(grids, ours * len(grids) if len(ours) == 1 else ours)))
        return
    for grid in grids:
        print("\n".join(report(grid, args.ours)))


if __name__ == "__main__":
    main()
