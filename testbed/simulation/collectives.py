"""Validation of the simulated clock, layer (a): each collective's modeled time against the emulated link's
measured time (issue 61). Root: it builds a LocalCluster per (workers, rate), runs gloo collectives of each size
between its hosts, and compares the median of their measured times with netsense.clock.simulated's model.

    sudo .venv/bin/python testbed/simulation/collectives.py [--out testbed/results/sim-collectives]
    sudo .venv/bin/python testbed/simulation/collectives.py --topology shared [--cross-flows 0 1]

``--topology shared``: the hosts on the two racks of the shared topology (netsense.emulation.cluster), the one
link between them shaped, at 2 and 4 workers and 10 and 100 Mbit (sim-collectives-shared); ``--cross-flows N``
also runs N bulk TCP flows from rack A to rack B (netsense.emulation.cross, always on from two seconds before the
first collective) through each measurement, and the model counts them (netsense.clock.simulated.shared_flows).

Writes <out>.jsonl (the results store, netsense.bench.store: a record a measurement: workers, rate, kind, size,
the measured repetitions, the model) and <out>.md (the table), and rewrites the store's index. A collective starts after an idle gap, as a step's first bucket does (a barrier,
then 50 ms of nothing): what training sees, slow start included. Cells whose model says more than
--max-seconds a repetition are left out (10 Mbit x 8 MB would take minutes and says nothing new).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from netsense.bench import store  # noqa: E402
from netsense.bench.provenance import provenance  # noqa: E402
from netsense.clock.simulated import collective_seconds, shared_flows  # noqa: E402
from netsense.control.cost import dense_allreduce_bytes  # noqa: E402
from netsense.emulation.bottleneck import CROSS_PORT  # noqa: E402
from netsense.emulation.cluster import LocalCluster  # noqa: E402
from netsense.emulation.cross import Flow  # noqa: E402
from netsense.shaping.profiles import build_profile  # noqa: E402
from netsense.shaping.shaper import write_clock  # noqa: E402
from netsense.spec.job import SIMULATION_LATENCY  # noqa: E402
from netsense.units import parse_duration  # noqa: E402

SIZES = [47_000, 370_000, 1_500_000, 8_000_000]  # bytes of the tensor (fp32), as the bench's tasks' buckets
RATES = ["10Mbit", "100Mbit", "1000Mbit"]
SHARED_RATES = ["10Mbit", "100Mbit"]  # the shared link: 1 Gbit is past what this machine's emulator carries
WORLDS = [2, 4]
CROSS_WARMUP_S = 2.0  # the cross flows' head start: their windows open and the queue fills, as a running flow's
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


def modeled(kind: str, size: int, world: int, bps: float, topology: str = "per-host", cross: int = 0) -> float:
    flows = shared_flows(world, 1, cross) if topology == "shared" else 1
    return collective_seconds(kind, wire_bytes(kind, size, world), world, bps, HOP_LATENCY_S, flows)


def start_cross(cluster: LocalCluster, flows: int, scratch: str, epoch: float) -> str:
    """``flows`` bulk flows from x0 (rack A) to x1 (rack B), on a clock started at ``epoch``; returns the
    receiver's goodput file (netsense.emulation.cross), its rows on that clock."""
    clock, out = os.path.join(scratch, "clock"), os.path.join(scratch, "cross_traffic.csv")
    write_clock(clock, epoch)
    me = sys.executable
    cluster.spawn_in(cluster.cross_ns(1), [me, "-m", "netsense.emulation.cross", "recv", str(CROSS_PORT), clock, out])
    specs = json.dumps([asdict(Flow(f"bulk0-{k}")) for k in range(flows)])
    cluster.spawn_in(cluster.cross_ns(0), [me, "-m", "netsense.emulation.cross", "send", cluster.cross_address(1),
                                           str(CROSS_PORT), clock, specs])
    time.sleep(CROSS_WARMUP_S)
    return out


def cross_mbit(path: str, since: float, until: float) -> float | None:
    """The cross flows' summed goodput (Mbit/s) in the receiver's bins between two times on its clock."""
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    bins: dict[str, float] = {}
    for r in rows:
        if since <= float(r["t"]) <= until:
            bins[r["t"]] = bins.get(r["t"], 0.0) + float(r["mbit"])
    return round(statistics.fmean(bins.values()), 2) if bins else None


