"""The judged set's table (issue 66), as testbed/judged/REGISTRATION.md fixed it before any cell ran: per
scenario, the hindsight-best fixed option (chosen on the pick seeds) against tta (its calibration charged in
full, amortized, and not at all), the paper's method, dc2 and the fixed defaults, on the judge seeds.

    .venv/bin/python testbed/judged/analyze.py --land      # runs/judged/ -> testbed/results/judged-runs.jsonl.gz
    .venv/bin/python testbed/judged/analyze.py             # the table, from the committed records
    .venv/bin/python testbed/judged/analyze.py --rooms     # each task's candidates' room to win (links.json)
    .venv/bin/python testbed/judged/analyze.py --emulated  # the emulated confirmation against the simulated runs

A fixed option's time on a scenario is its run (trained on the slow link) replayed on the scenario's link
(netsense.clock.replay); an adaptive method's is its own run on that link. A calibration's cost on a scenario:
its raced runs' training seconds replayed on the scenario's link at the task's clock inputs.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from prepare import (  # noqa: E402
    DEFAULTS,
    FIXED,
    HOLD,
    JUDGE,
    ORDER,
    PICK,
    RECORDS,
    RUNS,
    _json,
    _summary,
    _with_target,
    option_time,
)

from netsense.bench import store  # noqa: E402
from netsense.bench.stats import AMORTIZED_OVER, gmean, holm, reached_at, t_interval  # noqa: E402
from netsense.clock.replay import replay  # noqa: E402

BAR, WORST_BAR, LEVEL = 1.1, 1.25, 0.95
# Cut line (3) of REGISTRATION.md, applied by its amendment of 2026-12-07: gpt is dropped (with its cells, projected
# at ~6.3 hours, the set would have passed its 8 CPU-hours) and the set is judged on 9 scenarios, the first bar
# scaled to 8 of 9.
DROPPED = ("gpt",)
SCENARIOS, BAR_SCENARIOS = 9, 8
KEEP = ("method", "method_label", "scenario", "seed", "status", "reason", "steps", "train_seconds",
        "time_to_accuracy_s", "target_reached", "target_metric", "target_accuracy", "target_loss", "target_hold",
        "accuracy_curve", "loss_curve", "step_shapes", "simulation", "workers", "clock", "max_seconds",
        "mean_density", "dense_steps", "lowrank_steps", "probe_steps", "penalties", "commit", "dirty",
        "code_commit", "grid_commit")
GRIDS = ("dense", "pick", "judge-fixed", "adaptive", "emulated", "emulated-sim")
FIXED_GRIDS = ("dense", "pick", "judge-fixed", "emulated-sim")  # fixed options on the simulated clock


def land() -> str:
    records = []
    for task in ORDER:
        for grid in GRIDS:
            try:
                runs = _summary(f"judged-{task}-{grid}")
            except FileNotFoundError:
                continue
            records += [{"task": task, "grid": grid, **{k: r.get(k) for k in KEEP}} for r in runs]
        paths = sorted(glob.glob(os.path.join(RUNS, f"calibrate-{task}", "runs", "*", "result.json")))
        if not paths and store.resolve(RECORDS):  # a fresh machine: the calibration's committed records
            records += [r for r in store.load(RECORDS) if r["task"] == task and r["grid"] == "calibration"]
        for path in paths:
            with open(path) as fh:
                r = json.load(fh)
            records.append({"task": task, "grid": "calibration", "run": os.path.basename(os.path.dirname(path)),
                            **{k: r.get(k) for k in KEEP}})
    return store.save(RECORDS, records)


# -- reading the records ---------------------------------------------------------------------------------------

def _records() -> list[dict]:
    return store.load(RECORDS)


def fixed_of(records: list[dict], task: str) -> dict[str, dict[int, dict]]:
    """option -> seed -> run (held to the task's target), every fixed run of the task."""
    out: dict[str, dict[int, dict]] = {}
    for r in records:
        if r["task"] == task and r["grid"] in FIXED_GRIDS and r["method_label"] in FIXED:
            out.setdefault(r["method_label"], {})[r["seed"]] = _with_target(r, task)
    return out


def live_time(r: dict) -> float:
    at = reached_at(r) if r.get("status") == "Succeeded" else None
    return math.inf if at is None else at[1]


def calibration_cost(records: list[dict], task: str, profile: dict) -> float | None:
    """The task's calibration's raced runs, their training seconds replayed on ``profile`` at the task's
    inputs (None: no calibration recorded)."""
    runs = [r for r in records if r["task"] == task and r["grid"] == "calibration"]
    if not runs:
        return None
    inputs = _json("inputs.json")[task]
    sim = {k: inputs[k] for k in ("computeSeconds", "compressionSecondsPerMelement", "lowRankSecondsPerMelement")}
    return sum(replay(r, profile, {**sim, "jitter": 0.0})[-1] for r in runs)


def ratio_stats(ratios: list[float]) -> dict:
    """Geometric mean, its t interval (n - 1 degrees of freedom: stats.t_interval) and the one-sided p of
    "below 1"."""
    if not ratios:
        return {"ratio": None, "lo": None, "hi": None, "p_ahead": None, "n": 0}
    if not all(math.isfinite(r) for r in ratios):
        return {"ratio": math.inf, "lo": None, "hi": None, "p_ahead": None, "n": len(ratios)}
    lo, hi, p = t_interval(ratios, LEVEL, min_pairs=2)
    ratio = gmean(ratios)
    ahead = None if p is None else p / 2 if ratio < 1 else 1 - p / 2
    return {"ratio": ratio, "lo": lo, "hi": hi, "p_ahead": ahead, "n": len(ratios)}


def scenario_rows(records: list[dict]) -> list[dict]:
    links = _json("links.json")
    rows = []
    for task in ORDER:
        if task not in links or task in DROPPED:
            continue
        fixed = fixed_of(records, task)
        adaptive = [r for r in records if r["task"] == task and r["grid"] == "adaptive"]
        for scenario, profile in links[task]["scenarios"].items():
            pick = {o: statistics.fmean(option_time(rs[s], profile) for s in PICK)
                    for o, rs in fixed.items() if all(s in rs for s in PICK)}
            best = min(pick, key=pick.get)
            judge_best = {s: option_time(fixed[best][s], profile) for s in JUDGE if s in fixed.get(best, {})}
            cost = calibration_cost(records, task, profile)
            row = {"task": task, "scenario": scenario, "room": (links[task]["candidates"].get(scenario) or {}).get(
                "room"), "best": best, "best_pick_s": pick[best], "best_judge_s": judge_best,
                "calibration_s": cost, "methods": {}}
            for label in ("tta", "netsense", "dc2"):
                runs = {r["seed"]: r for r in adaptive if r["method_label"] == label and r["scenario"] == scenario}
                own = {s: live_time(r) for s, r in runs.items()}
                charges = {"own": 0.0, "amortized": (cost or 0.0) / AMORTIZED_OVER, "charged": cost or 0.0}
                for name, extra in charges.items():
                    if label != "tta" and name != "own":
                        continue
                    ratios = [(own[s] + extra) / judge_best[s] for s in JUDGE if s in own and s in judge_best]
                    row["methods"][label if name == "own" else f"{label} ({name})"] = {
                        **ratio_stats(ratios), "mean_s": statistics.fmean(own[s] + extra for s in own) if own
                        else None, "seeds": sorted(own)}
                if label == "tta" and runs:
                    row["tta_chose"] = {s: {"mean_density": r.get("mean_density"), "dense": r.get("dense_steps"),
                                            "lowrank_steps": r.get("lowrank_steps"), "steps": r.get("steps")}
                                        for s, r in runs.items()}
            for o in DEFAULTS:
                if o == best or o not in fixed:
                    continue
                ratios = [option_time(fixed[o][s], profile) / judge_best[s] for s in JUDGE
                          if s in fixed[o] and s in judge_best]
                row["methods"][o] = ratio_stats(ratios)
            rows.append(row)
    return rows


def _fmt(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}f}"


