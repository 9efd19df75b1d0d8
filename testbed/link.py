"""Is the emulated link faithful for what a training step sends? (root)

    python testbed/link.py [--rates 10,20,50,100,200,500,1000] [--out testbed/results/link.md]

For each static rate, a two-host testbed cluster sends payloads of 10 kB to
4 MB after 100 ms of idle link and prints each one's apparent rate at the
receiver as a multiple of the configured rate (median of 3): above 1 the
payload outran the link. Then one bulk TCP flow for 3 s: its fastest second
at the receiver. The two pull the bucket's size apart (netsense.shaping.tc):
a small bucket keeps payloads honest, a large one keeps bulk at the rate when
the kernel's timer wakes late. The tests hold 10 kB to what one bucket can
gain, larger payloads to netsense.emulation.bulk.payload_bounds (a cell outside
them is marked !), and bulk to 0.9-1.1x.
"""

from __future__ import annotations

import argparse
import os

from netsense.emulation.bulk import (
    best_second,
    bulk_result,
    payload_bounds,
    payload_rates,
    start_bulk,
)
from netsense.emulation.cluster import LocalCluster
from netsense.shaping.profiles import build_profile

TITLE = ("# Payload after idle: apparent rate at the receiver / configured rate (median of 3; after 100 ms idle);"
         " bulk: one TCP flow's fastest second\n\n"
         "Reproduce: `python testbed/link.py --out testbed/results/link.md` (root).")
SIZES = [10_000, 47_000, 100_000, 300_000, 1_000_000, 4_000_000]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10,20,50,100,200,500,1000", help="Mbit/s, comma separated")
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    lines = ["| link | " + " | ".join(f"{s // 1000} kB" for s in SIZES) + " | bulk |", "|---" * (len(SIZES) + 2) + "|"]
    for mbit in args.rates.split(","):
        profile = build_profile({"type": "static", "rate": f"{mbit}Mbit"})
        with LocalCluster(2, profile, shaping_log=open(os.devnull, "w")) as c:
            got = payload_rates(c, SIZES)
            bulk = best_second(bulk_result(start_bulk(c, 3.0)), 0.8, 2.8)
        bps = profile.rate_at(0)
        from_bytes, low, high = payload_bounds(bps)
        outside = {s for s in SIZES if s >= from_bytes and not low <= got[s] / bps <= high}
        lines.append(f"| {mbit} Mbit | " + " | ".join(f"{got[s] / bps:.2f}x{'!' if s in outside else ''}" for s in SIZES)
                     + f" | {bulk / bps:.2f}x |")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(f"{TITLE}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
