"""Study (registered: REGISTRATION.md). Question: can the first 20 steps of the user's own run tell which
compressor reaches the target soonest (the bar: within 1.1x of the hindsight-best fixed option, the reading's cost
counted, on 7 of 8 tasks)?
Answer (RESULTS.md beside this file): no: "Within 1.1x of the hindsight-best, the reading's cost counted: **2 of
8** (bar: 7 of 8: NOT met)"; the reading is not shipped.
Run on: six grids at f9b4c44, the all-conv and transformer grids again at b0d53c7 (as RESULTS.md records).

The in-run reading's decision-level table (issue 62, item 3), as REGISTRATION.md beside this file fixed it
before any cell ran: each task's pick by the reading (one constant, fitted leave-one-task-out) against the
hindsight-best fixed option (picked on seeds 2000-2001, judged on 2002-2003), the reading's cost counted.

    .venv/bin/python testbed/studies/reading/analyze.py --land      # runs/reading-*/summary.json -> the records
    .venv/bin/python testbed/studies/reading/analyze.py             # the table, from the committed records

The records (testbed/results/reading-traces.jsonl.gz): one a run, with its reading's per-step rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, ROOT)

from netsense.bench import store  # noqa: E402
from netsense.bench.stats import gmean, steps_to_target  # noqa: E402

RECORDS = os.path.join(ROOT, "testbed", "results", "reading-traces")
TASKS = ("mlp1d", "cnn1d", "cnn32", "syn4", "allconv", "tfm", "digits", "mlp32")
OPTIONS = ("fp16", "topk-0.001", "topk-0.005", "topk-0.02", "powersgd-r1", "powersgd-r4")
CANDIDATE = {"topk-0.001": "topk:0.001", "topk-0.005": "topk:0.005", "topk-0.02": "topk:0.02",
             "powersgd-r1": "powersgd:1", "powersgd-r4": "powersgd:4"}
READ_FROM = "topk-0.005"  # the run whose reading decides: the shipped fixed default's
WINDOW = (11, 20)  # the steps whose captured fractions are averaged
PICK_SEEDS, JUDGE_SEEDS = (2000, 2001), (2002, 2003)
FAMILY_ONLY = ("topk-0.005", "powersgd-r4")
BAR, BAR_TASKS = 1.1, 7
KEEP = ("method_label", "seed", "status", "steps", "time_to_accuracy_s", "target_reached", "train_seconds",
        "accuracy_curve", "reading", "simulation", "commit", "dirty", "code_commit", "grid_commit")


def land(runs: str) -> str:
    records = []
    for task in TASKS:
        with open(os.path.join(runs, f"reading-{task}", "summary.json")) as fh:
            for r in json.load(fh):
                records.append({"task": task, **{k: r.get(k) for k in KEEP},
                                "steps_to_target": steps_to_target(r)})
    records.sort(key=lambda r: (TASKS.index(r["task"]), OPTIONS.index(r["method_label"]), r["seed"]))
    return store.save(RECORDS, records)


class Run:
    """One run as the rule reads it: its steps and time to the target (a missed target: the budget's, a lower
    bound), its time a step, and its reading."""

    def __init__(self, rec: dict):
        self.reached = bool(rec.get("target_reached"))
        # A run that failed (diverged: NaN gradients) has no time: not foreseen by the registration, decided
        # before its table was printed: it never reaches the target (infinite time), is left out of the fit, and
        # the rule prices it at the least step time of the seed's options (the most in its favour); picked, it
        # fails its task.
        self.diverged = rec.get("status") != "Succeeded"
        self.steps = None if self.diverged else rec["steps_to_target"] if self.reached else rec["steps"]
        self.time = math.inf if self.diverged else rec["time_to_accuracy_s"] if self.reached else rec["train_seconds"]
        self.tau = None if self.diverged else self.time / self.steps
        rows = [r for r in (rec.get("reading") or {}).get("steps", []) if WINDOW[0] <= r["step"] <= WINDOW[1]]
        self.captured = {o: statistics.fmean(r[c] for r in rows) for o, c in CANDIDATE.items()} if rows else {}
        self.captured["fp16"] = 1.0
        self.reading_cost = sum(r["seconds"] for r in (rec.get("reading") or {}).get("steps", []))


def load() -> dict[tuple[str, str, int], Run]:
    return {(r["task"], r["method_label"], r["seed"]): Run(r) for r in store.load(RECORDS)}


def fit(runs: dict, tasks: list[str]) -> float:
    """a in log(steps factor) = a log(1 / captured), least squares through the origin over ``tasks``' options
    and seeds, each option's captured fraction read from that seed's TopK 0.5% run."""
    sxy = sxx = 0.0
    for (task, option, seed), run in runs.items():
        if task not in tasks or option == "fp16":
            continue
        dense, reader = runs.get((task, "fp16", seed)), runs.get((task, READ_FROM, seed))
        if dense is None or reader is None or run.steps is None or dense.steps is None:
            continue
        x, y = math.log(1 / reader.captured[option]), math.log(run.steps / dense.steps)
        sxy, sxx = sxy + x * y, sxx + x * x
    return sxy / sxx


def pick(runs: dict, task: str, seed: int, a: float, options=OPTIONS) -> str:
    reader = runs[(task, READ_FROM, seed)]
    least = min(t for o in OPTIONS if (t := runs[(task, o, seed)].tau) is not None)

    def tau(o: str) -> float:
        t = runs[(task, o, seed)].tau
        return least if t is None else t
    return min(options, key=lambda o: (1 / reader.captured[o]) ** a * tau(o))


def judge(runs: dict) -> list[dict]:
    rows = []
    for task in TASKS:
        a = fit(runs, [t for t in TASKS if t != task])
        best = min(OPTIONS, key=lambda o: gmean([runs[(task, o, s)].time for s in PICK_SEEDS]))
        seeds = []
        for s in JUDGE_SEEDS:
            chosen, family = pick(runs, task, s, a), pick(runs, task, s, a, FAMILY_ONLY)
            cost, base = runs[(task, READ_FROM, s)].reading_cost, runs[(task, best, s)].time
            seeds.append({"seed": s, "pick": chosen, "family_pick": family,
                          "ratio": (runs[(task, chosen, s)].time + cost) / base,
                          "decision_ratio": runs[(task, chosen, s)].time / base,
                          "family_ratio": (runs[(task, family, s)].time + cost) / base,
                          "default_ratio": runs[(task, READ_FROM, s)].time / base,
                          "cost_share": cost / runs[(task, chosen, s)].time})
        censored = sorted({o for o in OPTIONS for s in PICK_SEEDS + JUDGE_SEEDS
                           if not runs[(task, o, s)].reached and not runs[(task, o, s)].diverged})
        diverged = sorted({o for o in OPTIONS for s in PICK_SEEDS + JUDGE_SEEDS if runs[(task, o, s)].diverged})
        rows.append({"task": task, "a": a, "best": best, "seeds": seeds, "censored": censored, "diverged": diverged,
                     **{k: gmean([x[k] for x in seeds]) for k in
                        ("ratio", "decision_ratio", "family_ratio", "default_ratio")}})
    return rows


def factors(runs: dict) -> list[str]:
    """Per task and option: the measured steps factor against dense fp16 and the reading's captured fraction,
    each the geometric mean over the four seeds (for reference: what the rule is fitted on)."""
    out = ["| task | " + " | ".join(o for o in OPTIONS if o != "fp16") + " |",
           "| --- |" + " --- |" * (len(OPTIONS) - 1)]
    for task in TASKS:
        cells = []
        for o in OPTIONS[1:]:
            seeds = PICK_SEEDS + JUDGE_SEEDS
            if any(runs[(task, o, s)].steps is None for s in seeds):
                c = gmean([runs[(task, READ_FROM, s)].captured[o] for s in seeds])
                cells.append(f"diverged / {c:.2f}")
                continue
            f = gmean([runs[(task, o, s)].steps / runs[(task, "fp16", s)].steps for s in seeds])
            c = gmean([runs[(task, READ_FROM, s)].captured[o] for s in seeds])
            miss = "+" if any(not runs[(task, o, s)].reached for s in seeds) else ""
            cells.append(f"{f:.2f}{miss} / {c:.2f}")
        out.append(f"| {task} | " + " | ".join(cells) + " |")
    return out


def report(rows: list[dict], runs: dict) -> str:
    lines = ["| task | a (fold) | hindsight-best (2000-01) | picks (2002, 2003) | ratio, cost counted | "
             "decision alone | reading's cost | family only | TopK 0.5% fixed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        picks = ", ".join(s["pick"] for s in r["seeds"])
        share = max(s["cost_share"] for s in r["seeds"])
        ok = "**" if r["ratio"] <= BAR else ""
        lines.append(f"| {r['task']} | {r['a']:.3f} | {r['best']} | {picks} | {ok}{r['ratio']:.2f}{ok} | "
                     f"{r['decision_ratio']:.2f} | <= {100 * share:.0f}% | {r['family_ratio']:.2f} | "
                     f"{r['default_ratio']:.2f} |")
    within = sum(r["ratio"] <= BAR for r in rows)
    lines += ["", f"Within {BAR}x of the hindsight-best, the reading's cost counted: **{within} of {len(rows)}** "
              f"(bar: {BAR_TASKS} of 8: {'met' if within >= BAR_TASKS else 'NOT met'}). Without the cost (the "
              f"decision alone): {sum(r['decision_ratio'] <= BAR for r in rows)}; family only (TopK 0.5% or "
              f"PowerSGD rank 4), cost counted: {sum(r['family_ratio'] <= BAR for r in rows)}; the fixed TopK 0.5% "
              f"default: {sum(r['default_ratio'] <= BAR for r in rows)}. Worst, cost counted: "
              f"{max(r['ratio'] for r in rows):.2f}.", ""]
    censored = [f"{r['task']}: {', '.join(r['censored'])}" for r in rows if r["censored"]]
    if censored:
        lines += ["Options that missed the target in at least one run (charged the budget's time, a lower bound): "
                  + "; ".join(censored) + ".", ""]
    diverged = [f"{r['task']}: {', '.join(r['diverged'])}" for r in rows if r["diverged"]]
    if diverged:
        lines += ["Options whose runs diverged (NaN gradients; never reaching the target, left out of the fit): "
                  + "; ".join(diverged) + ".", ""]
    lines += ["Each fixed option judged as the reading is (not registered: seen after the table, for the next "
              "registration):", ""]
    for option in OPTIONS:
        ratios = [gmean([runs[(r["task"], option, s)].time / runs[(r["task"], r["best"], s)].time
                           for s in JUDGE_SEEDS]) for r in rows]
        lines.append(f"- {option}: within {BAR}x in {sum(x <= BAR for x in ratios)} of {len(rows)} "
                     f"({', '.join(f'{x:.2f}' for x in ratios)})")
    lines += [""]
    lines += ["Measured steps factor against dense fp16 / captured fraction (geometric means over the four seeds; "
              "`+`: some runs missed the target, their factor a lower bound):", "", *factors(runs)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--land", action="store_true", help="write the records from runs/reading-*/summary.json")
    ap.add_argument("--runs", default=os.path.join(ROOT, "runs"), help="where the benches wrote (--land)")
    args = ap.parse_args(argv)
    if args.land:
        print(f"wrote {land(args.runs)}")
    runs = load()
    print(report(judge(runs), runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
