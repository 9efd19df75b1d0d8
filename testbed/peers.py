"""Our methods against the best peer, re-read from a bench run that did not name its variants.

Grids since the `variants:` key name a method's own variants, and the bench's table pairs each method with
the best method outside its family. Runs from before it (eval4, eval2-after) paired tta with tta-plain
where that was the runner-up; this re-reads their summary.json with the methods named in --ours as one
family, with the bench's own statistics (netsense.bench.stats: geometric mean of the per-seed TTA ratios,
Student's t 95% interval on the log ratios, none below 5 pairs; the numbers it printed into the README
before, from a percentile bootstrap, are not what it prints now):

    python testbed/peers.py runs/eval4/summary.json --ours tta,tta-plain,tta-masked [--target 0.85]
"""

from __future__ import annotations

import argparse
import json

from netsense.bench.stats import at_targets, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary", help="a bench run's summary.json")
    ap.add_argument("--ours", required=True, help="comma-separated method labels that are ours (one family)")
    ap.add_argument("--target", type=float, help="a further target read off the accuracy curves")
    args = ap.parse_args()
    ours = args.ours.split(",")
    family = dict.fromkeys(ours, ours[0])
    results = json.load(open(args.summary))
    rows = summarize(results, family)
    if args.target:
        at_targets(results, rows, [args.target], None, family)
        rows = [{**r, **r["targets"][str(args.target)]} for r in rows]
    print("| scenario | method | peer | paired TTA ratio [95% CI] | seeds |")
    print("| --- | --- | --- | ---: | ---: |")
    for r in rows:
        if r["method"] in ours and r.get("pairs"):
            print(f"| {r['scenario']} | {r['method']} | {r['vs']} | {r['paired_ratio']:.2f} "
                  f"[{r['ratio_lo']:.2f}, {r['ratio_hi']:.2f}] | {r['pairs']} |")


if __name__ == "__main__":
    main()
