"""The fair comparison's numbers, recomputed from a committed table alone (testbed/results/<grid>.jsonl[.gz], the
bench's table.json with each seed's record): every figure the README quotes about it is printed here.

    python testbed/fair.py                      # every fair grid (fair3, fair4, fair5: sets 3-5 re-run at one
                                                # encoding, fine sweep), each with its set as it ran before
    python testbed/fair.py --grid fair4 --ours tta --before eval4

Per scenario: the link rates the cells trained under; each method's bytes per element on the wire, mean
density and mean TTA; whether the fixed TopK sweep brackets the densities ours chose (every seed's mean
density between the sweep's lowest and highest); ours against the hindsight-best fixed density, against the
best of every other family, and against itself at fp32 (the encoding's share of a lead): the geometric mean
of the per-seed TTA ratios with Student's t 95% interval on the log ratios (the bench's own functions,
applied to the per-seed records, not read from the table's columns); and issue 36's bar (bar_lines): ours's
mean TTA within 1.1x of the fastest other method's, its accuracy after the grid's equal epochs within 0.5
points of the fastest fixed method's. Then the same scenario's lead as the earlier table (--before) printed it,
for the before/after.

    python testbed/fair.py --grid fresh-cnn1d,fresh-mlp --ours tta-lowranks-pilot   # the first fresh set (issue 36)
    python testbed/fair.py --grid fresh2-syn4,fresh2-cnn32 --ours tta-lowranks-pilot  # the second fresh set
"""

from __future__ import annotations

import argparse
import math
import os
import statistics

from netsense.bench import store
from netsense.bench.stats import mean_tta, paired_ratio, seed_ratios, seed_times, seeds_for

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FAMILIES = {"topk-": "fixed TopK", "powersgd-": "PowerSGD", "netsense": "netsense (paper)", "dc2": "dc2",
            "allreduce": "allreduce"}


def family(method: str) -> str | None:
    return next((name for prefix, name in FAMILIES.items()
                 if (method.startswith(prefix) if prefix.endswith("-") else method == prefix)), None)


def is_peer(method: str, ours: str) -> bool:
    """Whether ``method`` is compared with ours: never ours itself or its own variants (``ours-...``; ours may
    be a fixed method: dev-frontload-*)."""
    return method != ours and not method.startswith(f"{ours}-")


def seeds_of(row: dict, key: str) -> list[float]:
    return [s[key] for s in row.get("per_seed", []) if s.get(key) is not None]


def ratio_text(mine: dict, theirs: dict) -> str:
    ratio, lo, hi, n = paired_ratio(mine, theirs)
    if ratio is None:
        return "no common seed reached the target"
    interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else " (no interval below 5 pairs)"
    verdict = "" if lo is None else (" lead" if hi < 1 else " behind" if lo > 1 else " no difference shown")
    return f"{ratio:.2f}{interval} (n={n}){verdict}"


def scenario_report(name: str, rows: list[dict], ours: str) -> list[str]:
    by = {r["method"]: r for r in rows}
    mine = by.get(ours)
    out = [f"## {name}", ""]
    seen = mine or rows[0]
    lows, meds, highs = (seeds_of(seen, f"link_rate_mbit_{k}") for k in ("min", "median", "max"))
    if lows:
        out.append(f"link (Mbit/s, {ours}'s cells): min {min(lows):.0f}, median of medians "
                   f"{statistics.median(meds):.0f}, max {max(highs):.0f}")
    out += ["", "| method | bytes/element | mean density | TTA s (mean over seeds) | steps to it (mean) | reached |",
            "|---|---:|---:|---:|---:|:---:|"]
    for r in sorted(rows, key=lambda r: (mean_tta(r) is None, mean_tta(r) or 0)):
        wire = sorted(set(seeds_of(r, "wire_bytes_per_element")))
        wire = [wire[0], wire[-1]] if len(wire) > 2 else wire  # the range: a method whose index cost varies
        dens = seeds_of(r, "mean_density")
        t = mean_tta(r)
        tta = "-" if t is None else f"{t:.2f}"
        steps = f"{statistics.fmean(n):.0f}" if t is not None and (n := seeds_of(r, "steps_to_target")) else "-"
        out.append(f"| {r['method']} | {'-'.join(f'{w:.3g}' for w in wire) or '-'} | "
                   f"{statistics.fmean(dens):.4f} | {tta} | {steps} | {r['reached']} |"
                   if dens else f"| {r['method']} | - | - | {tta} | {steps} | {r['reached']} |")
    if mine is None:
        return out + ["", f"({ours} not in this table)"]
    return out + [""] + comparisons(rows, ours)