def measure(world: int, rate: str, plan: dict[str, list[int]], reps: int, topology: str = "per-host",
            cross: int = 0) -> list[dict]:
    profile = build_profile({"type": "static", "rate": rate})
    records = []
    extra = {} if topology == "per-host" else {"topology": topology, "cross_flows": cross}
    with tempfile.TemporaryDirectory() as scratch, \
            LocalCluster(world, profile, shaping_log=open(os.devnull, "w"), topology=topology,
                         cross_hosts=cross > 0) as cluster:
        epoch = time.time()
        goodput = start_cross(cluster, cross, scratch, epoch) if cross else None
        for kind, sizes in plan.items():
            if not sizes:
                continue
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            procs = [cluster.spawn(r, [sys.executable, "-c", WORKER, str(r), str(world), str(reps), json.dumps(sizes),
                                       json.dumps([kind]), cluster.address(0), str(PORT)], env=env,
                                   stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL)
                     for r in range(world)]
            since = time.time() - epoch
            out = procs[0].communicate(timeout=1800)[0]
            for p in procs[1:]:
                p.wait(timeout=60)
            seen = {"cross_mbit": cross_mbit(goodput, since, time.time() - epoch)} if goodput else {}
            for rec in json.loads(out):
                records.append({"workers": world, "rate": rate, **extra, **rec, **seen,
                                "model_seconds": modeled(rec["kind"], rec["size"], world, profile.rate_at(0),
                                                         topology, cross)})
    return records


def table(records: list[dict]) -> str:
    shared = any("cross_flows" in r for r in records)
    head = "| workers | rate | cross flows | collective | size |" if shared else "| workers | rate | collective | size |"
    lines = [head + " measured s (median) | model s | measured / model |",
             "| ---: | ---: |" + (" ---: |" if shared else "") + " --- | ---: | ---: | ---: | ---: |"]
    for r in records:
        med = statistics.median(r["seconds"])
        cross = f" {r['cross_flows']} |" if shared else ""
        lines.append(f"| {r['workers']} | {r['rate']} |{cross} {r['kind']} | {r['size'] / 1e3:g} kB | {med:.4f} | "
                     f"{r['model_seconds']:.4f} | {med / r['model_seconds']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="default: testbed/results/sim-collectives, or sim-collectives-shared")
    ap.add_argument("--topology", choices=("per-host", "shared"), default="per-host")
    ap.add_argument("--cross-flows", type=int, nargs="+", default=[0], metavar="N",
                    help="shared: measure with N bulk cross flows, for each N given")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=2.0, help="leave out cells modeled longer a repetition")
    ap.add_argument("--print", action="store_true", help="print the committed table from <out>.jsonl, run nothing")
    args = ap.parse_args()
    shared = args.topology == "shared"
    if args.cross_flows != [0] and not shared:
        ap.error("--cross-flows: cross traffic competes at the shared link (--topology shared)")
    args.out = args.out or "testbed/results/sim-collectives" + ("-shared" if shared else "")
    if args.print:
        print(table(store.load(args.out + ".jsonl")))
        return 0
    records = []
    started = time.monotonic()
    made = provenance(__file__)
    for cross in args.cross_flows if shared else [0]:
        for world in WORLDS:
            for rate in SHARED_RATES if shared else RATES:
                bps = build_profile({"type": "static", "rate": rate}).rate_at(0)
                plan = {kind: [s for s in SIZES
                               if modeled(kind, s, world, bps, args.topology, cross) <= args.max_seconds]
                        for kind in ("all_reduce", "all_gather")}
                print(f"collectives: {world} workers at {rate}, {args.topology}, {cross} cross flows: {plan} "
                      f"({time.monotonic() - started:.0f} s so far)", file=sys.stderr, flush=True)
                records += [{**r, **made} for r in measure(world, rate, plan, args.reps, args.topology, cross)]
    store.save(args.out + ".jsonl", records)
    md = table(records)
    with open(args.out + ".md", "w") as fh:
        fh.write(f"# The simulated clock against the emulated link{' (shared topology)' if shared else ''}: one "
                 "collective at a time\n\n"
                 "Produced by `testbed/simulation/collectives.py` (median of the repetitions after a warm-up one; "
                 "each after a barrier and 50 ms idle); the model is netsense.clock.simulated's "
                 f"collective_seconds with the default {HOP_LATENCY_S * 1e6:.0f} us a hop.\n\n" + md + "\n")
    store.write_index(os.path.dirname(args.out) or ".")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