def _ratio_text(m: dict) -> str:
    """A ratio_stats as a cell: the ratio, its interval where it has one, n where seeds are missing."""
    s = _fmt(m["ratio"])
    if m.get("lo") is not None:
        s += f" [{_fmt(m['lo'])}, {_fmt(m['hi'])}]"
    if m["ratio"] is not None and m["n"] < len(JUDGE):
        s += f" (n={m['n']})"
    return s


def table(rows: list[dict]) -> None:
    print(f"Judged set (testbed/judged/REGISTRATION.md): ratio = geometric mean over judge seeds {list(JUDGE)} of "
          f"a method's time to the target / the hindsight-best fixed option's (chosen on pick seeds {list(PICK)}), "
          f"95% t interval; targets held {HOLD}x.\n")
    print("| task | scenario | room | hindsight-best (pick s) | tta charged | tta amortized | tta own | paper's | dc2 "
          "| " + " | ".join(DEFAULTS) + " |")
    print("|" + "---|" * (9 + len(DEFAULTS)))

    def cell(row, key):
        m = row["methods"].get(key)
        if m is None:
            return "(best)" if key == row["best"] else "-"
        return _ratio_text(m)

    for row in rows:
        room = "-" if row["room"] is None else f"{row['room']:.0%}"
        print(f"| {row['task']} | {row['scenario']} | {room} | {row['best']} ({_fmt(row['best_pick_s'])}) | "
              + " | ".join(cell(row, k) for k in ("tta (charged)", "tta (amortized)", "tta", "netsense", "dc2",
                                                  *DEFAULTS)) + " |")
    judged = [r for r in rows if (r["methods"].get("tta (charged)") or {}).get("ratio") is not None]
    if not judged:
        return
    print()
    for key in ("tta (charged)", "tta (amortized)", "tta"):
        ratios = [r["methods"][key]["ratio"] for r in judged]
        within = sum(1 for x in ratios if x <= BAR)
        print(f"{key}: within {BAR}x in {within} of {len(judged)} scenarios (bar {BAR_SCENARIOS} of {SCENARIOS}), "
              f"worst {_fmt(max(ratios))} (bar {WORST_BAR})")
    changing = [r for r in judged if r["room"] is not None and r["room"] >= 0.15]
    if len(judged) == SCENARIOS:
        charged = [r["methods"]["tta (charged)"]["ratio"] for r in judged]
        print(f"bars (tta charged): within {BAR}x in at least {BAR_SCENARIOS} of {SCENARIOS}: "
              f"{'met' if sum(x <= BAR for x in charged) >= BAR_SCENARIOS else 'not met'}; never worse than "
              f"{WORST_BAR}x: {'met' if max(charged) <= WORST_BAR else 'not met'}; ahead where a switch has room: "
              + ("nothing to judge (no scenario with room)" if not changing else "below"))
    ps = [r["methods"]["tta (charged)"]["p_ahead"] for r in judged]
    significant = holm(ps)
    for r, sig in zip(judged, significant, strict=True):
        if r in changing:
            print(f"{r['task']} {r['scenario']} (room {r['room']:.0%}): tta ahead of {r['best']} after Holm: "
                  f"{'yes' if sig else 'no'} (one-sided p {_fmt(r['methods']['tta (charged)']['p_ahead'], 3)})")