def comparisons(rows: list[dict], ours: str) -> list[str]:
    """Ours against the sweep (does it bracket ours, and the hindsight-best member) and every other family."""
    by = {r["method"]: r for r in rows}
    mine, out = by[ours], []
    peers = {m: r for m, r in by.items() if is_peer(m, ours)}
    sweep = {m: r for m, r in peers.items() if family(m) == "fixed TopK"}
    if sweep:
        densities = [statistics.fmean(d) for r in sweep.values() if (d := seeds_of(r, "mean_density"))]
        chose = seeds_of(mine, "mean_density")
        low, high = min(densities), max(densities)
        inside = all(low <= d <= high for d in chose)
        out.append(f"{ours}'s mean density per seed {min(chose):.4f}-{max(chose):.4f}; the sweep {low:.4f}-{high:.4f}: "
                   + ("bracketed" if inside else "NOT bracketed"))
        timed = {m: t for m, r in sweep.items() if (t := mean_tta(r)) is not None}
        if timed:
            best = min(timed, key=timed.get)
            out.append(f"{ours} / hindsight-best fixed TopK ({best}, {timed[best]:.2f} s): "
                       + ratio_text(seed_times(mine), seed_times(sweep[best])))
    for fam in dict.fromkeys(f for m in peers if (f := family(m)) and f != "fixed TopK"):
        members = {m: t for m, r in peers.items() if family(m) == fam and (t := mean_tta(r)) is not None}
        if members:
            best = min(members, key=members.get)
            out.append(f"{ours} / best {fam} ({best}): " + ratio_text(seed_times(mine), seed_times(by[best])))
    for m, r in by.items():
        if m.startswith(f"{ours}-"):
            out.append(f"{ours} / {m} (its own variant): " + ratio_text(seed_times(mine), seed_times(r)))
        elif ours.startswith(f"{m}-"):
            out.append(f"{ours} / {m} (the method it varies): " + ratio_text(seed_times(mine), seed_times(r)))
    return out + bar_lines(by, ours)


def bar_lines(by: dict[str, dict], ours: str) -> list[str]:
    """Issue 36's bar: ours's mean TTA within 1.1x of the fastest other method's (every family's members, the
    hindsight-best fixed density and the best PowerSGD rank among them; ours's own variants are not others), and
    its accuracy after the grid's equal epochs within 0.5 points of the fastest fixed method's (TopK or
    PowerSGD)."""
    out, mine = [], by[ours]
    others = {m: t for m, r in by.items() if family(m) and is_peer(m, ours) and (t := mean_tta(r)) is not None}
    if others and mean_tta(mine) is not None:
        fastest = min(others, key=others.get)
        ratio = mean_tta(mine) / others[fastest]
        out.append(f"bar: {ours}'s mean TTA / the fastest other method's ({fastest}, {others[fastest]:.2f} s) = "
                   f"{ratio:.2f}: " + ("within 1.1x" if ratio <= 1.1 else "NOT within 1.1x"))
        needed = seeds_for(seed_ratios(seed_times(mine), seed_times(by[fastest])))
        if needed is not None:
            out.append(f"seeds: at this spread of per-seed ratios, about {needed} paired seeds would narrow the 95% "
                       f"interval against {fastest} to +-10%")
    elif others:
        out.append(f"bar: {ours} did not reach the target on every seed: NOT within 1.1x")
    after = mine.get("after_epochs") or {}
    fixed = {m: r for m, r in by.items() if family(m) in ("fixed TopK", "PowerSGD")
             and (r.get("after_epochs") or {}).get("mean") is not None and mean_tta(r) is not None}
    if after.get("mean") is not None and fixed:
        # The fixed method ours stands in for: the fastest to the target (the highest accuracy per epoch is
        # the densest member's, which no compression at a lower density can match: printed too).
        best = min(fixed, key=lambda m: mean_tta(fixed[m]))
        densest = max(fixed, key=lambda m: fixed[m]["after_epochs"]["mean"])
        acc = {m: fixed[m]["after_epochs"]["mean"] for m in (best, densest)}
        gap = (acc[best] - after["mean"]) * 100
        out.append(f"bar: accuracy after {after['epochs']} epochs {after['mean']:.3f} ({after['n']} seeds) against "
                   f"the fastest fixed method's ({best}) {acc[best]:.3f}: "
                   + (f"{gap:.1f} points behind, " if gap > 0 else f"{-gap:.1f} points ahead, ")
                   + ("within 0.5" if gap <= 0.5 else "NOT within 0.5")
                   + f" (the highest fixed: {densest} {acc[densest]:.3f})")
    return out


def before_lines(before: str, scenario: str, ours: str, rows: list[dict]) -> list[str]:
    """The scenario's lead as the earlier table printed it, and ours against the same method now."""
    path = os.path.join(RESULTS, f"{before}.json")
    if not store.exists(path):
        return []
    row = next((r for r in store.load(path) if r["scenario"] == scenario and r["method"] == ours), None)
    if not row or row.get("paired_ratio") is None:
        return []
    out = [f"before ({before}.json, its own columns): {ours} {row['paired_ratio']:.2f} "
           f"[{row['ratio_lo']:.2f}, {row['ratio_hi']:.2f}] vs {row['vs']} (n={row['pairs']}), "
           f"mean density {row['mean_density']:.4f}, TTA {row['tta_mean_s']:.2f} s"]
    by = {r["method"]: r for r in rows}
    if ours in by and row["vs"] in by:
        out.append(f"now against the same method: {ours} / {row['vs']} "
                   + ratio_text(seed_times(by[ours]), seed_times(by[row["vs"]])))
    return out


