"""One table across the evaluation sets: the README's summary, read off the bench's own tables.

    python testbed/overview.py                        # eval, eval2, ... eval5 as testbed/results has them
    python testbed/overview.py --ours tta --grids eval,eval2

For each scenario of each grid's table (testbed/results/<grid>.jsonl[.gz], the bench's table.json as
testbed/rerun.sh lands it): the fastest mean, our method's regret (its mean TTA over the
fastest mean: the controller bar is 1.1) and its paired TTA ratio against the best method outside its
family with the 95% interval the table was written with (a percentile bootstrap in the tables of
sets 1-5, Student's t on the log ratios since; the bench's statistics, not recomputed here: testbed/fair.py
recomputes them from the per-seed records where a table has them), the same for the
best of each peer family (fixed TopK densities, PowerSGD ranks, the paper's netsense, dc2, allreduce),
and at the early target where the grid has one. Last, which code ran the tables: one line if one version
of the package ran them all, else each table's.
"""

from __future__ import annotations

import argparse
import os

from netsense.bench import store
from netsense.bench.stats import compared_mean

PEERS = {  # column -> its members: labels starting with this where it ends in "-", else this label alone
    "best fixed TopK": "topk-",
    "best PowerSGD": "powersgd-",
    "netsense (paper)": "netsense",
    "dc2": "dc2",
    "allreduce": "allreduce",
}
BAR = 1.1


def paired(row: dict | None) -> str:
    if not row:
        return "-"
    if row.get("paired_ratio") is None:
        return f"{row['method']}: reached {row.get('reached', '?')}"
    if row.get("vs") is None:
        return f"{row['method']} (first)"
    return f"{row['paired_ratio']:.2f} [{row['ratio_lo']:.2f}, {row['ratio_hi']:.2f}]"


def fastest(rows: list[dict]) -> dict | None:
    """The row with the lowest mean TTA (a calibrated row's charged mean: netsense.bench.stats.compared_mean)."""
    timed = [r for r in rows if r.get("tta_mean_s") is not None and compared_mean(r) is not None]
    return min(timed, key=compared_mean) if timed else None


def best_of(rows: list[dict], peer: str, ours: str) -> dict | None:
    """The member with the lowest mean TTA (the paper's netsense alone, not its -ef ablation)."""
    members = [r for r in rows if r["method"] != ours
               and (r["method"].startswith(peer) if peer.endswith("-") else r["method"] == peer)]
    return fastest(members) or (members[0] if members else None)


def scenario_line(grid: str, scenario: str, rows: list[dict], ours: str) -> str:
    top, mine = fastest(rows), next((r for r in rows if r["method"] == ours), None)
    regret = compared_mean(mine) / compared_mean(top) if mine and top and mine.get("tta_mean_s") else None
    cells = [f"{grid}: {scenario}", f"{top['method']} {compared_mean(top):.2f} s" if top else "-",
             f"{regret:.2f}" + (" met" if regret <= BAR else " **missed**") if regret else "-",
             paired(mine) + (f" vs {mine['vs']}" if mine and mine.get("vs") else "")]
    for peer in PEERS.values():
        best = best_of(rows, peer, ours)
        cells.append((f"{best['method']} " if best and best["method"] != peer else "") + paired(best))
    early = list((mine or {}).get("targets", {}).values())
    cells.append(" ".join(f"{paired(t)} vs {t['vs']}" if t.get("vs") else paired(t) for t in early) or "-")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="?", default=os.path.join(os.path.dirname(__file__), "results"),
                    help="the folder of <grid>.jsonl[.gz] tables (default: testbed/results)")
    ap.add_argument("--grids", default="eval,eval2,eval3,eval4,eval5", help="comma-separated, in order")
    ap.add_argument("--ours", default="tta", help="our method's label")
    args = ap.parse_args()
    header = ["scenario", "fastest mean", f"{args.ours} regret (bar {BAR})", f"{args.ours} paired vs best other",
              *PEERS, f"{args.ours} at the early target"]
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join(["---"] * 2 + ["---:"] * (len(header) - 2)) + " |")
    code: dict[str, str] = {}
    for grid in args.grids.split(","):
        path = os.path.join(args.results, f"{grid}.json")
        if not store.exists(path):
            print(f"| {grid}: not run yet ({path}) |" + " |" * (len(header) - 1))
            continue
        rows = store.load(path)
        code[grid] = ((rows[0].get("code_commit") or rows[0].get("commit") or "unknown")[:12]
                      + (" with uncommitted changes" if rows[0].get("dirty") else "")) if rows else "empty"
        for scenario in dict.fromkeys(r["scenario"] for r in rows):
            print(scenario_line(grid, scenario, [r for r in rows if r["scenario"] == scenario], args.ours))
    versions = set(code.values())
    print()
    if len(versions) == 1:
        print(f"Code: every table above ran the package as last changed in {versions.pop()}.")
    else:
        print("Code: the tables ran different versions of the package: "
              + ", ".join(f"{g} {c}" for g, c in code.items()) + ".")


if __name__ == "__main__":
    main()
