"""Our methods against the best peer, paired on seeds: the bench's own table pairs each method with the
best *other* method, which may be a variant of ours (tta against tta-plain); this asks the controller
issue's question instead: tta (and each variant named) against the fastest method that is none of them.

    python testbed/peers.py runs/eval4/summary.json --ours tta,tta-plain,tta-masked [--target 0.85]

Same statistics as ``netsense bench`` (netsense.bench.stats: geometric mean of the per-seed TTA ratios,
percentile bootstrap 95% interval, fixed generator); the peer is the lowest mean TTA among methods every
seed of which reached the target.
"""

from __future__ import annotations

import argparse
import json

from netsense.bench.stats import paired_ratio, time_to


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summary", help="a bench run's summary.json")
    ap.add_argument("--ours", required=True, help="comma-separated method labels that are ours")
    ap.add_argument("--target", type=float, help="a further target read off the accuracy curves")
    args = ap.parse_args()
    ours = args.ours.split(",")
    tta: dict[str, dict[str, dict[int, float | None]]] = {}
    for r in json.load(open(args.summary)):
        t = time_to(r, args.target) if args.target else r.get("time_to_accuracy_s")
        tta.setdefault(r["scenario"], {}).setdefault(r["method_label"], {})[r["seed"]] = (
            t if r.get("status") == "Succeeded" else None)
    print("| scenario | method | peer | paired TTA ratio [95% CI] | seeds |")
    print("| --- | --- | --- | ---: | ---: |")
    for scenario, by in sorted(tta.items()):
        complete = {m: sum(v.values()) / len(v) for m, v in by.items()
                    if m not in ours and all(t is not None for t in v.values())}
        if not complete:
            continue
        peer = min(complete, key=complete.get)
        for m in ours:
            ratio, lo, hi, n = paired_ratio(by.get(m, {}), by[peer])
            if n:
                print(f"| {scenario} | {m} | {peer} | {ratio:.2f} [{lo:.2f}, {hi:.2f}] | {n} |")


if __name__ == "__main__":
    main()