FAIR = {"fair3": "eval3", "fair4": "eval4", "fair5": "eval5"}  # each fair grid -> its set as it ran before


# Cells whose timing was disturbed, with why: reported as they ran, and each comparison again without them
# (every pair that has one of them dropped), so a reader sees whether they move a verdict.
DISTURBED = {
    "fair3": ("ran while a build (nice 19, Go compiler) shared the 2 cores, 12:29:30-12:40:50 UTC (the cells' "
              "profile-start times in runs/final/fair3)",
              {"dc2": [81], "netsense": [83], "powersgd-r4": [84, 85, 86], "powersgd-r8": [80, 83, 89],
               "topk-0.001": [86], "topk-0.002": [80], "topk-0.003": [86], "topk-0.005": [83], "topk-0.01": [80],
               "topk-0.02": [84, 87], "topk-0.03": [84, 85, 86], "topk-0.1": [83, 84, 88], "tta": [82, 84, 85]}),
}


def without(rows: list[dict], cells: dict[str, list[int]]) -> list[dict]:
    """The rows with the listed cells removed (a pair needs both cells, so ours's pairs with them go too)."""
    return [{**r, "per_seed": [s for s in r.get("per_seed", []) if s["seed"] not in cells.get(r["method"], [])]}
            for r in rows]


def slowdown(rows: list[dict], cells: dict[str, list[int]]) -> float:
    """How much longer the listed cells took than their method's mean over its other seeds (geometric mean)."""
    logs = []
    for r in rows:
        t = seed_times(r)
        rest = [v for s, v in t.items() if s not in cells.get(r["method"], []) and v is not None]
        logs += [math.log(t[s] / statistics.fmean(rest)) for s in cells.get(r["method"], []) if t.get(s) and rest]
    return math.exp(statistics.fmean(logs))


def variant_ratios(rows: list[dict], ours: str) -> list[float]:
    """Per scenario, ours over the method it varies (ours = that method's label + "-..."), paired by seed."""
    out = []
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        by = {r["method"]: r for r in rows if r["scenario"] == scenario}
        base = next((m for m in by if ours.startswith(f"{m}-")), None)
        if ours in by and base and (ratio := paired_ratio(seed_times(by[ours]), seed_times(by[base]))[0]) is not None:
            out.append(ratio)
    return out


def report(grid: str, table: str, ours: str, before: str) -> list[float]:
    """Print the grid's report; returns ours against the method it varies, per scenario (variant_ratios)."""
    rows = store.load(table)
    code = rows[0].get("code_commit") or rows[0].get("commit") or "unknown"
    print(f"# {grid}: recomputed from the per-seed records (package as last changed in {code[:12]})\n")
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        here = [r for r in rows if r["scenario"] == scenario]
        print("\n".join(scenario_report(scenario, here, ours)))
        print("\n".join(before_lines(before, scenario, ours, here)))
        if grid in DISTURBED and any(r["method"] == ours for r in here):
            why, cells = DISTURBED[grid]
            print(f"\nwithout the {sum(map(len, cells.values()))} cells that {why}; they took "
                  f"{slowdown(here, cells):.2f}x their method's mean TTA over its other seeds (geometric mean):")
            print("\n".join(comparisons(without(here, cells), ours)))
        print()
    return variant_ratios(rows, ours)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", help="the tables: testbed/results/GRID.jsonl[.gz], comma-separated (default: every fair grid "
                                   "that landed)")
    ap.add_argument("--ours", default="tta", help="our method's label (default tta)")
    ap.add_argument("--before", help="the earlier table of the same scenarios (default: the grid's set, e.g. eval4)")
    ap.add_argument("--table", help="a table.json elsewhere (e.g. runs/final/fair4/table.json; needs --grid)")
    args = ap.parse_args()
    if args.table and (not args.grid or "," in args.grid):
        ap.error("--table needs --grid with one name (the name its numbers are reported under)")
    grids = args.grid.split(",") if args.grid else [g for g in FAIR if store.exists(os.path.join(RESULTS, f"{g}.json"))]
    ratios = []
    for grid in grids:
        ratios += report(grid, args.table or os.path.join(RESULTS, f"{grid}.json"), args.ours,
                         args.before or FAIR.get(grid, ""))
    if ratios:  # a development grid's rule: ours against the method it varies, over every scenario printed
        print(f"{args.ours} / the method it varies, geometric mean over the {len(ratios)} scenarios' paired ratios: "
              f"{math.exp(statistics.fmean(map(math.log, ratios))):.3f} (per scenario {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
