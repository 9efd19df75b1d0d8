"""The fair comparison's numbers, recomputed from a committed table alone (testbed/results/<grid>.json, the
bench's table.json with each seed's record): every figure the README quotes about it is printed here.

    python testbed/fair.py                      # fair4 (set 4 re-run at one encoding, fine sweep), before: eval4
    python testbed/fair.py --grid fair4 --ours tta --before eval4

Per scenario: the link rates the cells trained under; each method's bytes per element on the wire, mean
density and mean TTA; whether the fixed TopK sweep brackets the densities ours chose (every seed's mean
density between the sweep's lowest and highest); ours against the hindsight-best fixed density, against the
best of every other family, and against itself at fp32 (the encoding's share of a lead): the geometric mean
of the per-seed TTA ratios with Student's t 95% interval on the log ratios (the bench's own functions,
applied to the per-seed records, not read from the table's columns). Then the same scenario's lead as the
earlier table (--before) printed it, for the before/after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from netsense.bench.stats import paired_ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FAMILIES = {"topk-": "fixed TopK", "powersgd-": "PowerSGD", "netsense": "netsense (paper)", "dc2": "dc2",
            "allreduce": "allreduce"}


def family(method: str) -> str | None:
    return next((name for prefix, name in FAMILIES.items()
                 if (method.startswith(prefix) if prefix.endswith("-") else method == prefix)), None)


def times(row: dict) -> dict[int, float | None]:
    return {s["seed"]: s.get("time_to_accuracy_s") for s in row.get("per_seed", [])}


def seeds_of(row: dict, key: str) -> list[float]:
    return [s[key] for s in row.get("per_seed", []) if s.get(key) is not None]


def ratio_text(mine: dict, theirs: dict) -> str:
    ratio, lo, hi, n = paired_ratio(mine, theirs)
    if ratio is None:
        return "no common seed reached the target"
    interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else " (no interval below 5 pairs)"
    verdict = "" if lo is None else (" lead" if hi < 1 else " behind" if lo > 1 else " no difference shown")
    return f"{ratio:.2f}{interval} (n={n}){verdict}"


def mean_tta(row: dict) -> float | None:
    ttas = [t for t in times(row).values() if t is not None]
    return statistics.fmean(ttas) if ttas and len(ttas) == len(row.get("per_seed", [])) else None


def scenario_report(name: str, rows: list[dict], ours: str) -> list[str]:
    by = {r["method"]: r for r in rows}
    mine = by.get(ours)
    out = [f"## {name}", ""]
    seen = mine or rows[0]
    lows, meds, highs = (seeds_of(seen, f"link_rate_mbit_{k}") for k in ("min", "median", "max"))
    if lows:
        out.append(f"link (Mbit/s, {ours}'s cells): min {min(lows):.0f}, median of medians "
                   f"{statistics.median(meds):.0f}, max {max(highs):.0f}")
    out += ["", "| method | bytes/element | mean density | TTA s (mean over seeds) | reached |", "|---|---:|---:|---:|:---:|"]
    for r in sorted(rows, key=lambda r: (mean_tta(r) is None, mean_tta(r) or 0)):
        wire = sorted(set(seeds_of(r, "wire_bytes_per_element")))
        wire = [wire[0], wire[-1]] if len(wire) > 2 else wire  # the range: a method whose index cost varies
        dens = seeds_of(r, "mean_density")
        t = mean_tta(r)
        out.append(f"| {r['method']} | {'-'.join(f'{w:.3g}' for w in wire) or '-'} | "
                   f"{statistics.fmean(dens):.4f} | {'-' if t is None else f'{t:.2f}'} | {r['reached']} |"
                   if dens else f"| {r['method']} | - | - | {'-' if t is None else f'{t:.2f}'} | {r['reached']} |")
    if mine is None:
        return out + ["", f"({ours} not in this table)"]
    sweep = {m: r for m, r in by.items() if family(m) == "fixed TopK"}
    out.append("")
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
                       + ratio_text(times(mine), times(sweep[best])))
    for fam in dict.fromkeys(f for m in by if (f := family(m)) and f != "fixed TopK"):
        members = {m: t for m, r in by.items() if family(m) == fam and (t := mean_tta(r)) is not None}
        if members:
            best = min(members, key=members.get)
            out.append(f"{ours} / best {fam} ({best}): " + ratio_text(times(mine), times(by[best])))
    for m, r in by.items():
        if m.startswith(f"{ours}-"):
            out.append(f"{ours} / {m} (its own variant): " + ratio_text(times(mine), times(r)))
    return out


def before_lines(before: str, scenario: str, ours: str) -> list[str]:
    path = os.path.join(RESULTS, f"{before}.json")
    if not os.path.exists(path):
        return []
    row = next((r for r in json.load(open(path)) if r["scenario"] == scenario and r["method"] == ours), None)
    if not row or row.get("paired_ratio") is None:
        return []
    return [f"before ({before}.json, its own columns): {ours} {row['paired_ratio']:.2f} "
            f"[{row['ratio_lo']:.2f}, {row['ratio_hi']:.2f}] vs {row['vs']} (n={row['pairs']}), "
            f"mean density {row['mean_density']:.4f}, TTA {row['tta_mean_s']:.2f} s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", default="fair4", help="the table: testbed/results/GRID.json (default fair4)")
    ap.add_argument("--ours", default="tta", help="our method's label (default tta)")
    ap.add_argument("--before", default="eval4", help="the earlier table of the same scenarios (default eval4)")
    ap.add_argument("--table", help="a table.json elsewhere (e.g. runs/final/fair4/table.json)")
    args = ap.parse_args()
    rows = json.load(open(args.table or os.path.join(RESULTS, f"{args.grid}.json")))
    code = rows[0].get("code_commit") or rows[0].get("commit") or "unknown"
    print(f"# {args.grid}: recomputed from the per-seed records (package as last changed in {code[:12]})\n")
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        print("\n".join(scenario_report(scenario, [r for r in rows if r["scenario"] == scenario], args.ours)))
        print("\n".join(before_lines(args.before, scenario, args.ours)))
        print()


if __name__ == "__main__":
    main()