def details(records: list[dict]) -> None:
    """What the prose beside the table quotes: each fixed option's steps to the target (pick seeds), the
    calibration's runs, steps and factors, and what tta ran (PowerSGD's share of its steps, its mean density)."""
    for task in ORDER:
        fixed = fixed_of(records, task)
        if not fixed or task in DROPPED:
            continue
        steps = {}
        for o, rs in fixed.items():
            at = [reached_at(rs[s]) for s in PICK if s in rs]
            steps[o] = statistics.fmean(a[0] for a in at) if at and all(at) else math.inf
        print(f"{task}: steps to the target, mean over the pick seeds: "
              + ", ".join(f"{o} {_fmt(v, 0)}" for o, v in sorted(steps.items(), key=lambda kv: kv[1])))
        cal = [r for r in records if r["task"] == task and r["grid"] == "calibration"]
        if cal:
            profile = _json(f"penalties/{task}.json") if os.path.exists(os.path.join(HERE, "penalties",
                                                                                    f"{task}.json")) else {}
            factors = {f"{fam} {o}": v["steps_factor"] for fam in ("topk", "powersgd") for o, v in
                       (profile.get(fam) or {}).items()}
            print(f"{task}: calibration: {len(cal)} runs, {sum(r['steps'] for r in cal)} steps; milestone "
                  f"{profile.get('milestone')}; steps factors {factors}")
        tta = [r for r in records if r["task"] == task and r["grid"] == "adaptive" and r["method_label"] == "tta"]
        for scenario in sorted({r["scenario"] for r in tta}):
            runs = [r for r in tta if r["scenario"] == scenario]
            share = [r["lowrank_steps"] / r["steps"] for r in runs]
            print(f"{task} {scenario}: tta ran PowerSGD on {min(share):.0%}-{max(share):.0%} of its steps, mean "
                  f"density {min(r['mean_density'] for r in runs):.3f}-{max(r['mean_density'] for r in runs):.3f}")


