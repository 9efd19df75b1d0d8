"""How many workers fit on this machine on the simulated clock (issue 65, item 1): one process a worker, as the
emulator and a cluster run them, measured at 2-64 workers for what it costs in memory and wall time, each worker
forked from a server that imported the trainer (netsense.emulation.forked, the default) and, side by side up to
32 workers, spawned as a fresh interpreter (as before forking).

Each size runs one small job (`netsense run`, the simulated clock, TopK 1% at fp16, a 0.27M-parameter MLP on the
digits, 8 samples a worker, 40 steps) while a sampler reads every process of the run's tree twice a second: the
sum of their proportional set sizes (PSS: a page shared by k processes, such as torch's libraries, counted 1/k
each, so the sum is what the run really holds) and the machine's MemAvailable. It writes a record a size.

    .venv/bin/python testbed/simulation/many_workers.py [--workers 2 8 16 32 64] \
        [--out testbed/results/sim-many-workers]

Writes <out>.jsonl (the results store), rewrites the store's index and prints the table (testbed/EVALUATION.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from netsense.bench import store  # noqa: E402
from netsense.bench.provenance import provenance  # noqa: E402

JOB = """apiVersion: netsense.dev/v1alpha1
kind: NetSenseJob
metadata: {{name: many-workers-{n}}}
spec:
  workers: {n}
  training: {{model: mlp, hiddenSize: 256, dataset: digits, batchSize: 8, epochs: 1000, maxSteps: {steps}, lr: 0.05,
             evalEvery: {steps}}}
  compression: {{method: topk, density: 0.01}}
  network: {{clock: simulated, profile: {{type: static, rate: 100Mbit}}}}
"""


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _kib(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _sample(root: int) -> tuple[int, int]:
    """(the tree's PSS, its process count) now, in KiB."""
    pss, procs = 0, 0
    for pid in _tree(root):
        try:
            pss += _kib(f"/proc/{pid}/smaps_rollup", "Pss")
            procs += 1
        except OSError:
            pass  # gone between the listing and the read
    return pss, procs


def measure(n: int, steps: int, workdir: str, launcher: str) -> dict:
    job = os.path.join(workdir, f"job-{n}.yaml")
    with open(job, "w") as f:
        f.write(JOB.format(n=n, steps=steps))
    out = os.path.join(workdir, f"out-{n}-{launcher}")
    env = {**os.environ, "NETSENSE_FORK_WORKERS": "1" if launcher == "forked" else "0"}
    available_before = _kib("/proc/meminfo", "MemAvailable")
    start = time.perf_counter()
    proc = subprocess.Popen([os.path.join(REPO, ".venv/bin/netsense"), "run", job, "--out", out, "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    peak = {"pss": 0, "procs": 0, "available_min": available_before}

    def sampler() -> None:
        while proc.poll() is None:
            pss, procs = _sample(proc.pid)
            peak["pss"], peak["procs"] = max(peak["pss"], pss), max(peak["procs"], procs)
            peak["available_min"] = min(peak["available_min"], _kib("/proc/meminfo", "MemAvailable"))
            time.sleep(0.5)

    thread = threading.Thread(target=sampler)
    thread.start()
    _, err = proc.communicate()
    thread.join()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{n} workers failed ({proc.returncode}):\n{err[-2000:]}")
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    return {"launcher": launcher, "workers": n, "steps": result["steps"], "wall_s": round(wall, 1),
            "training_wall_s": round(result["wall_seconds"], 2),
            "wall_ms_per_step": round(1e3 * result["wall_seconds"] / result["steps"], 1),
            "simulated_s": result["train_seconds"], "peak_pss_mib": round(peak["pss"] / 1024),
            "pss_mib_per_worker": round(peak["pss"] / 1024 / n), "peak_processes": peak["procs"],
            "available_drop_mib": round((available_before - peak["available_min"]) / 1024),
            "machine_mib": round(_kib("/proc/meminfo", "MemTotal") / 1024), **provenance(__file__)}


def table(records: list[dict]) -> str:
    rows = ["| workers | launcher | peak PSS, all processes (MiB) | per worker (MiB) | MemAvailable drop (MiB) | wall s "
            "(start to end) | training wall ms a step | simulated s |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in records:
        rows.append(f"| {r['workers']} | {r['launcher']} | {r['peak_pss_mib']} | {r['pss_mib_per_worker']} | "
                    f"{r['available_drop_mib']} | {r['wall_s']} | {r['wall_ms_per_step']} | {r['simulated_s']} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 8, 16, 32, 64])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--spawned-up-to", type=int, default=32,
                    help="also run each size up to this one with a fresh interpreter a worker (NETSENSE_FORK_WORKERS=0), "
                         "side by side with the forked ones (64 spawned would not fit in 24 GiB)")
    ap.add_argument("--out", default="testbed/results/sim-many-workers")
    ap.add_argument("--print", action="store_true", help="print the table of the committed records, run nothing")
    args = ap.parse_args()
    if args.print:
        print(table(store.load(args.out)))
        return 0
    records = []
    with tempfile.TemporaryDirectory() as workdir:
        for n in args.workers:
            for launcher in ("spawned", "forked") if n <= args.spawned_up_to else ("forked",):
                records.append(measure(n, args.steps, workdir, launcher))
                print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    store.save(args.out, records)
    store.write_index(os.path.dirname(args.out) or ".")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
