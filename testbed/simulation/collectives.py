"""Validation of the simulated clock, layer (a): each collective's modeled time against the emulated link's
measured time (issue 61). Root: it builds a LocalCluster per (workers, rate), runs gloo collectives of each size
between its hosts, and compares the median of their measured times with netsense.clock.simulated's model.

    sudo .venv/bin/python testbed/simulation/collectives.py [--out testbed/results/sim-collectives]

Writes <out>.jsonl (the results store, netsense.bench.store: a record a measurement: workers, rate, kind, size,
the measured repetitions, the model) and <out>.md (the table), and rewrites the store's index. A collective starts after an idle gap, as a step's first bucket does (a barrier,
then 50 ms of nothing): what training sees, slow start included. Cells whose model says more than
--max-seconds a repetition are left out (10 Mbit x 8 MB would take minutes and says nothing new).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from netsense.bench import store  # noqa: E402
from netsense.clock.simulated import collective_seconds  # noqa: E402
from netsense.control.cost import dense_allreduce_bytes  # noqa: E402
from netsense.emulation.cluster import LocalCluster  # noqa: E402
from netsense.shaping.profiles import build_profile  # noqa: E402
from netsense.spec.job import SIMULATION_LATENCY  # noqa: E402
from netsense.units import parse_duration  # noqa: E402

SIZES = [47_000, 370_000, 1_500_000, 8_000_000]  # bytes of the tensor (fp32), as the bench's tasks' buckets
RATES = ["10Mbit", "100Mbit", "1000Mbit"]
WORLDS = [2, 4]
HOP_LATENCY_S = parse_duration(SIMULATION_LATENCY)  # spec.network.simulation.latency's default
PORT = 29511

WORKER = r"""
import json, os, statistics, sys, time, datetime
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world, reps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sizes, kinds = json.loads(sys.argv[4]), json.loads(sys.argv[5])
dist.init_process_group("gloo", init_method=f"tcp://{sys.argv[6]}:{sys.argv[7]}", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=600))
out = []
for kind in kinds:
    for size in sizes:
        n = size // 4
        t = torch.ones(n)
        chunks = [torch.empty(n) for _ in range(world)]
        times = []
        for i in range(reps + 1):
            dist.barrier()
            time.sleep(0.05)
            t0 = time.perf_counter()
            if kind == "all_reduce":
                dist.all_reduce(t)
            else:
                dist.all_gather(chunks, t)
            times.append(time.perf_counter() - t0)
        out.append({"kind": kind, "size": size, "seconds": times[1:]})  # the first: connections warming up
if rank == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def wire_bytes(kind: str, size: int, world: int) -> float:
    """What one rank puts on the wire (the hooks' count): a ring all_reduce of the fp32 tensor
    (dense_allreduce_bytes), an all_gather p-1 copies of its chunk."""
    return dense_allreduce_bytes(size // 4, world) if kind == "all_reduce" else (world - 1) * size


def modeled(kind: str, size: int, world: int, bps: float) -> float:
    return collective_seconds(kind, wire_bytes(kind, size, world), world, bps, HOP_LATENCY_S)


def measure(world: int, rate: str, plan: dict[str, list[int]], reps: int) -> list[dict]:
    profile = build_profile({"type": "static", "rate": rate})
    records = []
    with LocalCluster(world, profile, shaping_log=open(os.devnull, "w")) as cluster:
        for kind, sizes in plan.items():
            if not sizes:
                continue
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            procs = [cluster.spawn(r, [sys.executable, "-c", WORKER, str(r), str(world), str(reps), json.dumps(sizes),
                                       json.dumps([kind]), cluster.address(0), str(PORT)], env=env,
                                   stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL)
                     for r in range(world)]
            out = procs[0].communicate(timeout=1800)[0]
            for p in procs[1:]:
                p.wait(timeout=60)
            for rec in json.loads(out):
                records.append({"workers": world, "rate": rate, **rec,
                                "model_seconds": modeled(rec["kind"], rec["size"], world, profile.rate_at(0))})
    return records


def table(records: list[dict]) -> str:
    lines = ["| workers | rate | collective | size | measured s (median) | model s | measured / model |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for r in records:
        med = statistics.median(r["seconds"])
        lines.append(f"| {r['workers']} | {r['rate']} | {r['kind']} | {r['size'] / 1e3:g} kB | {med:.4f} | "
                     f"{r['model_seconds']:.4f} | {med / r['model_seconds']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testbed/results/sim-collectives")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=2.0, help="leave out cells modeled longer a repetition")
    ap.add_argument("--print", action="store_true", help="print the committed table from <out>.jsonl, run nothing")
    args = ap.parse_args()
    if args.print:
        print(table(store.load(args.out + ".jsonl")))
        return 0
    records = []
    started = time.monotonic()
    for world in WORLDS:
        for rate in RATES:
            bps = build_profile({"type": "static", "rate": rate}).rate_at(0)
            plan = {kind: [s for s in SIZES if modeled(kind, s, world, bps) <= args.max_seconds]
                    for kind in ("all_reduce", "all_gather")}
            print(f"collectives: {world} workers at {rate}: {plan} ({time.monotonic() - started:.0f} s so far)",
                  file=sys.stderr, flush=True)
            records += measure(world, rate, plan, args.reps)
    store.save(args.out + ".jsonl", records)
    md = table(records)
    with open(args.out + ".md", "w") as fh:
        fh.write("# The simulated clock against the emulated link: one collective at a time\n\n"
                 "Produced by `testbed/simulation/collectives.py` (median of the repetitions after a warm-up one; "
                 "each after a barrier and 50 ms idle); the model is netsense.clock.simulated's "
                 f"collective_seconds with the default {HOP_LATENCY_S * 1e6:.0f} us a hop.\n\n" + md + "\n")
    store.write_index(os.path.dirname(args.out) or ".")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