def emulated(records: list[dict]) -> None:
    """The emulated confirmation: per scenario, tta's time to the B/2 target over the hindsight-best fixed
    option's (emulated.json), in real time, beside the same ratio read from the simulated runs at that target."""
    spec = _json("emulated.json")
    print(f"Emulated confirmation (REGISTRATION.md): tta / the pick seeds' best fixed option at the B/2 target, "
          f"geometric mean over judge seeds {list(JUDGE)}, 95% t interval; real time on tc-shaped links beside the "
          f"simulated clock's runs read at the same target. Registered: the direction is compared, not the value.\n")
    print("| task | scenario | target | fixed | emulated | simulated | same direction |")
    print("|---|---|---|---|---|---|---|")
    agree = 0
    for task, e in spec.items():
        fixed = fixed_of(records, task)
        for scenario, profile in e["scenarios"].items():
            best = e["best"][scenario]
            emu = [r for r in records if r["task"] == task and r["grid"] == "emulated" and r["scenario"] == scenario]
            emu_tta = {r["seed"]: live_time(r) for r in emu if r["method_label"] == "tta"}
            emu_fixed = {r["seed"]: live_time(r) for r in emu if r["method_label"] == best}
            sim_tta = {r["seed"]: live_time(_with_target(r, task, e["target"])) for r in records
                       if r["task"] == task and r["grid"] == "adaptive" and r["scenario"] == scenario
                       and r["method_label"] == "tta"}
            sim_fixed = {s: option_time(_with_target(r, task, e["target"]), profile)
                         for s, r in fixed.get(best, {}).items() if s in JUDGE}
            sides = [ratio_stats([a[s] / b[s] for s in JUDGE if s in a and s in b])
                     for a, b in ((emu_tta, emu_fixed), (sim_tta, sim_fixed))]
            cells = [_ratio_text(m) for m in sides]
            same = "-" if None in (sides[0]["ratio"], sides[1]["ratio"]) else (
                "yes" if (sides[0]["ratio"] < 1) == (sides[1]["ratio"] < 1) else "no")
            agree += same == "yes"
            print(f"| {task} | {scenario} | {e['metric']} {e['target']} | {best} | {cells[0]} | {cells[1]} | {same} |")
    print(f"\nsame direction in {agree} of {sum(len(e['scenarios']) for e in spec.values())} scenarios")


def attribution(records: list[dict]) -> None:
    """Which part of tta's ratio cost what, per scenario (geometric means over the judge seeds, against the
    hindsight-best fixed option): the steps its compression needed to the target, the seconds a step (its wire
    and compression time, its probes), and the reading (the calibration charged: charged time / own time)."""
    for row in scenario_rows(records):
        task, scenario, best = row["task"], row["scenario"], row["best"]
        profile = _json("links.json")[task]["scenarios"][scenario]
        fixed = fixed_of(records, task).get(best, {})
        tta = {r["seed"]: r for r in records if r["task"] == task and r["grid"] == "adaptive"
               and r["scenario"] == scenario and r["method_label"] == "tta"}
        steps, per_step, reading = [], [], []
        for s in JUDGE:
            a, b = (reached_at(tta[s]) if s in tta else None), (reached_at(fixed[s]) if s in fixed else None)
            if a is None or b is None:
                continue
            t_best = option_time(fixed[s], profile)
            steps.append(a[0] / b[0])
            per_step.append((a[1] / a[0]) / (t_best / b[0]))
            reading.append((a[1] + (row["calibration_s"] or 0.0)) / a[1])
        if steps:
            print(f"{task} {scenario}: tta / {best} (n={len(steps)}): steps {gmean(steps):.2f}x, seconds a step "
                  f"{gmean(per_step):.2f}x, own time {gmean([x * y for x, y in zip(steps, per_step, strict=True)]):.2f}x;"
                  f" the reading multiplies it by {gmean(reading):.2f}")
        missed = [s for s in JUDGE if s in tta and reached_at(tta[s]) is None]
        if missed:
            print(f"{task} {scenario}: tta did not reach the target on judge seed(s) {missed} within "
                  f"{max(tta[s]['steps'] for s in missed)} steps (best accuracy "
                  f"{max(max(p[2] for p in tta[s]['accuracy_curve']) for s in missed):.3f})")


def rooms() -> None:
    for task, entry in _json("links.json").items():
        for name, c in entry["candidates"].items():
            print(f"{task} {name}: room {c['room']:.1%} (best fixed {c['best_fixed']} {c['t_fixed']} s, oracle "
                  f"{c['t_oracle']} s)")
        print(f"{task}: chosen {entry['chosen']}; the pick seeds' best: {entry['picked']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--land", action="store_true", help="runs/judged/ -> the committed records")
    ap.add_argument("--rooms", action="store_true", help="each task's changing candidates' room to win")
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    ap.add_argument("--details", action="store_true", help="what RESULTS.md's prose quotes besides the table")
    ap.add_argument("--emulated", action="store_true", help="the emulated confirmation against the simulated runs")
    args = ap.parse_args()
    if args.land:
        print(land())
        return
    if args.rooms:
        rooms()
        return
    if args.details:
        records = _records()
        details(records)
        attribution(records)
        return
    if args.emulated:
        emulated(_records())
        return
    rows = scenario_rows(_records())
    if args.json:
        json.dump(rows, sys.stdout, indent=1, default=str)
        return
    table(rows)


if __name__ == "__main__":
    main()
